"""``make slim``: the starter stripped to its core; every extra, app and data kind removed but those kept.

    python -m scripts.slim                     # make slim: the core alone
    python -m scripts.slim tables dashboard    # make slim KEEP="tables dashboard": those and what they need

The core is ``src/`` outside ``src/extras/`` and ``src/apps/``. Each folder of those two says in its
``plugin.toml`` what it needs (read here, never imported)::

    needs = ["cv"]      # the extras and apps its code imports: kept with it
    uses = ["images"]   # read only for what they made (their checkpoints): removed without it
    [stand_in."src.extras.<name>.logger.MyLogger"]               # a class of its own named in configs/,
    class_path = "lightning.pytorch.loggers.TensorBoardLogger"   # and Lightning's that takes its place
    drop = ["save_every_s"]                                      # init_args only its own class takes

What goes with the ones removed:
- their folders, and the modules beside the folders (``src/extras/*.py``) that no kept folder imports;
- in ``configs/``: the sections of ``defaults.yaml`` that name them, in every config file those sections
  and the ``trainer`` entries (a ``trainer.callbacks`` item, the logger) that name them; a config whose
  model or data is theirs goes whole, and so does a fragment left with nothing;
- the benchmarks, examples and notebooks that name them (or a config or file that went), and the Makefile
  lines that name any of those;
- in every Markdown page: table rows, sentences, commands and code blocks that name them or link to what
  went; a paragraph whose first sentence names them goes whole, and so does a section whose table or
  text is left empty (with the links to its heading).

It refuses a tree with changes that git has not committed, and writes no new file: ``git checkout -- .``
brings everything back.
"""

import ast
import json
import re
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from scripts.links import HEADING, LINK, NOT_FOLLOWED, slug

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("extras", "apps")
#: folders whose files run only when all they name is there: a file there that names what went goes whole
RUNNABLE = ("benchmarks", "examples", "notebooks")
#: top-level keys of a config that are LightningCLI's own; every other key of defaults.yaml is a section
CLI_KEYS = {"trainer", "model", "data", "seed_everything", "ckpt_path", "optimizer", "lr_scheduler"}
#: what a walk of the tree leaves out where git cannot list the files: environments, caches, runs, data
NOT_WALKED = {"logs", "lightning_logs", "data", "build", "__pycache__"}
UNDO = "git checkout -- ."
DEFAULTS = "configs/defaults.yaml"


class SlimError(Exception):
    """What make slim cannot do, in one sentence; nothing has been changed."""


# -- what each folder needs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StandIn:
    class_path: str
    drop: tuple[str, ...]


@dataclass(frozen=True)
class Plugin:
    """A folder ``src/<kind>/<name>/`` and what its ``plugin.toml`` says."""

    name: str
    kind: str  # "extras" or "apps"
    needs: frozenset[str]
    uses: frozenset[str]
    stand_ins: tuple[tuple[str, StandIn], ...]  # (its class_path, Lightning's in its place)

    @property
    def folder(self) -> str:
        return f"src/{self.kind}/{self.name}"


def plugins(root: Path = ROOT) -> dict[str, Plugin]:
    """Every extra and app by its folder's name, as its ``plugin.toml`` declares it."""
    found: dict[str, Plugin] = {}
    for kind in KINDS:
        for init in sorted((root / "src" / kind).glob("*/__init__.py")):
            folder = init.parent.relative_to(root).as_posix()
            declared = init.parent / "plugin.toml"
            if not declared.is_file():
                raise SlimError(
                    f"{folder}/ has no plugin.toml: say in one what it needs (needs = [] for the core)."
                )
            try:
                table = tomllib.loads(declared.read_text())
            except tomllib.TOMLDecodeError as err:
                raise SlimError(f"{folder}/plugin.toml is not TOML: {err}.") from None
            if "needs" not in table or set(table) - {"needs", "uses", "stand_in"}:
                raise SlimError(
                    f"{folder}/plugin.toml holds {sorted(table)}: it takes needs, and uses and stand_in."
                )
            name = init.parent.name
            if name in found:
                raise SlimError(
                    f"{found[name].folder}/ and {folder}/ share a name, which KEEP cannot tell apart."
                )
            stand_ins = tuple(
                (source, StandIn(entry["class_path"], tuple(entry.get("drop", []))))
                for source, entry in sorted(table.get("stand_in", {}).items())
            )
            found[name] = Plugin(
                name, kind, frozenset(table["needs"]), frozenset(table.get("uses", [])), stand_ins
            )
    for plugin in found.values():
        unknown = sorted((plugin.needs | plugin.uses) - set(found))
        if unknown:
            raise SlimError(
                f"{plugin.folder}/plugin.toml names {unknown}, no folder of src/extras/ or src/apps/."
            )
    return found


def with_needs(names: Iterable[str], found: dict[str, Plugin]) -> set[str]:
    """``names`` and everything they need, transitively."""
    kept = set(names)
    frontier = list(kept)
    while frontier:
        for need in found[frontier.pop()].needs - kept:
            kept.add(need)
            frontier.append(need)
    return kept


def all_but(name: str, found: dict[str, Plugin]) -> set[str]:
    """What stays when ``name`` alone is removed: every other one that does not need it."""
    return {other for other in found if name not in with_needs([other], found)}


def module_of(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, root: Path) -> set[str]:
    """Every module ``path`` imports, relative imports resolved (``from a import b``: ``a`` and ``a.b``)."""
    package = (
        module_of(path, root) if path.name == "__init__.py" else module_of(path, root).rpartition(".")[0]
    )
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1]) if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def shared_modules(root: Path) -> dict[str, Path]:
    """The modules beside the folders (``src/extras/*.py``, ``src/apps/*.py``) by module name."""
    return {
        module_of(path, root): path
        for kind in KINDS
        for path in sorted((root / "src" / kind).glob("*.py"))
        if path.name != "__init__.py"
    }


def shared_kept(root: Path, folders: Iterable[str]) -> set[Path]:
    """The shared modules the kept ``folders`` import, transitively; a test beside them (``test_*.py``)
    stays while every shared module it imports stays."""
    shared = shared_modules(root)
    kept: set[Path] = set()
    frontier = [path for folder in folders for path in (root / folder).rglob("*.py")]
    while frontier:
        for module in imported(frontier.pop(), root):
            path = shared.get(module)
            if path is not None and path not in kept and not path.name.startswith("test_"):
                kept.add(path)
                frontier.append(path)
    for path in shared.values():
        if path.name.startswith("test_") and {shared[m] for m in imported(path, root) if m in shared} <= kept:
            kept.add(path)
    return kept


# -- what names what went --------------------------------------------------------------------------------


@dataclass
class Gone:
    """What went, and the text that names it."""

    root: Path
    paths: set[str] = field(default_factory=set)  # removed files and folders, root-relative
    sections: set[str] = field(default_factory=set)  # callback sections of defaults.yaml
    targets: set[str] = field(default_factory=set)  # make targets of removed apps
    anchors: dict[str, set[str]] = field(default_factory=dict)  # page → its headings removed
    stand_ins: dict[str, StandIn] = field(default_factory=dict)
    _pattern: re.Pattern[str] | None = None

    def add(self, path: str) -> None:
        self.paths.add(path)
        self._pattern = None

    def has(self, path: str) -> bool:
        return any(path == gone or path.startswith(gone + "/") for gone in self.paths)

    @property
    def pattern(self) -> re.Pattern[str]:
        """Paths and modules of what went (``src/extras/<name>``, ``src.extras.<name>``, a config's file
        name), its make targets and its sections' CLI words (``--<section>``)."""
        if self._pattern is None:
            words = []
            for path in sorted(self.paths):
                stem = path.removesuffix(".py")
                if path.startswith("configs/"):
                    words.append(rf"(?<![\w-]){re.escape(Path(path).name)}\b")
                else:
                    words.append(r"\b" + r"[./]".join(map(re.escape, stem.split("/"))) + r"\b")
            if self.targets:
                words.append(rf"\bmake (?:{'|'.join(sorted(self.targets))})\b")
            if self.sections:
                words.append(rf"--(?:{'|'.join(sorted(self.sections))})\b")
            self._pattern = re.compile("|".join(words) or r"(?!)")
        return self._pattern

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


# -- configs: whole sections and list items, line by line, so the comments of what stays stay ----------


def indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def is_comment(line: str) -> bool:
    return line.lstrip().startswith("#")


def last_line(lines: list[str], node: yaml.Node) -> int:
    """The last line of ``node``'s own text: a block ends where the next token starts."""
    end = node.end_mark
    if end.line < len(lines) and lines[end.line][: end.column].strip():
        return end.line
    return end.line - 1


@dataclass
class Entry:
    """One key of a mapping, or one item of a sequence, with the lines it spans."""

    start: int  # its first line
    end: int  # one past its last line (trailing blanks and comments belong to what follows)
    column: int
    node: yaml.Node
    lead: int  # the first of the comment lines right above it at its column (== start if none)


def entries(lines: list[str], parent: yaml.Node) -> list[Entry]:
    found = []
    children = parent.value if isinstance(parent, yaml.SequenceNode) else [v for _, v in parent.value]
    starts = (
        [child.start_mark for child in parent.value]
        if isinstance(parent, yaml.SequenceNode)
        else [key.start_mark for key, _ in parent.value]
    )
    for child, mark in zip(children, starts, strict=True):
        start, column = mark.line, mark.column
        if isinstance(parent, yaml.SequenceNode):  # the item starts at its dash
            before = lines[start][:column]
            if "-" not in before:
                start = max(line for line in range(start) if lines[line].strip())
            column = lines[start].index("-")
        end = last_line(lines, child) + 1
        while end > start + 1 and (
            not lines[end - 1].strip() or (is_comment(lines[end - 1]) and indent(lines[end - 1]) <= column)
        ):
            end -= 1
        lead = start
        while lead > 0 and is_comment(lines[lead - 1]) and indent(lines[lead - 1]) == column:
            lead -= 1
        found.append(Entry(start, end, column, child, lead))
    return found


@dataclass
class Edit:
    lines: list[str]
    deleted: set[int] = field(default_factory=set)
    replaced: dict[int, str] = field(default_factory=dict)

    def remove(self, siblings: list[Entry], gone_ones: set[int], header: bool = False) -> None:
        """Remove the entries ``gone_ones`` (indices into ``siblings``) with their lines; the comment lines
        right above one go too when every sibling up to the next one with comments of its own goes (the
        comment speaks of them all). The file's header, above its first entry, always stays."""
        for i in sorted(gone_ones):
            entry = siblings[i]
            self.deleted.update(range(entry.start, entry.end))
            if entry.lead == entry.start or (header and i == 0):
                continue
            following = [j for j in range(i + 1, len(siblings)) if siblings[j].lead < siblings[j].start]
            upto = following[0] if following else len(siblings)
            if all(j in gone_ones for j in range(i, upto)):
                self.deleted.update(range(entry.lead, entry.start))

    def text(self) -> str:
        kept = [self.replaced.get(i, line) for i, line in enumerate(self.lines) if i not in self.deleted]
        return "".join(kept)


def emptied(line: str, value: str) -> str:
    """``  key:    # why`` → ``  key: []  # why``: ``value`` after the colon, the comment where it was."""
    head, _, tail = line.rstrip("\n").partition(":")
    text = f"{head}: {value}"
    comment = tail.strip()
    if not comment:
        return text + "\n"
    column = len(head) + 1 + tail.index("#")
    return (text.ljust(column) if column > len(text) + 1 else text + "  ") + comment + "\n"


def edit_config(text: str, gone: Gone, defaults: dict[str, object], whole: bool = True) -> str | None:
    """``text`` of a config without what went, or ``None`` when the config goes whole: its model or data is
    what went (its own, or defaults.yaml's it relies on), or nothing is left of it. ``whole``: a config
    file (a fragment in a page is only trimmed)."""
    names = module_words(gone)
    try:
        tree = yaml.compose(text)
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise SlimError(f"it is not YAML: {err}") from None
    if tree is None or not isinstance(tree, yaml.MappingNode):
        if names(loaded):
            raise SlimError("it names what went outside a mapping")
        return text
    lines = text.splitlines(keepends=True)
    edit = Edit(lines)
    stood_in = stand_in(edit, tree, gone)

    def naming(node: yaml.Node) -> bool:
        return any(names(s.value) for s in scalars(node) if id(s) not in stood_in)

    if whole:
        for key in ("model", "data"):
            value = loaded.get(key)
            relies = isinstance(value, dict) and "class_path" not in value  # on defaults.yaml's class
            if value is not None and (names(value) or (relies and names(defaults.get(key)))):
                return None
    top = entries(lines, tree)
    going: set[int] = set()
    for i, (key, value) in enumerate(tree.value):
        if key.value in gone.sections or (key.value != "trainer" and naming(value)):
            going.add(i)
        elif key.value == "trainer" and naming(value):
            if not isinstance(value, yaml.MappingNode) or value.flow_style:
                raise SlimError("its trainer names what went on a line shared with what stays")
            inner = entries(lines, value)
            inner_going = set()
            for j, (_, item) in enumerate(value.value):
                if not naming(item):
                    continue
                if isinstance(item, yaml.SequenceNode) and not item.flow_style:
                    items = entries(lines, item)
                    listed = {k for k, element in enumerate(item.value) if naming(element)}
                    edit.remove(items, listed)
                    if len(listed) == len(items):
                        edit.replaced[inner[j].start] = emptied(lines[inner[j].start], "[]")
                else:
                    inner_going.add(j)
            edit.remove(inner, inner_going)
            if len(inner_going) == len(inner):
                going.add(i)
    edit.remove(top, going, header=True)
    result = edit.text()
    kept = yaml.safe_load(result)
    if kept and names(kept):
        raise SlimError(
            "it names what went in an entry that is not a section, a trainer entry or a list item"
        )
    if whole and not kept:
        return None
    return result


def scalars(node: yaml.Node) -> Iterator[yaml.ScalarNode]:
    if isinstance(node, yaml.ScalarNode):
        yield node
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            yield from scalars(item)
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield from scalars(key)
            yield from scalars(value)


def stand_in(edit: Edit, tree: yaml.Node, gone: Gone) -> set[int]:
    """Write Lightning's class where a class that went has a stand-in (its trailing comment, which spoke
    of the class that went, dropped, and the init_args only that class took); the scalars rewritten."""
    rewritten: set[int] = set()
    for node in nodes(tree):
        if not isinstance(node, yaml.MappingNode):
            continue
        for key, value in node.value:
            if (
                key.value != "class_path"
                or not isinstance(value, yaml.ScalarNode)
                or value.value not in gone.stand_ins
            ):
                continue
            replacement = gone.stand_ins[value.value]
            start, end = value.start_mark, value.end_mark
            line = edit.lines[start.line]
            rest = line[end.column :]
            if not rest.strip() or is_comment(rest):
                rest = "\n"  # a comment after the class spoke of the class that went
            edit.replaced[start.line] = line[: start.column] + replacement.class_path + rest
            rewritten.add(id(value))
            for other, args in node.value:
                if other.value == "init_args" and isinstance(args, yaml.MappingNode):
                    dropped = {i for i, (arg, _) in enumerate(args.value) if arg.value in replacement.drop}
                    if dropped and args.flow_style:
                        raise SlimError(
                            f"{', '.join(replacement.drop)} of {value.value} share a line with what stays"
                        )
                    edit.remove(entries(edit.lines, args), dropped)
    return rewritten


def nodes(node: yaml.Node) -> Iterator[yaml.Node]:
    yield node
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            yield from nodes(item)
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield from nodes(key)
            yield from nodes(value)


# -- Markdown: rows, sentences, commands, blocks and sections -------------------------------------------

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
    if item:
        text = text.lstrip()
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


# -- the whole tree --------------------------------------------------------------------------------------


def is_checkout(root: Path) -> bool:
    """Whether ``root`` is the top of a git checkout (a copy inside another one is not)."""
    top = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True, text=True
    )
    return top.returncode == 0 and Path(top.stdout.strip()).resolve() == root.resolve()


def files(root: Path) -> list[str]:
    """The repository's files, root-relative: git's list where ``root`` is a checkout, else a walk that
    leaves out hidden folders, environments, caches, runs and data."""
    if is_checkout(root):
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z"], capture_output=True, text=True, check=True
        )
        return sorted(name for name in out.stdout.split("\0") if name and (root / name).is_file())
    found = []
    for path in root.rglob("*"):
        parts = path.relative_to(root).parts
        if any(part.startswith(".") or part in NOT_WALKED or part.endswith(".egg-info") for part in parts):
            continue
        if path.is_file() and not path.relative_to(root).as_posix().startswith("benchmarks/results/"):
            found.append(path.relative_to(root).as_posix())
    return sorted(found)


@dataclass
class Slimmed:
    """What make slim removed and changed."""

    removed: list[Plugin]
    kept: list[Plugin]
    deleted: list[str]  # files outside the folders removed
    edited: list[str]
    left: list[str]  # files in the folders removed that git does not track, left in place
    naming: list[str]  # files that still name what went, with what they name

    def report(self, root: Path) -> str:
        said = []
        for kind in KINDS:
            names = [p.name for p in self.removed if p.kind == kind]
            if names:
                said.append(f"the {kind} {', '.join(names)}")
        kept = ", ".join(p.name for p in self.kept) or "none"
        lines = [f"Removed {'; '.join(said) or 'nothing'} (kept: {kept})."]
        if self.deleted:
            lines.append(f"Deleted with them: {', '.join(self.deleted)}.")
        if self.edited:
            lines.append(f"Edited: {', '.join(self.edited)}.")
        if self.left:
            lines.append(f"Left in place, not tracked by git: {', '.join(self.left)}.")
        if self.naming:
            lines.append("Still naming what went (edit them by hand): " + "; ".join(self.naming) + ".")
        count, modules = python_lines(root / "src")
        lines.append(f"src/ now holds {count:,} lines of Python in {modules} files.")
        lines.append(
            f"To bring it all back: {UNDO} (make slim writes no new file; once committed: git revert)."
        )
        return "\n".join(lines)


def python_lines(folder: Path) -> tuple[int, int]:
    """Lines and files of Python under ``folder``."""
    paths = [path for path in folder.rglob("*.py") if "__pycache__" not in path.parts]
    return sum(len(path.read_text().splitlines()) for path in paths), len(paths)


def gone_with(root: Path, removed: list[Plugin], kept: list[Plugin]) -> Gone:
    """The folders removed, their stand-ins and make targets, and the shared modules no kept one imports."""
    gone = Gone(root)
    for plugin in removed:
        gone.add(plugin.folder)
        gone.stand_ins.update(plugin.stand_ins)
        makefile = root / plugin.folder / "app.mk"
        if makefile.is_file():
            gone.targets.update(re.findall(r"^([\w-]+)\s*:(?!=)", makefile.read_text(), re.MULTILINE))
    staying = shared_kept(root, [plugin.folder for plugin in kept])
    for path in shared_modules(root).values():
        if path not in staying:
            gone.add(path.relative_to(root).as_posix())
    return gone


def trim_configs(
    root: Path, tree: list[str], gone: Gone, defaults: dict[str, object]
) -> dict[str, str | None]:
    """Each config file's new text, or ``None`` for one that goes; the sections of defaults.yaml that name
    what went are added to ``gone`` first, and the configs that go after."""
    names = module_words(gone)
    gone.sections = {key for key, value in defaults.items() if key not in CLI_KEYS and names(value)}
    written: dict[str, str | None] = {}
    for name in tree:
        if not (name.startswith("configs/") and name.endswith((".yaml", ".yml"))):
            continue
        text = (root / name).read_text()
        try:
            result = edit_config(text, gone, defaults, whole=name != DEFAULTS)
        except SlimError as err:
            raise SlimError(f"{name} cannot be trimmed: {err}.") from None
        if result != text:
            written[name] = result
    for name, result in written.items():
        if result is None:
            gone.add(name)
    return written


def drop_runnable(root: Path, tree: list[str], gone: Gone) -> dict[str, str | None]:
    """The benchmarks, examples and notebooks whose code names what went, to a fixed point (one that goes
    may be named by another); each is added to ``gone``."""
    runnable = [name for name in tree if name.startswith(RUNNABLE) and name.endswith((".py", ".ipynb"))]
    written: dict[str, str | None] = {}
    more = True
    while more:
        more = False
        for name in runnable:
            if not gone.has(name) and gone.names(code_of(root / name)):
                gone.add(name)
                written[name] = None
                more = True
    return written


def trim_lines(text: str, gone: Gone) -> str:
    """``text`` (a Makefile) without the lines, a ``\\``-continued command whole, that name what went."""
    kept: list[str] = []
    command: list[str] = []
    for line in text.splitlines(keepends=True):
        command.append(line)
        if line.rstrip("\n").endswith("\\"):
            continue
        if not gone.names("".join(command)):
            kept.extend(command)
        command = []
    return "".join(kept + command)


def trim_pages(root: Path, tree: list[str], gone: Gone, defaults: dict[str, object]) -> dict[str, str | None]:
    """Every Markdown page's new text, edited until no more headings go (a link to one goes with it)."""
    pages = [name for name in tree if name.endswith(".md") and not gone.has(name)]
    texts = {name: (root / name).read_text() for name in pages}
    lost_before = -1
    while lost_before != sum(map(len, gone.anchors.values())):
        lost_before = sum(map(len, gone.anchors.values()))
        for name in pages:
            texts[name], lost = edit_markdown(name, texts[name], gone, defaults)
            if lost:
                gone.anchors.setdefault(name, set()).update(lost)
    return {name: text for name, text in texts.items() if text != (root / name).read_text()}


def slim(root: Path, keep: Iterable[str]) -> Slimmed:
    """Remove from ``root`` every extra and app but ``keep`` and what they need, with everything that names
    what went (the module's docstring lists it). All is worked out before the first file changes."""
    found = plugins(root)
    unknown = sorted(set(keep) - set(found))
    if unknown:
        choices = ", ".join(sorted(found))
        raise SlimError(
            f"KEEP names {', '.join(unknown)}, no folder of src/extras/ or src/apps/ ({choices})."
        )
    kept_names = with_needs(keep, found)
    kept = [found[name] for name in sorted(kept_names)]
    removed = [plugin for name, plugin in sorted(found.items()) if name not in kept_names]
    gone = gone_with(root, removed, kept)
    tree = [name for name in files(root) if not gone.has(name)]
    defaults = yaml.safe_load((root / DEFAULTS).read_text()) or {}
    written = trim_configs(root, tree, gone, defaults)
    written |= drop_runnable(root, tree, gone)
    makefile = (root / "Makefile").read_text()
    if trim_lines(makefile, gone) != makefile:
        written["Makefile"] = trim_lines(makefile, gone)
    written |= trim_pages(root, tree, gone, defaults)

    left = [name for plugin in removed for name in remove_folder(root, plugin.folder)]
    for path in gone.paths:
        if (root / path).is_file():
            written.setdefault(path, None)
    for name, result in sorted(written.items()):
        if result is None:
            (root / name).unlink(missing_ok=True)
        else:
            (root / name).write_text(result)
    return Slimmed(
        removed=removed,
        kept=kept,
        deleted=sorted(name for name, result in written.items() if result is None),
        edited=sorted(name for name, result in written.items() if result is not None),
        left=left,
        naming=still_naming(root, tree, gone, kept),
    )


def still_naming(root: Path, tree: list[str], gone: Gone, kept: list[Plugin]) -> list[str]:
    """The files left outside the kept folders that still name what went, each with what it names."""
    found = []
    for name in tree:
        path = root / name
        if not path.is_file() or any(name.startswith(plugin.folder + "/") for plugin in kept):
            continue
        named = gone.pattern.search(path.read_text(errors="replace"))
        if named:
            found.append(f"{name} ({named.group(0)})")
    return found


def code_of(path: Path) -> str:
    """What a Python file or a notebook's code cells run: the modules imported and the strings that are not
    docstrings (a docstring or comment that names a config does not need it)."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text()).get("cells", [])
        source = "\n".join(
            "".join(cell.get("source", [])) for cell in cells if cell.get("cell_type") == "code"
        )
        source = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    else:
        source = path.read_text()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    words: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            words.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            words.extend(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            words.append(node.value)
    return "\n".join(words)


def remove_folder(root: Path, folder: str) -> list[str]:
    """Delete ``folder``'s files but those git ignores and Python did not make (the user's, which git could
    not bring back), then the folders left empty; those left in place are returned."""
    words = ["ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--", folder]
    ignored = subprocess.run(["git", "-C", str(root), *words], capture_output=True, text=True)
    listed = ignored.stdout.split("\0") if ignored.returncode == 0 and is_checkout(root) else []
    made = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
    theirs = {
        name for name in listed if name and not set(Path(name).parts) & made and not name.endswith(".pyc")
    }
    for path in sorted((root / folder).rglob("*"), reverse=True):
        name = path.relative_to(root).as_posix()
        if name in theirs:
            continue
        if path.is_dir() and not path.is_symlink():
            if not any(path.iterdir()):
                path.rmdir()
        else:
            path.unlink()
    if (root / folder).is_dir() and not any((root / folder).iterdir()):
        (root / folder).rmdir()
    return sorted(theirs)


def refuse_unless_committed(root: Path) -> None:
    """make slim undoes with git: a tree with changes git has not committed would lose them."""
    status = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True)
    if status.returncode != 0:
        raise SlimError(f"{root} is no git checkout, so nothing could bring back what make slim removes.")
    if status.stdout.strip():
        changed = len(status.stdout.splitlines())
        raise SlimError(
            f"the tree has {changed} uncommitted change(s) (git status): commit or stash them first, so that "
            f"`{UNDO}` can bring back all that make slim removes."
        )


def main(argv: list[str] | None = None) -> int:
    keep = [
        word for arg in (sys.argv[1:] if argv is None else argv) for word in re.split(r"[\s,]+", arg) if word
    ]
    try:
        refuse_unless_committed(ROOT)
        done = slim(ROOT, keep)
    except SlimError as err:
        print(f"make slim: {err}", file=sys.stderr)
        return 2
    print(done.report(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
