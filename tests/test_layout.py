"""Core, extras and apps apart: the core imports no extra and no app; each extra needs only the core, and
comes off by deleting its folder, its entries in ``configs/`` and its README row; each app needs only the
core and the apps it names, and comes off by deleting its folder (its code, tests, page, make targets and
benchmark) and its row in the README's table of apps."""

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

SRC = ROOT / "src"
#: the apps each app builds on: a sweep cross-validates its trials through cv
NEEDS = {"sweep": {"cv"}}


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, relative imports resolved."""
    package = module_of(path) if path.name == "__init__.py" else module_of(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1]) if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)  # `from src.apps import cv`
    return found


def app_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["src", "apps"] and len(parts) > 2 else None


def test_the_core_imports_no_app() -> None:
    core = [path for path in SRC.rglob("*.py") if not module_of(path).startswith("src.apps")]
    assert len(core) > 20
    for path in core:
        apps = {module for module in imported(path) if module.startswith("src.apps")}
        assert not apps, f"{path.relative_to(ROOT)} imports {sorted(apps)}: the core must not know the apps"


def test_each_app_needs_only_the_core_and_the_apps_it_names() -> None:
    assert {app_of(module_of(path)) for path in (SRC / "apps").rglob("*.py")} - {None} == set(apps())
    for path in (SRC / "apps").rglob("*.py"):
        app = app_of(module_of(path))
        if app is None:
            continue
        others = {app_of(module) for module in imported(path)} - {None, app}
        assert others <= NEEDS.get(app, set()), f"{path.relative_to(ROOT)} uses the apps {sorted(others)}"


def apps() -> list[str]:
    return sorted(path.parent.name for path in (SRC / "apps").glob("*/__init__.py"))


def gone_with(app: str) -> set[str]:
    """``app`` and the apps that build on it, which go with it."""
    gone = {app}
    while more := {other for other, needs in NEEDS.items() if needs & gone} - gone:
        gone |= more
    return gone


#: what a copy of the repository leaves out: environments, caches, runs, generated data and results
NOT_COPIED = {".git", ".venv", "logs", "lightning_logs", "data", "benchmarks/results", ".hypothesis"}


def not_copied(folder: str, names: list[str]) -> set[str]:
    where = Path(folder).relative_to(ROOT)
    return {
        name
        for name in names
        if (where / name).as_posix() in NOT_COPIED or name == "__pycache__" or name.endswith("_cache")
    }


@pytest.mark.slow
@pytest.mark.parametrize("app", apps())
def test_an_app_comes_off_by_deleting_its_folder_and_its_row_in_the_readme(app: str, tmp_path: Path) -> None:
    """In a copy of the repository: the app's folder (and those of the apps that build on it) and their
    rows in the README's table deleted, nothing left names them, the rest of the suite collects and the
    README's checks pass."""
    copy = tmp_path / "repository"
    shutil.copytree(ROOT, copy, ignore=not_copied)
    gone = gone_with(app)
    targets = set()
    for name in gone:
        folder = copy / "src" / "apps" / name
        targets |= set(re.findall(r"^([\w-]+):", (folder / "app.mk").read_text(), re.MULTILINE))
        shutil.rmtree(folder)
    readme = copy / "README.md"
    lines = readme.read_text().splitlines(keepends=True)
    rows = [line for line in lines if any(f"(src/apps/{name}/README.md)" in line for name in gone)]
    assert len(rows) == len(gone)  # each app has its row
    readme.write_text("".join(line for line in lines if line not in rows))

    names = "|".join(sorted(gone))
    naming = re.compile(rf"src[./]apps[./]({names})\b|\bmake ({'|'.join(sorted(targets))})\b")
    for path in copy.rglob("*"):
        if path.is_file() and path.suffix in {".py", ".md", ".yaml", ".mk", ".sh", ".toml", ".ipynb", ""}:
            if path.is_relative_to(copy / "tests"):
                continue  # the tests run below; a rule held on every path skips a deleted app's
            found = naming.search(path.read_text(errors="replace"))
            assert found is None, f"{path.relative_to(copy)} still names {found.group(0)!r}"

    # one run: the whole remaining suite collected (an import that fails stops it), the README's checks run
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    checks = "test_readme and (linked or link_to or args_adds)"
    words = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "not slow", "-k", checks]
    done = subprocess.run([*words, "tests", "src/apps"], cwd=copy, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    counts = re.search(r"(\d+) passed, (\d+) deselected", done.stdout)
    assert counts is not None, done.stdout[-3000:]
    passed, deselected = counts.groups()
    assert int(passed) >= 3  # the two checks of links, make train's words, and the apps' left
    assert int(deselected) > 500
    for target in targets:  # make knows the deleted app's targets no more
        made = subprocess.run(["make", "-s", "-n", "-C", str(copy), target], capture_output=True, text=True)
        assert made.returncode != 0
        assert f"No rule to make target '{target}'" in made.stderr


# -- the extras: what a config switches on, one folder each, which the core never names -----------------

EXTRAS = SRC / "extras"
#: the apps built on an extra, which go with it
EXTRA_APPS = {"text": {"generate"}}
#: the class Lightning ships that stands in for an extra's logger once the extra is gone
STOCK_LOGGER = "lightning.pytorch.loggers.TensorBoardLogger"


def extras() -> list[str]:
    return sorted(path.parent.name for path in EXTRAS.glob("*/__init__.py"))


def extra_of(module: str) -> str | None:
    """The extra a module belongs to; ``None`` for the core and for what the extras share
    (``src/extras/*.py``: the painter, the worker processes, the loggers' helpers)."""
    parts = module.split(".")
    inside = parts[:2] == ["src", "extras"] and len(parts) > 2 and (EXTRAS / parts[2]).is_dir()
    return parts[2] if inside else None


def is_test(path: Path) -> bool:
    return path.name.startswith("test_") or path.name == "conftest.py"


def core_files() -> list[Path]:
    return [
        path
        for path in SRC.rglob("*.py")
        if not module_of(path).startswith(("src.apps", "src.extras")) and not is_test(path)
    ]


def test_the_core_imports_no_extra_and_names_none() -> None:
    core = core_files()
    assert len(core) > 15
    naming = re.compile(r"src[./]extras\b")
    for path in core:
        found = naming.search(path.read_text())
        assert found is None, f"{path.relative_to(ROOT)} names the extras: the core must not know them"


def test_each_extra_needs_only_the_core() -> None:
    assert len(extras()) >= 8
    for path in EXTRAS.rglob("*.py"):
        own = extra_of(module_of(path))
        if own is None or is_test(path):
            continue
        others = {extra_of(module) for module in imported(path)} - {None, own}
        apps = {module for module in imported(path) if module.startswith("src.apps")}
        assert not others, f"{path.relative_to(ROOT)} uses the extras {sorted(others)}"
        assert not apps, f"{path.relative_to(ROOT)} uses the apps {sorted(apps)}"


def names(value: object, extra: str) -> bool:
    """Whether a config value names a class of ``src/extras/<extra>/`` anywhere inside it."""
    if isinstance(value, dict):
        return any(names(item, extra) for item in value.values())
    if isinstance(value, list):
        return any(names(item, extra) for item in value)
    return isinstance(value, str) and re.match(rf"src\.extras\.{extra}\b", value) is not None


def take_off(config: dict, extra: str, sections: set[str]) -> dict | None:
    """``config`` without the entries of ``extra`` (its sections, its callbacks, its logger: Lightning's own
    stands in), or ``None`` for a config whose model or data is the extra's (it goes with the extra)."""
    if names(config.get("model"), extra) or names(config.get("data"), extra):
        return None
    kept = {key: value for key, value in config.items() if key not in sections}
    trainer = kept.get("trainer")
    if isinstance(trainer, dict):
        callbacks = trainer.get("callbacks")
        if isinstance(callbacks, list):
            trainer["callbacks"] = [c for c in callbacks if not names(c, extra)]
        logger = trainer.get("logger")
        if isinstance(logger, dict) and names(logger.get("class_path"), extra):
            logger["class_path"] = STOCK_LOGGER
            logger["init_args"] = {
                key: value for key, value in (logger.get("init_args") or {}).items() if key != "save_every_s"
            }
    assert not names(kept, extra), f"an entry of {extra} that cannot come off: {kept}"
    return kept


def sections_of(extra: str, configs: Path) -> set[str]:
    defaults = yaml.safe_load((configs / "defaults.yaml").read_text())
    return {key for key, value in defaults.items() if names(value, extra)}


@pytest.mark.parametrize("extra", extras())
def test_every_entry_of_an_extra_in_the_configs_comes_off(extra: str) -> None:
    """Each config names an extra only in entries that come off with it: a section of its own, an item of
    ``trainer.callbacks``, the logger; or it is the extra's own experiment (its model or data)."""
    sections = sections_of(extra, ROOT / "configs")
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        config = yaml.safe_load(path.read_text()) or {}
        take_off(config, extra, sections)  # raises for an entry that cannot come off
    readme = (ROOT / "README.md").read_text()
    assert f"(src/extras/{extra}/README.md)" in readme  # its row in the table of extras


@pytest.mark.slow
@pytest.mark.parametrize("extra", extras())
def test_an_extra_comes_off_by_deleting_its_folder_and_its_entries(extra: str, tmp_path: Path) -> None:
    """In a copy of the repository: the extra's folder, its entries in ``configs/`` and its README row
    deleted, nothing of the core or the configs names it, every remaining shipped config fits (one step
    of each) and the rest of the suite collects."""
    copy = tmp_path / "repository"
    shutil.copytree(ROOT, copy, ignore=not_copied)
    shutil.rmtree(copy / "src" / "extras" / extra)
    rows = [f"(src/extras/{extra}/README.md)"]
    for app in EXTRA_APPS.get(extra, set()):
        shutil.rmtree(copy / "src" / "apps" / app)
        rows.append(f"(src/apps/{app}/README.md)")
    readme = copy / "README.md"
    lines = readme.read_text().splitlines(keepends=True)
    readme.write_text("".join(line for line in lines if not any(row in line for row in rows)))
    sections = sections_of(extra, copy / "configs")
    for path in sorted((copy / "configs").rglob("*.yaml")):
        kept = take_off(yaml.safe_load(path.read_text()) or {}, extra, sections)
        if kept is None:
            path.unlink()
        else:
            path.write_text(yaml.safe_dump(kept, sort_keys=False))

    naming = re.compile(rf"src[./]extras[./]{extra}\b")
    for path in [*(copy / "src").rglob("*.py"), *(copy / "configs").rglob("*.yaml"), copy / "Makefile"]:
        if path.is_relative_to(copy / "src" / "apps") or is_test(path):
            # an app may read an extra's checkpoints, which cannot exist without it; a test that needs
            # another extra skips without it
            continue
        found = naming.search(path.read_text())
        assert found is None, f"{path.relative_to(copy)} still names {found.group(0)!r}"

    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    configs = sorted(str(path) for path in (copy / "configs").glob("*.yaml") if path.name != "defaults.yaml")
    assert configs
    fits = (
        "import sys\nfrom src.cli import main\n"
        "for config in sys.argv[1:]:\n"
        "    main(['fit', '--config', config, '--trainer.fast_dev_run=1',\n"
        "          '--trainer.enable_progress_bar=false'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", fits, *configs], cwd=copy, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    words = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--collect-only"]
    collected = subprocess.run(
        [*words, "tests", "examples", "src"], cwd=copy, env=env, capture_output=True, text=True
    )
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
