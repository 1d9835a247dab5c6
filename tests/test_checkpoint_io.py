"""A checkpoint is whole or absent: a save cut short leaves the previous file and no debris behind, and a
run killed during its saves resumes from one that reads."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from src.checkpoint_io import AtomicCheckpointIO
from src.checkpoints import load_checkpoint
from src.files import TEMPORARY, remove_leftovers
from tests.conftest import BARE, CONFIGS, QUIET, ROOT


def checkpoint(value: float) -> dict:
    return {"state_dict": {"w": torch.full((1000,), value)}, "epoch": int(value)}


def test_a_save_cut_short_leaves_the_previous_checkpoint_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    io, target = AtomicCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint(checkpoint(1.0), target)
    real_save = torch.save

    def dies_halfway(obj: object, file: object) -> None:
        real_save(obj, file)
        file.truncate(100)  # what a kill in the middle of writing leaves
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint(checkpoint(2.0), target)
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    assert load_checkpoint(target)["epoch"] == 1


def test_the_temporary_file_is_beside_its_destination_whatever_tmpdir_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "ram-disk"
    elsewhere.mkdir()
    monkeypatch.setenv("TMPDIR", str(elsewhere))
    renames: list[tuple[Path, Path]] = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (renames.append((Path(a), Path(b))), real_replace(a, b)))
    target = tmp_path / "checkpoints" / "best.ckpt"
    AtomicCheckpointIO().save_checkpoint(checkpoint(3.0), target)
    assert renames == [(target.with_name(f".best.partial-{os.getpid()}.ckpt"), target)]
    assert list(elsewhere.iterdir()) == []
    assert load_checkpoint(target)["epoch"] == 3


def test_debris_of_a_killed_save_is_removed_and_a_live_save_is_left_alone(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    debris = tmp_path / f".last.partial-{int(dead.stdout)}.ckpt"
    busy = tmp_path / ".best.partial-1.ckpt"  # pid 1 is alive: a save under way in another process
    debris.write_bytes(b"half a checkpoint")
    busy.write_bytes(b"being written")
    assert remove_leftovers(tmp_path) == [debris]
    assert busy.exists()


# -- in the background ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_killed_during_saves_twenty_times_every_checkpoint_reads_and_the_run_resumes(tmp_path: Path) -> None:
    """kill -9 at random moments of a run that saves every step, with $TMPDIR on another filesystem."""
    shm = Path("/dev/shm")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(shm if shm.is_dir() else tmp_path)}
    words = [
        sys.executable, "-m", "src.cli", "fit", "--config", str(CONFIGS / "spiral.yaml"),
        "--data.num_samples=20000", "--model.init_args.net.init_args.hidden_sizes=[512, 512]",
        "--trainer.max_epochs=1000",
        "--trainer.logger.init_args.version=killed", *BARE,
        "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
        "--trainer.callbacks.filename=last", "--trainer.callbacks.every_n_train_steps=1",
        "--trainer.callbacks.enable_version_counter=false", *QUIET,
    ]  # fmt: skip
    folder = tmp_path / "logs" / "spiral" / "killed" / "checkpoints"
    rng = random.Random(0)
    resumed_steps = []
    for kill in range(20):
        last = folder / "last.ckpt"
        before = last.stat().st_mtime_ns if last.exists() else None
        resume = ["--ckpt_path", str(last)] if before is not None else []
        process = subprocess.Popen([*words, *resume], cwd=tmp_path, env=env, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        # wait for this process's own first save, then kill it a moment later, in the middle of saving
        while (not last.exists() or last.stat().st_mtime_ns == before) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.2, 2.0))
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        files = list(folder.iterdir())
        leftovers = [(p, TEMPORARY.match(p.name)) for p in files]
        # the killed save's own temporary file may be left, whole (a step ahead of last.ckpt, killed
        # before its rename) or cut short: it is not a checkpoint, and the next save removes it
        assert [p for p, match in leftovers if match and match.group(1) != str(process.pid)] == [], kill
        for path, match in leftovers:
            if path.suffix == ".ckpt" and not match:
                resumed_steps.append(load_checkpoint(path)["global_step"])  # every checkpoint reads, whole
        assert len(resumed_steps) == kill + 1, kill  # last.ckpt, never lost
    assert resumed_steps == sorted(resumed_steps)  # each start went on from where the last one stopped
    assert resumed_steps[-1] > resumed_steps[0]
