"""Lightning's progress bar, refreshed on the steps the loggers receive instead of on every step."""

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar
from typing_extensions import override


class ProgressBar(TQDMProgressBar):
    """``TQDMProgressBar`` whose refresh rate follows ``trainer.log_every_n_steps`` unless one is given.

    Every refresh reads the bar's metrics back from Lightning's result collection (and from the device);
    on every step that costs a small net about a fifth of its speed. The loss the bar shows is logged
    every ``log_every_n_steps`` steps, so refreshing more often shows nothing new.

    Args:
        refresh_rate: Batches between refreshes; ``None`` follows ``trainer.log_every_n_steps``.
        process_position: As ``TQDMProgressBar``'s.
        leave: As ``TQDMProgressBar``'s.
    """

    def __init__(
        self, refresh_rate: int | None = None, process_position: int = 0, leave: bool = False
    ) -> None:
        given = 1 if refresh_rate is None else refresh_rate  # 0, as in Lightning, turns the bar off
        super().__init__(refresh_rate=given, process_position=process_position, leave=leave)
        self._follow_logging = refresh_rate is None
        self._every_n_steps = 1

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
