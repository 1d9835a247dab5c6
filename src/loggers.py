"""Lightning's TensorBoard logger, writing each stage's values as a run of its own, as Keras does.

TensorBoard colours lines by run, and draws one chart per tag: ``train/loss`` and ``val/loss`` written into
one run are two charts of one colour. Written as the tag ``metrics/loss`` of two runs, ``<version>/train``
and ``<version>/validation``, they are one chart with two colours and a legend, the convention of Keras'
TensorBoard callback. What the run folder then holds:

- ``<version>/`` itself: the run's config and environment (Text tab), its HParams session and the best
  epoch's values and figures (``summary/…``), and whatever is written straight to ``experiment``;
- ``<version>/train``, ``<version>/validation``, ``<version>/test``: the values logged under ``train/``,
  ``val/`` and ``test/``, each under the rest of its name (``val/loss`` → ``metrics/loss``, a name without
  a group of its own going into the ``metrics`` group; ``train/optimization/lr`` → ``optimization/lr``).

Names without one of those stages (``epoch_loss``, ``my/value``) go to ``<version>/`` as they are.
"""

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch import loggers
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_only
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.distributed.tensor import DTensor
from torch.utils.tensorboard import SummaryWriter
from typing_extensions import override

#: the run, inside the version folder, that each stage's values are written to
STAGE_RUNS = {"train": "train", "val": "validation", "test": "test"}
#: the Time Series group of a value whose name has no group of its own: the first one TensorBoard opens
GROUP = "metrics"


def run_and_tag(name: str) -> tuple[str, str]:
    """Where a logged value goes: ``("validation", "metrics/loss")`` for ``val/loss``; ``("", name)`` (the
    version folder itself) for a name without a stage."""
    stage, _, rest = name.partition("/")
    if stage not in STAGE_RUNS or not rest:
        return "", name
    return STAGE_RUNS[stage], rest if "/" in rest else f"{GROUP}/{rest}"


def logged_name(run: str, tag: str) -> str:
    """The name a value was logged under, from its run and tag: the inverse of :func:`run_and_tag`."""
    stage = next((s for s, r in STAGE_RUNS.items() if r == run), None)
    if stage is None:
        return tag
    return f"{stage}/{tag.removeprefix(GROUP + '/')}"


def read_scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of a run folder and its stage runs, by the name it was logged under: ``(step, value)``
    pairs, as TensorBoard reads them (``{"val/loss": [(19, 0.41), ...], "train/optimization/lr": ...}``)."""
    found: dict[str, list[tuple[int, float]]] = {}
    for run in ["", *STAGE_RUNS.values()]:
        folder = Path(log_dir) / run
        if not folder.is_dir():
            continue
        events = EventAccumulator(str(folder), size_guidance={"scalars": 0}).Reload()
        for tag in events.Tags()["scalars"]:
            found[logged_name(run, tag)] = [(e.step, e.value) for e in events.Scalars(tag)]
    return found


class TensorBoardLogger(loggers.TensorBoardLogger):
    """``lightning.pytorch.loggers.TensorBoardLogger`` with a run per stage, whose ``save()`` does its work
    at most once a second.

    ``log_metrics`` writes ``<stage>/<name>`` values into the stage's run (:data:`STAGE_RUNS`, see the module
    docstring); ``experiment`` is the version folder's own writer, as Lightning's is.

    Lightning calls ``save()`` after every ``log_metrics``: each call flushes the event files and asks the
    filesystem (through fsspec) whether ``hparams.yaml`` exists, about 5 ms on a CPU machine. Here a call
    within ``save_every_s`` seconds of the last one that ran is skipped, so a value may wait in its event
    file's buffer until a later save (at the latest the writer's own flush every ``flush_secs``) before a
    live TensorBoard shows it; the run's end (``finalize``) flushes and saves as Lightning's does.

    Args:
        save_every_s: Seconds between two saves that run; 0 saves on every call, as Lightning's does.
        **kwargs: ``TensorBoardLogger``'s (``save_dir``, ``name``, ``version``, ``default_hp_metric`` ...).
    """

    def __init__(self, *args: object, save_every_s: float = 1.0, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.save_every_s = save_every_s
        self._saved_at: float | None = None
        self._runs: dict[str, SummaryWriter] = {}

    def run_writer(self, run: str) -> SummaryWriter:
        """The writer of one of the version folder's runs (``"train"``, ``"validation"``, ``"test"``);
        ``""``: the folder's own, ``experiment``."""
        if not run:
            return self.experiment
        if run not in self._runs:
            self._runs[run] = SummaryWriter(str(Path(self.log_dir) / run))
        return self._runs[run]

    @override
    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        for name, value in metrics.items():
            if name == "epoch":  # Lightning's epoch counter: the x axis says it already
                continue
            run, tag = run_and_tag(name)
            number = value.item() if isinstance(value, torch.Tensor) else float(value)
            self.run_writer(run).add_scalar(tag, number, step)

    @override
    @rank_zero_only
    def save(self) -> None:
        now = time.monotonic()
        if self._saved_at is not None and now - self._saved_at < self.save_every_s:
            return
        self._saved_at = now
        for writer in self._runs.values():
            writer.flush()
        super().save()

    @override
    @rank_zero_only
    def finalize(self, status: str) -> None:
        self._saved_at = None  # the last save always runs
        super().finalize(status)
        for writer in self._runs.values():
            writer.close()
        # a test after the fit, in the same process, opens them again
        self._runs = {}


def tensorboard_writer(trainer: L.Trainer, run: str = "") -> SummaryWriter | None:
    """The TensorBoard writer of one of the run folder's runs (``""``: the folder's own, ``"validation"`` …)
    on the process that writes (global rank 0); None elsewhere, or without a TensorBoard logger. A logger
    without runs per stage (Lightning's own) gives its one writer for every run."""
    if not trainer.is_global_zero:
        return None
    logger = next((lg for lg in trainer.loggers if isinstance(lg, loggers.TensorBoardLogger)), None)
    if isinstance(logger, TensorBoardLogger):
        return logger.run_writer(run)
    return logger.experiment if logger is not None else None


def logging_step(trainer: L.Trainer) -> int:
    """The step Lightning gives the values logged after a training step (in validation, at an epoch's end),
    so images line up with them: the index of the last optimizer step.

    Lightning's own counter is private; the public ``global_step`` (optimizer steps taken) is one more
    under automatic optimization with one optimizer. Under manual optimization it counts optimizer
    steps, not batches, so with accumulation the images sit at earlier steps than the scalars.
    """
    return max(trainer.global_step - 1, 0)


def monitored(trainer: L.Trainer) -> tuple[str, str]:
    """The value the best checkpoint is chosen by, and whether lower or higher is better (``val/loss``,
    lower, when no checkpoint or early stopping monitors one)."""
    checkpoint = trainer.checkpoint_callback
    if isinstance(checkpoint, ModelCheckpoint) and checkpoint.monitor:
        return checkpoint.monitor, checkpoint.mode
    stopper = trainer.early_stopping_callback
    if isinstance(stopper, EarlyStopping):
        return stopper.monitor, stopper.mode
    return "val/loss", "min"


def last_by_cap(trainer: L.Trainer) -> bool:
    """Whether the validation under way is the fit's last by its ``max_epochs`` or ``max_steps`` cap (or a
    stop request), or a validation of its own (``validate``)."""
    if trainer.state.fn != "fit" or trainer.should_stop:
        return True
    epochs, steps = trainer.max_epochs, trainer.max_steps
    by_epochs = epochs is not None and epochs >= 0 and trainer.current_epoch + 1 >= epochs
    return by_epochs or (steps is not None and steps >= 0 and trainer.global_step >= steps)


class BestEpoch:
    """What a callback kept of the best validation epoch so far, by the monitored value (:func:`monitored`),
    to draw at the fit's end; the latest epoch's while the monitored value is not logged.

    ``offer(trainer, kept)`` in ``on_validation_end``, where ``trainer.callback_metrics`` holds the epoch's
    values; ``kept`` is then the best epoch's (``None`` before the first offer).
    """

    def __init__(self) -> None:
        self.kept: Any = None
        self.value: float | None = None
        self.epoch: int | None = None

    def offer(self, trainer: L.Trainer, kept: Any) -> None:
        """Keep ``kept`` when this epoch is the best so far."""
        monitor, mode = monitored(trainer)
        logged = trainer.callback_metrics.get(monitor)
        value = float(logged.item()) if isinstance(logged, torch.Tensor) and logged.numel() == 1 else None
        if value is None or not math.isfinite(value):
            if self.value is None:
                self.kept, self.epoch = kept, trainer.current_epoch
            return
        if self.value is None or (value < self.value if mode == "min" else value > self.value):
            self.kept, self.value, self.epoch = kept, value, trainer.current_epoch

    def title(self, trainer: L.Trainer) -> str:
        """``best epoch 12 (val/loss 0.0812)``, or ``last epoch 12`` without a monitored value."""
        if self.value is None:
            return f"last epoch {self.epoch}"
        return f"best epoch {self.epoch} ({monitored(trainer)[0]} {self.value:.4g})"


def step_loss(trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any) -> torch.Tensor | None:
    """The loss ``training_step`` returned, from the ``outputs`` the batch-end hooks get; ``None`` when
    it returned no single number."""
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
        return None
    # Lightning hands on the automatic loop's loss divided by accumulate_grad_batches
    return loss * trainer.accumulate_grad_batches if pl_module.automatic_optimization else loss


def write(
    trainer: L.Trainer, values: Mapping[str, torch.Tensor | float], step: int, epoch: int | None = None
) -> None:
    """Write scalar values to every logger at ``step``, with the ``epoch`` (by default the current one), as
    Lightning writes logged ones; the tensors are read back from the device together, once."""
    tensors = {name: value for name, value in values.items() if isinstance(value, torch.Tensor)}
    numbers = {name: float(value) for name, value in values.items() if name not in tensors}
    if tensors:
        full = [t.full_tensor() if isinstance(t, DTensor) else t for t in tensors.values()]
        read = torch.stack([t.detach().reshape(()).to(full[0].device, torch.float32) for t in full]).tolist()
        numbers.update(zip(tensors, read, strict=True))
    for logger in trainer.loggers:
        logger.log_metrics({**numbers, "epoch": trainer.current_epoch if epoch is None else epoch}, step=step)
        logger.save()
