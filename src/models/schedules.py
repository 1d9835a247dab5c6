"""Learning-rate schedules that YAML cannot compose or size by itself, built from torch's own schedulers."""

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

from src.errors import UserInputError, notice

#: arguments by which a scheduler spans the whole run (OneCycleLR's, CosineAnnealingLR's)
SPANS_THE_RUN = ("total_steps", "T_max")


def spanned_by(factory: Callable[..., Any]) -> str | None:
    """The argument by which a scheduler spans the run when the config left it out (bound as None)."""
    bound = factory.keywords if isinstance(factory, functools.partial) else {}
    if bound.get("epochs") is not None:
        return None  # OneCycleLR given epochs and steps_per_epoch counts them itself
    return next((name for name in SPANS_THE_RUN if name in bound and bound[name] is None), None)


def run_length(trainer: Any, interval: str, argument: str = "T_max") -> int:
    """The run's length in the steps of a schedule's ``argument`` (optimizer steps, or epochs)."""
    if argument == "total_steps" and interval != "step":
        raise UserInputError(
            "a scheduler that counts total_steps (OneCycleLR, WarmupCosine) steps per optimizer step: "
            "set model.init_args.scheduler_interval: step."
        )
    steps = trainer.estimated_stepping_batches
    if math.isinf(steps):
        raise UserInputError(
            "a schedule that spans the run needs the run's length: set trainer.max_epochs or "
            "trainer.max_steps."
        )
    if interval == "step":
        return int(steps)
    per_epoch = math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches)
    return math.ceil(steps / max(per_epoch, 1))


def check_length(scheduler: Any, run_length: Callable[[str], int], interval: str) -> None:
    """Say in one line when a typed ``T_max`` or ``total_steps`` is not the run's length."""
    for argument in SPANS_THE_RUN:
        given = getattr(scheduler, argument, None)  # torch's schedulers keep them as public attributes
        if not isinstance(given, int) or given == (length := run_length(argument)):
            continue
        steps = argument == "total_steps" or interval == "step"
        notice(
            f"model.init_args.scheduler.init_args.{argument}={given}, but this run is {length} "
            f"{'optimizer steps' if steps else 'epochs'} long, so the schedule "
            f"{'ends before' if given < length else 'is not done when'} the run ends; leave {argument} "
            "out and the run's length is filled in."
        )


#: what a scheduler sets in the optimizer's param groups as its job or its bookkeeping: never news
SCHEDULERS_OWN = ("lr", "initial_lr")


def settings(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """The settings of each of ``optimizer``'s param groups (all but the parameters), as they are now."""
    return [
        {key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups
    ]


def check_replaced(before: list[dict[str, Any]], optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    """Say which optimizer setting ``scheduler`` replaced (the momentum OneCycleLR cycles, say)."""
    name, group, old = type(scheduler).__name__, optimizer.param_groups[0], before[0]
    # torch's cycling schedulers keep their bounds in each group, and cycle betas[0] where there are betas
    if getattr(scheduler, "cycle_momentum", False) and "base_momentum" in group:
        key = "betas" if "betas" in old else "momentum"
        given, setting = (old[key][0], "betas[0]") if key == "betas" else (old[key], key)
        what = "first beta (its momentum)" if key == "betas" else "momentum"
        notice(
            f"model.init_args.scheduler: {name} cycles the optimizer's {what} between "
            f"{group['base_momentum']:g} and {group['max_momentum']:g} and replaces {setting}={given:g}; "
            "give cycle_momentum: false to keep it."
        )
        return
    changed = [k for k, v in old.items() if k not in SCHEDULERS_OWN and k in group and group[k] != v]
    if changed:  # the first group's first setting: one line for the run
        key = changed[0]
        notice(
            f"model.init_args.scheduler: {name} sets the optimizer's {key} to {group[key]} and replaces "
            f"{key}={old[key]}."
        )


class WarmupCosine(SequentialLR):
    """Linear warmup, then cosine decay, stepped per optimizer step; YAML cannot compose the two itself.

    Args:
        optimizer: The optimizer whose learning rate is scheduled.
        warmup_steps: Steps of linear warmup, from ``warmup_start_factor * lr`` up to ``lr``.
        total_steps: Length of the whole run in steps; left out, the task fills it in.
        warmup_start_factor: Fraction of the base learning rate at step 0.
        eta_min: Learning rate at the end of the cosine.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        warmup_steps: int,
        total_steps: int | None = None,
        warmup_start_factor: float = 0.01,
        eta_min: float = 0.0,
    ) -> None:
        if total_steps is None:
            raise ValueError("WarmupCosine needs total_steps; BaseTask fills it in from the Trainer.")
        if not 0 < warmup_steps < total_steps:
            raise UserInputError(
                f"model.init_args.scheduler.init_args.warmup_steps={warmup_steps} must lie in (0, "
                f"total_steps={total_steps}); lower it or train for more steps."
            )
        #: the run's length, as torch's OneCycleLR keeps it (the task checks it against the Trainer's)
        self.total_steps = total_steps
        warmup = LinearLR(optimizer, start_factor=warmup_start_factor, total_iters=warmup_steps)
        cosine = CosineAnnealingLR(optimizer, T_max=total_steps - warmup_steps, eta_min=eta_min)
        super().__init__(optimizer, schedulers=[warmup, cosine], milestones=[warmup_steps])


class Cosine(CosineAnnealingLR):
    """torch's ``CosineAnnealingLR`` whose ``T_max`` the task fills in with the run's length.

    Args:
        optimizer: The optimizer whose learning rate is scheduled.
        T_max: Scheduler steps from the base learning rate down to ``eta_min``; leave it out.
        eta_min: Learning rate at the end of the run.
        last_epoch: The index of the last scheduler step (-1 starts afresh).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        T_max: int | None = None,
        eta_min: float = 0.0,
        last_epoch: int = -1,
    ) -> None:
        if T_max is None:
            raise ValueError("Cosine needs T_max; BaseTask fills it in from the Trainer.")
        super().__init__(optimizer, T_max=T_max, eta_min=eta_min, last_epoch=last_epoch)
