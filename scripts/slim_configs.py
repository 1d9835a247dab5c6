"""A config without what went, line by line, so that the comments of what stays stay: whole top-level
sections, ``trainer`` entries and list items go (their own comments with them); a class with a stand-in
becomes Lightning's; a config whose model or data went goes whole."""

from collections.abc import Iterator
from dataclasses import dataclass, field

import yaml

from scripts.gone import Gone, module_words
from scripts.plugins import SlimError


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
