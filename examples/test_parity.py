"""The hand-written loop, the manual-optimization module and the Trainer's automatic loop train alike.

Same seed, same initial weights, same batch order: after every optimizer step of two epochs the three
paths hold the same parameters, buffers and Adam moments, compared with ``torch.testing.assert_close``
at zero tolerance (bit for bit). The data gives 7 training batches per epoch (6 of 64 rows and one of
36), so accumulation over 2 or 3 batches ends each epoch with a shorter group: all three paths step on
it with the micro-batch losses divided by ``accumulate_grad_batches`` (not by the group's length) and
start the next epoch with a fresh group. ``examples/test_loop.py`` checks that rule against a direct
computation.
"""

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any
from unittest import mock

import lightning as L
import pytest
import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, OneCycleLR, ReduceLROnPlateau, StepLR

from examples.loop import FitResult, fit
from examples.manual import ManualClassifier
from src.data import ArrayDataModule
from src.models import Classifier
from src.nets import MLP

EPOCHS = 2
BATCHES_PER_EPOCH = 7  # 420 training rows of the 600-row spiral, in batches of 64
EXACT = {"rtol": 0.0, "atol": 0.0}
# The global gradient norms of the norm-clipped cases run from about 0.07 (the short last group of an
# epoch) to 0.21: at 0.15 clipping rescales some steps and leaves others alone, so both are compared.
# A threshold above 0.21 would never fire, and a path that forgot to clip by norm would still match.
NORM_CLIP = 0.15


@dataclass(frozen=True)
class Case:
    accumulate: int = 1
    clip_val: float | None = None
    clip_algorithm: str = "norm"
    scheduler: Any = None
    interval: str = "epoch"
    precision: str = "32-true"
    net: dict[str, Any] = field(default_factory=dict)  # the MLP's own arguments beyond hidden_sizes


CASES = {
    "plain": Case(net={"dropout": 0.2}),
    "accumulate3-clip-norm-step-scheduler": Case(
        accumulate=3,
        clip_val=NORM_CLIP,
        scheduler=partial(LinearLR, start_factor=0.2, total_iters=5),
        interval="step",
    ),
    "accumulate2-clip-value-epoch-scheduler-batchnorm": Case(
        accumulate=2,
        clip_val=0.05,
        clip_algorithm="value",
        scheduler=partial(StepLR, step_size=1, gamma=0.5),
        net={"batch_norm": True},
    ),
    "bf16-mixed-accumulate3-clip-norm": Case(
        accumulate=3,
        clip_val=NORM_CLIP,
        scheduler=partial(CosineAnnealingLR, T_max=6),
        interval="step",
        precision="bf16-mixed",
    ),
    # threshold=1: no epoch counts as an improvement, so the LR halves after each validation
    "plateau": Case(scheduler=partial(ReduceLROnPlateau, factor=0.5, patience=0, threshold=1.0)),
    "64-true-accumulate3": Case(accumulate=3, clip_val=NORM_CLIP, precision="64-true"),
}


def data() -> ArrayDataModule:
    return ArrayDataModule(
        source="spiral", num_samples=600, batch_size=64, seed=0, min_batches_per_epoch=None
    )


def net(case: Case) -> partial[MLP]:
    """The net every path trains, as the factory the tasks are given: ``net(in_features, out_features)``."""
    return partial(MLP, hidden_sizes=[16, 16], **case.net)


def initial_model(case: Case) -> Classifier:
    torch.manual_seed(0)
    return Classifier(in_features=2, out_features=3, net=net(case))


def run_raw(case: Case, model: Classifier) -> FitResult:
    torch.manual_seed(1)  # the dropout masks: the same seed as the Trainer paths
    dm = data()
    dm.setup("fit")
    return fit(
        copy.deepcopy(model.net),
        dm.train_dataloader(),
        dm.val_dataloader(),
        optimizer=partial(torch.optim.Adam, lr=0.01),
        scheduler=case.scheduler,
        scheduler_interval=case.interval,
        max_epochs=EPOCHS,
        accumulate_grad_batches=case.accumulate,
        gradient_clip_val=case.clip_val,
        gradient_clip_algorithm=case.clip_algorithm,
        precision=case.precision,
    )


def run_trainer(case: Case, model: Classifier, manual: bool) -> tuple[L.Trainer, Classifier]:
    settings = {"scheduler": case.scheduler, "scheduler_interval": case.interval}
    optimizer = partial(torch.optim.Adam, lr=0.01)
    if manual:
        module: Classifier = ManualClassifier(
            in_features=2,
            out_features=3,
            net=net(case),
            optimizer=optimizer,
            accumulate_grad_batches=case.accumulate,
            gradient_clip_val=case.clip_val,
            gradient_clip_algorithm=case.clip_algorithm,
            **settings,
        )
        loop = {}
    else:
        module = Classifier(in_features=2, out_features=3, net=net(case), optimizer=optimizer, **settings)
        loop = {
            "accumulate_grad_batches": case.accumulate,
            "gradient_clip_val": case.clip_val,
            "gradient_clip_algorithm": case.clip_algorithm,
        }
    module.load_state_dict(model.state_dict())
    trainer = L.Trainer(
        max_epochs=EPOCHS,
        precision=case.precision,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **loop,
    )
    torch.manual_seed(1)
    trainer.fit(module, datamodule=data())
    return trainer, module


@contextmanager
def clipping_recorded() -> Iterator[list[bool]]:
    """Per call of torch's norm or value clipping inside the block: whether it changed any gradient."""
    changed: list[bool] = []

    def record(clip: Callable[..., Any]) -> Callable[..., Any]:
        def clip_and_record(parameters: Any, *args: Any, **kwargs: Any) -> Any:
            parameters = list(parameters)
            before = [p.grad.clone() for p in parameters]
            result = clip(parameters, *args, **kwargs)
            changed.append(any(not torch.equal(b, p.grad) for b, p in zip(before, parameters, strict=True)))
            return result

        return clip_and_record

    utils = torch.nn.utils
    with (
        mock.patch.object(utils, "clip_grad_norm_", record(utils.clip_grad_norm_)),
        mock.patch.object(utils, "clip_grad_value_", record(utils.clip_grad_value_)),
    ):
        yield changed


def assert_same_training(raw: FitResult, trainer: L.Trainer, module: Classifier) -> None:
    # parameters and BatchNorm running statistics, name by name
    torch.testing.assert_close(dict(raw.net.state_dict()), dict(module.net.state_dict()), **EXACT)
    # Adam's step count and moments (exp_avg, exp_avg_sq) per parameter, and the learning rate
    optimizer = trainer.optimizers[0]
    state = optimizer.state_dict()["state"]
    if trainer.precision == "64-true" and not module.automatic_optimization:
        # The one difference: Adam makes its step counter in the default dtype, and the manual module
        # calls step() inside training_step, where Lightning's 64-true sets that default to float64.
        # Adam reads the counter as a Python number, so the updates are the same (checked above).
        for per_param in state.values():
            assert per_param["step"].dtype == torch.float64
            per_param["step"] = per_param["step"].float()
    torch.testing.assert_close(raw.optimizer.state_dict()["state"], state, **EXACT)
    assert raw.optimizer.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
    assert raw.steps == trainer.global_step
    # the logged epoch losses are means over the same samples (summed in another order: not bit for bit)
    metrics = trainer.callback_metrics
    torch.testing.assert_close(metrics["train/loss"].item(), raw.history.train_loss[-1])
    torch.testing.assert_close(metrics["val/loss"].item(), raw.history.val_loss[-1])


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_raw_loop_equals_manual_module_equals_automatic_module(case: Case) -> None:
    model = initial_model(case)
    with clipping_recorded() as clipped:
        raw = run_raw(case, model)
    # the run did what the case says: it moved the weights, and a scheduler moved the learning rate
    assert raw.steps == EPOCHS * -(-BATCHES_PER_EPOCH // case.accumulate)
    assert not torch.equal(raw.net.head.weight.float(), model.net.head.weight)
    if case.scheduler is not None:
        assert raw.optimizer.param_groups[0]["lr"] != 0.01
    # and clipping had work to do: it changed the gradients of some steps (a path that skipped it would
    # then differ), and by norm it left others alone (a path that always rescaled would differ too)
    if case.clip_val is None:
        assert clipped == []
    else:
        assert len(clipped) == raw.steps
        assert any(clipped)
        assert case.clip_algorithm == "value" or not all(clipped)
    for manual in (False, True):
        trainer, module = run_trainer(case, model, manual)
        assert module.automatic_optimization is not manual
        assert_same_training(raw, trainer, module)


def test_parity_notices_a_small_difference() -> None:
    """The comparison is sharp: a warmup that starts at 0.21 instead of 0.2 of the LR is caught.

    Everything else is the case's own, clipping included, so the warmup is the only difference.
    """
    case = CASES["accumulate3-clip-norm-step-scheduler"]
    warmup = partial(LinearLR, start_factor=0.21, total_iters=5)
    raw = run_raw(replace(case, scheduler=warmup), initial_model(case))
    trainer, module = run_trainer(case, initial_model(case), manual=False)
    with pytest.raises(AssertionError):
        assert_same_training(raw, trainer, module)


def test_a_schedule_over_the_whole_run_gets_the_optimizer_step_count_in_both_modules() -> None:
    """OneCycleLR without total_steps: the task fills in optimizer steps (k=3: 3 per epoch), not batches.

    Under manual optimization the Trainer's own count is of batches, so the manual module counts its
    groups itself; both must match the raw loop given the true count by hand.
    """
    filled_in = partial(OneCycleLR, max_lr=0.05, total_steps=None, epochs=None)  # what the CLI builds
    by_hand = partial(OneCycleLR, max_lr=0.05, total_steps=EPOCHS * -(-BATCHES_PER_EPOCH // 3))
    model = initial_model(Case())
    raw = run_raw(Case(accumulate=3, scheduler=by_hand, interval="step"), model)
    for manual in (False, True):
        trainer, module = run_trainer(Case(accumulate=3, scheduler=filled_in, interval="step"), model, manual)
        assert trainer.lr_scheduler_configs[0].scheduler.total_steps == trainer.global_step == raw.steps == 6
        assert_same_training(raw, trainer, module)
