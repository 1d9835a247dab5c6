"""Shared fixtures: run the CLI as a user would, in a scratch folder, with the environment restored."""

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from src.cli import CLI, main
from src.settings import callback_sections
from tests.helpers import SMALL_NET

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"


@pytest.fixture(autouse=True)
def _restore_environ() -> Iterator[None]:
    """Distributed launches leave MASTER_ADDR, LOCAL_RANK, PL_* behind; give each test the original."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A scratch working directory: `logs/` and predictions land here, not in the repository."""
    monkeypatch.chdir(tmp_path)
    # the CLI reads its words from main(args); pytest's own argv must not look like extra arguments
    monkeypatch.setattr(sys, "argv", ["src.cli"])
    return tmp_path


@pytest.fixture
def nothing_written(workdir: Path) -> Iterator[None]:
    """Whatever fails must leave no run folder, checkpoint or half-written file behind."""
    yield
    assert [p.name for p in workdir.rglob("*") if p.suffix not in (".csv", ".parquet")] == []


QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
#: every shipped callback's section switched off (configs/trainer/bare.yaml): for tests of the loop itself,
#: where checkpoints and what plug-ins add play no part and only cost time
BARE = ["--config", str(CONFIGS / "trainer" / "bare.yaml")]
#: the sections of configs/defaults.yaml whose callbacks are the core's own: the checkpoints, early stopping
#: and predict's writer
CORE_SECTIONS = ("best_checkpoint", "last_checkpoint", "early_stopping", "prediction_writer")
#: every other section switched off, whichever are there: for tests of the core's own callbacks, where what a
#: plug-in adds to a run plays no part and only costs time
CORE_ONLY = [f"--{section}=null" for section in callback_sections() if section not in CORE_SECTIONS]
#: one pass over the training rows per epoch, for tests that count steps on tables of fewer than 16 batches
#: (the shipped data.min_batches_per_epoch repeats their rows)
ONE_PASS = ["--data.min_batches_per_epoch=null"]


@pytest.fixture
def cli(workdir: Path) -> Callable[..., CLI]:
    """``cli("fit", "--config", "digits.yaml", ...)``: the real CLI, quiet, in the scratch folder.

    A bare config name is looked up in ``configs/``.
    """

    def run(subcommand: str, *args: str) -> CLI:
        words = [subcommand]
        for arg in args:
            if arg.endswith(".yaml") and not Path(arg).exists() and (CONFIGS / arg).exists():
                arg = str(CONFIGS / arg)
            words.append(arg)
        return main([*words, *QUIET])

    return run


@pytest.fixture
def write_csv(tmp_path: Path) -> Callable[..., Path]:
    """Write a small CSV file from columns and return its path."""

    def write(columns: dict[str, list], name: str = "data.csv") -> Path:
        path = tmp_path / name
        pd.DataFrame(columns).to_csv(path, index=False)
        return path

    return write


def plant_val_loss(run: CLI, script: list[float]) -> None:
    """Make val/loss of epoch ``e`` exactly ``script[e]``; training keeps its real loss and gradients."""
    real = run.model.loss

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if run.model.training:
            return real(output, target)
        return torch.tensor(script[run.trainer.current_epoch])

    run.model.loss = loss


@dataclass(frozen=True)
class Trained:
    """A finished fit: the CLI object, the raw table it was fitted on and its last checkpoint."""

    run: CLI
    frame: pd.DataFrame
    checkpoint: Path

    def raw_rows(self, stage: str) -> pd.DataFrame:
        """The raw rows of one split, as the file held them, without the target."""
        return self.frame.iloc[self.run.datamodule.split_rows[stage]].drop(columns="label")


def fit_in(folder: Path, *words: str) -> CLI:
    """A short fit run from ``folder`` as a user would, logging under ``folder/logs``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setattr(sys, "argv", ["src.cli"])
        return main(
            [
                "fit", *words, f"--trainer.logger.init_args.save_dir={folder / 'logs'}",
                "--trainer.max_epochs=3", "--trainer.limit_val_batches=2", *QUIET,
            ]
        )  # fmt: skip


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """One short fit of the digits, shared by the tests of what comes after training: its raw rows are the
    64 pixel columns and ``label``."""
    folder = tmp_path_factory.mktemp("trained")
    run = fit_in(folder, "--config", str(CONFIGS / "digits.yaml"))
    data = run.datamodule
    frame = pd.DataFrame(data.x, columns=data.columns).assign(label=np.asarray(data.label_names)[data.y])
    return Trained(run, frame, Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt")


@pytest.fixture(scope="session")
def regression_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    """A short fit of the friedman regression; returns its last checkpoint and raw validation rows."""
    folder = tmp_path_factory.mktemp("regression-trained")
    run = fit_in(folder, "--config", str(CONFIGS / "friedman.yaml"), "--data.num_samples=400")
    rows = run.datamodule.predict_frame  # the validation rows' feature columns
    return Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt", rows


@pytest.fixture(scope="session")
def quantiles_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    """A short fit of the friedman table by a task of the user's own with three outputs per row
    (tests/helpers.py's Quantiles: ``preds`` ``(N, 3)``): its last checkpoint and raw validation rows."""
    folder = tmp_path_factory.mktemp("quantiles-trained")
    run = fit_in(
        folder, "--config", str(CONFIGS / "friedman.yaml"), "--data.num_samples=400",
        "--model=tests.helpers.Quantiles",
    )  # fmt: skip
    data = run.datamodule
    rows = pd.DataFrame(data.x[data.split_rows["val"]], columns=data.columns)
    return Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt", rows


@pytest.fixture(scope="session")
def many_labels_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short fit of a multi-label task of the user's own on a DataModule of their own over random
    tensors (tests/helpers.py): its last checkpoint, which carries no table's preprocessing."""
    folder = tmp_path_factory.mktemp("many-labels-trained")
    run = fit_in(
        folder, "--model=tests.helpers.MultiLabelTask", "--data=tests.helpers.ManyTargets", *SMALL_NET
    )
    return Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt"


PLANTED = "planted_trust_probe"
#: a module that leaves a marker file when imported, and offers a class and a function to be named
PLANTED_SOURCE = """
import os, pathlib, torch
pathlib.Path(os.environ["PLANTED_MARKER"]).touch()
class Optimizer(torch.optim.SGD):
    pass
def function(*args, **kwargs):
    pathlib.Path(os.environ["PLANTED_MARKER"]).touch()
"""


@pytest.fixture
def planted(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The planted module on the import path; the marker its import (or its function) would leave."""
    (workdir / f"{PLANTED}.py").write_text(PLANTED_SOURCE)
    monkeypatch.syspath_prepend(str(workdir))
    marker = workdir / "code-ran"
    monkeypatch.setenv("PLANTED_MARKER", str(marker))
    yield marker
    sys.modules.pop(PLANTED, None)
