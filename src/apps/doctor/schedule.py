"""Checks of the learning-rate schedule over the run's real length, from a copy stepped ahead of time."""

import copy
import warnings

import lightning as L
import torch
from lightning.pytorch.utilities.types import LRSchedulerConfig
from torch.optim.lr_scheduler import (
    CosineAnnealingLR,
    CosineAnnealingWarmRestarts,
    CyclicLR,
    OneCycleLR,
    ReduceLROnPlateau,
)

from src.apps.doctor.findings import Finding
from src.models import BaseTask

#: a move of this share of the peak LR counts as a fall, or as a climb back
MOVE = 0.1
#: below this share of its peak the LR has collapsed
COLLAPSED = 1e-3
#: schedules whose restarts are the point
CYCLIC = (CyclicLR, CosineAnnealingWarmRestarts)


def scheduler_steps(trainer: L.Trainer, model: L.LightningModule, config: LRSchedulerConfig) -> int | None:
    """How often the run steps the scheduler: once per epoch or per optimizer step, every ``frequency``."""
    if isinstance(model, BaseTask) and model.hparams.get("scheduler_interval") == config.interval:
        return model.run_length() // config.frequency  # the manual module counts its own accumulation
    if config.interval == "step":
        steps = trainer.estimated_stepping_batches
        return None if steps == float("inf") else int(steps) // config.frequency
    epochs = trainer.max_epochs
    return None if epochs is None or epochs < 0 else max(epochs, 1) // config.frequency


def simulate(
    optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler, steps: int
) -> tuple[list[float], str | None]:
    """The LR of the first parameter group after 0, 1, ..., ``steps`` scheduler steps, from a copy.

    The parameters are shared with the copy, not copied (the copy never updates them). Returns the rates
    and, when the scheduler refuses a step (OneCycleLR past its ``total_steps``), its message.
    """
    shared = {id(p): p for group in optimizer.param_groups for p in group["params"]}
    optimizer, scheduler = copy.deepcopy((optimizer, scheduler), memo=shared)
    rates = [float(optimizer.param_groups[0]["lr"])]
    with warnings.catch_warnings():
        # the copy is stepped without optimizer steps on purpose, which torch warns about
        warnings.simplefilter("ignore")
        for _ in range(steps):
            try:
                scheduler.step()
            except ValueError as err:
                return rates, str(err)
            rates.append(float(optimizer.param_groups[0]["lr"]))
    return rates, None


def check_schedule(
    optimizer: torch.optim.Optimizer, config: LRSchedulerConfig, steps: int | None
) -> list[Finding]:
    """Findings about one scheduler over the run's ``steps`` scheduler steps."""
    scheduler = config.scheduler
    if steps is None or steps < 1 or isinstance(scheduler, ReduceLROnPlateau):
        return []  # an endless run, or a schedule whose course depends on the monitored metric
    name, unit = type(scheduler).__name__, "epochs" if config.interval == "epoch" else "optimizer steps"
    rates, refused = simulate(optimizer, scheduler, steps)
    length = _length(scheduler, steps, unit, refused)
    if length is not None:
        return [length]  # the curve checks would report the same mistake again
    used = rates[:steps]  # the LR of each scheduler step's span; rates[steps] is where the run leaves it
    peak = max(used)
    if peak <= 0:
        return []  # a zero LR shows up as weights that do not move
    findings = []
    if not isinstance(scheduler, CYCLIC) and (climb := _climb_back(used, peak)) is not None:
        at, low, high = climb
        findings.append(
            Finding(
                "schedule-restarts",
                f"{name} takes the LR down to {low:.3g} and back up to {high:.3g} by {unit[:-1]} {at} of "
                f"{steps} (peak {peak:.3g})",
                "the schedule is shorter than the run (T_max or a period typed beside max_epochs), or an "
                "epoch schedule is stepped per optimizer step: the LR climbs back while the run should end",
                "let the schedule span the run (leave T_max out with src.models.schedules.Cosine, or compute "
                "it from self.trainer.estimated_stepping_batches) and check scheduler_interval",
            )
        )
    # from here on, the LR stays below COLLAPSED of its peak (a cosine that touches zero and comes back
    # is a restart, not a collapse)
    collapsed = next((i for i in range(steps) if max(used[i:]) < COLLAPSED * peak), None)
    if collapsed is not None and collapsed < steps // 2:
        findings.append(
            Finding(
                "schedule-collapses",
                f"{name} takes the LR below 1/{1 / COLLAPSED:.0f} of its peak ({peak:.3g}) after {collapsed} "
                f"of {steps} {unit}",
                "most of the run then trains at an LR too small to move: an epoch schedule stepped per "
                "optimizer step decays len(loader) times too fast",
                "step epoch schedules per epoch (model.init_args.scheduler_interval: epoch), or size the "
                "decay to the run",
            )
        )
    if steps > 1 and max(range(steps), key=used.__getitem__) == steps - 1 and used[-1] > used[0]:
        findings.append(
            Finding(
                "schedule-warmup-longer-than-run",
                f"{name} is still raising the LR at the last of {steps} {unit} "
                f"({used[0]:.3g} to {used[-1]:.3g})",
                "the warmup is longer than the run: it never trains at the intended LR and never decays",
                "make the warmup a small share of the run (say 5%), or train longer",
            )
        )
    return findings


def _length(
    scheduler: torch.optim.lr_scheduler.LRScheduler, steps: int, unit: str, refused: str | None
) -> Finding | None:
    """A scheduler sized by hand (CosineAnnealingLR's ``T_max``, OneCycleLR's ``total_steps``) to another
    length than the run's, or one that refused a step of the run."""
    name = type(scheduler).__name__
    if refused is not None:
        sized = f"{name} refuses to be stepped as often as the run steps it ({refused})"
    elif isinstance(scheduler, CosineAnnealingLR) and scheduler.T_max != steps:
        sized = f"{name} has T_max={scheduler.T_max}, but the run steps it {steps} times ({unit})"
    elif isinstance(scheduler, OneCycleLR) and scheduler.total_steps != steps:
        sized = f"{name} has total_steps={scheduler.total_steps}, but the run steps it {steps} times ({unit})"
    else:
        return None
    return Finding(
        "schedule-length",
        sized,
        "a schedule shorter than the run ends before it does (CosineAnnealingLR climbs back up, OneCycleLR "
        "stops the run with an error); a longer one leaves the run before the LR comes down",
        "give it the run's length from the Trainer: leave T_max or total_steps out of a BaseTask config "
        "(src.models.schedules.Cosine), or use self.trainer.estimated_stepping_batches / max_epochs",
    )


def _climb_back(rates: list[float], peak: float) -> tuple[int, float, float] | None:
    """Where the LR, having fallen by ``MOVE`` of the peak, climbs back by as much: (index, low, high)."""
    top, bottom = rates[0], None
    for i, lr in enumerate(rates):
        if bottom is None:
            top = max(top, lr)
            if lr <= top - MOVE * peak:
                bottom = lr
        else:
            bottom = min(bottom, lr)
            if lr >= bottom + MOVE * peak:
                return i, bottom, max(rates[i:])
    return None
