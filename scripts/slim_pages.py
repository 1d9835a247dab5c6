"""A Markdown page without what went: table rows, sentences, shell commands, YAML entries and code blocks
that name it or link to it; a paragraph whose first sentence names it goes whole, a code block with the
paragraph that introduced it, a section whose table or text is left empty with its heading (and, on the
next pass, the links to that heading)."""

import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

import yaml

from scripts.gone import Gone
from scripts.links import HEADING, slug
from scripts.plugins import SlimError
from scripts.slim_configs import edit_config, indent, is_comment

FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w-]*)")
ITEM = re.compile(r"^(\s*)([-*+]|\d+[.)])\s+")
SHELL = {"", "bash", "sh", "shell", "console"}
#: the widest a rewrapped paragraph's lines grow (ruff's line length)
WIDTH = 110
#: where a sentence ends: . ! or ? (a bold or bracketed close after it), then a space and a capital,
#: a code span, a link or emphasis
SENTENCE_END = re.compile(r"(?<=[.!?])((?:\*\*|\)|\")?)\s+(?=[A-Z`\[*(\"])")


@dataclass
class Block:
    kind: str  # blank, heading, code, table, item, prose
    lines: list[str]
    level: int = 0
    lang: str = ""


def blocks_of(text: str) -> list[Block]:
    lines = text.splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = FENCE.match(line)
        if not line.strip():
            found.append(Block("blank", [line]))
            i += 1
        elif fence:
            end = i + 1
            while end < len(lines) and not lines[end].strip().startswith(fence.group(2)):
                end += 1
            found.append(Block("code", lines[i : end + 1], lang=fence.group(3)))
            i = end + 1
        elif HEADING.match(line):
            found.append(Block("heading", [line], level=len(line) - len(line.lstrip("#"))))
            i += 1
        elif line.lstrip().startswith("|"):
            end = i
            while end < len(lines) and lines[end].lstrip().startswith("|"):
                end += 1
            found.append(Block("table", lines[i:end]))
            i = end
        else:
            item = ITEM.match(line)
            end = i + 1
            while end < len(lines) and lines[end].strip():
                following = lines[end]
                if FENCE.match(following) or HEADING.match(following) or following.lstrip().startswith("|"):
                    break
                if ITEM.match(following) and (item or indent(following) == 0):
                    break
                end += 1
            found.append(Block("item" if item else "prose", lines[i:end]))
            i = end
    return found


def sentences(text: str) -> list[str]:
    """``text`` cut after each sentence; a bold lead-in (``**Your images.**``) opens the sentence after it."""
    parts: list[str] = []
    start = 0
    for end in SENTENCE_END.finditer(text):
        parts.append(text[start : end.start() + len(end.group(1))])
        start = end.end()
    parts.append(text[start:])
    if len(parts) > 1 and re.fullmatch(r"\*\*[^*]+\*\*", parts[0]):
        parts[:2] = [f"{parts[0]} {parts[1]}"]
    return parts


def edit_prose(block: Block, names: Callable[[str], bool], drop_colon: bool = False) -> list[str] | None:
    """The block's lines without the sentences that name what went, rewrapped; ``None`` when the block goes:
    its first sentence names it, or nothing is left. ``drop_colon``: the code block it introduced went, so
    a last sentence ending in ``:`` goes too."""
    first = block.lines[0]
    item = ITEM.match(first)
    prefix = item.group(0) if item else first[: indent(first)]
    text = " ".join(line.strip() for line in block.lines)[len(prefix.strip()) :].strip()
    if not names(text) and not (drop_colon and text.endswith(":")):
        return block.lines
    parts = sentences(text)
    if names(parts[0]):
        return None
    kept = [part for part in parts if not names(part)]
    if drop_colon and kept and kept[-1].endswith(":"):
        kept.pop()
    if not kept:
        return None
    width = min(max(len(line) for line in block.lines), WIDTH)
    return textwrap.wrap(
        " ".join(kept),
        width=max(width, 60),
        initial_indent=prefix,
        subsequent_indent=" " * len(prefix),
        break_long_words=False,
        break_on_hyphens=False,
    )


def edit_code(
    block: Block, gone: Gone, names: Callable[[str], bool], defaults: dict[str, object]
) -> list[str] | None:
    """A code block without what names what went: a shell block loses those commands (and goes when none is
    left), a YAML block those entries; any other block that names it goes whole."""
    opening, body, closing = block.lines[0], block.lines[1:-1], block.lines[-1:]
    if not names("\n".join(body)):
        return block.lines
    if block.lang in SHELL:
        kept: list[str] = []
        command: list[str] = []
        for line in body:
            command.append(line)
            if line.rstrip().endswith("\\"):
                continue
            if not names("\n".join(command)):
                kept.extend(command)
            command = []
        kept.extend(command)
        if not any(line.strip() and not is_comment(line) for line in kept):
            return None
        return [opening, *kept, *closing]
    if block.lang in {"yaml", "yml"}:
        margin = min((indent(line) for line in body if line.strip()), default=0)
        try:
            trimmed = edit_config("".join(line[margin:] + "\n" for line in body), gone, defaults, whole=False)
        except SlimError:
            return None
        if trimmed is None or not yaml.safe_load(trimmed):
            return None
        return [opening, *(" " * margin + line if line else line for line in trimmed.splitlines()), *closing]
    return None


def heading_slugs(blocks: list[Block]) -> dict[int, str]:
    """The anchor of each heading block, by its index, numbered as GitHub numbers a repeated one."""
    slugs: dict[int, str] = {}
    seen: dict[str, int] = {}
    for i, block in enumerate(blocks):
        if block.kind == "heading":
            base = slug(block.lines[0].lstrip("#").strip())
            slugs[i] = f"{base}-{seen[base]}" if seen.get(base) else base
            seen[base] = seen.get(base, 0) + 1
    return slugs


def section_of(blocks: list[Block], start: int) -> range:
    """The blocks of the section that the heading ``blocks[start]`` opens, subsections included."""
    level = blocks[start].level
    after = (
        j for j in range(start + 1, len(blocks)) if blocks[j].kind == "heading" and blocks[j].level <= level
    )
    return range(start, next(after, len(blocks)))


def emptied_headings(blocks: list[Block], removed: set[int]) -> set[int]:
    """The headings left with nothing under them before the next heading of their level, where what was
    there went (a heading that stood alone stays)."""
    found: set[int] = set()
    changed = True
    while changed:
        changed = False
        for i, block in enumerate(blocks):
            if block.kind != "heading" or i in removed | found:
                continue
            had = [j for j in range(i + 1, len(blocks)) if blocks[j].kind != "blank"]
            left = [j for j in had if j not in removed | found]
            closes = not left or (blocks[left[0]].kind == "heading" and blocks[left[0]].level <= block.level)
            if had and had[0] in removed | found and closes:
                found.add(i)
                changed = True
    return found


def edit_markdown(page: str, text: str, gone: Gone, defaults: dict[str, object]) -> tuple[str, set[str]]:
    """``page``'s text without what names what went, and the anchors of the headings it lost."""
    names = gone.in_prose(page)
    blocks = blocks_of(text)
    removed: set[int] = set()
    sections: set[int] = set()  # headings whose whole section goes
    heading = None
    introduced = False  # a paragraph that went ended in ":": the code block it introduced goes with it
    for i, block in enumerate(blocks):
        if block.kind != "blank" and introduced:
            introduced = False
            if block.kind == "code":
                removed.add(i)
                continue
        if block.kind == "heading":
            heading = i
            if names(block.lines[0]):
                sections.add(i)
        elif block.kind == "table":
            rows = [row for row in block.lines[2:] if not names(row)]
            if block.lines[2:] and not rows:  # a table of what went: its section goes
                removed.add(i)
                sections.update([] if heading is None else [heading])
            block.lines = block.lines[:2] + rows
        elif block.kind == "code":
            code = edit_code(block, gone, names, defaults)
            if code is not None:
                block.lines = code
                continue
            removed.add(i)
            before = max((j for j in range(i) if blocks[j].kind != "blank"), default=None)
            if before is not None and blocks[before].kind in {"prose", "item"} and before not in removed:
                trimmed = edit_prose(blocks[before], names, drop_colon=True)
                if trimmed is None:
                    removed.add(before)
                else:
                    blocks[before].lines = trimmed
        elif block.kind in {"prose", "item"}:
            prose = edit_prose(block, names)
            if prose is None:
                removed.add(i)
                introduced = block.lines[-1].rstrip().endswith(":")
            else:
                block.lines = prose
    for start in sections:
        removed.update(section_of(blocks, start))
    removed |= emptied_headings(blocks, removed)
    lines: list[str] = []
    for i, block in enumerate(blocks):
        if i in removed or (block.kind == "blank" and (not lines or not lines[-1].strip())):
            continue
        lines.extend(block.lines)
    while lines and not lines[-1].strip():
        lines.pop()
    slugs = heading_slugs(blocks)
    return "\n".join(lines) + "\n", {slugs[i] for i in removed if i in slugs}
