"""Checkpoints written in the background (the shipped Trainer's plugin): a save returns before its write,
the next one and a removal wait for it, a failed write is said in one sentence, and a fit returns with its
last write on disk."""

import errno
import re
import threading
import time
from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning_utilities import apply_to_collection

from src.checkpoint_io import AtomicCheckpointIO
from src.checkpoints import load_checkpoint
from src.cli import main
from src.extras.resume.background import BackgroundCheckpointIO, snapshot
from src.files import TEMPORARY, NoRoomError
from tests.conftest import CONFIGS, CORE_ONLY, QUIET
from tests.test_checkpoint_io import checkpoint


def test_the_shipped_trainer_saves_through_it_in_the_background_and_one_switch_keeps_it_inline(
    workdir: Path,
) -> None:
    run = main(["--config", str(CONFIGS / "spiral.yaml"), *QUIET], run=False)
    plugin = run.trainer.strategy.checkpoint_io
    assert isinstance(plugin, BackgroundCheckpointIO)
    assert isinstance(plugin.writer, AtomicCheckpointIO)
    off = ["--trainer.plugins=src.checkpoint_io.AtomicCheckpointIO"]  # the switch configs/defaults.yaml names
    inline = main(["--config", str(CONFIGS / "spiral.yaml"), *off, *QUIET], run=False)
    assert type(inline.trainer.strategy.checkpoint_io) is AtomicCheckpointIO


class Held(AtomicCheckpointIO):
    """The atomic writer, each of whose writes waits until ``go`` is set: a write under way for as long as
    a test needs. Records what was on disk when each removal came."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.on_disk_at_removal: list[list[str]] = []

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        assert self.go.wait(timeout=120)  # bounds a hang only
        super().save_checkpoint(*args, **kwargs)

    def remove_checkpoint(self, path: Any) -> None:
        self.on_disk_at_removal.append(sorted(p.name for p in Path(path).parent.iterdir()))
        super().remove_checkpoint(path)


def go_soon(held: Held) -> None:
    """Let the held write go from another thread, while this one is (or should be) waiting for it."""
    threading.Timer(0.2, held.go.set).start()


def test_a_save_returns_before_its_write_and_the_next_save_waits_for_it(tmp_path: Path) -> None:
    held = Held()
    plugin = BackgroundCheckpointIO(held)
    first, second = tmp_path / "first.ckpt", tmp_path / "second.ckpt"
    state = checkpoint(1.0)
    plugin.save_checkpoint(state, first)
    assert not first.exists()  # returned while its write is held
    state["state_dict"]["w"].fill_(7.0)  # training goes on: the checkpoint is the state when it was saved
    go_soon(held)
    plugin.save_checkpoint(checkpoint(2.0), second)
    assert load_checkpoint(first)["state_dict"]["w"].unique().tolist() == [1.0]  # on disk before it returned
    plugin.teardown()  # the end of a Trainer run
    assert load_checkpoint(second)["epoch"] == 2
    assert [p.name for p in tmp_path.iterdir() if TEMPORARY.match(p.name)] == []


class Pair(NamedTuple):
    name: str
    value: torch.Tensor


@dataclass
class Boxed:
    tensor: torch.Tensor
    count: int


def same(a: Any, b: Any) -> bool:
    """Equal types all the way down, and equal values; tensors of the same dtype, shape and elements."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return bool((a == b).all())
    if isinstance(a, Boxed):
        return same(a.tensor, b.tensor) and a.count == b.count
    return bool(a == b)


def test_the_copy_for_the_writer_is_lightnings_copy_made_in_one_lean_pass() -> None:
    # what checkpoints hold: tensors in OrderedDicts, dicts, lists and tuples, numbers, strings, None,
    # and now and then another container (a namedtuple, a dataclass, a defaultdict, an array)
    weights = OrderedDict(w=torch.ones(3), b=torch.zeros(2, dtype=torch.float64))
    state = {
        "epoch": 3,
        "state_dict": weights,
        "optimizer_states": [
            {"state": {0: {"step": torch.tensor(4.0)}}, "param_groups": [{"lr": 0.1, "params": [0]}]}
        ],
        "rng": (7, [1, 2, 3], None),
        "callbacks": {"Pair": Pair("best", torch.tensor(0.5)), "Held": Boxed(torch.arange(3), 2)},
        "counts": defaultdict(int, a=1),
        "array": np.arange(4),
        "flags": [True, "text", 1.5, torch.tensor([1], dtype=torch.int64)],
    }
    lightnings = apply_to_collection(state, torch.Tensor, lambda t: t.detach().clone())
    lean = snapshot(state)
    assert same(lean, lightnings)
    # a copy: the training changes the original in place, the writer's copy stays as it was
    weights["w"].add_(1.0)
    state["optimizer_states"][0]["param_groups"][0]["lr"] = 0.2
    state["flags"].append("more")
    state["callbacks"]["Held"].tensor.zero_()
    assert same(lean, lightnings)
    assert lean["state_dict"]["w"].tolist() == [1.0, 1.0, 1.0]


def test_a_displaced_checkpoint_is_removed_only_once_the_one_displacing_it_is_on_disk(tmp_path: Path) -> None:
    """ModelCheckpoint asks for the new best file, then removes the old one at once: a kill in between
    must leave the old one, not neither."""
    held = Held()
    held.go.set()
    plugin = BackgroundCheckpointIO(held)
    old, new = tmp_path / "best-epoch1.ckpt", tmp_path / "best-epoch2.ckpt"
    plugin.save_checkpoint(checkpoint(1.0), old)
    plugin.wait()
    held.go.clear()
    plugin.save_checkpoint(checkpoint(2.0), new)
    go_soon(held)
    plugin.remove_checkpoint(old)
    assert held.on_disk_at_removal == [["best-epoch1.ckpt", "best-epoch2.ckpt"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best-epoch2.ckpt"]


def test_a_write_that_failed_in_the_background_ends_the_next_save_and_the_run_in_one_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin, target = BackgroundCheckpointIO(), tmp_path / "last.ckpt"
    plugin.save_checkpoint(checkpoint(1.0), target)
    plugin.wait()
    before = target.read_bytes()
    real_save = torch.save

    def full_disk(obj: object, file: Any) -> None:  # as torch's writer fails on a full disk
        real_save(obj, file)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos") from OSError(
            errno.ENOSPC, "No space left on device"
        )

    monkeypatch.setattr(torch, "save", full_disk)
    plugin.save_checkpoint(checkpoint(2.0), target)  # returns: its write fails on the writer's thread
    sentence = f"cannot write {str(target)!r}: no space left on device ("
    with pytest.raises(NoRoomError, match=re.escape(sentence)):
        plugin.save_checkpoint(checkpoint(3.0), target)  # said before anything more is written
    with pytest.raises(NoRoomError, match=re.escape(sentence)):
        plugin.teardown()  # and at the run's end, were there no next save
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


class SlowWrites(Callback):
    """Holds each checkpoint write on the writer's thread a moment: a run that does not wait for its last
    write would end with it still under way."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        plugin = trainer.strategy.checkpoint_io
        assert isinstance(plugin, BackgroundCheckpointIO)
        inner = plugin.writer
        real_save = inner.save_checkpoint

        def slow(*args: Any, **kwargs: Any) -> None:
            time.sleep(0.3)
            real_save(*args, **kwargs)

        inner.save_checkpoint = slow  # type: ignore[method-assign]


FIT = [
    "--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=200", *CORE_ONLY,
    "--trainer.callbacks+=src.extras.resume.test_background.SlowWrites", *QUIET,
]  # fmt: skip


@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty:UserWarning")  # resumed
def test_fit_returns_with_its_last_checkpoint_whole_and_last_reads_it(workdir: Path) -> None:
    run = main(["fit", *FIT, "--trainer.max_epochs=3", "--trainer.logger.init_args.version=r"])
    last = Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt"
    assert (
        load_checkpoint(last)["epoch"] == 3
    )  # written at the fit's end, its 3 epochs done; whole when fit returned
    assert [p for p in last.parent.iterdir() if TEMPORARY.match(p.name)] == []
    resumed = main(["fit", *FIT, "--trainer.max_epochs=4", "--trainer.logger.init_args.version=r",
                    "--ckpt_path=last"])  # fmt: skip
    assert resumed.trainer.current_epoch == 4
    assert load_checkpoint(last)["epoch"] == 4


class FailAt(Callback):
    """Raises an error as the training step after optimizer step ``step`` starts: between two steps."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError("a bug between two steps")


def test_the_checkpoint_of_an_error_between_steps_is_whole_when_the_fit_ends(workdir: Path) -> None:
    """last.ckpt, written on the way out of a fit that stops on an error, is on disk whole when the error
    reaches the caller, its write held back by SlowWrites."""
    stop = ["--trainer.callbacks+=src.extras.resume.test_background.FailAt", "--trainer.callbacks.step=3"]
    with pytest.raises(RuntimeError, match="between two steps"):
        main(["fit", *FIT, "--trainer.max_epochs=3", *stop])
    (last,) = workdir.rglob("last.ckpt")
    assert load_checkpoint(last)["global_step"] == 3  # the state the fit stopped at
    assert [p for p in last.parent.iterdir() if TEMPORARY.match(p.name)] == []
