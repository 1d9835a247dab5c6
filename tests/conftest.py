"""Shared fixtures: run the CLI as a user would, in a scratch folder, with the environment restored."""

import importlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from src.cli import CLI, main

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"


def app(name: str) -> ModuleType | None:
    """The app ``src/apps/<name>/`` where it is still there, else None: a rule held on every prediction
    path holds on those that remain when an app is deleted."""
    found = importlib.util.find_spec(f"src.apps.{name}") is not None
    return importlib.import_module(f"src.apps.{name}") if found else None


def extra(name: str) -> bool:
    """Whether the extra ``src/extras/<name>/`` is still there: a core test checks what an extra adds to a
    run only while the extra is part of the project."""
    return importlib.util.find_spec(f"src.extras.{name}") is not None


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


QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
#: every shipped callback's section switched off (configs/trainer/bare.yaml): for tests of the loop itself,
#: where checkpoints, figures and dashboards play no part and only cost time
BARE = ["--config", str(CONFIGS / "trainer" / "bare.yaml")]
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
def messy_trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """One short fit on a messy CSV (text, yes/no words, booleans, empty cells, "?", named classes),
    shared by the tests of what comes after training: export and serving. No net named: the default one
    (src.nets.DEFAULT_NET) is what they export and serve."""
    from src.extras.tables.test_preprocessing import messy_frame

    folder = tmp_path_factory.mktemp("messy-trained")
    frame = messy_frame(n=300)
    frame.to_csv(folder / "train.csv", index=False)
    run = fit_in(
        folder, "--config", str(CONFIGS / "digits.yaml"), "--data=src.extras.tables.TabularDataModule",
        "--data.source=csv", "--data.path=train.csv",
        "--data.target_column=label", "--data.task=classification", "--data.encoding.max_categories=4",
        "--data.encoding.missing_indicator=true", "--model.init_args.net=null",
    )  # fmt: skip
    return Trained(run, frame, Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt")


@pytest.fixture(scope="session")
def regression_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    """A short fit of the friedman regression; returns its last checkpoint and raw validation rows."""
    folder = tmp_path_factory.mktemp("regression-trained")
    run = fit_in(folder, "--config", str(CONFIGS / "friedman.yaml"), "--data.num_samples=400")
    rows = run.datamodule.predict_frame  # the validation rows' feature columns
    return Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt", rows


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


# -- a small image run, shared by the tests of predicting, exporting and serving images ---------------

CLASSES = ["cat", "dog", "owl"]
PROBABILITIES = [f"probability({name})" for name in CLASSES]


def write_images(folder: Path, classes: list[str], per_class: int, seed: int, size: int = 8) -> list[Path]:
    """Random grayscale PNG files in class folders; class k has bright rows k, k + K, ... (learnable)."""
    rng = np.random.default_rng(seed)
    for k, name in enumerate(classes):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 120, size=(size, size), dtype=np.uint8)
            pixels[k :: len(classes)] += 100
            Image.fromarray(pixels).save(folder / name / f"{i:03d}.png")
    return sorted(folder.rglob("*.png"))


def in_folder(folder: Path, words: list[str]) -> object:
    """``python -m src.cli <words>`` run from ``folder``, as a user would."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setattr(sys, "argv", ["src.cli"])
        return main([*words, *QUIET])


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("image-run")


@pytest.fixture(scope="session")
def image_checkpoint(image_folder: Path) -> Path:
    """Two epochs of configs/images.yaml's CNN (widths 4, 8) on 90 tiny 8x8 PNG files: its last checkpoint."""
    write_images(image_folder / "train", CLASSES, per_class=30, seed=0)
    in_folder(image_folder, [
        "fit", "--config", str(CONFIGS / "images.yaml"), *BARE, "--trainer.callbacks=[]",
        f"--data.init_args.folder={image_folder / 'train'}", "--data.init_args.batch_size=16",
        "--model.init_args.net.init_args.widths=[4, 8]", "--trainer.max_epochs=2",
        "--last_checkpoint=src.callbacks.LatestCheckpoint",
    ])  # fmt: skip
    (found,) = image_folder.rglob("last.ckpt")
    return found


@pytest.fixture(scope="session")
def new_images(image_folder: Path) -> list[Path]:
    """PNG files the run never saw, of all three classes."""
    return write_images(image_folder / "new", CLASSES, per_class=4, seed=9)


@pytest.fixture(scope="session")
def predicted_images(image_folder: Path, image_checkpoint: Path, new_images: list[Path]) -> pd.DataFrame:
    """``python -m src.cli predict`` on the new images: its CSV file."""
    out = image_folder / "predictions.csv"
    in_folder(image_folder, [
        "predict", "--ckpt_path", str(image_checkpoint), "--data.predict_path", str(image_folder / "new"),
        "--output", str(out),
    ])  # fmt: skip
    return pd.read_csv(out)


# -- a small text and a tiny character model fitted on it: the text tests and the generate app's -------

T = 16  # the tests' window length


@pytest.fixture(scope="session")
def small_text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled text's first 12 000 characters: 600 training windows of 16, 75 for val and for test."""
    from src.extras.text import bundled_text  # here: the suite collects without the text extra

    path = tmp_path_factory.mktemp("text") / "small.txt"
    path.write_text(bundled_text()[:12_000], encoding="utf-8")
    return path


def tiny(text: Path, *extra: str) -> list[str]:
    """configs/charlm.yaml on the small text with a tiny net: a few steps take well under a second."""
    return [
        "--config", str(CONFIGS / "charlm.yaml"), f"--data.init_args.path={text}",
        f"--data.init_args.block_size={T}", "--data.init_args.stride=null", "--data.init_args.batch_size=32",
        f"--model.init_args.net.init_args.block_size={T}", "--model.init_args.net.init_args.d_model=16",
        "--model.init_args.net.init_args.n_heads=2", "--model.init_args.net.init_args.n_layers=1",
        "--model.init_args.scheduler=null", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="session")
def trained_charlm(small_text: Path, tmp_path_factory: pytest.TempPathFactory) -> CLI:
    """A tiny fit through the CLI with the shipped callbacks: 2 epochs, a sample of 20 characters
    whenever TextSamples writes one (every 5th epoch: epoch 0, and the last)."""
    folder = tmp_path_factory.mktemp("charlm")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setattr(sys, "argv", ["src.cli"])  # pytest's own words must not look like the CLI's
        return main(
            [
                "fit", *tiny(small_text), "--trainer.max_epochs=2", "--trainer.limit_train_batches=10",
                "--trainer.callbacks.init_args.max_new_tokens=20",
                "--trainer.callbacks.init_args.every_n_epochs=5",
                f"--trainer.logger.init_args.save_dir={folder / 'logs'}", *QUIET,
            ]
        )  # fmt: skip


def last_checkpoint(run: CLI) -> Path:
    return Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt"
