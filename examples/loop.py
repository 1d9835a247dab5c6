"""The hand-written PyTorch training loop, in the order the tutorials teach it, without Lightning.

This is what ``Trainer.fit`` does for one optimizer on one device, written out to be read, run and
compared: ``examples/test_parity.py`` proves that it ends with the same weights and optimizer state as
:class:`src.models.Classifier` under the Trainer and :class:`examples.manual.ManualClassifier`; where the
tutorials and Lightning part ways (the last, shorter accumulation group of an epoch), it follows Lightning.

    from functools import partial

    import torch

    from src.data import ArrayDataModule
    from examples.loop import fit
    from src.nets import MLP

    data = ArrayDataModule(source="spiral", num_samples=600)
    data.setup("fit")
    net = MLP(data.in_features, data.out_features, hidden_sizes=[64, 64])
    result = fit(net, data.train_dataloader(), data.val_dataloader(),
                 optimizer=partial(torch.optim.Adam, lr=0.01), max_epochs=5)
    print(result.history.val_loss)
"""

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

Precision = Literal["32-true", "64-true", "bf16-mixed"]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Scheduler = LRScheduler | ReduceLROnPlateau


class Batches(Protocol):
    """A ``DataLoader``, or a list of batches: ``(x, y, ...)`` tuples with a known count per epoch."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]: ...

    def __len__(self) -> int: ...


@dataclass
class History:
    """One entry per epoch: sample-weighted mean losses and the learning rate the epoch ended with."""

    train_loss: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)


@dataclass
class FitResult:
    """What :func:`fit` trained and with what: the optimizer and scheduler keep their state."""

    net: nn.Module
    optimizer: Optimizer
    scheduler: Scheduler | None
    history: History
    steps: int  # optimizer steps, Lightning's ``trainer.global_step``


def fit(
    net: nn.Module,
    train_loader: Batches,
    val_loader: Batches | None = None,
    *,
    optimizer: Callable[[Iterable[nn.Parameter]], Optimizer],
    scheduler: Callable[[Optimizer], Scheduler] | None = None,
    scheduler_interval: Literal["epoch", "step"] = "epoch",
    loss_fn: LossFn = F.cross_entropy,
    max_epochs: int = 1,
    accumulate_grad_batches: int = 1,
    gradient_clip_val: float | None = None,
    gradient_clip_algorithm: Literal["norm", "value"] = "norm",
    precision: Precision = "32-true",
    device: str | torch.device = "cpu",
) -> FitResult:
    """Train ``net`` for ``max_epochs`` epochs and validate after each one.

    Args:
        net: A plain ``nn.Module`` (say :class:`src.nets.MLP`); trained in place.
        train_loader: Training batches ``(x, y)``; iterated once per epoch.
        val_loader: Validation batches; ``None`` skips validation.
        optimizer: Builds the optimizer from the parameters (``partial(torch.optim.Adam, lr=1e-3)``).
        scheduler: Builds the LR scheduler from the optimizer; ``None`` keeps the LR constant.
        scheduler_interval: ``epoch`` or ``step`` (one optimizer step, not one micro-batch).
        loss_fn: ``loss_fn(output, y)``, a mean over the batch; raw logits go in for cross-entropy.
        max_epochs: Passes over ``train_loader``.
        accumulate_grad_batches: Micro-batches whose gradients add up to one optimizer step.
        gradient_clip_val: Clip threshold; ``None`` or 0 does not clip.
        gradient_clip_algorithm: ``norm`` (global L2 norm of all gradients) or ``value`` (each element).
        precision: ``32-true``, ``64-true`` (weights and inputs in float64) or ``bf16-mixed`` (autocast).
        device: Where the net and the batches go.

    Returns:
        The net, the optimizer and scheduler with their state, the per-epoch history and the step count.
    """
    if accumulate_grad_batches < 1:
        raise ValueError(f"accumulate_grad_batches={accumulate_grad_batches} must be at least 1.")
    device = torch.device(device)
    # the move and the dtype conversion come BEFORE the optimizer is built: a conversion that makes new
    # parameter objects would otherwise leave the optimizer updating the discarded ones
    net.to(device)
    if precision == "64-true":
        net.double()
    opt = optimizer(net.parameters())
    sched = scheduler(opt) if scheduler is not None else None
    plateau = isinstance(sched, ReduceLROnPlateau)
    if plateau and (scheduler_interval != "epoch" or val_loader is None):
        raise ValueError("ReduceLROnPlateau needs scheduler_interval='epoch' and a val_loader to watch.")

    history = History()
    steps = 0
    for _ in range(max_epochs):
        train_loss, epoch_steps = train_epoch(
            net,
            train_loader,
            opt,
            sched if scheduler_interval == "step" else None,
            loss_fn=loss_fn,
            accumulate_grad_batches=accumulate_grad_batches,
            gradient_clip_val=gradient_clip_val,
            gradient_clip_algorithm=gradient_clip_algorithm,
            precision=precision,
            device=device,
        )
        steps += epoch_steps
        history.train_loss.append(train_loss)
        if sched is not None and scheduler_interval == "epoch" and not plateau:
            # once per epoch, after its last optimizer step; stepped per batch it would decay
            # len(train_loader) times too fast
            sched.step()
        if val_loader is not None:
            history.val_loss.append(evaluate(net, val_loader, loss_fn, precision=precision, device=device))
        if isinstance(sched, ReduceLROnPlateau):  # not `if plateau:`, so that the type narrows too
            # after validation, since it watches this epoch's validation loss
            sched.step(history.val_loss[-1])
        history.lr.append(opt.param_groups[0]["lr"])
    return FitResult(net, opt, sched, history, steps)


def train_epoch(
    net: nn.Module,
    loader: Batches,
    optimizer: Optimizer,
    step_scheduler: LRScheduler | None = None,
    *,
    loss_fn: LossFn = F.cross_entropy,
    accumulate_grad_batches: int = 1,
    gradient_clip_val: float | None = None,
    gradient_clip_algorithm: Literal["norm", "value"] = "norm",
    precision: Precision = "32-true",
    device: str | torch.device = "cpu",
) -> tuple[float, int]:
    """One pass over ``loader``; see :func:`fit` for the arguments.

    Returns:
        The epoch's sample-weighted mean training loss and the number of optimizer steps taken.
    """
    device = torch.device(device)
    k = accumulate_grad_batches
    num_batches = len(loader)
    # train mode: dropout drops, BatchNorm normalizes with (and updates) batch statistics;
    # evaluate() switched both off, so this is switched back at the start of every epoch
    net.train()
    loss_sum = torch.zeros((), device=device)
    seen = 0
    steps = 0
    for batch_idx, batch in enumerate(loader):
        x, y = _to_device(batch, device, precision)
        # Groups of k micro-batches make one optimizer step each, counted from the start of the epoch.
        # The last group of an epoch may hold fewer than k batches: Lightning still steps on it (it
        # steps on the last batch of every epoch) rather than carry it into the next epoch.
        first_in_group = batch_idx % k == 0
        last_in_group = (batch_idx + 1) % k == 0 or batch_idx + 1 == num_batches
        if first_in_group:
            # once per group, not once per batch, so the group's gradients add up; None rather than
            # zeros: no memset, and step() skips a parameter that received no gradient
            optimizer.zero_grad(set_to_none=True)
        with _autocast(device, precision):
            output = net(x)  # (B, K) raw logits, never softmaxed: cross_entropy applies log-softmax
            loss = loss_fn(output, y)  # mean over the micro-batch
        # Divided by k, the configured group size, also in a shorter last group (Lightning divides
        # every micro-batch loss by accumulate_grad_batches): a full group's gradient is then the mean
        # over its k micro-batches, as one batch k times larger would give.
        (loss / k).backward()
        # detached: a running sum of graph-carrying losses keeps every step's graph alive;
        # summed on the device and read once per epoch, so there is no host sync per step
        loss_sum += loss.detach() * len(y)
        seen += len(y)
        if last_in_group:
            # after backward (the gradients exist) and before step (step uses what is clipped here)
            if gradient_clip_val and gradient_clip_algorithm == "value":
                torch.nn.utils.clip_grad_value_(net.parameters(), gradient_clip_val)
            elif gradient_clip_val:
                torch.nn.utils.clip_grad_norm_(net.parameters(), gradient_clip_val)
            optimizer.step()
            steps += 1
            if step_scheduler is not None:
                step_scheduler.step()  # per optimizer step, never per micro-batch
    return loss_sum.item() / seen, steps


def evaluate(
    net: nn.Module,
    loader: Batches,
    loss_fn: LossFn = F.cross_entropy,
    *,
    precision: Precision = "32-true",
    device: str | torch.device = "cpu",
) -> float:
    """The sample-weighted mean loss over ``loader``, in eval mode and without autograd."""
    device = torch.device(device)
    # eval mode: dropout off, BatchNorm uses its running statistics, so two evaluations agree
    net.eval()
    loss_sum = torch.zeros((), device=device)
    seen = 0
    # inference_mode: no graph is recorded, so no activation is kept for a backward that never comes
    with torch.inference_mode():
        for batch in loader:
            x, y = _to_device(batch, device, precision)
            with _autocast(device, precision):
                loss_sum += loss_fn(net(x), y).float() * len(y)
            seen += len(y)
    return loss_sum.item() / seen


def predict(
    net: nn.Module,
    loader: Iterable[tuple[torch.Tensor, ...]],
    *,
    precision: Precision = "32-true",
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """``(N, K)`` raw outputs for every batch ``(x, ...)`` of ``loader``, in eval mode, without autograd."""
    device = torch.device(device)
    net.eval()
    with torch.inference_mode():
        outputs = []
        for batch in loader:
            x = _to_device(batch[:1], device, precision)[0]
            with _autocast(device, precision):
                outputs.append(net(x).float())
        return torch.cat(outputs)


def _to_device(
    batch: tuple[torch.Tensor, ...], device: torch.device, precision: Precision
) -> tuple[torch.Tensor, ...]:
    # 64-true converts floating inputs to the weights' float64, as Lightning's DoublePrecision does
    dtype = torch.float64 if precision == "64-true" else None
    return tuple(t.to(device, dtype=dtype) if t.is_floating_point() else t.to(device) for t in batch)


def _autocast(device: torch.device, precision: Precision) -> torch.autocast:
    # bf16-mixed: autocast runs matmuls in bfloat16 and keeps reductions and losses in float32; the
    # weights, their gradients and the optimizer state stay float32
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed")
