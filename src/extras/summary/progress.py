"""Lightning's progress bar in 80 columns, refreshed on the steps the loggers receive, not every step."""

import math
import sys
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm
from typing_extensions import override

from src.extras.loggers import monitored, step_loss

#: the training bar's line: the values right after the epoch, where they stay whole, then the bar, which
#: shrinks to what is left of the terminal's width
BAR_FORMAT = "{desc}{postfix} |{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}]"


class ProgressBar(TQDMProgressBar):
    """``TQDMProgressBar`` that fits a terminal of 80 columns, whose refresh rate follows
    ``trainer.log_every_n_steps`` unless one is given, and which reads the values it shows only when it
    refreshes.

    At each refresh the bar shows, after the epoch and before the bar itself (so that a narrow terminal
    shortens the bar, never a number): the monitored value (the best checkpoint's, ``val/loss`` by
    default), the logged values named in ``show``, what the module logs with ``prog_bar=True``, and the loss
    ``training_step`` returned for the batch just done (read back from the device then, once per refresh,
    for any LightningModule); each to 4 significant digits, a name not logged left out. The loss is not a
    ``prog_bar`` value: Lightning reads every ``prog_bar`` value back from the device after every step (a
    host sync per step on a GPU), whether the bar shows it or not.

    A training refresh due within ``min_interval_s`` of the last one is left out (the epoch's last batch
    always refreshes): a small net takes hundreds of steps a second, faster than anyone can read a line;
    tqdm's own default is the same interval.

    Args:
        refresh_rate: Batches between refreshes; ``None`` follows ``trainer.log_every_n_steps``.
        process_position: As ``TQDMProgressBar``'s.
        leave: As ``TQDMProgressBar``'s.
        show: Logged values to show after the monitored one (``[val/acc]``).
        min_interval_s: Seconds at least between two refreshes of the training bar within an epoch.
    """

    def __init__(
        self,
        refresh_rate: int | None = None,
        process_position: int = 0,
        leave: bool = False,
        show: list[str] | None = None,
        min_interval_s: float = 0.1,
    ) -> None:
        given = 1 if refresh_rate is None else refresh_rate  # 0, as in Lightning, turns the bar off
        super().__init__(refresh_rate=given, process_position=process_position, leave=leave)
        self._follow_logging = refresh_rate is None
        self._every_n_steps = 1
        self.show = list(show or [])
        self.min_interval_s = min_interval_s
        self._refreshed_at = -math.inf
        self._loss: torch.Tensor | None = None

    @property
    @override
    def refresh_rate(self) -> int:
        return self._every_n_steps if self._follow_logging else super().refresh_rate

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        # public and documented, but assigned in a connector without being declared on the class
        every: int = trainer.log_every_n_steps  # type: ignore[attr-defined]
        self._every_n_steps = max(every, 1)

    @override
    def init_train_tqdm(self) -> Tqdm:
        # Lightning's, with the values before the bar and a description without its colon
        return _TrainBar(
            desc=self.train_description,
            position=(2 * self.process_position),
            disable=self.is_disabled,
            leave=True,
            dynamic_ncols=True,
            file=sys.stdout,
            smoothing=0,
            bar_format=BAR_FORMAT,
        )

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        self._refreshed_at = -math.inf

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.is_enabled:
            return
        done, total = batch_idx + 1, self.train_progress_bar.total
        if done % self.refresh_rate != 0 and done != total:
            return  # no refresh due: Lightning's bar would do nothing either
        now = time.monotonic()
        if done != total and now - self._refreshed_at < self.min_interval_s:
            return
        self._refreshed_at = now
        self._loss = step_loss(trainer, pl_module, outputs)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    @override
    def get_metrics(
        self, trainer: L.Trainer, pl_module: L.LightningModule
    ) -> dict[str, int | str | float | dict[str, float]]:
        # the monitored value first, Lightning's version number (v_num) left out: it is in the run folder
        own = {k: v for k, v in super().get_metrics(trainer, pl_module).items() if k != "v_num"}
        names = list(dict.fromkeys([monitored(trainer)[0], *self.show]))
        metrics: dict[str, int | str | float | dict[str, float]] = {}
        for name in names:
            value = trainer.callback_metrics.get(name)
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                metrics[name] = _short(value.item())
        metrics.update({k: _short(v) if isinstance(v, float) else v for k, v in own.items()})
        if self._loss is not None:
            metrics["loss"] = _short(self._loss.item())
        return metrics


class _TrainBar(Tqdm):
    """ "Epoch 3, val/loss=0.08, loss=0.05 |███ |": tqdm puts a comma before the values, so the
    description ends without the colon tqdm gives it."""

    @override
    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.set_description_str(desc, refresh)


def _short(value: float) -> str:
    """4 significant digits: ``0.04481``, ``12.35``, ``1.234e+05``."""
    return f"{value:.4g}"
