"""What each extra and app needs, as the ``plugin.toml`` in its folder says, and what its code imports.

Every folder ``src/extras/<name>/`` and ``src/apps/<name>/`` (one with an ``__init__.py``) holds a
``plugin.toml``, read here and never imported::

    needs = ["cv"]      # the extras and apps its code imports: make slim keeps them with it
    uses = ["images"]   # read only for what they made (their checkpoints): removed without it
    [stand_in."src.extras.<name>.logger.MyLogger"]               # a class of its own named in configs/,
    class_path = "lightning.pytorch.loggers.TensorBoardLogger"   # and Lightning's that takes its place
    drop = ["save_every_s"]                                      # init_args only its own class takes

The modules beside the folders (``src/extras/*.py``) belong to whichever folders import them.
"""

import ast
import dataclasses
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("extras", "apps")


class SlimError(Exception):
    """What make slim cannot do, in one sentence; nothing has been changed."""


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
    for name, plugin in found.items():
        unknown = sorted(plugin.needs - set(found))
        if unknown:
            raise SlimError(
                f"{plugin.folder}/plugin.toml names {unknown}, no folder of src/extras/ or src/apps/."
            )
        # what it uses may be gone already (make slim removes it without the one that uses it)
        found[name] = dataclasses.replace(plugin, uses=plugin.uses & set(found))
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
