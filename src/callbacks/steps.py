"""Per-step values for TensorBoard, read from public state, for any LightningModule."""

from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.distributed.tensor import DTensor
from typing_extensions import override


class StepValues(Callback):
    """Writes the step's loss, learning rates, gradient norm and whether clipping fired, every
    ``trainer.log_every_n_steps`` optimizer steps.

    Tags: ``train/loss_step`` (the loss ``training_step`` returned; with accumulated gradients, the
    step's last micro-batch's), ``train/lr`` (``train/lr/<group name or pgN>`` for several parameter
    groups, ``…/opt<N>`` for several optimizers), ``train/grad_norm`` (the total L2 norm of the gradients
    the optimizer is about to use, before clipping) and ``train/grad_clipped`` (1 when clipping cut this
    step's gradients: the Trainer's, judged by its threshold; or a module's own under manual
    optimization, judged by the gradients' norm at the batch's end, which reads 0 after an optimizer that
    writes into the gradients, as SGD with Nesterov momentum does).

    Everything comes from public hooks and state: ``on_before_optimizer_step`` (after backward and
    unscaling, before clipping and the update) sees the optimizer's parameter groups and gradients,
    ``on_train_batch_end`` the step's output and the same gradients after clipping (clipping scales them
    in place; they are cleared only before the next backward). As Lightning's own
    ``LearningRateMonitor`` does, the values go straight to the loggers, at the index of the step they
    belong to, so they cost nothing on the other steps: no ``self.log`` call, no device sync; one
    read-back per logging step.
    """

    def __init__(self) -> None:
        # this optimizer step's values, written with the loss once the batch ends: (step, values)
        self._pending: tuple[int, dict[str, torch.Tensor | float]] | None = None
        # the gradients whose norm was taken before clipping, by tag, to measure again after it
        self._clipped: dict[str, list[torch.Tensor]] = {}
        self._due = False  # whether this batch's optimizer steps include a logging step

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pending = None
        self._clipped = {}

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # decided once per batch: with several optimizers (manual optimization) each of their steps
        # counts as one, and all of them are written together when any is a logging step
        # (log_every_n_steps is public and documented, but assigned in a connector without being declared)
        every: int = trainer.log_every_n_steps  # type: ignore[attr-defined]
        first = trainer.global_step
        steps = range(first, first + len(trainer.optimizers))
        self._due = every > 0 and any((step + 1) % every == 0 for step in steps)

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if not (self._due or trainer.should_stop):
            return
        optimizers = trainer.optimizers
        suffix = "" if len(optimizers) == 1 else f"/opt{optimizers.index(optimizer) + 1}"
        step, values = self._pending or (trainer.global_step, {})
        groups = optimizer.param_groups
        for index, group in enumerate(groups, start=1):
            name = "" if len(groups) == 1 else f"/{group.get('name', f'pg{index}')}"
            values[f"train/lr{suffix}{name}"] = float(group["lr"])  # the optimizer's own Python number
        grads = [p.grad for group in groups for p in group["params"] if p.grad is not None]
        if grads:  # none when NonFiniteGuard has dropped this step's
            norm = torch.nn.utils.get_total_norm(grads)
            if isinstance(norm, DTensor):  # FSDP2: the shards' norms, gathered on every process
                norm = norm.full_tensor()
            values[f"train/grad_norm{suffix}"] = norm
            clip = trainer.gradient_clip_val
            if clip:  # the Trainer's clipping, which comes next, fires above its threshold
                if trainer.gradient_clip_algorithm == "value":
                    fired = torch.stack([g.abs().max() for g in grads]).max() > clip
                else:
                    fired = norm > clip
                values[f"train/grad_clipped{suffix}"] = fired.float()
            else:  # a module that clips itself (manual optimization): measured again at the batch's end
                self._clipped[suffix] = grads
        self._pending = (step, values)

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._pending is None:
            return
        step, values = self._pending
        self._pending = None
        for suffix, grads in self._clipped.items():
            after = torch.nn.utils.get_total_norm(grads)
            if isinstance(after, DTensor):
                after = after.full_tensor()
            values[f"train/grad_clipped{suffix}"] = (after < values[f"train/grad_norm{suffix}"]).float()
        self._clipped = {}
        loss = step_loss(trainer, pl_module, outputs)
        if loss is not None:
            values["train/loss_step"] = loss
        write(trainer, values, step)


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
