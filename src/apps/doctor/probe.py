"""The doctor's probes: short runs of copies of the configured model, with the run's own settings.

:func:`examine` runs two, on copies (the model given is left untouched):

1. the configured run itself, cut off after a few optimizer steps: the same loader, precision, clipping,
   accumulation, run length (so the scheduler is built as in the real run) and one validation batch,
   watched by the :class:`~src.apps.doctor.Doctor` callback;
2. one fixed training batch (its first rows, up to 128 targets), a few dozen steps, at the optimizer's own
   LR (a :class:`~src.models.BaseTask`'s schedule is left out, so a warmup does not hide the answer): its
   loss must fall well below that of the best prediction that ignores the input.
"""

import copy
import warnings
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, Dataset
from typing_extensions import override

from src.apps.doctor import model as model_checks
from src.apps.doctor.callback import Doctor, _aside, _forward
from src.apps.doctor.findings import Finding
from src.data.loading import keep_batch
from src.models import BaseTask

#: optimizer steps of the configured run that the doctor watches
WATCH_STEPS = 16
#: steps on one fixed batch
OVERFIT_STEPS = 40
#: targets in that batch at most: a sequence model's batch of B rows of T targets each is cut to its first
#: rows (a table's or an image folder's batch, one target a row, stays whole up to this many rows)
OVERFIT_TARGETS = 128


class _StopAfter(Callback):
    """Ends ``fit`` after ``steps`` optimizer steps, without changing the run length the model sees
    (``max_steps`` would: schedules that span the run are sized from it)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step >= self.steps:
            trainer.should_stop = True


class _Losses(Callback):
    """The training loss of each step, and (a task with a ``loss`` function) the loss of the best
    prediction of the batch that ignores the input."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.rows = 0
        self.targets = 0
        self.input_free: float | None = None

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if batch_idx or not isinstance(pl_module, BaseTask) or not isinstance(batch, list | tuple):
            return
        x, target = batch[0], batch[1]
        self.rows, self.targets = len(target), target.numel()
        with _aside(pl_module):
            output = _forward(trainer, pl_module, x)
        if output is not None:
            self.input_free = input_free_loss(pl_module.loss, output.float(), target)

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            self.losses.append(float(loss))
        self.rows = len(batch[1]) if isinstance(batch, list | tuple) and len(batch) > 1 else 0


def input_free_loss(
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], output: torch.Tensor, target: torch.Tensor
) -> float:
    """The loss of the best prediction of ``target`` that ignores the input: one output vector, the same
    for every row (and every position of a sequence), fitted to the batch with the task's own ``loss``
    (convex in it for cross-entropy, squared error and Huber, label smoothing and class weights
    included): the class frequencies of the batch, or its mean. A model whose output does not depend on
    its input can do no better on that batch, however long it trains."""
    constant = torch.zeros(output.shape[-1], device=output.device, requires_grad=True)
    search = torch.optim.LBFGS([constant], max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        search.zero_grad()
        value = loss(constant.expand_as(output), target)
        value.backward()
        return value

    with torch.enable_grad():
        search.step(closure)
    with torch.no_grad():
        return float(loss(constant.expand_as(output), target))


def _settings(trainer: L.Trainer) -> dict[str, Any]:
    """What the probes copy from the configured Trainer: the device, numerics and the loop's rules."""
    return {
        "accelerator": trainer.accelerator,
        "devices": 1,
        "precision": trainer.precision,
        "gradient_clip_val": trainer.gradient_clip_val,
        "gradient_clip_algorithm": trainer.gradient_clip_algorithm,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }


def watch_the_run(
    model: L.LightningModule, datamodule: L.LightningDataModule, trainer: L.Trainer, steps: int
) -> list[Finding]:
    """The configured run, cut off after ``steps`` optimizer steps, watched by the doctor."""
    doctor = Doctor(steps=steps, report=False)
    probe = L.Trainer(
        **_settings(trainer),
        max_epochs=trainer.max_epochs,
        max_steps=trainer.max_steps,
        limit_train_batches=trainer.limit_train_batches,
        accumulate_grad_batches=trainer.accumulate_grad_batches,
        limit_val_batches=1,
        num_sanity_val_steps=1,  # one validation batch, before training: enough to see its mode and outputs
        inference_mode=False,  # no_grad instead, so validation code that turns gradients back on shows
        callbacks=[doctor, _StopAfter(steps)],
    )
    try:
        probe.fit(copy_of(model), datamodule=datamodule)
    except Exception as err:  # the user's code failing is itself a finding, beside those made before
        return [*doctor.findings, _failed("the watched run", err)]
    return doctor.findings


class OneBatch(L.LightningDataModule):
    """The configured DataModule with its training loader replaced by one fixed batch, ``steps`` times.

    All the steps make one epoch. (Lightning's ``overfit_batches=1`` makes each step an epoch of its own,
    paying an epoch's metric computation and loader start at every step.) Anything else, such as the
    class weights or target statistics a task reads in ``setup``, comes from the configured DataModule.
    """

    def __init__(self, data: L.LightningDataModule, steps: int) -> None:
        super().__init__()
        self.data = data
        self.steps = steps

    def __getattr__(self, name: str) -> Any:
        # only for what this class lacks: the configured DataModule's own methods and properties
        if name == "data":
            raise AttributeError(name)
        return getattr(self.data, name)

    @override
    def setup(self, stage: str) -> None:
        self.data.setup(stage)

    @override
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # a hook of the base class, so __getattr__ never reaches the configured one: what it makes of a
        # batch on the device (an image DataModule's float conversion and normalization) is the net's input
        return self.data.on_after_batch_transfer(batch, dataloader_idx)

    @override
    def train_dataloader(self) -> DataLoader:
        batch = _at_most(next(iter(self.data.train_dataloader())), OVERFIT_TARGETS)
        # batch_size=None: each item is a whole batch already
        return DataLoader(_Repeated(batch, self.steps), batch_size=None, collate_fn=keep_batch)


def _at_most(batch: Any, targets: int) -> Any:
    """The first rows of an ``(x, y, ...)`` batch that hold ``targets`` targets at most (one row at least).
    A batch of 64 windows of 64 characters has 4096 targets: a language model falls to the characters'
    frequencies in a few steps and needs hundreds more to learn that many by heart; two windows it learns
    as fast as a table model learns its batch of rows."""
    if not isinstance(batch, list | tuple) or len(batch) < 2 or not isinstance(batch[1], torch.Tensor):
        return batch
    per_row = max(1, batch[1][0].numel()) if len(batch[1]) else 1
    rows = max(1, targets // per_row)
    return type(batch)(t[:rows] if isinstance(t, torch.Tensor) else t for t in batch)


class _Repeated(Dataset[Any]):
    """One item, ``times`` times."""

    def __init__(self, item: Any, times: int) -> None:
        self.item = item
        self.times = times

    def __len__(self) -> int:
        return self.times

    def __getitem__(self, index: int) -> Any:
        return self.item


def copy_of(model: L.LightningModule) -> L.LightningModule:
    """A copy to train without touching ``model``: its tensors copied, its factories (the optimizer and
    scheduler callables a config builds, which may hold locks) shared."""
    factories = {
        id(value): value
        for value in vars(model).values()
        if callable(value) and not isinstance(value, torch.nn.Module)
    }
    return copy.deepcopy(model, memo=factories)


def overfit_one_batch(
    model: L.LightningModule, datamodule: L.LightningDataModule, trainer: L.Trainer, steps: int
) -> Finding | None:
    """Train a copy on one fixed training batch for ``steps`` steps and see its loss fall."""
    model = copy_of(model)
    if isinstance(model, BaseTask):
        model.scheduler = None  # at the optimizer's own LR: a warmup or a cycle's start would hide the answer
    losses = _Losses()
    probe = L.Trainer(
        **_settings(trainer), max_epochs=1, limit_val_batches=0, num_sanity_val_steps=0, callbacks=[losses]
    )
    try:
        with warnings.catch_warnings():
            # no validation here on purpose, which Lightning points out
            warnings.filterwarnings("ignore", "You defined a `validation_step` but have no `val_dataloader`")
            probe.fit(model, datamodule=OneBatch(datamodule, steps))
    except Exception as err:
        return _failed("overfitting one batch", err)
    return model_checks.cannot_overfit(losses.losses, losses.rows, losses.targets, losses.input_free)


def _failed(probe: str, err: Exception) -> Finding:
    return Finding(
        "probe-failed",
        f"{probe} stopped with {type(err).__name__}: {err}",
        "the real run would stop there too, or the doctor could not finish its checks",
        "fix the error; `python -m src.cli fit` with the same arguments shows its traceback",
    )


def examine(
    model: L.LightningModule,
    datamodule: L.LightningDataModule,
    trainer: L.Trainer,
    steps: int = WATCH_STEPS,
    overfit_steps: int = OVERFIT_STEPS,
) -> list[Finding]:
    """Every check, on copies of ``model`` with ``trainer``'s settings, each problem once."""
    findings = watch_the_run(model, datamodule, trainer, steps)
    overfit = overfit_one_batch(model, datamodule, trainer, overfit_steps)
    if overfit is not None and all(overfit.id != f.id for f in findings):
        findings.append(overfit)
    return findings
