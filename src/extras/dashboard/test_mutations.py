"""Break the dashboard's values on purpose: the proofs that hold them must fail."""

from pathlib import Path

import pytest

import src.extras.dashboard.test_clipping_logged as clipping_logged
import src.extras.dashboard.test_dashboard as dashboard
import src.extras.dashboard.test_plain_module as plain_module
from src.extras.dashboard import Dashboard
from src.extras.dashboard.steps import StepValues
from tests.test_mutations import mutate


def test_clipping_test_catches_a_grad_norm_logged_after_clipping(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # clip first, then measure: train/grad_norm would never show a norm above the threshold
    norm = "norm = step_norm(grads, optimizer, trainer.global_step)"
    clipped = f"{norm}.clamp(max=trainer.gradient_clip_val)"  # the norm of the clipped gradients
    mutate(monkeypatch, StepValues, "on_before_optimizer_step", norm, clipped)
    with pytest.raises(AssertionError, match="not close"):
        clipping_logged.test_norm_clipping_bounds_the_global_norm_and_logs_the_norm_before(workdir)


def test_any_module_catches_a_gap_of_the_wrong_sign(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mutate(
        monkeypatch,
        Dashboard,
        "_write_gap",
        'logged["val/loss"] - logged["train/loss"]',
        'logged["train/loss"] - logged["val/loss"]',
    )
    with pytest.raises(AssertionError):
        plain_module.test_a_plain_lightning_module_trains_under_every_shipped_default(workdir)


def test_the_k_target_test_catches_the_worst_epoch_taken_for_the_best(
    workdir: Path, monkeypatch, cli
) -> None:
    mutate(
        monkeypatch,
        Dashboard,
        "_write_best",
        '(min if mode == "min" else max)(scored',
        '(max if mode == "min" else min)(scored',
    )
    with pytest.raises(AssertionError):
        dashboard.test_a_users_k_target_task_gets_its_own_values_as_the_best_epochs_columns(
            cli, "labels", ["loss", "acc", "f1"]
        )
