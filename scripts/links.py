"""The links of Markdown pages that lead nowhere: relative links to files and folders, and ``#anchors``.

    python -m scripts.links README.md docs/*.md      # one line per broken link; exit status 1 if any

An anchor is a heading's slug as GitHub makes it: the heading's text lowercased, punctuation dropped but
``-`` and ``_``, each space made ``-``; a repeated heading gets ``-1``, ``-2``, ... Links to the web and
to what ``make bench`` writes (``benchmarks/results/``, which git does not keep) are not followed; links
inside code blocks are not links.
"""

import re
import sys
from collections.abc import Iterator
from pathlib import Path

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
#: targets not followed: the web, and the tables make bench writes
NOT_FOLLOWED = ("http://", "https://", "mailto:")
GENERATED = "benchmarks/results/"


def prose_lines(text: str) -> Iterator[str]:
    """The lines of ``text`` outside its fenced code blocks."""
    fence = ""
    for line in text.splitlines():
        opened = FENCE.match(line)
        if fence:
            if opened and opened.group(1) == fence:
                fence = ""
        elif opened:
            fence = opened.group(1)
        else:
            yield line


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text: ``"Make it yours"`` → ``"make-it-yours"``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    text = re.sub(r"[`*]", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> list[str]:
    """Every heading's anchor, in order; a repeated slug numbered as GitHub numbers it."""
    seen: dict[str, int] = {}
    found = []
    for line in prose_lines(text):
        heading = HEADING.match(line)
        if heading is None:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        found.append(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return found


def links(text: str) -> list[str]:
    """The targets of the Markdown links in ``text``'s prose."""
    return [target for line in prose_lines(text) for target in LINK.findall(line)]


def broken(page: Path) -> list[str]:
    """One sentence per link of ``page`` that leads to no file, or to no heading of a page."""
    found = []
    for target in links(page.read_text()):
        if target.startswith(NOT_FOLLOWED) or GENERATED in target:
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page.resolve()
        if not where.exists():
            found.append(f"{page}: the link {target} leads to no file")
        elif anchor and where.suffix == ".md" and anchor.lower() not in anchors(where.read_text()):
            found.append(f"{page}: the link {target} leads to no heading of {where.name}")
    return found


def main(pages: list[str]) -> int:
    problems = [problem for page in pages for problem in broken(Path(page))]
    print("\n".join(problems) or f"every link of {len(pages)} pages leads somewhere")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
