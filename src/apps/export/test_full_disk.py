"""The export on a full disk, as every writer of the core (tests/test_full_disk.py): one sentence naming the
files and the space left, the files that were there before unchanged, no temporary file left, exit status
2, and no process abort."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tests.test_full_disk as full_disk
from src.apps import export
from src.extras.tables import conftest as tables
from tests.conftest import ROOT, Trained

# the table runs these tests take further (the table kind's fixtures)
messy_trained = tables.messy_trained

#: a real filesystem of 2 MiB, mounted for the test and unmounted after it
disk = full_disk.disk


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["onnx", "torch-export"])
def test_an_export(disk: Path, messy_trained: Trained, workdir: Path, fmt: str) -> None:
    """In a process of its own: ``torch.export.save`` once aborted the whole process on a full disk."""
    graph = disk / ("model.onnx" if fmt == "onnx" else "model.pt2")
    words = ["--ckpt_path", str(messy_trained.checkpoint), "--format", fmt, "--output", str(graph)]
    export.main(words)  # while there is room
    before = full_disk.contents(disk)
    assert sorted(before) == sorted([graph.name, f"{graph.name}.json"])
    full_disk.fill(disk)
    command = [sys.executable, "-m", "src.apps.export", *words, "--overwrite"]
    done = subprocess.run(
        command, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: cannot write {str(graph)!r} and '{graph}.json': no space left on device "
        + full_disk.SENTENCE_END
    )
    full_disk.assert_nothing_lost(disk, before)
