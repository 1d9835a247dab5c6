"""A short penguins fit and raw penguin rows: what the prediction benchmarks measure on."""

import contextlib
import io
from pathlib import Path

import pandas as pd

from src.cli import main
from src.extras.tables.sources import penguins_path

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "penguins.yaml"
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def train(folder: Path) -> Path:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main(
            [
                "fit",
                "--config",
                str(CONFIG),
                "--trainer.max_epochs=2",
                f"--trainer.logger.init_args.save_dir={folder / 'logs'}",
                *QUIET,
            ]
        )
    return next((folder / "logs").rglob("last.ckpt"))


def raw_rows(n: int, seed: int = 0) -> pd.DataFrame:
    """Raw penguin rows as the file holds them, without the target, drawn with replacement."""
    frame = pd.read_csv(penguins_path()).drop(columns="Sex")
    return frame.sample(n, replace=True, random_state=seed).reset_index(drop=True)
