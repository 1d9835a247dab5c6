"""A LightningModule of the user's own (``TutorialModule`` of tests/test_any_module.py, which knows nothing
of this project) under every shipped default: what the dashboard writes of it, from Lightning's public
hooks and from what the module itself logs."""

from pathlib import Path

import pytest

from src.extras.dashboard.logger import read_scalars
from tests.test_any_module import fit


def test_a_plain_lightning_module_trains_under_every_shipped_default(workdir: Path) -> None:
    run = fit(workdir)
    scalars = read_scalars(Path(run.trainer.logger.log_dir))
    # StepValues: the loss it returned, the learning rate and the gradient norm, every 2nd optimizer step
    steps = run.trainer.global_step
    assert steps == 3 * run.trainer.num_training_batches
    assert [s for s, _ in scalars["train/optimization/loss"]] == list(range(1, steps, 2))
    assert all(value == pytest.approx(0.01) for _, value in scalars["train/optimization/lr"])
    assert len(scalars["train/optimization/grad_norm"]) == steps // 2
    # the shipped default clips at 1.0: the share of each interval's steps whose norm was above it
    assert all(0 <= share <= 1 for _, share in scalars["train/optimization/clipped"])
    # Dashboard: speed every epoch, and the gap from what the module itself logged
    assert len(scalars["train/speed/samples_per_sec"]) == 3
    gaps = [value for _, value in scalars["val/generalization_gap"]]
    val, train = [v for _, v in scalars["val/loss"]], [v for _, v in scalars["train/loss"]]
    assert gaps == pytest.approx([v - t for v, t in zip(val, train, strict=True)], rel=1e-5)
