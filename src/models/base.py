"""The base task: one net, one shared step for train/val/test, injected optimizer and scheduler."""

import functools
import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, Literal, Self

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.plugins.precision import Precision
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from torchmetrics import MeanMetric, MetricCollection
from typing_extensions import override

from src.checkpoints import check_names, load_checkpoint
from src.errors import UserInputError
from src.nets import MLP
from src.nets.mlp import Activation

Stage = Literal["train", "val", "test"]
STAGES: tuple[Stage, ...] = ("train", "val", "test")
DEFAULT_OPTIMIZER = functools.partial(torch.optim.AdamW, lr=1e-3)
#: training batches whose metric inputs the train metrics take in one update
METRIC_BATCHES = 32
#: attributes set on every step that are never parameters, buffers or modules
_PLAIN_PER_STEP = frozenset({"_current_fx_name", "grad_norm"})


class BaseTask(L.LightningModule, ABC):
    """What the classifier and the regressor share; subclasses define the loss, metrics and predictions.

    ``build_metrics``, ``loss``, ``metric_inputs`` and ``predict_step`` are abstract: a subclass that
    leaves one out cannot be instantiated (``TypeError`` naming the missing hooks).

    Args:
        in_features: Input width; linked from the DataModule by the CLI, never typed by hand.
        out_features: Output width (class count, or 1 for regression); linked from the DataModule.
        hidden_sizes: Hidden layer widths of the MLP.
        activation: Activation of the MLP (``relu``, ``gelu``, ``silu``, ``tanh``, ``leaky_relu``).
        dropout: Dropout after each hidden activation.
        batch_norm: BatchNorm after each hidden linear layer.
        optimizer: Builds the optimizer from the parameters; chosen in YAML (``class_path`` + ``init_args``).
            ``None`` means ``AdamW(lr=1e-3)``. (No class default here on purpose: the parser would carry a
            default class's ``init_args``, say AdamW's ``weight_decay``, over to the class a config names.)
        scheduler: Builds the LR scheduler from the optimizer; ``None`` keeps the LR constant.
        scheduler_interval: ``epoch`` or ``step``: when Lightning steps the scheduler. Per-step schedules
            (warmup, OneCycleLR) need ``step``; epoch schedules stepped per batch decay far too fast.
        scheduler_monitor: The logged metric a ``ReduceLROnPlateau`` watches.
        compile_net: Compile the net with ``torch.compile`` (the net only: ``self.log`` does not compile).
        activation_checkpointing: Recompute the MLP's hidden activations in backward instead of storing them.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        hidden_sizes: list[int] | None = None,
        activation: Activation = "relu",
        dropout: float = 0.0,
        batch_norm: bool = False,
        optimizer: OptimizerCallable | None = None,
        scheduler: LRSchedulerCallable | None = None,
        scheduler_interval: Literal["epoch", "step"] = "epoch",
        scheduler_monitor: str = "val/loss",
        compile_net: bool = False,
        activation_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        # primitives only, so checkpoints load with torch.load(weights_only=True); the optimizer and
        # scheduler are rebuilt from the config, which the CLI saves beside the checkpoints
        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        if not 0.0 <= dropout < 1.0:
            raise UserInputError(f"model.init_args.dropout={dropout} must lie in [0, 1).")
        if hidden_sizes is not None and any(size < 1 for size in hidden_sizes):
            raise UserInputError(
                f"model.init_args.hidden_sizes={hidden_sizes}: every width must be at least 1."
            )
        self.check_shapes()
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.net = self.build_net()
        if compile_net:
            # in place: the state_dict keeps its keys, so checkpoints load with or without compiling
            self.net.compile()
        # one collection per stage, cloned with a prefix: `train/acc`, `val/acc`, `test/acc`
        # (attributes, not a ModuleDict: "train" is taken by nn.Module.train)
        metrics = self.build_metrics()
        for stage in STAGES:
            setattr(self, f"{stage}_metrics", metrics.clone(prefix=f"{stage}/"))
            # epoch loss as a metric: averaged over samples, reduced across processes once per epoch
            # nan_strategy="ignore": a step whose loss is NaN (NonFiniteGuard skips it) is left out of the
            # epoch's mean instead of warning on every such step ("disable" would also drop the weights)
            setattr(self, f"{stage}_loss", MeanMetric(nan_strategy="ignore"))
        # the train loss and metric inputs of the batches since their last update: (loss, rows, preds, target)
        self._metric_inputs: list[tuple[torch.Tensor, int, torch.Tensor, torch.Tensor]] = []
        # the stages whose epoch metrics were handed to self.log this epoch
        self._logged_stages: set[Stage] = set()
        #: the latest training step values written to the loggers (``train/loss_step`` ...), as numbers
        self.step_values: dict[str, float] = {}
        # this optimizer step's values, written once it has its gradients: (global_step, values)
        self._pending_step_values: tuple[int, dict[str, torch.Tensor | float]] | None = None
        #: the total L2 norm of this optimizer step's gradients over :meth:`parameters`, in their order,
        #: before clipping, when a callback has computed it (``NonFiniteGuard`` does): clipping and the
        #: logged ``train/grad_norm`` use it instead of computing it again; read once, in
        #: :meth:`configure_gradient_clipping`
        self.grad_norm: torch.Tensor | None = None

    @override
    def __setattr__(self, name: str, value: Any) -> None:
        # Lightning assigns _current_fx_name (a str or None, its own attribute) before and after each of
        # the ~50 hook calls of a training step, and grad_norm changes every step. nn.Module.__setattr__
        # first asks whether the value is a Parameter, Buffer or Module (isinstance through Python
        # metaclasses, 1 µs); neither ever is one, so each ends in object.__setattr__ either way, which is
        # where it goes directly (0.1 µs). Lightning's own _ResultMetric skips nn.Module.__setattr__ so.
        if name in _PLAIN_PER_STEP:
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    @classmethod
    def load_from_checkpoint(  # type: ignore[override]
        cls,
        checkpoint_path: str | Path | IO[bytes],
        map_location: Any = None,
        hparams_file: str | Path | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Self:
        """Lightning's loader, under the project's rule for checkpoints: read as data only, whatever the
        path (Lightning's own turns ``weights_only`` off for an ``http(s)://`` one, which is refused here:
        download it first), and no class imported that the checkpoint names at any depth unless it is
        this project's, its libraries', or this class or one of its imported subclasses
        (:func:`src.checkpoints.check_names`)."""
        if isinstance(checkpoint_path, str | Path):
            checkpoint = load_checkpoint(checkpoint_path)
        else:  # a file object: read, then rewound for Lightning
            start = checkpoint_path.tell()
            checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
            checkpoint_path.seek(start)
        family = [cls, *_subclasses(cls)]
        check_names(checkpoint, str(checkpoint_path), {f"{c.__module__}.{c.__qualname__}" for c in family})
        return super().load_from_checkpoint(
            checkpoint_path, map_location, hparams_file, strict, weights_only=True, **kwargs
        )

    # -- what subclasses define -----------------------------------------------------------------------

    def build_net(self) -> nn.Module:
        """The plain PyTorch net; override to bring your own (it receives ``(B, in_features)``)."""
        hp = self.hparams
        return MLP(
            hp["in_features"],
            hp["out_features"],
            hidden_sizes=hp["hidden_sizes"] if hp["hidden_sizes"] is not None else [128, 64],
            activation=hp["activation"],
            dropout=hp["dropout"],
            batch_norm=hp["batch_norm"],
            activation_checkpointing=hp["activation_checkpointing"],
        )

    def check_shapes(self) -> None:
        """Refuse shapes the task cannot serve (say, regression data linked into a classifier)."""

    @abstractmethod
    def build_metrics(self) -> MetricCollection:
        """The metrics of one stage, unprefixed; ``__init__`` clones them per stage."""

    @abstractmethod
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The scalar loss of a batch, from the net's raw ``output`` and the batch's ``target``."""

    @abstractmethod
    def metric_inputs(self, output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(preds, target)`` as the metrics expect them."""

    @override
    @abstractmethod
    def predict_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> dict[str, torch.Tensor]:
        """Named ``(B,)`` or ``(B, K)`` tensors per batch; ``PredictionWriter`` makes them CSV columns.

        Lightning's own default would call the net on the whole ``(x, y)`` batch tuple.
        """

    # -- the loop -------------------------------------------------------------------------------------

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def epoch_loss(self, stage: Stage) -> MeanMetric:
        """The stage's sample-weighted mean loss of the epoch (``train/loss``, ``val/loss`` ...)."""
        loss: MeanMetric = getattr(self, f"{stage}_loss")
        return loss

    def stage_metrics(self, stage: Stage) -> MetricCollection:
        """The stage's metrics, prefixed ``<stage>/`` (``val/acc``, ``val/f1`` ...)."""
        metrics: MetricCollection = getattr(self, f"{stage}_metrics")
        return metrics

    def _shared_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], stage: Stage, last: bool = True
    ) -> dict[str, torch.Tensor]:
        """The step's ``loss`` (with its graph) and the detached ``preds``, ``target`` the metrics see.

        ``last``: whether no training batch of the epoch follows this one (for the batched metric update).
        """
        x, target = batch
        output = self(x)
        loss = self.loss(output, target)
        epoch_loss, metrics = self.epoch_loss(stage), self.stage_metrics(stage)
        with torch.no_grad():
            preds, metric_target = self.metric_inputs(output.detach(), target)
            if stage == "train":
                # The train loss and metrics take the inputs of METRIC_BATCHES batches in one update:
                # the loss's mean is weighted by rows and the metrics' counts are sums over rows, so the
                # epoch's values are the same, and one update of a metric costs about as much as a small
                # net's step spends on it. Detached: a tensor that keeps its graph keeps every
                # activation of the step alive.
                self._metric_inputs.append((loss.detach(), len(target), preds, metric_target))
                if last or len(self._metric_inputs) >= METRIC_BATCHES:
                    self.update_train_metrics()
            else:
                # updated on the device every step, with no host sync
                epoch_loss.update(loss.detach(), weight=len(target))
                metrics.update(preds, metric_target)
        if stage not in self._logged_stages:
            # The epoch's first batch (or the first after a resume). The metric objects are handed to
            # self.log once per epoch, not per step: Lightning keeps the object, calls its compute()
            # (reduced across processes) when the epoch ends and resets it, so the epoch value holds
            # every update. Each self.log call walks Lightning's result collection, and six per step
            # cost more than a small net's step itself.
            self._logged_stages.add(stage)
            self.log(f"{stage}/loss", epoch_loss, on_step=False, on_epoch=True)
            self.log_dict(metrics, on_step=False, on_epoch=True)
        return {"loss": loss, "preds": preds, "target": metric_target}

    def is_logging_step(self) -> bool:
        """Whether this training step's values are written to the loggers.

        On Lightning's schedule for step values: every ``log_every_n_steps`` optimizer steps, and on a
        step during which the run was told to stop. Under automatic optimization with one optimizer the
        step about to be taken is ``global_step + 1``. (A stop decided during the step itself, by a time
        limit or a callback, is not foreseen here: that last step writes no step values.)
        """
        try:
            trainer = self.trainer
        except RuntimeError:  # a step called by hand, outside a Trainer: nothing is written anywhere
            return False
        # public and documented, but Lightning assigns it in a connector without declaring it on the class
        every: int = trainer.log_every_n_steps  # type: ignore[attr-defined]
        return every > 0 and ((trainer.global_step + 1) % every == 0 or trainer.should_stop)

    def update_train_metrics(self) -> None:
        """Take in the training batches gathered since the last update (the train loss and metrics).

        The task does so every ``METRIC_BATCHES`` batches and on the batch it foresees as the epoch's last,
        and again in its ``on_train_epoch_end`` for an epoch that ended unforeseen (a stop set after a step,
        a time limit). Lightning calls callbacks' ``on_train_epoch_end`` before the module's: a callback
        that reads the train loss or metrics there calls this first.
        """
        if self._metric_inputs:
            losses, rows, preds, target = zip(*self._metric_inputs, strict=True)
            # each batch's mean loss, weighted by its rows (a NaN one is left out with its weight)
            epoch_loss = self.epoch_loss("train")
            weights = torch.tensor(rows, dtype=epoch_loss.dtype, device=epoch_loss.device)
            epoch_loss.update(torch.stack(losses), weight=weights)
            self.stage_metrics("train").update(torch.cat(preds), torch.cat(target))
            self._metric_inputs = []

    def _last_training_batch(self, batch_idx: int) -> bool:
        """Whether the epoch's training ends after this batch (its last batch, or a stop, or max_steps)."""
        try:
            trainer = self.trainer
        except RuntimeError:  # a step called by hand, outside a Trainer
            return True
        return (
            batch_idx + 1 >= trainer.num_training_batches
            or trainer.should_stop
            or 0 < trainer.max_steps <= trainer.global_step + 1
        )

    @override
    def on_train_epoch_end(self) -> None:
        # a backstop: an epoch that ended where _last_training_batch did not foresee still counts every
        # batch before Lightning computes the epoch's metrics, right after this hook
        self.update_train_metrics()

    # Each epoch starts from empty metrics. Lightning resets them when it has computed an epoch's values;
    # an epoch cut short by an exception leaves them filled, and a later fit of the same module would
    # otherwise add to them (and, their update count past 1, never hand them to self.log).
    @override
    def on_train_epoch_start(self) -> None:
        self._reset_stage("train")
        self._metric_inputs = []
        self._pending_step_values = None

    @override
    def on_validation_epoch_start(self) -> None:
        self._reset_stage("val")

    @override
    def on_test_epoch_start(self) -> None:
        self._reset_stage("test")

    def _reset_stage(self, stage: Stage) -> None:
        self.epoch_loss(stage).reset()
        self.stage_metrics(stage).reset()
        self._logged_stages.discard(stage)

    @override
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._shared_step(batch, "train", last=self._last_training_batch(batch_idx))["loss"]
        if self.is_logging_step():  # per-step values only on the steps the loggers receive
            values: dict[str, torch.Tensor | float] = {"train/loss_step": loss.detach()}
            values.update(self._learning_rates())
            if self.automatic_optimization:
                # written with the gradient norm once the optimizer step has its gradients; with
                # accumulated gradients each micro-batch replaces them, so the step's loss is its last's
                self._pending_step_values = (self.trainer.global_step, values)
            else:
                self.write_step_values(values)
        return loss

    @override
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # a backstop: values of a step taken without configure_gradient_clipping writing them (a subclass
        # that overrides it without calling it), at the step they belong to
        if self._pending_step_values is not None and self.trainer.global_step > self._pending_step_values[0]:
            self._write_pending_step_values({})

    def _write_pending_step_values(self, values: dict[str, torch.Tensor | float]) -> None:
        """Write the step's pending values and ``values`` together, in one call to each logger."""
        step, pending = self._pending_step_values or (self.trainer.global_step, {})
        self._pending_step_values = None
        if pending or values:
            self.write_step_values({**pending, **values}, step=step)

    def write_step_values(self, values: Mapping[str, torch.Tensor | float], step: int | None = None) -> None:
        """Write values of a training step to the loggers now, as Lightning writes logged step values:
        at ``step`` (by default ``global_step``: the optimizer steps taken before this one), with the
        ``epoch``; scalars only.

        The task writes its own once per logging step (:meth:`is_logging_step`). ``self.log`` would keep
        each value in Lightning's result collection until the step ends: each such call costs about 0.3 ms
        on a CPU (it deep-copies its metadata and moves its record to the device), and Lightning then
        goes over every kept step value after every later step of the epoch, reading ``prog_bar`` ones
        back from the device each time. Here the values are read back once, together. They stay in
        :attr:`step_values` (the progress bar shows the loss from there), not in
        ``trainer.callback_metrics``: a callback that monitors a value watches an epoch value
        (``val/loss``, ``train/loss``), never a step value.

        Under manual optimization Lightning's step numbers count batches, not optimizer steps: there the
        values go through ``self.log`` and Lightning writes them on its own schedule.
        """
        if not self.automatic_optimization:
            self.log_dict(dict(values), on_step=True, on_epoch=False)
            return
        tensors = {name: value for name, value in values.items() if isinstance(value, torch.Tensor)}
        numbers = {name: float(value) for name, value in values.items() if name not in tensors}
        if tensors:
            # one read-back for all of them; a sharded (FSDP2) value is gathered first
            full = [t.full_tensor() if isinstance(t, DTensor) else t for t in tensors.values()]
            for name, t in zip(tensors, full, strict=True):
                if t.numel() != 1:
                    raise ValueError(
                        f"step value {name!r} has {t.numel()} elements; log one number per name."
                    )
            dtype = functools.reduce(torch.promote_types, [t.dtype for t in full], torch.float32)
            device = full[0].device
            read = torch.stack([t.detach().reshape(()).to(device, dtype) for t in full]).tolist()
            numbers.update(zip(tensors, read, strict=True))
        self.step_values.update(numbers)
        trainer = self.trainer
        at = trainer.global_step if step is None else step
        for logger in trainer.loggers:
            logger.log_metrics({**numbers, "epoch": trainer.current_epoch}, step=at)
            logger.save()

    def _learning_rates(self) -> dict[str, float]:
        """``train/lr`` for one parameter group; ``train/lr/<group name or pgN>`` for several; with several
        optimizers (a subclass's), ``train/lr/opt<N>`` before those."""
        rates = {}
        optimizers = self.trainer.optimizers
        for number, optimizer in enumerate(optimizers, start=1):
            base = "train/lr" if len(optimizers) == 1 else f"train/lr/opt{number}"
            groups = optimizer.param_groups
            for index, group in enumerate(groups, start=1):
                name = base if len(groups) == 1 else f"{base}/{group.get('name', f'pg{index}')}"
                rates[name] = float(group["lr"])  # the optimizer's own Python number
        return rates

    @override
    def validation_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> dict[str, torch.Tensor]:
        # Lightning has already called model.eval() and entered torch.inference_mode() here;
        # the returned preds and target reach callbacks' on_validation_batch_end (ValidationFigures)
        return self._shared_step(batch, "val")

    @override
    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._shared_step(batch, "test")

    @override
    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        # runs after backward (and after unscaling under mixed precision), before optimizer.step();
        # the norm is computed for the dashboard only on the steps the loggers receive
        offered, self.grad_norm = self.grad_norm, None
        if self.is_logging_step():
            values: dict[str, torch.Tensor | float] = {}
            grads = [p.grad for p in self.parameters() if p.grad is not None]
            if grads:  # none when NonFiniteGuard has dropped this step's
                norm = offered if offered is not None else torch.nn.utils.get_total_norm(grads)
                values["train/grad_norm"] = norm
                if gradient_clip_val:
                    if gradient_clip_algorithm == "value":
                        largest = torch.stack([g.abs().max() for g in grads]).max()
                        fired = largest > gradient_clip_val
                    else:
                        fired = norm > gradient_clip_val
                    values["train/grad_clipped"] = fired.float()
            if self.automatic_optimization:
                self._write_pending_step_values(values)  # the step's values, in one write
            elif values:
                self.write_step_values(values)
        parameters = (
            None
            if offered is None
            else self._clipped_by_norm(optimizer, gradient_clip_val, gradient_clip_algorithm)
        )
        if offered is not None and parameters is not None:
            # what Lightning's clipping does below, with the norm it would compute again: 0.07 ms a step
            torch.nn.utils.clip_grads_with_norm_(parameters, float(gradient_clip_val or 0), offered)
        else:
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def _clipped_by_norm(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None,
        gradient_clip_algorithm: str | None,
    ) -> list[torch.nn.Parameter] | None:
        """The parameters Lightning's ``clip_gradients`` would clip by their total norm, when that is all it
        would do: the Trainer's own clipping value and algorithm ``norm``, a precision plugin that clips as
        Lightning's base plugin does (mixed precision, FSDP and DeepSpeed clip their own way), and the
        optimizer holding exactly :meth:`parameters`, in their order, so that their total norm is
        :attr:`grad_norm` to the last bit. ``None`` otherwise."""
        trainer = self.trainer
        plugin = trainer.precision_plugin
        if (
            not gradient_clip_val
            or gradient_clip_val <= 0
            or gradient_clip_val != trainer.gradient_clip_val
            or (gradient_clip_algorithm or "norm") != "norm"
            or any(
                getattr(type(plugin), name) is not getattr(Precision, name)
                for name in ("clip_gradients", "clip_grad_by_norm", "main_params")
            )
        ):
            return None
        parameters = list(plugin.main_params(optimizer))
        if [id(p) for p in parameters] != [id(p) for p in self.parameters()]:
            return None
        return parameters

    @override
    def configure_model(self) -> None:
        # only under ModelParallelStrategy (FSDP2), which sets the mesh once the processes exist; the
        # Trainer calls this hook again for every stage, so a sharded net is left alone
        if self.device_mesh is None or isinstance(self.net, FSDPModule):
            return
        mesh = self.device_mesh["data_parallel"]
        # each Linear its own group (its parameters gathered just before use), then the rest of the net
        for layer in self.net.modules():
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    # -- optimization ---------------------------------------------------------------------------------

    @override
    def configure_optimizers(self) -> Any:
        # called by the Trainer after the model reached its device and dtype, so the optimizer holds
        # the parameters that will really be trained
        optimizer = (self.optimizer or DEFAULT_OPTIMIZER)(self.parameters())
        if self.scheduler is None:
            return optimizer
        scheduler = self._call_scheduler(optimizer)
        config = {"scheduler": scheduler, "interval": self.hparams["scheduler_interval"], "frequency": 1}
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            config["monitor"] = self.hparams["scheduler_monitor"]
        return {"optimizer": optimizer, "lr_scheduler": config}

    def total_optimizer_steps(self) -> int:
        """Optimizer steps in the whole run, for schedules that span it (the Trainer's estimate)."""
        steps = self.trainer.estimated_stepping_batches
        if steps == float("inf"):
            raise UserInputError(
                "a schedule that spans the run needs the run's length: set trainer.max_epochs or "
                "trainer.max_steps."
            )
        return int(steps)

    def total_epochs(self) -> int:
        """Epochs in the whole run, for epoch schedules that span it: ``trainer.max_epochs``, or fewer
        when ``trainer.max_steps`` ends the run first."""
        trainer = self.trainer
        if trainer.max_epochs is None or trainer.max_epochs < 0:
            raise UserInputError(
                "an epoch schedule that spans the run needs trainer.max_epochs; set it, or step the "
                "schedule per optimizer step (model.init_args.scheduler_interval: step)."
            )
        steps = self.total_optimizer_steps()  # also makes the Trainer count the training batches
        epochs = max(trainer.max_epochs, 1)
        if trainer.max_steps != -1:
            per_epoch = math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches)
            epochs = min(epochs, math.ceil(steps / per_epoch))
        return epochs

    def _call_scheduler(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
        """Build the scheduler; one that spans the run is given the run's length by the Trainer.

        The scheduler class's signature says which argument that is (:data:`SPANS_THE_RUN`). Left out, it
        is filled in: ``total_steps`` in optimizer steps; ``T_max`` in the scheduler's own steps, epochs
        or optimizer steps as ``scheduler_interval`` says. Written in the config, it must equal the run's
        length: a value typed beside ``trainer.max_epochs`` drifts when that changes, and the schedule
        then restarts or stops short without a word, so a disagreeing value is refused.
        """
        factory = self.scheduler
        assert factory is not None
        scheduler_class = _built_class(factory)
        parameters = inspect.signature(scheduler_class).parameters if scheduler_class is not None else {}
        name = next((name for name in SPANS_THE_RUN if name in parameters), None)
        # the values the config binds (the CLI's partial holds every init argument, unset ones as None)
        bound = factory.keywords if isinstance(factory, functools.partial) else {}
        if name is None or (name == "total_steps" and bound.get("epochs") is not None):
            return factory(optimizer)  # nothing spans the run, or OneCycleLR counts epochs itself
        interval = self.hparams["scheduler_interval"]
        if name == "total_steps" and interval != "step":
            raise UserInputError(
                "a scheduler that counts total_steps (OneCycleLR, WarmupCosine) steps per optimizer "
                "step: set model.init_args.scheduler_interval: step."
            )
        if interval == "step":
            length, unit = self.total_optimizer_steps(), "optimizer steps"
        else:
            length, unit = self.total_epochs(), "epochs"
        given = bound.get(name)
        if given is None:
            return factory(optimizer, **{name: length})
        if given != length:
            raise UserInputError(
                f"model.init_args.scheduler.init_args.{name}={given}, but this run is {length} {unit} "
                f"long, so the schedule would {'end before' if given < length else 'not be done when'} the "
                f"run ends; leave {name} out and the run's length is filled in."
            )
        return factory(optimizer)


#: init arguments by which a scheduler spans the whole run: OneCycleLR's and WarmupCosine's
#: ``total_steps``, CosineAnnealingLR's ``T_max``
SPANS_THE_RUN = ("total_steps", "T_max")


def _built_class(factory: Callable[..., Any]) -> type | None:
    """The class a scheduler factory builds: the class itself, ``functools.partial(cls, ...)``, or the
    CLI's ``partial(call, instantiator, cls, ...)``; ``None`` for any other callable."""
    if inspect.isclass(factory):
        return factory
    if isinstance(factory, functools.partial):
        return next((c for c in (factory.func, *factory.args) if inspect.isclass(c)), None)
    return None


def _subclasses(cls: type) -> list[type]:
    """Every subclass of ``cls`` imported so far, at any depth."""
    found: list[type] = []
    subclasses: list[type] = cls.__subclasses__()
    for sub in subclasses:
        found += [sub, *_subclasses(sub)]
    return found
