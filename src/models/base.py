"""The base task: an injected net, one shared step for train/val/test, injected optimizer and scheduler;
a subclass says what differs: loss, metrics, ``predict_step``."""

import functools
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any, Literal, Self

import lightning as L
import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau
from torchmetrics import MeanMetric, MetricCollection
from typing_extensions import override

from src.checkpoints import check_for_class
from src.errors import UserInputError
from src.models.schedules import check_length, check_replaced, run_length, settings, spanned_by
from src.nets import DEFAULT_NET, MLP, shard

#: builds the net from the data's widths: ``net(in_features, out_features)``
NetFactory = Callable[[int, int], nn.Module]
#: builds the optimizer from the parameters (LightningCLI's ``OptimizerCallable``)
OptimizerCallable = Callable[[Iterable[Any]], Optimizer]
#: builds the scheduler from the optimizer (LightningCLI's ``LRSchedulerCallable``)
LRSchedulerCallable = Callable[[Optimizer], LRScheduler | ReduceLROnPlateau]
DEFAULT_OPTIMIZER = functools.partial(torch.optim.AdamW, lr=1e-3)


class BaseTask(L.LightningModule, ABC):
    """What the classifier and the regressor share; subclasses define the loss, metrics and predictions.

    Args:
        in_features: Input width; linked from the DataModule.
        out_features: Output width (classes, labels, targets, or 1); linked from the DataModule.
        net: Builds the net from ``(in_features, out_features)``; ``None``: :data:`src.nets.DEFAULT_NET`.
        optimizer: Builds the optimizer from the parameters; ``None``: ``AdamW(lr=1e-3)`` (a class default's
            ``init_args`` would carry over to the class a config names).
        scheduler: Builds the LR scheduler from the optimizer; ``None`` keeps the LR constant.
        scheduler_interval: When Lightning steps the scheduler; warmup and OneCycleLR need ``step``.
        scheduler_monitor: The logged metric a ``ReduceLROnPlateau`` watches.
        compile_net: Compile the net (only the net) with ``torch.compile``.
        target_names: The data's target columns when it has several (``None``: one); linked from the data.
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
        target_names: list[str] | None = None,
    ) -> None:
        super().__init__()
        # plain data, so checkpoints load with weights_only=True; optimizer and scheduler: in the run's config
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Attribute 'net' is an instance of `nn.Module`")
            self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        if self.hparams.get("net") is not None and not isinstance(self.hparams["net"], dict):
            # a net factory built in Python: pass it again to load_from_checkpoint(path, net=...)
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
            self.net.compile()  # in place: the state_dict keeps its keys, so checkpoints load either way
        # each stage's metrics (`val/acc` ...) and mean loss over rows, leaving out non-finite (skipped) steps
        metrics = self.build_metrics()
        self.train_metrics = metrics.clone(prefix="train/")
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")
        self.train_loss = MeanMetric(nan_strategy="ignore")
        self.val_loss = MeanMetric(nan_strategy="ignore")
        self.test_loss = MeanMetric(nan_strategy="ignore")

    @classmethod
    def load_from_checkpoint(  # type: ignore[override]
        cls,
        checkpoint_path: str | Path | IO[bytes],
        map_location: Any = None,
        hparams_file: str | Path | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Self:
        """Lightning's loader, reading data only and importing no untrusted class the checkpoint names."""
        check_for_class(checkpoint_path, cls)
        return super().load_from_checkpoint(
            checkpoint_path, map_location, hparams_file, strict, weights_only=True, **kwargs
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
        """Named ``(B,)`` or ``(B, K)`` tensors per batch; ``PredictionWriter`` makes them CSV columns."""

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    @override
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._shared_step(batch, self.train_loss, self.train_metrics)["loss"]

    @override
    def validation_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> dict[str, torch.Tensor]:
        # returned: callbacks' on_validation_batch_end gets the preds and target (ValidationFigures)
        return self._shared_step(batch, self.val_loss, self.val_metrics)

    @override
    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._shared_step(batch, self.test_loss, self.test_metrics)

    # an epoch cut short by an exception leaves its updates (Lightning resets at an epoch's end): start empty
    @override
    def on_train_epoch_start(self) -> None:
        self.train_loss.reset()
        self.train_metrics.reset()

    @override
    def on_validation_epoch_start(self) -> None:
        self.val_loss.reset()
        self.val_metrics.reset()

    @override
    def on_test_epoch_start(self) -> None:
        self.test_loss.reset()
        self.test_metrics.reset()

    # torchmetrics computes each over the epoch (gathered from every process); Lightning logs and resets it
    @override
    def on_train_epoch_end(self) -> None:
        self._log_epoch(self.train_loss, self.train_metrics)

    @override
    def on_validation_epoch_end(self) -> None:
        self._log_epoch(self.val_loss, self.val_metrics)

    @override
    def on_test_epoch_end(self) -> None:
        self._log_epoch(self.test_loss, self.test_metrics)

    def _log_epoch(self, loss_mean: MeanMetric, metrics: MetricCollection) -> None:
        if not loss_mean.update_called:  # an epoch without steps (a resumed fit may start at an epoch's end)
            return
        self.log(f"{metrics.prefix}loss", loss_mean)
        targets = self.hparams.get("target_names")
        if targets is None:
            self.log_dict(metrics)
            return
        # several targets: a (K,) metric is logged per target, `val/r2(<target>)`, and as their mean, `val/r2`
        for name, value in metrics.compute().items():
            self.log(name, value.mean())  # a scalar, as it is
            if value.ndim:
                for target, each in zip(targets, value, strict=True):
                    self.log(f"{name}({target})", each)

    def _shared_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], loss_mean: MeanMetric, metrics: MetricCollection
    ) -> dict[str, torch.Tensor]:
        """``loss`` (with its graph), the detached net ``output``, and ``preds`` and ``target`` as the metrics
        read them; updates the stage's metrics."""
        x, target = batch
        output = self(x)  # (B, K) raw logits or (B, 1) values
        loss = self.loss(output, target)
        preds, metric_target = self.metric_inputs(output.detach(), target)
        loss_mean.update(loss.detach(), weight=len(target))  # detached: a graph would keep the activations
        metrics.update(preds, metric_target)
        return {"loss": loss, "output": output.detach(), "preds": preds, "target": metric_target}

    @override
    def configure_model(self) -> None:
        if self.device_mesh is not None:  # only under ModelParallelStrategy (FSDP2)
            shard(self.net, self.device_mesh["data_parallel"])

    @override
    def configure_optimizers(self) -> Any:
        # the Trainer calls this once the model is on its device and dtype: the parameters really trained
        optimizer = (self.optimizer or DEFAULT_OPTIMIZER)(self.parameters())
        if self.scheduler is None:
            return optimizer
        interval = self.hparams["scheduler_interval"]
        spans = spanned_by(self.scheduler)  # left out of the config: the run's length fills it in
        given = settings(optimizer)
        scheduler = self.scheduler(optimizer, **({spans: self.run_length(spans)} if spans else {}))
        check_replaced(given, optimizer, scheduler)  # momentum a cycling scheduler took over, say
        check_length(scheduler, self.run_length, interval)
        config = {"scheduler": scheduler, "interval": interval}
        if isinstance(scheduler, ReduceLROnPlateau):
            config["monitor"] = self.hparams["scheduler_monitor"]
        return {"optimizer": optimizer, "lr_scheduler": config}

    def run_length(self, argument: str = "T_max") -> int:
        """The run's length in the steps of the schedule's ``argument`` (:func:`schedules.run_length`)."""
        return run_length(self.trainer, self.hparams["scheduler_interval"], argument)
