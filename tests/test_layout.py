"""Core and apps apart: the core imports no app, and each app needs only the core and the apps it names,
so that an app goes by deleting its module (or folder), its Makefile target, its test file and its
commands in docs/."""

import ast
from pathlib import Path

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
    apps = {app_of(module_of(path)) for path in (SRC / "apps").rglob("*.py")} - {None}
    assert apps == {"cv", "doctor", "export", "generate", "serve", "sweep"}
    for path in (SRC / "apps").rglob("*.py"):
        app = app_of(module_of(path))
        if app is None:
            continue
        others = {app_of(module) for module in imported(path)} - {None, app}
        assert others <= NEEDS.get(app, set()), f"{path.relative_to(ROOT)} uses the apps {sorted(others)}"
