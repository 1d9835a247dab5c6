"""last.ckpt, the state a resume goes on from: at most every ``every_seconds``, and always at the fit's end
and on an exception between two steps, never of a step half taken."""

import os
import signal
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from src.callbacks import LatestCheckpoint
from src.checkpoint_io import AtomicCheckpointIO

STEPS_PER_EPOCH = 4


class Recording(AtomicCheckpointIO):
    """The checkpoint writer, keeping the global step of every checkpoint it wrote, by file name."""

    def __init__(self) -> None:
        super().__init__()
        self.saves: list[tuple[str, int]] = []

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        super().save_checkpoint(checkpoint, path, storage_options)
        self.saves.append((Path(path).name, checkpoint["global_step"]))


class Tiny(L.LightningModule):
    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3, 1)
        self.fail_at = fail_at

    @override
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.global_step == self.fail_at:
            raise RuntimeError("a bug inside the step")
        x, y = batch
        return F.mse_loss(self.net(x), y)

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    @override
    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(4 * STEPS_PER_EPOCH, 3, generator=generator)
        return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)


class FailAtEpochEnd(Callback):
    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == 1:
            raise RuntimeError("a bug between two steps")


def fit(
    folder: Path,
    latest: LatestCheckpoint,
    module: Tiny,
    *callbacks: Callback,
    writer: Recording | None = None,
) -> Recording:
    writer = writer or Recording()
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=3, logger=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[latest, *callbacks], plugins=[writer], default_root_dir=folder,
    )  # fmt: skip
    trainer.fit(module)
    return writer


def test_a_short_fit_writes_its_latest_state_once_at_its_end(tmp_path: Path) -> None:
    writer = fit(tmp_path, LatestCheckpoint(dirpath=str(tmp_path), every_seconds=3600), Tiny())
    assert writer.saves == [("last.ckpt", 3 * STEPS_PER_EPOCH)]
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 3 * STEPS_PER_EPOCH


def test_every_seconds_zero_writes_at_every_step_but_an_epochs_last(tmp_path: Path) -> None:
    """An epoch's last step is followed by its validation: the save waits for the next step."""
    writer = fit(tmp_path, LatestCheckpoint(dirpath=str(tmp_path), every_seconds=0), Tiny())
    steps = [step for name, step in writer.saves if name == "last.ckpt"]
    last_steps = range(STEPS_PER_EPOCH, 3 * STEPS_PER_EPOCH + 1, STEPS_PER_EPOCH)
    assert steps == [step for step in range(1, 3 * STEPS_PER_EPOCH + 1) if step not in last_steps] + [
        3 * STEPS_PER_EPOCH  # and at the end
    ]


def test_an_exception_between_steps_writes_the_state_it_stopped_at(tmp_path: Path) -> None:
    latest = LatestCheckpoint(dirpath=str(tmp_path), every_seconds=3600)
    with pytest.raises(RuntimeError, match="between two steps"):
        fit(tmp_path, latest, Tiny(), FailAtEpochEnd())
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 2 * STEPS_PER_EPOCH  # the end of epoch 1, both epochs' steps taken


class PeerLostAtEpochEnd(Callback):
    """What gloo raises on a survivor when another process of a distributed run is killed."""

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == 1:
            pair = "[../third_party/gloo/gloo/transport/tcp/pair.cc:537]"
            raise RuntimeError(f"{pair} Read error [127.0.0.1]:29500: Connection reset by peer")


def test_a_process_that_lost_the_others_writes_nothing_after_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Between two steps as above, but the distributed run is broken: the last save stays the one to go
    on from (here none), as its error says."""
    latest, writer = LatestCheckpoint(dirpath=str(tmp_path), every_seconds=3600), Recording()
    with pytest.raises(RuntimeError, match="Connection reset by peer"):
        fit(tmp_path, latest, Tiny(), PeerLostAtEpochEnd(), writer=writer)
    assert writer.saves == []
    assert not (tmp_path / "last.ckpt").exists()
    assert "last.ckpt" not in caplog.text


class CtrlCAtEpochEnd(Callback):
    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == 1:
            os.kill(os.getpid(), signal.SIGINT)  # Python's own handler raises KeyboardInterrupt here


def test_a_ctrl_c_between_steps_writes_the_state_it_stopped_at(tmp_path: Path) -> None:
    """Lightning's own handling of Ctrl-C, as a fit gets it where no callback takes SIGINT: a
    KeyboardInterrupt that ends the fit with exit status 1, after this save."""
    latest = LatestCheckpoint(dirpath=str(tmp_path), every_seconds=3600)
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SystemExit) as stopped:
            fit(tmp_path, latest, Tiny(), CtrlCAtEpochEnd())
    finally:
        signal.signal(signal.SIGINT, handler)  # Lightning ignores every later Ctrl-C of the process
    assert stopped.value.code == 1
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 2 * STEPS_PER_EPOCH


def test_an_exception_inside_a_step_writes_nothing_of_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    every_step, writer = LatestCheckpoint(dirpath=str(tmp_path), every_seconds=0), Recording()
    with pytest.raises(RuntimeError, match="inside the step"):
        fit(tmp_path, every_step, Tiny(fail_at=6), writer=writer)
    # the file is the last whole step's: nothing written of the failed one, whose batch was drawn already
    assert writer.saves == [("last.ckpt", step) for step in (1, 2, 3, 5, 6)]  # (4: an epoch's last)
    assert "Stopped inside training step 6" in caplog.text
