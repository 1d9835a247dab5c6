"""What the terminal says about a run: a model summary a person reads, and the story of the fit at its end.

Both read public state only, so they work for any LightningModule: the values it logs
(``trainer.callback_metrics``), the Trainer's checkpoint and early-stopping callbacks, its log folder.
"""

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from lightning.pytorch.callbacks import ModelSummary as LightningModelSummary
from typing_extensions import override

from src.callbacks.baselines import TAG
from src.callbacks.dashboard import SPEED, cli_config, monitored
from src.callbacks.guard import NonFiniteGuard
from src.errors import UserInputError


class ModelSummary(LightningModelSummary):
    """Lightning's model summary, trimmed to what a person reads: one row per block that holds parameters
    (the metric and loss containers hold none), no FLOPs column (it reads 0 unless measured), and the
    totals. Printed only when the progress bar is on: ``--trainer.enable_progress_bar=false`` is quiet,
    and ``--trainer.enable_model_summary=false`` (or ``model_summary: null``) turns it off.

    Args:
        max_depth: Levels of nested modules shown: 1, the module's top-level children (its blocks).
    """

    def __init__(self, max_depth: int = 1) -> None:
        super().__init__(max_depth=max_depth)

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the Trainer does not keep its enable_model_summary argument; the CLI's resolved config does
        saver = cli_config(trainer)
        switched_off = saver is not None and saver.config.get("trainer.enable_model_summary") is False
        if trainer.progress_bar_callback is None or switched_off:
            return
        super().on_fit_start(trainer, pl_module)

    @staticmethod
    @override
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        print(summary_text(summary_data, total_parameters, trainable_parameters, model_size))


def summary_text(
    summary_data: list[tuple[str, list[str]]],
    total_parameters: int,
    trainable_parameters: int,
    model_size: float,
) -> str:
    """The table of blocks with parameters (Lightning's columns ``Name``, ``Type``, ``Params``) and the
    totals, e.g. ``net | MLP | 50.8 K`` then ``50.8 K parameters (all trainable), 0.20 MB``."""
    columns = dict(summary_data)
    rows = [
        (name, kind, params)
        for name, kind, params in zip(columns["Name"], columns["Type"], columns["Params"], strict=True)
        if params.strip() != "0"
    ]
    widths = [
        max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(("block", "type", "params"))
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(("block", "type", "params"), widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    frozen = total_parameters - trainable_parameters
    trainable = "all trainable" if not frozen else f"{_count(frozen)} frozen"
    lines.append(f"{_count(total_parameters)} parameters ({trainable}), {model_size:.2f} MB")
    return "\n".join(lines)


def _count(n: int) -> str:
    """``50800`` → ``50.8 K``, as Lightning writes parameter counts."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return str(n)


@dataclass
class _Validation:
    """One validation epoch's scalar values, as ``callback_metrics`` held them once it ended."""

    epoch: int
    values: dict[str, float]


class RunSummary(Callback):
    """At the end of a fit, a few lines that tell its story, on global rank 0.

    Why it ended (the ``max_epochs``/``max_steps`` cap, early stopping and why, the non-finite guard or a
    stop request), the best validation epoch by the best checkpoint's monitored value (``val/loss`` when
    there is no such checkpoint) with its validation values (beside ``val/<metric>_<model>``
    values when a baselines callback logs them), a word when the run hit its cap while still improving,
    and where things are: the best checkpoint, the run folder and the command that opens TensorBoard on it.

    Args:
        recent_epochs: A best epoch within this many of the last validated one, in a run that ended on
            its cap, counts as "still improving".
    """

    def __init__(self, recent_epochs: int = 3) -> None:
        if recent_epochs < 1:
            raise UserInputError(f"RunSummary recent_epochs={recent_epochs} must be at least 1.")
        self.recent_epochs = recent_epochs
        self.validations: list[_Validation] = []

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.validations = []

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # on_validation_end, not on_validation_epoch_end: Lightning moves the epoch's logged values into
        # callback_metrics after the epoch-end hooks (EarlyStopping reads them here too). One host read per
        # value per epoch.
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        values = {
            name: float(value.item())
            for name, value in trainer.callback_metrics.items()
            if isinstance(value, torch.Tensor) and value.numel() == 1
        }
        self.validations.append(_Validation(trainer.current_epoch, values))

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        folder = trainer.log_dir if trainer.loggers else None  # a collective under DDP: every rank asks
        if trainer.is_global_zero:
            print(self.text(trainer, ending(trainer), folder))

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        guard = next((c for c in _callbacks(trainer) if isinstance(c, NonFiniteGuard)), None)
        if not trainer.is_global_zero or guard is None or not guard.consecutive:
            return  # the CLI says what went wrong; a stop by the guard is part of the run's story
        why = (
            f"the NonFiniteGuard stopped the run at epoch {trainer.current_epoch}: the last "
            f"{guard.consecutive} steps had non-finite gradients ({guard.skipped} skipped in all)."
        )
        # no run folder: trainer.log_dir is a collective, and the other processes are not asking now
        print(self.text(trainer, why, None))

    def text(self, trainer: L.Trainer, why: str, folder: str | None) -> str:
        """Why the fit ended, its best epoch, the cap-while-improving advice, where things are."""
        monitor, mode = monitored(trainer)
        lines = [f"Fit ended: {why}"]
        scored = [v for v in self.validations if _finite(v.values.get(monitor))]
        if scored:
            pick = min if mode == "min" else max
            best = pick(scored, key=lambda v: v.values[monitor])
            lines += [f"Best epoch {best.epoch} (by {monitor}):", *_table(best.values)]
            advice = self._still_improving(trainer, best, scored[-1], monitor)
            lines += [advice] if advice else []
        checkpoint = trainer.checkpoint_callback
        if isinstance(checkpoint, ModelCheckpoint) and checkpoint.best_model_path:
            lines.append(f"Best checkpoint: {_shown(checkpoint.best_model_path)}")
        if folder is not None:
            run = _shown(folder)
            tensorboard = _shown(str(Path(sys.executable).parent / "tensorboard"))
            lines.append(f"Run folder:      {run}")
            lines.append(f"TensorBoard:     {tensorboard} --logdir {run} --host 127.0.0.1")
        return "\n".join(lines)

    def _still_improving(self, trainer: L.Trainer, best: _Validation, last: _Validation, monitor: str) -> str:
        """One sentence when the run ended on its cap while the monitored value was still improving."""
        cap = _cap(trainer)
        if cap is None or trainer.should_stop or last.epoch - best.epoch >= self.recent_epochs:
            return ""
        name, value = cap
        return (
            f"{monitor} was still improving when the run reached trainer.{name}={value} (best at epoch "
            f"{best.epoch} of {last.epoch}): a longer run may do better; raise trainer.{name} "
            f"(--trainer.{name}={value * 2})."
        )


def ending(trainer: L.Trainer) -> str:
    """Why a fit that ended without an error ended, in one sentence."""
    stopper = trainer.early_stopping_callback
    epochs = trainer.current_epoch  # epochs run: Lightning counts the last one once it ended
    if isinstance(stopper, EarlyStopping) and stopper.stopped_epoch > 0:
        reason = (
            f"{stopper.monitor} did not improve for {stopper.wait_count} validations "
            f"(patience {stopper.patience})"
            if stopper.wait_count >= stopper.patience
            else f"{stopper.monitor} crossed a threshold or was not finite (EarlyStopping's settings)"
        )
        return f"early stopping at epoch {stopper.stopped_epoch} (max_epochs {trainer.max_epochs}): {reason}."
    cap = _cap(trainer)
    if cap is not None:
        return f"reached trainer.{cap[0]}={cap[1]} after {epochs} epochs ({trainer.global_step} steps)."
    if trainer.should_stop:
        return (
            f"stopped on request after {epochs} epochs (a stop signal or a callback set trainer.should_stop)."
        )
    return f"after {epochs} epochs ({trainer.global_step} steps)."


def _table(values: Mapping[str, float]) -> list[str]:
    """The best epoch's validation values; beside the baselines' in columns when any were logged."""
    baselines: dict[str, dict[str, float]] = {}
    for name, value in values.items():
        if (found := TAG.fullmatch(name)) and found[1] == "val":  # val/acc_hgb
            baselines.setdefault(found[3], {})[f"val/{found[2]}"] = value
    own = {
        n: v
        for n, v in values.items()
        if n.startswith("val/") and n.removeprefix("val/") not in SPEED and not TAG.fullmatch(n)
    }
    if not baselines:
        return ["  " + "   ".join(f"{name} {_number(value)}" for name, value in own.items())]
    models = ["net", *baselines]
    rows = [*own, *sorted({m for b in baselines.values() for m in b} - set(own))]
    width = max(len(row) for row in rows)
    table = [" " * (width + 2) + "".join(f"{model:>10}" for model in models)]
    for row in rows:
        cells = [own.get(row), *(baselines[model].get(row) for model in baselines)]
        table.append(
            f"  {row:<{width}}" + "".join(f"{_number(c) if c is not None else '-':>10}" for c in cells)
        )
    return table


def _number(value: float) -> str:
    return f"{value:.4g}"


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _cap(trainer: L.Trainer) -> tuple[str, int] | None:
    """``("max_epochs", 60)`` or ``("max_steps", n)`` when the fit ran to that cap; None otherwise."""
    max_steps = trainer.max_steps
    if max_steps is not None and max_steps >= 0 and trainer.global_step >= max_steps:
        return "max_steps", max_steps
    max_epochs = trainer.max_epochs
    if max_epochs is not None and max_epochs >= 0 and trainer.current_epoch >= max_epochs:
        return "max_epochs", max_epochs
    return None


def _shown(path: str | os.PathLike[str]) -> str:
    """A path relative to the working folder when it is inside it (shorter, and what a person types)."""
    absolute = Path(path).resolve()
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


def _callbacks(trainer: L.Trainer) -> list[Callback]:
    # Trainer.callbacks is public and documented, but assigned in a connector without being declared
    return list(trainer.callbacks)  # type: ignore[attr-defined]
