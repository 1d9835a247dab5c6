"""Nothing lost, nothing run, as at the core's entry points (tests/test_trust.py): export opens a checkpoint
that names code or is no checkpoint with the core's sentences, and writes its graph and sidecar only where
an output may land."""

import json
from pathlib import Path

import pytest

import tests.test_trust as trust
from src.apps import export
from src.extras.tables import conftest as tables
from tests.conftest import Trained

# the table runs these tests take further (the table kind's fixtures)
messy_trained = tables.messy_trained


def exporting(path: str) -> None:
    export.main(["--ckpt_path", path])


@pytest.mark.slow
@pytest.mark.parametrize("where", trust.PLACES)
def test_a_checkpoint_names_no_code_at_any_depth_at_any_entry_point(
    messy_trained: Trained, planted: Path, workdir: Path, capsys, where: str
) -> None:
    trust.assert_names_no_code(exporting, messy_trained, planted, workdir, capsys, where)


@pytest.mark.slow
@pytest.mark.parametrize("kind", trust.KINDS)
def test_a_file_that_is_no_checkpoint_gets_the_same_sentence_at_every_entry_point(
    workdir: Path, capsys, kind: str
) -> None:
    trust.assert_refused_as_the_core_refuses(exporting, workdir, capsys, kind)


@pytest.mark.slow
@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("target", ["the checkpoint", "a link to it"])
def test_no_output_lands_on_an_input_even_when_overwriting(
    messy_trained: Trained, workdir: Path, capsys, target: str, overwrite: bool
) -> None:
    checkpoint = workdir / "model.ckpt"
    checkpoint.write_bytes(messy_trained.checkpoint.read_bytes())
    (workdir / "link.ckpt").symlink_to(checkpoint)
    output = checkpoint if target == "the checkpoint" else workdir / "link.ckpt"
    before = trust.fingerprint(checkpoint)
    exported = ["--ckpt_path", str(checkpoint), "--output", str(output), *(["--overwrite"] * overwrite)]
    assert "an input of this run; name another file." in trust.refusal(export.main, exported, capsys)
    assert trust.fingerprint(checkpoint) == before


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["a pipe", "/dev/full"])
def test_only_regular_files_are_written(messy_trained: Trained, workdir: Path, capsys, kind: str) -> None:
    output = trust.special_file(workdir, kind)
    device = output.stat()
    words = ["--ckpt_path", str(messy_trained.checkpoint), "--output", str(output), "--overwrite"]
    assert trust.refusal(export.main, words, capsys) == (
        f"--output={str(output)!r} is not a regular file (a device, pipe or socket); name a file."
    )
    assert (output.stat().st_ino, output.stat().st_mode) == (device.st_ino, device.st_mode)


@pytest.mark.slow
def test_an_existing_file_is_replaced_only_when_asked(messy_trained: Trained, workdir: Path, capsys) -> None:
    notes, sidecar = workdir / "notes.txt", workdir / "model.json"
    notes.write_text("my notes\n")
    sidecar.write_text('{"mine": true}\n')
    ckpt = ["--ckpt_path", str(messy_trained.checkpoint)]
    assert trust.refusal(export.main, [*ckpt, "--output", str(notes)], capsys) == (
        f"--output={str(notes)!r} exists; pass --overwrite true to replace it, or name another file."
    )
    # a sidecar name the user never typed is still never taken without asking
    assert trust.refusal(export.main, [*ckpt, "--output", str(workdir / "model")], capsys) == (
        f"the sidecar of --output={str(sidecar)!r} exists; pass --overwrite true to replace it, or name "
        "another file."
    )
    assert notes.read_text() == "my notes\n"
    assert sidecar.read_text() == '{"mine": true}\n'
    assert sorted(p.name for p in workdir.iterdir()) == ["model.json", "notes.txt"]

    export.main([*ckpt, "--output", str(workdir / "model"), "--overwrite"])
    assert json.loads(sidecar.read_text())["format_version"] == export.SIDECAR_VERSION


@pytest.mark.slow
def test_a_killed_writers_leftovers_are_removed_by_the_next_write(
    messy_trained: Trained, workdir: Path
) -> None:
    alive = trust.plant_leftovers(workdir)
    export.main(["--ckpt_path", str(messy_trained.checkpoint), "--output", str(workdir / "model.onnx")])
    assert sorted(p.name for p in workdir.iterdir()) == sorted([alive.name, "model.onnx", "model.onnx.json"])
