"""``make slim``: the starter stripped to its core; every extra, app and data kind removed but those kept.

    python -m scripts.slim                     # make slim: the core alone
    python -m scripts.slim dashboard images    # make slim KEEP="dashboard images": those and what they need

The core is ``src/`` outside ``src/extras/`` and ``src/apps/``; each folder of those two says in its
``plugin.toml`` what it needs (:mod:`scripts.plugins`).

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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from scripts.gone import Gone, module_words
from scripts.plugins import KINDS, ROOT, Plugin, SlimError, plugins, shared_kept, shared_modules, with_needs
from scripts.slim_configs import edit_config
from scripts.slim_pages import edit_markdown

#: folders whose files run only when all they name is there: a file there that names what went goes whole
RUNNABLE = ("benchmarks", "examples", "notebooks")
#: top-level keys of a config that are LightningCLI's own; every other key of defaults.yaml is a section
CLI_KEYS = {"trainer", "model", "data", "seed_everything", "ckpt_path", "optimizer", "lr_scheduler"}
#: what a walk of the tree leaves out where git cannot list the files: environments, caches, runs, data
NOT_WALKED = {"logs", "lightning_logs", "data", "build", "__pycache__"}
UNDO = "git checkout -- ."
DEFAULTS = "configs/defaults.yaml"


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


#: the folders whose sub-folders make slim may remove whole
REMOVABLE = ("src/extras/", "src/apps/")


def refuse_unless_committed(root: Path) -> None:
    """make slim undoes with git: a tree with changes git has not committed would lose them."""
    status = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=all"],
        capture_output=True,
        text=True,
    )
    if status.returncode != 0:
        raise SlimError(f"{root} is no git checkout, so nothing could bring back what make slim removes.")
    # an untracked file is at risk only inside the folders whose plug-ins may go; elsewhere slim edits
    # and deletes tracked files alone
    lines = status.stdout.splitlines()
    at_risk = [
        line for line in lines if not line.startswith("??") or line[3:].strip('"').startswith(REMOVABLE)
    ]
    if at_risk:
        raise SlimError(
            f"the tree has {len(at_risk)} uncommitted change(s) make slim could lose (git status: "
            f"{at_risk[0][3:]}{' ...' * (len(at_risk) > 1)}): commit or stash them first, so that "
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
