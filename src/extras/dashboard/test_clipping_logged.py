"""The gradient norm StepValues writes is the norm before clipping, whatever the algorithm, and the share of
steps clipped says when clipping fired: tests/test_accumulation_clipping.py's probed runs, with StepValues
back on after bare.yaml."""

from pathlib import Path

import torch

from src.cli import CLI
from src.extras.dashboard.logger import read_scalars
from tests.test_accumulation_clipping import fit_probed, global_norm

#: back after bare.yaml: it writes the gradient norm
STEP_VALUES = ["--trainer.callbacks+=src.extras.dashboard.steps.StepValues"]


def written(run: CLI, tag: str) -> list[torch.Tensor]:
    """What StepValues wrote to TensorBoard under ``tag``, one value per optimizer step, in order."""
    points = read_scalars(run.trainer.log_dir)[tag]
    assert [step for step, _ in points] == list(range(len(points)))
    assert len(points) == 5  # one per optimizer step of the probed run
    return [torch.tensor(value) for _, value in points]


def test_norm_clipping_bounds_the_global_norm_and_logs_the_norm_before(workdir: Path) -> None:
    max_norm = 0.05  # below the gradients' norm here, so clipping acts on every step
    run, probe = fit_probed("clip_norm.yaml", max_norm, *STEP_VALUES)
    assert run.trainer.gradient_clip_algorithm == "norm"
    logged_norms, fired = (
        written(run, "train/optimization/grad_norm"),
        written(run, "train/optimization/clipped"),
    )
    for before, used, logged, clipped in zip(probe.before_clip, probe.used, logged_norms, fired, strict=True):
        norm = global_norm(before)
        assert norm > max_norm  # the precondition: clipping had something to do
        torch.testing.assert_close(logged, norm)  # the logged norm is the norm before clipping
        assert clipped == 1.0  # the share of steps clipped: this one
        assert global_norm(used) <= max_norm * (1 + 1e-5)
        # clipping rescales the whole gradient: same direction, shorter
        torch.testing.assert_close(used, [g * (global_norm(used) / norm) for g in before])


def test_value_clipping_bounds_every_element(workdir: Path) -> None:
    value = 0.01
    run, probe = fit_probed("clip_value.yaml", value, *STEP_VALUES)
    assert run.trainer.gradient_clip_algorithm == "value"
    logged_norms, fired = (
        written(run, "train/optimization/grad_norm"),
        written(run, "train/optimization/clipped"),
    )
    for before, used, logged, clipped in zip(probe.before_clip, probe.used, logged_norms, fired, strict=True):
        assert max(g.abs().max() for g in before) > value  # the precondition
        assert max(g.abs().max() for g in used) <= value
        torch.testing.assert_close(used, [g.clamp(-value, value) for g in before])
        torch.testing.assert_close(logged, global_norm(before))  # the norm, whatever the algorithm
        assert clipped == 1.0  # some element was beyond the value: clipping fired
