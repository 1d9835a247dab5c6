"""Lightning's progress bar, refreshed on the steps the loggers receive instead of on every step."""

import math
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from typing_extensions import override

from src.callbacks.steps import step_loss

#: the values the bar shows by default, when logged: validation loss and the shipped tasks' main metrics
SHOW = ("val/loss", "val/acc", "val/rmse")


class ProgressBar(TQDMProgressBar):
    """``TQDMProgressBar`` whose refresh rate follows ``trainer.log_every_n_steps`` unless one is given,
    and which reads the values it shows only when it refreshes.

    At each refresh the bar shows the loss ``training_step`` returned for the batch just done (read back
    from the device then, once per refresh, for any LightningModule), and the logged values named in
    ``show`` from ``trainer.callback_metrics`` (the latest validation's loss and main metric: ``val/acc``
    for the classifier, ``val/rmse`` for the regressor; a name not logged is left out). The loss is not a
    ``prog_bar`` value: Lightning reads every ``prog_bar`` value back from the device after every step
    (a host sync per step on a GPU), whether the bar shows it or not.

    A training refresh due within ``min_interval_s`` of the last one is left out (the epoch's last batch
    always refreshes): a small net takes hundreds of steps a second, and each refresh (formatting and
    writing the line) costs about 0.3 ms, more than anyone can read at that rate. tqdm's own default
    is the same 0.1 s.

    Args:
        refresh_rate: Batches between refreshes; ``None`` follows ``trainer.log_every_n_steps``.
        process_position: As ``TQDMProgressBar``'s.
        leave: As ``TQDMProgressBar``'s.
        show: Logged values to show beside the loss and what the module logs with ``prog_bar=True``.
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
        self.show = list(SHOW) if show is None else list(show)
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
        metrics = super().get_metrics(trainer, pl_module)
        if self._loss is not None:
            metrics["loss"] = self._loss.item()
        for name in self.show:
            value = trainer.callback_metrics.get(name)
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                metrics[name] = value.item()
        return metrics
