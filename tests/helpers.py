"""Callbacks the tests stop runs with, at a chosen optimizer step: as a crash or a scheduler would; and a
task of the user's own with several targets at once, with its DataModule."""

import functools
import os
import signal
import threading
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MeanAbsoluteError, MetricCollection, R2Score
from torchmetrics.classification import MultilabelAccuracy, MultilabelF1Score
from typing_extensions import override

from src.models.base import BaseTask
from src.nets import MLP


class StopAt(Callback):
    """Stops the fit after the given optimizer step, as a crash or a preemption would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            trainer.should_stop = True


class SigtermAt(Callback):
    """Sends this process SIGTERM during a training step, as a scheduler preempting the job would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


class SignalAt(Callback):
    """Sends the signal ``name`` during optimizer step ``step`` from one rank: to itself or to its parent (the
    launcher that started it), as a scheduler, the OOM killer or a crash would, or to its whole process group,
    as a terminal sends Ctrl-C; ``delay`` seconds after the step starts, from a timer thread, it lands
    wherever the run is by then (a step, a validation, a write). Each rank first writes its process id to
    ``<folder>/pid<rank>`` so that a test can watch them all, and the sender writes ``<folder>/signalled``
    as it sends."""

    def __init__(
        self, step: int, folder: str, rank: int = 0, name: str = "SIGTERM", parent: bool = False,
        group: bool = False, delay: float = 0.0,
    ) -> None:  # fmt: skip
        self.step, self.folder, self.rank, self.parent, self.group = step, folder, rank, parent, group
        self.signal = signal.Signals[name]
        self.delay = delay
        self.sent = False

    def on_train_start(self, trainer: L.Trainer, *args: object) -> None:
        with open(os.path.join(self.folder, f"pid{trainer.global_rank}"), "w") as file:
            file.write(str(os.getpid()))

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step != self.step or trainer.global_rank != self.rank or self.sent:
            return
        self.sent = True
        if self.delay > 0:
            timer = threading.Timer(self.delay, self._send)
            timer.daemon = True  # a process that ends first ends without sending it
            timer.start()
        else:
            self._send()

    def _send(self) -> None:
        with open(os.path.join(self.folder, "signalled"), "w"):  # its time: the file's
            pass
        if self.group:
            os.killpg(os.getpgid(0), self.signal)
        else:
            os.kill(os.getppid() if self.parent else os.getpid(), self.signal)


# -- a task of the user's own with K targets at once, and the DataModule it trains on ------------------
# Written as a user writes them (a BaseTask subclass, a LightningDataModule over tensors), not as the
# shipped tasks are: every shared piece (the prediction writer, figures, summary, dashboard, apps) is
# held to what such a task returns, (N, K) outputs against (N, K) targets.

#: the names the DataModule gives its K = 3 targets: labels of a multi-label task, or the outputs' names
LABEL_NAMES = ["spam", "urgent", "personal"]
VALUE_NAMES = ["price", "rent", "tax"]


class ManyTargets(L.LightningDataModule):
    """Random ``(N, F)`` features and ``(N, K)`` float targets from a seeded linear rule plus noise (so that
    a net learns them): 0/1 labels (``kind="labels"``, as ``binary_cross_entropy_with_logits`` takes them)
    or values in units of their own (``"values"``). The first three quarters of the rows train, the last
    quarter validates, tests and is predicted (its features alone).

    Args:
        kind: ``labels`` (multi-label classification) or ``values`` (multi-output regression).
        rows: N.
        in_features: F.
        targets: K.
        batch_size: Rows per batch.
        seed: Seeds the features, the rule and the noise.
        named: Give the K targets names (``label_names``), else none.
    """

    def __init__(
        self,
        kind: Literal["labels", "values"] = "labels",
        rows: int = 240,
        in_features: int = 5,
        targets: int = 3,
        batch_size: int = 40,
        seed: int = 0,
        named: bool = True,
    ) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(rows, in_features, generator=generator)  # (N, F)
        rule = torch.randn(in_features, targets, generator=generator)
        scores = self.x @ rule + 0.3 * torch.randn(rows, targets, generator=generator)  # (N, K)
        self.y = (scores > 0).float() if kind == "labels" else 10 * scores + 5  # (N, K)
        self.kind, self.in_features, self.out_features = kind, in_features, targets
        names = LABEL_NAMES if kind == "labels" else VALUE_NAMES
        self.label_names = names[:targets] if named and targets <= len(names) else None
        self.batch_size = batch_size
        self.train_rows, self.val_rows = slice(0, rows * 3 // 4), slice(rows * 3 // 4, rows)

    def train_dataloader(self) -> DataLoader:
        data = TensorDataset(self.x[self.train_rows], self.y[self.train_rows])
        return DataLoader(data, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        data = TensorDataset(self.x[self.val_rows], self.y[self.val_rows])
        return DataLoader(data, batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.x[self.val_rows]), batch_size=self.batch_size)


class MultiLabelTask(BaseTask):
    """Multi-label classification: K logits into binary cross-entropy, torchmetrics' multi-label accuracy
    and F1 on the probabilities; ``predict_step`` gives ``probs`` and 0/1 ``preds``, both ``(N, K)``."""

    @override
    def build_metrics(self) -> MetricCollection:
        k = self.hparams["out_features"]
        return MetricCollection({"acc": MultilabelAccuracy(k), "f1": MultilabelF1Score(k)})

    @override
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(output, target)  # (B, K) logits, (B, K) 0/1 floats

    @override
    def metric_inputs(self, output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return output.sigmoid(), target

    @override
    def predict_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> dict[str, torch.Tensor]:
        probs = self(batch[0]).sigmoid()  # (B, K)
        return {"probs": probs, "preds": (probs > 0.5).int()}


class MultiOutputTask(BaseTask):
    """Multi-output regression: K values, mean squared error, MAE and R² over the K outputs;
    ``predict_step`` gives ``preds`` ``(N, K)``."""

    @override
    def build_metrics(self) -> MetricCollection:
        # R² of each output, averaged over the K (torchmetrics reads K from the first update)
        return MetricCollection({"mae": MeanAbsoluteError(), "r2": R2Score()})

    @override
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(output, target)  # (B, K) against (B, K)

    @override
    def metric_inputs(self, output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return output, target

    @override
    def predict_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> dict[str, torch.Tensor]:
        return {"preds": self(batch[0])}  # (B, K)


#: the CLI's words for a fit of one of them with a small net: ``[*MANY_LABELS, "--trainer.max_epochs=2"]``
SMALL_NET = ["--model.init_args.net=src.nets.MLP", "--model.init_args.net.init_args.hidden_sizes=[16]"]
MANY_LABELS = ["--model=tests.helpers.MultiLabelTask", "--data=tests.helpers.ManyTargets", *SMALL_NET]
MANY_VALUES = [
    "--model=tests.helpers.MultiOutputTask", "--data=tests.helpers.ManyTargets", "--data.kind=values",
    *SMALL_NET,
]  # fmt: skip


def many_targets(kind: Literal["labels", "values"] = "labels", **data: Any) -> tuple[BaseTask, ManyTargets]:
    """One of the two tasks with a small net, and its DataModule, built in Python."""
    datamodule = ManyTargets(kind, **data)
    task = MultiLabelTask if kind == "labels" else MultiOutputTask
    net = functools.partial(MLP, hidden_sizes=[16])
    return task(in_features=datamodule.in_features, out_features=datamodule.out_features, net=net), datamodule


class Quantiles(BaseTask):
    """Three quantiles of a table's one target at once (its 10th, 50th and 90th percentile), as a user
    writes a multi-output regression: K = 3 outputs of the net, the pinball loss, the median's MAE;
    ``predict_step`` gives the three as ``preds`` ``(N, 3)``, in the target's units.

    Args:
        out_features: The data's targets (one); the net gets three outputs per target.
        **kwargs: :class:`BaseTask`'s other arguments.
    """

    #: the quantiles, in the order of the net's outputs
    LEVELS = (0.1, 0.5, 0.9)

    def __init__(self, *, out_features: int, **kwargs: Any) -> None:
        # the hyperparameters keep the data's out_features (this frame's), so the checkpoint rebuilds this
        super().__init__(out_features=len(self.LEVELS) * out_features, **kwargs)
        self.register_buffer("levels", torch.tensor(self.LEVELS), persistent=False)

    @override
    def build_metrics(self) -> MetricCollection:
        return MetricCollection({"mae": MeanAbsoluteError()})

    @override
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        below = target.unsqueeze(-1) - output  # (B, 3): how far each quantile lies below the target
        return torch.maximum(self.levels * below, (self.levels - 1) * below).mean()

    @override
    def metric_inputs(self, output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return output[:, 1], target  # the median

    @override
    def predict_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> dict[str, torch.Tensor]:
        return {"preds": self(batch[0])}  # (B, 3)
