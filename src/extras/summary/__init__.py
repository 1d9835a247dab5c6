"""What the terminal says about a run: a model summary a person reads, and the story of the fit at its end.

Both read public state only, so they work for any LightningModule: the values it logs
(``trainer.callback_metrics``), the Trainer's checkpoint and early-stopping callbacks, its log folder.
"""

import logging
import math
import os
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from lightning.pytorch.callbacks import ModelSummary as LightningModelSummary
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from typing_extensions import override

from src.errors import UserInputError
from src.extras.loggers import monitored

ROOT = Path(__file__).resolve().parents[3]  # src/extras/<extra>/__init__.py: the repository
#: Lightning's own line at a capped fit's end, which the summary's first line says again
LIGHTNING_ENDING = "`Trainer.fit` stopped:"
#: the terminal width the summary's sentences are wrapped to
WIDTH = 80
#: the share of steps clipped above which the summary says what to try
CLIPPED_MOST = 0.5


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
        if trainer.progress_bar_callback is not None:
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

    Why it ended (the ``max_epochs``/``max_steps`` cap, early stopping and why, a stop request, or the
    sentence of the error that stopped it), the best validation epoch by the best checkpoint's monitored
    value (``val/loss`` when there is no such checkpoint) with its ``val/<name>`` values (values named after
    one of them, ``val/acc_hgb`` beside ``val/acc``, stand beside it in a column of their own), a word when
    the run hit its cap while still improving or when clipping cut most steps' gradients, and where things
    are: the best checkpoint, the run folder and how to look at its curves, by its own loggers
    (:func:`viewers`). Lightning's own
    line about the cap is left out: the first line here says it.

    Args:
        recent_epochs: A best epoch within this many of the last validated one, in a run that ended on
            its cap, counts as "still improving".
        clipped: The logged value holding the fit's share of optimizer steps whose gradients were clipped
            (the dashboard's step values log it); above one half the summary says what to try.
            ``None``: not looked at.
        references: The suffixes of the values that models fitted beside the net log
            (``val/acc_hgb``: ``hgb``), each shown in a column of its own beside the net's value of the
            same name only. ``None``: each suffix found beside a value of the net's.
    """

    def __init__(
        self,
        recent_epochs: int = 3,
        clipped: str | None = "train/optimization/clipped_share",
        references: list[str] | None = None,
    ) -> None:
        if recent_epochs < 1:
            raise UserInputError(f"RunSummary recent_epochs={recent_epochs} must be at least 1.")
        self.recent_epochs = recent_epochs
        self.clipped = clipped
        self.references = references
        self.validations: list[_Validation] = []

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_without_lightnings_ending)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        logging.getLogger("lightning.pytorch.utilities.rank_zero").removeFilter(_without_lightnings_ending)

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
        self.validations.append(_Validation(trainer.current_epoch, _numbers(trainer.callback_metrics)))

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        folder = trainer.log_dir if trainer.loggers else None  # a collective under DDP: every rank asks
        if trainer.is_global_zero:
            print(self.text(trainer, ending(trainer), folder))

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        # a sentence for the user (a NonFiniteGuard that stopped the run, say) is part of a fit's story once
        # it has trained; a refusal before the first step (or outside a fit) is the CLI's one sentence alone,
        # and anything else is a bug's traceback, which the summary would only hide
        if not trainer.is_global_zero or not isinstance(exception, UserInputError):
            return
        if trainer.state.fn != "fit" or trainer.global_step == 0:
            return
        why = f"stopped at epoch {trainer.current_epoch}: {exception}"
        # no run folder: trainer.log_dir is a collective, and the other processes are not asking now
        print(self.text(trainer, why, None))

    def text(self, trainer: L.Trainer, why: str, folder: str | None) -> str:
        """Why the fit ended, its best epoch, the advice, where things are."""
        monitor, mode = monitored(trainer)
        lines = textwrap.wrap(f"Fit ended: {why}", WIDTH)
        scored = [v for v in self.validations if _finite(v.values.get(monitor))]
        if scored:
            pick = min if mode == "min" else max
            best = pick(scored, key=lambda v: v.values[monitor])
            values = _with_references(best.values, self.validations)
            lines += [f"Best epoch {best.epoch} (by {monitor}):", *_table(values, self.references)]
            advice = self._still_improving(trainer, best, scored[-1], monitor)
            lines += textwrap.wrap(advice, WIDTH) if advice else []
        lines += textwrap.wrap(self._clipping(trainer), WIDTH)
        checkpoint = trainer.checkpoint_callback
        best_path = checkpoint.best_model_path if isinstance(checkpoint, ModelCheckpoint) else ""
        if folder is not None:
            lines.append(f"Run folder:      {_shown(folder)}")
            if best_path:  # inside the run folder, as a rule: said once
                lines.append(f"Best checkpoint: {_shown(best_path, within=folder)}")
            lines += viewers(trainer.loggers)
        elif best_path:
            lines.append(f"Best checkpoint: {_shown(best_path)}")
        return "\n".join(lines)

    def _clipping(self, trainer: L.Trainer) -> str:
        """One sentence when clipping cut the gradients of most optimizer steps: the threshold then sets
        every step's length, whatever the gradient says."""
        value = trainer.callback_metrics.get(self.clipped) if self.clipped else None
        if not isinstance(value, torch.Tensor) or value.numel() != 1 or value.item() <= CLIPPED_MOST:
            return ""
        threshold = f"trainer.gradient_clip_val={trainer.gradient_clip_val}"
        return (
            f"Clipping cut the gradients of {value.item():.0%} of the optimizer steps ({threshold}): the "
            "threshold, not the gradient, sets most steps' length. Raise it above the usual gradient norm "
            "(optimization/grad_norm in TensorBoard), or lower the learning rate."
        )

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


def viewers(loggers: Sequence[Logger]) -> list[str]:
    """How to look at the run's curves, one line per logger that writes them: TensorBoard's command for a
    TensorBoard logger (``make tensorboard`` for a run under the repository's ``logs/``, typed from the
    repository; else ``tensorboard --logdir <run>``), the ``metrics.csv`` file of a CSV logger."""
    lines = []
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger) and logger.log_dir:
            if Path(logger.log_dir).resolve().is_relative_to(ROOT / "logs") and Path.cwd().resolve() == ROOT:
                lines.append("TensorBoard:     make tensorboard")
            else:
                lines.append(f"TensorBoard:     tensorboard --logdir {_shown(logger.log_dir)}")
        elif isinstance(logger, CSVLogger) and logger.log_dir:
            lines.append(f"Metrics:         {_shown(Path(logger.log_dir) / 'metrics.csv')}")
    return lines


def _without_lightnings_ending(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(LIGHTNING_ENDING)


def _numbers(logged: Mapping[str, Any]) -> dict[str, float]:
    return {
        name: float(value.item())
        for name, value in logged.items()
        if isinstance(value, torch.Tensor) and value.numel() == 1
    }


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


def _with_references(values: Mapping[str, float], validations: list[_Validation]) -> dict[str, float]:
    """The best epoch's ``values``, and the values named after one of them (``val/acc_hgb`` beside
    ``val/acc``) that it lacks, from the last validation that has them: references fitted beside the
    training (the baselines) are logged from the first epoch after they are in, one value for the run."""
    found = dict(values)
    for validation in reversed(validations):
        for name, value in validation.values.items():
            if name not in found and any(name.startswith(f"{own}_") for own in values):
                found[name] = value
    return found


def _table(values: Mapping[str, float], references: Sequence[str] | None = None) -> list[str]:
    """The best epoch's ``val/<name>`` values (not the grouped ``val/<group>/<name>`` ones); the values of a
    reference model, named ``val/<name>_<reference>`` (``val/acc_hgb``), in a column of their own beside the
    net's value of the same name, and nowhere when the net logs none (a score of another model is never
    the net's). ``references``: the suffixes of such values; ``None``: each suffix that stands beside a
    value of the net's somewhere in ``values`` (``hgb`` of ``val/acc_hgb`` beside ``val/acc``)."""
    named = {n[4:]: v for n, v in values.items() if n.startswith("val/") and "/" not in n[4:]}
    if references is None:
        references = [n[len(stem) + 1 :] for n in named for stem in named if n.startswith(f"{stem}_")]
    own: dict[str, float] = {}
    beside: dict[str, dict[str, float]] = {reference: {} for reference in dict.fromkeys(references)}
    for name, value in named.items():
        reference = max((r for r in beside if name.endswith(f"_{r}")), key=len, default=None)
        if reference is None:
            own[f"val/{name}"] = value
        elif (stem := name[: -len(reference) - 1]) in named:
            beside[reference][f"val/{stem}"] = value
    beside = {reference: scores for reference, scores in beside.items() if scores}
    if not beside:
        return ["  " + "   ".join(f"{name} {_number(value)}" for name, value in own.items())]
    models = ["net", *beside]
    rows = list(own)
    width = max(len(row) for row in rows)
    table = [" " * (width + 2) + "".join(f"{model:>10}" for model in models)]
    for row in rows:
        cells = [own.get(row), *(beside[model].get(row) for model in beside)]
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


def _shown(path: str | os.PathLike[str], within: str | os.PathLike[str] | None = None) -> str:
    """A path relative to ``within`` (by default the working folder) when it is inside it: shorter, and
    what a person types."""
    absolute = Path(path).resolve()
    try:
        return str(absolute.relative_to(Path(within or Path.cwd()).resolve()))
    except ValueError:
        return str(absolute)
