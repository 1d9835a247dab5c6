"""Top-k checkpoints across a resume: the resumed process keeps its own best ``k`` and deletes no file an
earlier process wrote (the rule lives in the checkpoint IO, so it holds for every callback)."""

import functools
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from src.checkpoint_io import AtomicCheckpointIO
from src.data import ArrayDataModule
from src.models import Classifier
from src.nets import MLP

pytestmark = pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")


def fit(folder: Path, epochs: int, k: int, ckpt_path: Path | None = None) -> ModelCheckpoint:
    """A short fit whose every epoch is a new best (the monitor is the step, highest best), in a new
    checkpoint IO: as a new process would."""
    torch.manual_seed(0)
    data = ArrayDataModule(source="spiral", num_samples=300, batch_size=50, min_batches_per_epoch=None)
    model = Classifier(
        in_features=data.in_features,
        out_features=data.out_features,
        net=functools.partial(MLP, hidden_sizes=[8]),
    )
    best = ModelCheckpoint(dirpath=folder, monitor="step", mode="max", save_top_k=k, filename="best-{step}")
    last = ModelCheckpoint(dirpath=folder, filename="last", enable_version_counter=False)
    trainer = L.Trainer(
        max_epochs=epochs,
        limit_train_batches=3,
        limit_val_batches=1,
        logger=False,
        callbacks=[best, last],
        plugins=[AtomicCheckpointIO()],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    return best


def best_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("best-*.ckpt"))}


@pytest.mark.parametrize("k", [1, 2])
def test_a_resumed_fit_deletes_no_checkpoint_of_the_earlier_process(tmp_path: Path, k: int) -> None:
    folder = tmp_path / "checkpoints"
    fit(folder, epochs=3, k=k)
    earlier = best_files(folder)
    assert len(earlier) == k
    best = fit(folder, epochs=6, k=k, ckpt_path=folder / "last.ckpt")
    now = best_files(folder)
    # every file of the earlier process is still there, byte for byte
    assert {name: now[name] for name in earlier} == earlier
    # of its own, the resumed process kept its best k, as ModelCheckpoint tracks them
    own = sorted(name for name in now if name not in earlier)
    assert own == sorted(Path(p).name for p in best.best_k_models if Path(p).name not in earlier)
    assert len(own) == k


def test_a_fresh_run_removes_nothing_it_did_not_write(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    stranger = folder / "best-step=999.ckpt"
    stranger.write_bytes(b"not ours")
    fit(folder, epochs=2, k=1)
    assert stranger.read_bytes() == b"not ours"
