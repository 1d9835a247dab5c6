"""On a GPU: the fit in mixed precision, batches pinned and sent without blocking, and predictions that
equal the CPU's. Skipped where no CUDA device is present; ``make gpu-check`` runs them, with a timed fit."""

from pathlib import Path

import pandas as pd
import pytest
import torch

from src.cli import main
from src.predict import Predictor
from tests.conftest import CONFIGS, ONE_PASS, QUIET

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none here"),
]
SPIRAL = [
    "--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=600", *ONE_PASS, "--trainer.max_epochs=2",
    "--trainer.accelerator=gpu", *QUIET,
]  # fmt: skip


@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed", "32-true"])
def test_a_fit_on_the_gpu_learns_and_its_checkpoint_reads_on_the_cpu(workdir: Path, precision: str) -> None:
    run = main(["fit", *SPIRAL, f"--trainer.precision={precision}"])
    assert run.trainer.state.finished
    assert next(run.model.parameters()).device.type == "cuda"
    assert torch.isfinite(run.trainer.callback_metrics["val/loss"])
    assert run.trainer.callback_metrics["val/acc"] > 0.5  # two spirals: chance is 0.5
    last = Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt"
    on_cpu = Predictor.from_checkpoint(last, device="cpu")
    assert next(on_cpu.model.parameters()).device.type == "cpu"


def test_batches_are_pinned_for_the_gpu(workdir: Path) -> None:
    run = main([*SPIRAL[:-3], *QUIET], run=False)  # the same settings, not fitted
    run.datamodule.trainer = run.trainer
    assert run.datamodule.train_dataloader().pin_memory


def test_predictions_on_the_gpu_equal_the_cpus(workdir: Path) -> None:
    run = main(["fit", *SPIRAL])
    last = Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt"
    rows: pd.DataFrame = run.datamodule.predict_frame
    gpu = Predictor.from_checkpoint(last)  # auto: the GPU, as it is present
    assert gpu.device.type == "cuda"
    cpu = Predictor.from_checkpoint(last, device="cpu")
    pd.testing.assert_frame_equal(gpu.predict(rows), cpu.predict(rows), check_exact=False, atol=1e-5)
