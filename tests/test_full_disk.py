"""Every writer on a full disk: one sentence naming the file and the space left, the file that was there
before unchanged, no temporary file left, exit status 2 from the commands, and no process abort.

Each test mounts a small real filesystem (tmpfs, 2 MiB), writes the old file while there is room, fills
what is left but :data:`LEFT`, and runs the writer again over the old file; a fit that starts on a full
disk runs as the command, in a process of its own, to see all that the process prints.
"""

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from src.checkpoint_io import AtomicCheckpointIO
from src.cli import main
from src.files import TEMPORARY, NoRoomError, written
from tests.conftest import CONFIGS, CORE_ONLY, QUIET, ROOT, Trained

#: what a full disk still has free when a writer starts: less than any file written here
LEFT = 4096
SENTENCE_END = "(4.0 KiB free there), and nothing was replaced; free some space or write elsewhere."


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A real filesystem of 2 MiB, mounted for the test and unmounted after it."""
    folder = tmp_path / "disk"
    folder.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command here: a full disk needs a small filesystem of its own (tmpfs)")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(
            "mounting a small filesystem (mount -t tmpfs) is not permitted here, which a full disk needs: "
            + (mounted.stderr.strip() or f"exit status {mounted.returncode}")
        )
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def fill(disk: Path, left: int = LEFT) -> None:
    """Leave ``left`` bytes free on ``disk`` (tmpfs counts whole pages, so exactly that)."""
    free = shutil.disk_usage(disk).free
    with (disk / "filler").open("wb") as filler:
        filler.write(b"\0" * (free - left))
    assert shutil.disk_usage(disk).free == left


def contents(disk: Path) -> dict[str, bytes]:
    """Every file on the disk but the filler, by name: the bytes a failed writer must leave as they were."""
    return {
        str(p.relative_to(disk)): p.read_bytes()
        for p in disk.rglob("*")
        if p.is_file() and p.name != "filler"
    }


def refused(
    command: Callable[[list[str]], object], words: list[str], capsys: pytest.CaptureFixture[str]
) -> str:
    """The one line a command ended with, having exited with status 2."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        command(words)
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("error: "), lines
    assert not any("Traceback" in line for line in lines), lines
    return lines[-1].removeprefix("error: ")


def assert_nothing_lost(disk: Path, before: dict[str, bytes]) -> None:
    assert contents(disk) == before  # every old file's bytes, and no new file (no temporary one either)
    assert [p for p in disk.rglob("*") if TEMPORARY.match(p.name)] == []


def test_the_shared_writer_says_the_file_and_the_space_left(disk: Path) -> None:
    target = disk / "notes.txt"
    target.write_text("mine\n")
    fill(disk)
    with pytest.raises(NoRoomError) as refusal, written(target) as (partial,):
        partial.write_text("x" * 4 * LEFT)
    assert str(refusal.value) == f"cannot write {str(target)!r}: no space left on device {SENTENCE_END}"
    assert_nothing_lost(disk, {"notes.txt": b"mine\n"})


def test_a_checkpoint_written_by_torch_save(disk: Path) -> None:
    target = disk / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"w": torch.zeros(10)}, target)
    before = contents(disk)
    fill(disk)
    with pytest.raises(NoRoomError) as refusal:  # torch's own writer error, with the disk's behind it
        AtomicCheckpointIO().save_checkpoint({"w": torch.zeros(10_000)}, target)
    assert str(refusal.value) == f"cannot write {str(target)!r}: no space left on device {SENTENCE_END}"
    assert_nothing_lost(disk, before)


@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty:UserWarning")  # resumed
@pytest.mark.parametrize(
    "plugin",
    ["shipped (in the background)", "src.checkpoint_io.AtomicCheckpointIO"],
    ids=["background", "inline"],
)
def test_a_fit_whose_checkpoint_does_not_fit_ends_in_one_sentence(
    disk: Path, workdir: Path, capsys: pytest.CaptureFixture[str], plugin: str
) -> None:
    words = [
        "fit", "--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=200", *CORE_ONLY,
        "--trainer.logger=false", f"--trainer.default_root_dir={disk}",
        *([] if plugin.startswith("shipped") else [f"--trainer.plugins={plugin}"]), *QUIET,
    ]  # fmt: skip
    main([*words, "--trainer.max_epochs=1"])
    last = disk / "checkpoints" / "last.ckpt"
    before = contents(disk)
    assert "checkpoints/last.ckpt" in before
    fill(disk)
    sentence = refused(main, [*words, "--trainer.max_epochs=3", f"--ckpt_path={last}"], capsys)
    assert sentence.startswith(f"cannot write '{disk / 'checkpoints'}/")
    assert sentence.endswith(f".ckpt': no space left on device {SENTENCE_END}")
    assert_nothing_lost(disk, before)


def test_a_fit_whose_run_folder_has_no_room_ends_in_one_sentence(
    disk: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run folder's own files (config.yaml, TensorBoard's) on a full disk: one sentence, and the runs
    already there as they were."""
    words = [
        "fit", "--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=200", *CORE_ONLY,
        f"--trainer.logger.init_args.save_dir={disk}", "--trainer.max_epochs=1",
        *QUIET,
    ]  # fmt: skip
    main(words)
    before = contents(disk)
    fill(disk)
    sentence = refused(main, words, capsys)
    assert sentence.startswith(
        f"cannot write '{disk}/spiral/version_1/config.yaml': no space left on device ("
    )
    assert sentence.endswith("free there), and nothing was replaced; free some space or write elsewhere.")
    assert contents(disk) == before  # the first run as it was, and nothing of the refused one left


def test_a_fit_whose_tensorboard_writer_has_no_room_ends_in_one_sentence(disk: Path, tmp_path: Path) -> None:
    """The command as a user types it, in a process of its own: TensorBoard writes its event files from a
    thread of its own, whose error the fit then raises again; one sentence says it, with no traceback of
    the thread or of the fit beside it."""
    command = [
        sys.executable, "-m", "src.cli", "fit", "--config", str(CONFIGS / "spiral.yaml"),
        "--data.num_samples=200", *CORE_ONLY,
        f"--trainer.logger.init_args.save_dir={disk}", "--trainer.max_epochs=1", *QUIET,
    ]  # fmt: skip
    # the fewest pages in which the run's files before the event file (config.yaml, and what the logger
    # writes first) and the event file's first page fit, so that the writer thread's next write does not:
    # one page more at a time, since what the logger writes first depends on its class
    for pages in range(2, 6):
        fill(disk, left=pages * 4096)
        done = subprocess.run(
            command, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True
        )
        if list((disk / "spiral" / "version_0").glob("events.out.tfevents.*")):  # the thread's file, begun
            break
        shutil.rmtree(disk / "spiral", ignore_errors=True)
        (disk / "filler").unlink()
    else:
        pytest.fail("no room of 2 to 5 pages let the event file begin")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-3000:]
    assert "Exception in thread" not in done.stderr + done.stdout
    assert done.stderr.strip().splitlines()[-1] == (
        "error: a file of the run could not be written: no space left on its disk; free some space."
    )
    assert sum(line.startswith("error: ") for line in done.stderr.splitlines()) == 1


@pytest.fixture
def rows(trained: Trained, tmp_path: Path) -> Path:
    path = tmp_path / "new.csv"  # every row of the training file: their predictions take some 30 KB
    trained.frame.drop(columns="label").to_csv(path, index=False)
    return path


def test_predictions(
    disk: Path,
    trained: Trained,
    rows: Path,
    workdir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    output = disk / "predictions.csv"
    output.write_text("my old predictions\n")
    fill(disk)
    words = ["predict", "--ckpt_path", str(trained.checkpoint), f"--data.predict_path={rows}"]
    words += [f"--output={output}", "--overwrite=true"]
    sentence = refused(main, [*words, *QUIET], capsys)
    assert sentence == f"cannot write {str(output)!r}: no space left on device {SENTENCE_END}"
    assert_nothing_lost(disk, {"predictions.csv": b"my old predictions\n"})
