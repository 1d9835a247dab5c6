"""The base task: an injected net, one shared step for train/val/test, injected optimizer and scheduler."""

import functools
import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Literal, Self, cast

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torchmetrics import MeanMetric, MetricCollection
from typing_extensions import override

from src.checkpoints import check_names, load_checkpoint
from src.errors import UserInputError
from src.nets import DEFAULT_NET, MLP

Stage = Literal["fit", "val", "test"]
#: each stage's prefix in the logged names (``train/loss``, ``val/acc``); the metrics live under the
#: stage's name, since ``train`` is taken by ``nn.Module.train``
PREFIX: dict[Stage, str] = {"fit": "train", "val": "val", "test": "test"}
#: builds the net from the data's widths: ``net(in_features, out_features)``; in YAML, the ``class_path`` of
#: any ``nn.Module`` whose first two arguments are those widths, with its other arguments as ``init_args``
NetFactory = Callable[[int, int], nn.Module]
DEFAULT_OPTIMIZER = functools.partial(torch.optim.AdamW, lr=1e-3)
#: init arguments by which a scheduler spans the whole run: OneCycleLR's and WarmupCosine's
#: ``total_steps``, CosineAnnealingLR's ``T_max``
SPANS_THE_RUN = ("total_steps", "T_max")


class BaseTask(L.LightningModule, ABC):
    """What the classifier and the regressor share; subclasses define the loss, metrics and predictions.

    ``build_metrics``, ``loss``, ``metric_inputs`` and ``predict_step`` are abstract: a subclass that
    leaves one out cannot be instantiated (``TypeError`` naming the missing hooks).

    Args:
        in_features: Input width; linked from the DataModule by the CLI, never typed by hand.
        out_features: Output width (class count, or 1 for regression); linked from the DataModule.
        net: Builds the net from ``(in_features, out_features)``: in YAML the ``class_path`` of any
            ``nn.Module`` taking those two widths first, its other arguments as ``init_args``. ``None``
            means :data:`src.nets.DEFAULT_NET` (an ensemble of MLPs for tables).
        optimizer: Builds the optimizer from the parameters; chosen in YAML (``class_path`` + ``init_args``).
            ``None`` means ``AdamW(lr=1e-3)``. (No class default here on purpose: the parser would carry a
            default class's ``init_args``, say AdamW's ``weight_decay``, over to the class a config names.)
        scheduler: Builds the LR scheduler from the optimizer; ``None`` keeps the LR constant.
        scheduler_interval: ``epoch`` or ``step``: when Lightning steps the scheduler. Per-step schedules
            (warmup, OneCycleLR) need ``step``; epoch schedules stepped per batch decay far too fast.
        scheduler_monitor: The logged metric a ``ReduceLROnPlateau`` watches.
        compile_net: Compile the net with ``torch.compile`` (the net only: ``self.log`` does not compile).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        net: NetFactory | None = None,
        optimizer: OptimizerCallable | None = None,
        scheduler: LRSchedulerCallable | None = None,
        scheduler_interval: Literal["epoch", "step"] = "epoch",
        scheduler_monitor: str = "val/loss",
        compile_net: bool = False,
    ) -> None:
        super().__init__()
        # Primitives only, so that checkpoints load with torch.load(weights_only=True). Built by the CLI,
        # ``net`` is saved as its config (class_path and init_args), which is how a checkpoint rebuilds it;
        # the optimizer and scheduler are rebuilt from the config the CLI saves beside the checkpoints.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Attribute 'net' is an instance of `nn.Module`")
            self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        if self.hparams.get("net") is not None and not isinstance(self.hparams["net"], dict):
            # a net factory built in Python, not read from a config: pass it again when loading
            # (``load_from_checkpoint(path, net=...)``); its weights are in the checkpoint either way
            self.save_hyperparameters(ignore=["optimizer", "scheduler", "net"])
        self.check_shapes()
        self.optimizer = optimizer
        self.scheduler = scheduler
        build: NetFactory = net or functools.partial(MLP, **DEFAULT_NET["init_args"])
        try:
            self.net = build(in_features, out_features)
        except (ValueError, TypeError) as err:  # a bad argument of the net, as one sentence
            raise UserInputError(f"model.init_args.net: {err}") from err
        if compile_net:
            # in place: the state_dict keeps its keys, so checkpoints load with or without compiling
            self.net.compile()
        # one collection per stage, cloned with a prefix (`train/acc`, `val/acc` ...), and the stage's
        # epoch loss as a metric: averaged over rows, reduced across processes once per epoch.
        # nan_strategy="ignore": a step whose loss is NaN (NonFiniteGuard skips it) is left out of the
        # epoch's mean instead of warning on every such step.
        metrics = self.build_metrics()
        self.metrics = nn.ModuleDict(
            {stage: metrics.clone(prefix=f"{name}/") for stage, name in PREFIX.items()}
        )
        self.losses = nn.ModuleDict({stage: MeanMetric(nan_strategy="ignore") for stage in PREFIX})

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

    # -- the steps ------------------------------------------------------------------------------------

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def _shared_step(self, batch: tuple[torch.Tensor, torch.Tensor], stage: Stage) -> dict[str, torch.Tensor]:
        """The batch's ``loss`` (with its graph) and the detached ``preds`` and ``target`` the metrics see.

        The stage's loss and metric objects take the batch in on the device, with no host sync; their
        epoch values are logged once, when the epoch ends (:meth:`_log_epoch`).
        """
        x, target = batch
        output = self(x)  # (B, K) raw logits or (B, 1) values
        if output.dim() == target.dim() + 2:
            # (B, k, K): an ensemble's k predictions of each row (src.nets.MLP in training), each member
            # trained on every row: the mean of the members' losses; the metrics see the members' mean
            members = output.shape[1]
            loss = self.loss(output.flatten(0, 1), target.repeat_interleave(members, dim=0))
            output = output.mean(dim=1)
        else:
            loss = self.loss(output, target)
        preds, metric_target = self.metric_inputs(output.detach(), target)
        epoch_loss, metrics = self._metrics_of(stage)
        # detached: a tensor that keeps its graph keeps every activation of the step alive
        epoch_loss.update(loss.detach(), weight=len(target))
        metrics.update(preds, metric_target)
        return {"loss": loss, "preds": preds, "target": metric_target}

    @override
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        # the step's loss reaches TensorBoard through the StepValues callback, which reads it from here
        return self._shared_step(batch, "fit")["loss"]

    @override
    def validation_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> dict[str, torch.Tensor]:
        # Lightning has already called model.eval() and entered torch.inference_mode() here; the returned
        # preds and target reach callbacks' on_validation_batch_end (ValidationFigures)
        return self._shared_step(batch, "val")

    @override
    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._shared_step(batch, "test")

    @override
    def on_train_epoch_end(self) -> None:
        self._log_epoch("fit")

    @override
    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val")

    @override
    def on_test_epoch_end(self) -> None:
        self._log_epoch("test")

    def _log_epoch(self, stage: Stage) -> None:
        """Log the epoch's ``<prefix>/loss`` and metrics: the metric objects themselves, which Lightning
        computes (reduced over processes by torchmetrics) and resets once the hook returns. An epoch in
        which every batch was skipped logs nothing rather than a metric of no rows."""
        loss, metrics = self._metrics_of(stage)
        if loss.update_called:
            self.log(f"{PREFIX[stage]}/loss", loss)
            self.log_dict(metrics)

    # Each epoch starts from empty metrics, also after one cut short by an exception (a later fit of the
    # same module would otherwise add to them).
    @override
    def on_train_epoch_start(self) -> None:
        self._reset("fit")

    @override
    def on_validation_epoch_start(self) -> None:
        self._reset("val")

    @override
    def on_test_epoch_start(self) -> None:
        self._reset("test")

    def _reset(self, stage: Stage) -> None:
        for metric in self._metrics_of(stage):
            metric.reset()

    def _metrics_of(self, stage: Stage) -> tuple[MeanMetric, MetricCollection]:
        """The stage's epoch loss and its metrics (prefixed ``train/``, ``val/``, ``test/``)."""
        return cast(MeanMetric, self.losses[stage]), cast(MetricCollection, self.metrics[stage])

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

    def _run_length(self, name: str) -> tuple[int, str]:
        """The run's length in the unit a scheduler's ``name`` argument counts."""
        interval = self.hparams["scheduler_interval"]
        if name == "total_steps" and interval != "step":
            raise UserInputError(
                "a scheduler that counts total_steps (OneCycleLR, WarmupCosine) steps per optimizer "
                "step: set model.init_args.scheduler_interval: step."
            )
        if interval == "step":
            return self.total_optimizer_steps(), "optimizer steps"
        return self.total_epochs(), "epochs"

    def _call_scheduler(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
        """Build the scheduler; one that spans the run (:data:`SPANS_THE_RUN`) is given the run's length.

        Left out of the config, the length is filled in: ``total_steps`` in optimizer steps; ``T_max`` in
        the scheduler's own steps, epochs or optimizer steps as ``scheduler_interval`` says. Written in
        the config, it must equal the run's length: a value typed beside ``trainer.max_epochs`` drifts
        when that changes, and the schedule then restarts or stops short without a word, so a
        disagreeing value is refused. (The CLI builds a ``functools.partial`` that binds every init
        argument, unset ones as ``None``: its public ``keywords`` say which were left out.)
        """
        factory = self.scheduler
        assert factory is not None
        bound = factory.keywords if isinstance(factory, functools.partial) else {}
        if bound.get("epochs") is not None:
            return factory(optimizer)  # OneCycleLR given epochs and steps_per_epoch counts them itself
        for name in SPANS_THE_RUN:
            if name in bound and bound[name] is None:
                return factory(optimizer, **{name: self._run_length(name)[0]})
        scheduler = factory(optimizer)
        for name in SPANS_THE_RUN:
            given = getattr(scheduler, name, None)  # torch's schedulers keep them as public attributes
            if not isinstance(given, int):
                continue
            length, unit = self._run_length(name)
            if given != length:
                raise UserInputError(
                    f"model.init_args.scheduler.init_args.{name}={given}, but this run is {length} {unit} "
                    f"long, so the schedule would {'end before' if given < length else 'not be done when'} "
                    f"the run ends; leave {name} out and the run's length is filled in."
                )
        return scheduler


def _subclasses(cls: type) -> list[type]:
    """Every subclass of ``cls`` imported so far, at any depth."""
    found: list[type] = []
    subclasses: list[type] = cls.__subclasses__()
    for sub in subclasses:
        found += [sub, *_subclasses(sub)]
    return found
