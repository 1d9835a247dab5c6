"""Top-k checkpoints: a leftover of an interrupted update is removed when the run resumes."""

import functools
import os
import shutil
from pathlib import Path

import lightning as L
import pytest
import torch

from src.callbacks import TopKCheckpoint
from src.data import TabularDataModule
from src.models import Classifier
from src.nets import MLP

pytestmark = pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")

FILENAME = "best-epoch{epoch:03d}-step{step}"


def trainer(folder: Path, epochs: int, k: int) -> tuple[L.Trainer, TopKCheckpoint]:
    best = TopKCheckpoint(
        dirpath=folder, monitor="val/loss", save_top_k=k, filename=FILENAME, auto_insert_metric_name=False
    )
    last = L.pytorch.callbacks.ModelCheckpoint(dirpath=folder, filename="last", enable_version_counter=False)
    run = L.Trainer(
        max_epochs=epochs,
        limit_train_batches=3,
        logger=False,
        callbacks=[best, last],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    return run, best


def fit(folder: Path, epochs: int, k: int, ckpt_path: Path | None = None) -> TopKCheckpoint:
    torch.manual_seed(0)
    data = TabularDataModule(source="spiral", num_samples=300, batch_size=50)
    net = functools.partial(MLP, hidden_sizes=[8])
    model = Classifier(in_features=data.in_features, out_features=data.out_features, net=net)
    run, best = trainer(folder, epochs, k)
    run.fit(model, datamodule=data, ckpt_path=ckpt_path)
    return best


def best_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("best-*.ckpt"))


@pytest.mark.parametrize("k", [1, 2])
def test_a_leftover_of_an_interrupted_update_is_removed_on_resume(tmp_path: Path, k: int) -> None:
    folder = tmp_path / "checkpoints"
    fit(folder, epochs=3, k=k)
    assert len(best_files(folder)) == k
    last = folder / "last.ckpt"
    # (a name the resumed run cannot write itself)
    # what a kill between writing a new best and deleting the one it displaces leaves: one file more,
    # written after last.ckpt (the best callback saves before the last one in an epoch)
    leftover = folder / "best-epoch003-step13.ckpt"
    shutil.copy(folder / best_files(folder)[0], leftover)
    # a file an earlier run left in the folder, older than last.ckpt: not this run's to remove
    foreign = folder / "best-epoch099-step999.ckpt"
    shutil.copy(last, foreign)
    os.utime(foreign, (last.stat().st_mtime - 60, last.stat().st_mtime - 60))
    os.utime(leftover, (last.stat().st_mtime + 1, last.stat().st_mtime + 1))

    best = fit(folder, epochs=4, k=k, ckpt_path=last)
    assert not leftover.exists()
    assert foreign.exists()
    ours = [name for name in best_files(folder) if name != foreign.name]
    assert sorted(ours) == sorted(Path(p).name for p in best.best_k_models)
    assert len(ours) == k


def test_a_fresh_run_removes_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    stranger = folder / "best-epoch007-step70.ckpt"
    stranger.write_bytes(b"not ours")
    fit(folder, epochs=2, k=1)
    assert stranger.exists()
