"""A non-finite step is skipped, never taken; a run that keeps at it stops; blown-up weights are not saved."""

import math
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from src.callbacks import NonFiniteGuard
from src.cli import CLI, main
from src.errors import UserInputError
from src.models import Classifier
from tests.conftest import CONFIGS, QUIET

STEPS = 10  # 2 epochs of 5 batches
SPIRAL = [
    "--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=1500", "--trainer.max_epochs=2",
    "--trainer.limit_train_batches=5", "--trainer.limit_val_batches=1",
    "--model.init_args.optimizer=torch.optim.SGD", "--model.init_args.optimizer.init_args.lr=0.1",
]  # fmt: skip
PER_STEP_SCHEDULE = [
    "--model.init_args.scheduler=torch.optim.lr_scheduler.LinearLR",
    "--model.init_args.scheduler.init_args.total_iters=20", "--model.init_args.scheduler_interval=step",
]  # fmt: skip


def build(workdir: Path, *extra: str) -> CLI:
    return main([*SPIRAL, *extra, *QUIET], run=False)


def scale_loss_at(run: CLI, steps: set[int], factor: float) -> None:
    """Multiply the training loss by ``factor`` (NaN, or 0) at the given optimizer steps."""
    real = run.model.loss

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        value = real(output, target)
        return value * factor if run.model.training and run.trainer.global_step in steps else value

    run.model.loss = loss


def guard(run: CLI) -> NonFiniteGuard:
    return next(c for c in run.trainer.callbacks if isinstance(c, NonFiniteGuard))


def test_a_nan_step_is_skipped_exactly_as_if_it_had_never_happened(workdir: Path, caplog) -> None:
    skipped = build(workdir)
    scale_loss_at(skipped, {3}, math.nan)
    skipped.trainer.fit(skipped.model, datamodule=skipped.datamodule)
    assert skipped.trainer.global_step == STEPS
    assert guard(skipped).skipped == 1
    assert "Skipped the optimizer step at epoch 0, batch 3: non-finite gradients in net." in caplog.text
    assert skipped.trainer.callback_metrics["train/skipped_steps"] == 1
    # plain SGD: a step with zero gradients leaves the weights where they were, as a skipped step must
    zeroed = build(workdir)
    scale_loss_at(zeroed, {3}, 0.0)
    zeroed.trainer.fit(zeroed.model, datamodule=zeroed.datamodule)
    for (name, a), b in zip(
        skipped.model.state_dict().items(), zeroed.model.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
        assert torch.isfinite(a).all()


def test_a_per_step_schedule_is_set_back_for_the_skipped_step_only(workdir: Path) -> None:
    run = build(workdir, *PER_STEP_SCHEDULE)
    scale_loss_at(run, {3}, math.nan)
    run.trainer.fit(run.model, datamodule=run.datamodule)
    scheduler = run.trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.last_epoch == STEPS - 1
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    reference = torch.optim.lr_scheduler.LinearLR(optimizer, total_iters=20)
    for _ in range(STEPS - 1):
        optimizer.step()
        reference.step()
    assert scheduler.get_last_lr() == pytest.approx(reference.get_last_lr())
    assert run.trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(reference.get_last_lr()[0])


def test_adam_keeps_its_moments_through_a_skipped_step(workdir: Path) -> None:
    run = main([*SPIRAL, "--model.init_args.optimizer=torch.optim.Adam", *QUIET], run=False)
    scale_loss_at(run, {2, 7}, math.inf)
    run.trainer.fit(run.model, datamodule=run.datamodule)
    states = run.trainer.optimizers[0].state.values()
    assert {int(state["step"]) for state in states} == {STEPS - 2}


def test_steps_that_stay_non_finite_stop_the_run_with_a_sentence(workdir: Path) -> None:
    run = build(workdir)
    guard(run).max_consecutive = 3
    scale_loss_at(run, set(range(4, STEPS)), math.nan)
    with pytest.raises(
        UserInputError, match=r"3 optimizer steps in a row had non-finite gradients \(last at epoch"
    ):
        run.trainer.fit(run.model, datamodule=run.datamodule)


class BlowUpAfterTheLastStep(Callback):
    """Weights that become infinite after the second epoch's last step, just before it is saved."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: object) -> None:
        if trainer.current_epoch == 1 and trainer.global_step == STEPS:
            with torch.no_grad():
                next(pl_module.parameters()).fill_(math.inf)


def test_a_checkpoint_with_non_finite_weights_is_never_written(workdir: Path) -> None:
    run = build(workdir)
    run.trainer.callbacks.append(BlowUpAfterTheLastStep())
    with pytest.raises(UserInputError, match="the weights are no longer finite at epoch 1"):
        run.trainer.fit(run.model, datamodule=run.datamodule)
    checkpoints = Path(run.trainer.log_dir) / "checkpoints"
    for path in checkpoints.glob("*.ckpt"):
        checkpoint = torch.load(path, weights_only=True)
        assert checkpoint["epoch"] == 0
        assert all(
            torch.isfinite(t).all() for t in checkpoint["state_dict"].values() if t.is_floating_point()
        )


class NaNLoss(Classifier):
    """A user's loss that went wrong: NaN from the first step on."""

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return super().loss(output, target) * math.nan


def test_the_cli_ends_a_hopeless_run_with_one_sentence(cli, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli("fit", *SPIRAL, "--model", "tests.test_guard.NaNLoss", "--trainer.max_epochs=5")
    assert exit_.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert "every optimizer step of epoch 0 (5) had non-finite gradients, so nothing was trained" in errors[0]


@pytest.fixture
def lightning_clipped(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The steps at which the task left clipping to Lightning's ``clip_gradients``."""
    steps: list[int] = []
    clip_gradients = Classifier.clip_gradients

    def counted(self: Classifier, *args: object, **kwargs: object) -> None:
        steps.append(self.trainer.global_step)
        clip_gradients(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Classifier, "clip_gradients", counted)
    return steps


@pytest.mark.parametrize("log_every", [1, 50])
def test_clipping_with_the_guards_norm_trains_to_the_very_bits_of_lightnings_own_clipping(
    workdir: Path, lightning_clipped: list[int], log_every: int
) -> None:
    """The guard hands its gradient norm to the task, which clips with it instead of computing it again."""
    clip = ["--trainer.gradient_clip_val=0.05", f"--trainer.log_every_n_steps={log_every}"]  # acts every step
    shared = build(workdir, *clip)
    shared.trainer.fit(shared.model, datamodule=shared.datamodule)
    assert lightning_clipped == []  # every step clipped with the guard's norm
    own = build(workdir, *clip, "--nonfinite_guard=null")
    own.trainer.fit(own.model, datamodule=own.datamodule)
    assert len(lightning_clipped) == STEPS  # without the guard, Lightning's clipping computes the norm
    for (name, a), b in zip(shared.model.state_dict().items(), own.model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_a_precision_plugin_that_clips_its_own_way_keeps_lightnings_clipping(
    workdir: Path, lightning_clipped: list[int]
) -> None:
    mixed = build(workdir, "--trainer.precision=bf16-mixed")  # MixedPrecision clips its own way
    mixed.trainer.fit(mixed.model, datamodule=mixed.datamodule)
    assert len(lightning_clipped) == STEPS
