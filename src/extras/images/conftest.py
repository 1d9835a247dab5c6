"""A small image run, shared by the tests of predicting images here and by the apps' tests of exporting and
serving an image model, which import these fixtures (``from src.extras.images.conftest import ...``)."""

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from src.cli import main
from tests.conftest import BARE, CONFIGS, QUIET

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
