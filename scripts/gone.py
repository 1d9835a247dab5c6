"""What make slim removed, and the text that names it: paths and modules, config file names, make targets,
sections' CLI words and links to the files and headings that went."""

import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from scripts.links import LINK, NOT_FOLLOWED
from scripts.plugins import StandIn


@dataclass
class Gone:
    """What went, and the text that names it."""

    root: Path
    paths: set[str] = field(default_factory=set)  # removed files and folders, root-relative
    sections: set[str] = field(default_factory=set)  # callback sections of defaults.yaml
    targets: set[str] = field(default_factory=set)  # make targets of removed apps
    anchors: dict[str, set[str]] = field(default_factory=dict)  # page → its headings removed
    stand_ins: dict[str, StandIn] = field(default_factory=dict)

    def add(self, path: str) -> None:
        self.paths.add(path)

    def has(self, path: str) -> bool:
        return any(path == gone or path.startswith(gone + "/") for gone in self.paths)

    @property
    def pattern(self) -> re.Pattern[str]:
        """Paths and modules of what went (``src/extras/<name>``, ``src.extras.<name>``, a config's file
        name), its make targets and its sections' CLI words (``--<section>``)."""
        return naming(frozenset(self.paths), frozenset(self.targets), frozenset(self.sections))

    def names(self, text: str) -> bool:
        return self.pattern.search(text) is not None

    def link_goes(self, page: str, target: str) -> bool:
        """Whether a link of ``page`` (root-relative) to ``target`` leads to what went."""
        if target.startswith(NOT_FOLLOWED):
            return False
        path, _, anchor = target.partition("#")
        where = (self.root / page).parent / path if path else self.root / page
        try:
            relative = where.resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return False
        return self.has(relative) or anchor in self.anchors.get(relative, set())

    def in_prose(self, page: str) -> Callable[[str], bool]:
        """Whether a piece of ``page``'s prose names or links to what went."""
        return lambda text: self.names(text) or any(self.link_goes(page, t) for t in LINK.findall(text))


def strings(value: object) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)
    elif isinstance(value, str):
        yield value


def module_words(gone: Gone) -> Callable[[object], bool]:
    """Whether a config value names a module that went (a class_path, anywhere inside it)."""
    modules = [path.removesuffix(".py").replace("/", ".") for path in gone.paths if path.startswith("src/")]
    pattern = re.compile("|".join(rf"\b{re.escape(module)}\b" for module in modules) or r"(?!)")
    return lambda value: any(pattern.search(text) for text in strings(value))


@functools.cache
def naming(paths: frozenset[str], targets: frozenset[str], sections: frozenset[str]) -> re.Pattern[str]:
    words = []
    for path in sorted(paths):
        if path.startswith("configs/"):
            words.append(rf"(?<![\w-]){re.escape(Path(path).name)}\b")
        else:
            words.append(r"\b" + r"[./]".join(map(re.escape, path.removesuffix(".py").split("/"))) + r"\b")
    if targets:
        words.append(rf"\bmake (?:{'|'.join(sorted(targets))})\b")
    if sections:  # a section as a CLI word, a YAML key starting a line, or in backticks (its key too)
        names = "|".join(sorted(sections))
        words += [rf"--(?:{names})\b", rf"^\s*(?:{names}):", rf"`(?:{names})[:`]"]
    return re.compile("|".join(words) or r"(?!)", re.MULTILINE)
