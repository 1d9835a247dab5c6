"""A small text and a tiny character model fitted on it, shared by the text tests here and by the generate
app's, which imports these fixtures (``from src.extras.text.conftest import ...``)."""

import sys
from pathlib import Path

import pytest

from src.cli import CLI, main
from src.extras.text import bundled_text
from tests.conftest import CONFIGS, QUIET

T = 16  # the tests' window length


@pytest.fixture(scope="session")
def small_text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled text's first 12 000 characters: 600 training windows of 16, 75 for val and for test."""
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
