"""The loop doctor as a callback: watches the first optimizer steps of any run for the silent training bugs.

Switch it on in a config by appending it to the Trainer's callbacks (``+`` keeps the ones already there)::

    trainer:
      callbacks+:
        - class_path: src.apps.doctor.Doctor

or on the command line with ``--trainer.callbacks+=src.apps.doctor.Doctor``. It prints one line per
finding (:class:`src.apps.doctor.Finding`) as it sees it, and keeps them in ``findings``. ``make doctor``
runs it in a short probe of the configured run, together with the one check that needs a probe of its own
(overfitting one batch); see :mod:`src.apps.doctor`.

Everything it does per step is bookkeeping on the host plus, while it watches, one gradient norm and one
loss read back from the device; after ``steps`` optimizer steps it stops watching. It keeps a copy of the
trainable weights from the start of training to the end of its watch, to see whether they moved. Its own
forward passes run in eval mode on forked random-number generators, so a run draws the same random
numbers, and BatchNorm keeps the same statistics, with or without it.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from time import perf_counter
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning_utilities.core.apply_func import apply_to_collection
from typing_extensions import override

from examples.manual import ManualClassifier
from src.apps.doctor import data as data_checks
from src.apps.doctor import model as model_checks
from src.apps.doctor.findings import Finding
from src.apps.doctor.schedule import check_schedule, scheduler_steps
from src.errors import UserInputError
from src.extras.tables import TabularDataModule
from src.models import BaseTask, Classifier

#: the kernel's account of this thread's time (Linux): nanoseconds on a CPU, waiting for one, time slices
SCHEDSTAT = Path("/proc/thread-self/schedstat")


def waited_for_cpu() -> float:
    """Seconds this thread has spent ready to run but waiting for a CPU (other processes had it), as the
    kernel counts them; 0.0 where it does not say."""
    try:
        return int(SCHEDSTAT.read_text().split()[1]) * 1e-9
    except (OSError, ValueError, IndexError):
        return 0.0


def clock() -> float:
    """The wall clock (seconds) less the time this thread waited for a CPU that other processes held: on a
    busy machine, time preempted between two steps is no wait for data, nor time a step took."""
    return perf_counter() - waited_for_cpu()


class Doctor(Callback):
    """Checks the model, data and schedule of the run it is in, and watches its first optimizer steps.

    Args:
        steps: Optimizer steps to watch; the findings about training follow them (or the end of a
            shorter run).
        report: Print each finding as one line when it is found (on the first process only).
    """

    def __init__(self, steps: int = 20, report: bool = True) -> None:
        if steps < 1:
            raise UserInputError(f"Doctor steps={steps} must be at least 1.")
        self.steps = steps
        self.report = report
        self.findings: list[Finding] = []
        self._watching = True
        self._start: dict[str, torch.Tensor] = {}
        self._optimizer_steps = 0
        self._losses: list[float] = []
        self._norms: list[float] = []
        self._clipped: list[bool] = []
        self._data_time = self._step_time = 0.0
        self._timed_steps = 0
        self._mark: float | None = None
        self._timing = False
        self._validation_seen = False
        self._first_batch_seen = False
        self._labels_checked = False

    def _add(self, trainer: L.Trainer, *findings: Finding | None) -> None:
        for finding in findings:
            if finding is None or any(f.id == finding.id for f in self.findings):
                continue
            self.findings.append(finding)
            if self.report and trainer.is_global_zero:
                print(finding.line())

    # -- before training -------------------------------------------------------------------------------

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # before configure_optimizers, which fails on some of what these find
        if stage != "fit":
            return
        self._add(trainer, model_checks.layers_in_python_lists(pl_module), model_checks.frozen(pl_module))
        datamodule = trainer.datamodule  # type: ignore[attr-defined]
        if isinstance(datamodule, TabularDataModule) and trainer.is_global_zero:
            self._add(trainer, *data_checks.check_data(datamodule, weighs_classes=_weighs_classes(pl_module)))

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # before the sanity check's validation, where labels out of range would already fail
        datamodule = trainer.datamodule  # type: ignore[attr-defined]
        if not isinstance(datamodule, TabularDataModule):
            return
        x, labels = datamodule.dataset("train").tensors
        if torch.is_floating_point(labels) or labels.dim() != 1:  # class ids only, not K labels or values
            return
        with _aside(pl_module):
            output = _forward(trainer, pl_module, x[:8].to(pl_module.device))
        if output is not None and output.dim() == 2:
            self._labels_checked = True
            self._add(trainer, data_checks.labels_out_of_range(labels, output.shape[-1]))

    @override
    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._validation_seen:
            return
        self._validation_seen = True
        # after the step ran, so a .train() call inside validation code shows too
        layers = [
            name
            for name, module in pl_module.named_modules()
            if module.training and isinstance(module, model_checks.MODE_DEPENDENT)
        ]
        stochastic = False
        x = _inputs(batch)
        if not layers and x is not None:
            # two passes in eval mode must agree; functional dropout without training=... does not
            with _aside(pl_module):
                first, second = _forward(trainer, pl_module, x), _forward(trainer, pl_module, x)
            if first is not None and second is not None:
                stochastic = not torch.equal(first.nan_to_num(), second.nan_to_num())  # NaN is NaN
        graphs: list[str] = []
        apply_to_collection(
            outputs,
            torch.Tensor,
            lambda t: graphs.append(f"a {tuple(t.shape)} tensor") if t.requires_grad else None,
        )
        self._add(
            trainer, model_checks.val_train_mode(layers, stochastic), model_checks.val_output_graph(graphs)
        )

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._add(trainer, model_checks.not_in_optimizer(pl_module, trainer.optimizers))
        for config in trainer.lr_scheduler_configs:
            optimizer = config.scheduler.optimizer
            self._add(
                trainer, *check_schedule(optimizer, config, scheduler_steps(trainer, pl_module, config))
            )
        self._start = {
            name: p.detach().clone() for name, p in pl_module.named_parameters() if p.requires_grad
        }

    # -- while watching ---------------------------------------------------------------------------------

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._mark = None  # the wait for an epoch's first batch includes the epoch change (validation)

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._mark = None  # a validation inside an epoch (val_check_interval) is no wait for data

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not self._watching:
            return
        now = clock()
        # timed from the end of one step to the end of the next: an epoch's first step, which waits for
        # the epoch change too (validation, loader start), and the first-batch checks are not
        self._timing = self._mark is not None and self._first_batch_seen
        if self._timing and self._mark is not None:
            self._data_time += now - self._mark
            self._timed_steps += 1
        self._mark = now
        if not self._first_batch_seen:
            self._first_batch_seen = True
            self._first_batch(trainer, pl_module, batch)

    def _first_batch(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any) -> None:
        x = _inputs(batch)
        target = batch[1] if isinstance(batch, list | tuple) and len(batch) > 1 else None
        if x is None or not isinstance(target, torch.Tensor):
            return
        with _aside(pl_module):
            output = _forward(trainer, pl_module, x)
            if output is None:
                return
            # the shipped classifier's loss takes logits, whatever its targets; for any other module,
            # integer targets say classes, and (B, K) targets of 0s and 1s beside a (B, K) output K labels
            labels = (
                output.dim() == 2
                and target.shape == output.shape
                and bool(((target == 0) | (target == 1)).all())
            )
            classification = (
                isinstance(pl_module, Classifier) or not torch.is_floating_point(target) or labels
            )
            if classification:
                self._add(trainer, model_checks.probabilities_into_loss(output.float()))
            if not torch.is_floating_point(target) and output.dim() == 2 and target.dim() == 1:  # class ids
                if not self._labels_checked:
                    self._add(trainer, data_checks.labels_out_of_range(target, output.shape[-1]))
                if int(target.min()) < 0 or int(target.max()) >= output.shape[-1]:
                    return  # the loss would fail on these labels
            if isinstance(pl_module, BaseTask):
                # the task's loss as a function (another module's is inside its training_step): what an
                # all-zero output would score on the same batch
                loss = float(pl_module.loss(output, target))
                expected = float(pl_module.loss(torch.zeros_like(output), target))
                what = (
                    f"an all-zero output (probability 0.5 for each of {output.shape[-1]} labels)"
                    if labels
                    else f"an all-zero output (uniform over {output.shape[-1]} classes)"
                    if classification
                    else "an all-zero output (the training mean)"
                )
                self._add(trainer, model_checks.initial_loss(loss, expected, what))

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if not self._watching:
            return
        if self._optimizer_steps == 0:
            self._add(trainer, model_checks.no_grad(pl_module))
        self._optimizer_steps += 1
        # here the gradients are complete (after accumulation and unscaling) and not yet clipped
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        if not grads:
            return
        norm = float(torch.nn.utils.get_total_norm(grads))
        self._norms.append(norm)
        threshold, algorithm = _clipping(trainer, pl_module)
        if threshold:
            size = float(torch.stack([g.abs().max() for g in grads]).max()) if algorithm == "value" else norm
            self._clipped.append(size > threshold)

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self._watching:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            self._losses.append(float(loss))
        now = clock()
        if self._timing and self._mark is not None:
            self._step_time += now - self._mark
        self._mark = now
        if self._optimizer_steps >= self.steps:
            self._conclude(trainer, pl_module)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._watching:
            self._conclude(trainer, pl_module)

    def _conclude(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._watching = False
        parameters = dict(pl_module.named_parameters())
        moved = sum(_moved(self._start[name], parameters[name].detach()) for name in self._start)
        threshold, _ = _clipping(trainer, pl_module)
        self._add(
            trainer,
            model_checks.not_moving(moved, len(self._start), self._optimizer_steps),
            model_checks.non_finite_from_the_start(self._losses),
            model_checks.exploding(self._norms, self._losses),
            model_checks.clipping_every_step(self._norms, self._clipped, threshold or 0.0),
            model_checks.loader_share(self._data_time, self._step_time, self._timed_steps),
        )
        self._start = {}


def _weighs_classes(pl_module: L.LightningModule) -> bool:
    return isinstance(pl_module, Classifier) and bool(pl_module.hparams["class_weights"])


def _clipping(trainer: L.Trainer, pl_module: L.LightningModule) -> tuple[float | None, str | None]:
    """The clipping threshold and algorithm in force: the Trainer's, or the manual module's own."""
    if isinstance(pl_module, ManualClassifier):
        return pl_module.hparams["gradient_clip_val"], pl_module.hparams["gradient_clip_algorithm"]
    return trainer.gradient_clip_val, trainer.gradient_clip_algorithm


def _moved(before: torch.Tensor, after: torch.Tensor) -> bool:
    """Whether a tensor moved other than by scaling (weight decay with zero gradients only scales it)."""
    change = (after - before).double().flatten()
    if not torch.isfinite(change).all():
        return True  # into NaN or infinity: moved, badly (an exploding norm reports it)
    start = before.double().flatten()
    size = start.norm()
    if size == 0:
        return bool(change.norm() > 0)
    across = change - (change @ start) / size**2 * start  # the part of the change not along the weights
    return bool(across.norm() > model_checks.STILL * size)


def _inputs(batch: Any) -> torch.Tensor | None:
    """The input tensor of an ``(x, y, ...)`` batch."""
    if isinstance(batch, list | tuple) and batch and isinstance(batch[0], torch.Tensor):
        return batch[0]
    return None


def _forward(trainer: L.Trainer, pl_module: L.LightningModule, x: torch.Tensor) -> torch.Tensor | None:
    """The module's output for ``x`` as the loop computes it (precision and all); ``None`` if its
    ``forward`` takes something else."""
    precision = trainer.precision_plugin
    try:
        with precision.forward_context():
            output = pl_module(precision.convert_input(x))
    except (TypeError, RuntimeError):
        return None
    return output if isinstance(output, torch.Tensor) else None


@contextmanager
def _aside(pl_module: L.LightningModule) -> Iterator[None]:
    """Forward passes that leave no trace on the run: in eval mode (BatchNorm keeps its statistics), without
    a graph, on forked random-number generators (the run draws the same numbers); modes restored after."""
    modes = {module: module.training for module in pl_module.modules()}
    device = pl_module.device
    devices = [device.index or 0] if device.type == "cuda" else []
    pl_module.eval()
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            yield
    finally:
        for module, training in modes.items():
            module.training = training
