"""Notebooks are committed without outputs, and the pre-commit hook keeps them so.

`make test-full` executes them (``pytest --nbmake notebooks/``); git keeps only their source.
"""

import itertools
import shlex
import subprocess
from pathlib import Path

import nbformat
import pytest
import yaml
from nbformat.v4 import new_output

from tests.conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def strip_hook() -> list[str]:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    (hook,) = [h for h in hooks if h["id"] == "strip-notebook-outputs"]
    assert hook["types"] == ["jupyter"]
    return shlex.split(hook["entry"])


def test_there_are_notebooks() -> None:
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_without_outputs(path: Path) -> None:
    notebook = nbformat.read(path, as_version=nbformat.NO_CONVERT)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name}: run `pre-commit run --all-files` to strip outputs"
            assert cell.execution_count is None


def test_pre_commit_hook_strips_outputs_and_keeps_the_source(tmp_path: Path) -> None:
    source = nbformat.read(NOTEBOOKS[0], as_version=nbformat.NO_CONVERT)
    executed = nbformat.from_dict(source)
    for count, cell in enumerate(c for c in executed.cells if c.cell_type == "code"):
        cell.execution_count = count + 1
        cell.outputs = [new_output("stream", name="stdout", text="printed\n")]
    path = tmp_path / "executed.ipynb"
    nbformat.write(executed, path)

    first = subprocess.run([*strip_hook(), str(path)], cwd=ROOT, capture_output=True, text=True)
    assert first.returncode == 1, first.stderr  # changed a file: pre-commit stops the commit
    assert f"stripped outputs: {path}" in first.stdout
    stripped = nbformat.read(path, as_version=nbformat.NO_CONVERT)
    assert [c.source for c in stripped.cells] == [c.source for c in source.cells]
    assert all(c.outputs == [] and c.execution_count is None for c in stripped.cells if c.cell_type == "code")

    again = subprocess.run([*strip_hook(), str(path)], cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 0, again.stdout + again.stderr  # a clean notebook passes untouched


def test_make_test_full_executes_the_notebooks() -> None:
    recipes = {}
    lines = (ROOT / "Makefile").read_text().splitlines()
    for target, recipe in itertools.pairwise(lines):
        if target.startswith(("test:", "test-full:")):
            recipes[target.split(":")[0]] = recipe
    assert set(recipes) == {"test", "test-full"}
    assert "--nbmake" in recipes["test-full"]
    assert "notebooks" in recipes["test-full"].split()
    assert "notebooks" not in recipes["test"].split()  # a walk of minutes: make test-full's
