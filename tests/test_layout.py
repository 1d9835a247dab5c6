"""Core and apps apart: the core imports no app, each app needs only the core and the apps it names, and
an app comes off by deleting its folder (its code, tests, page, make targets and benchmark) and its row
in the README's table of apps."""

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
