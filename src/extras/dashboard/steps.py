"""Per-step values for TensorBoard, read from public state, for any LightningModule."""

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from src.extras.gradients import step_norm, total_norm
from src.extras.loggers import step_loss, write

#: the name of the fit's share of optimizer steps whose gradients clipping cut, in ``callback_metrics``
CLIPPED_SHARE = "train/optimization/clipped_share"


class StepValues(Callback):
    """Writes the step's loss, learning rates, gradient norm and the share of steps clipping cut, every
    ``trainer.log_every_n_steps`` optimizer steps.

    Tags (as the project's logger writes them, in the ``train`` run): ``optimization/loss`` (the loss
    ``training_step`` returned; with accumulated gradients, the step's last micro-batch's),
    ``optimization/lr`` (``…/lr/<group name or pgN>`` for several parameter groups, ``…/opt<N>`` for several
    optimizers), ``optimization/grad_norm`` (the total L2 norm of the gradients the optimizer is about to
    use, before clipping) and ``optimization/clipped`` (the share of the interval's optimizer steps whose
    gradients clipping cut: the Trainer's, judged by its threshold; or a module's own under manual
    optimization or in ``configure_gradient_clipping``, judged by the gradients' norm at the batch's end,
    which reads 0 after an optimizer that writes into the gradients, as SGD with Nesterov momentum does).
    The fit's share so far is also in ``trainer.callback_metrics`` as :data:`CLIPPED_SHARE` (not logged).

    Everything comes from public hooks and state: ``on_before_optimizer_step`` (after backward and
    unscaling, before clipping and the update) sees the optimizer's parameter groups and gradients,
    ``on_train_batch_end`` the step's output and the same gradients after clipping (clipping scales them
    in place; they are cleared only before the next backward). Whether clipping fired is counted on the
    device at every step; as Lightning's own ``LearningRateMonitor`` does, the values go straight to the
    loggers, at the index of the step they belong to, read back from the device together once per
    logging interval: no ``self.log`` call per step, no device sync per step.
    """

    def __init__(self) -> None:
        # this optimizer step's values, written with the loss once the batch ends: (step, values)
        self._pending: tuple[int, dict[str, torch.Tensor | float]] | None = None
        # the gradients whose norm was taken before clipping, by suffix, to measure again after it
        self._before: dict[str, tuple[list[torch.Tensor], torch.Tensor]] = {}
        self._due = False  # whether this batch's optimizer steps include a logging step
        # steps clipped (on the device) and steps counted, by suffix: in this interval, and in the fit
        self._interval: dict[str, tuple[torch.Tensor, int]] = {}
        self._fit: dict[str, tuple[torch.Tensor, int]] = {}

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._interval, self._fit = {}, {}

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pending = None
        self._before = {}

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
        optimizers = trainer.optimizers
        suffix = "" if len(optimizers) == 1 else f"/opt{optimizers.index(optimizer) + 1}"
        groups = optimizer.param_groups
        grads = [p.grad for group in groups for p in group["params"] if p.grad is not None]
        norm = None  # no gradients when NonFiniteGuard dropped this step's
        if grads:  # taken once per step: NonFiniteGuard, before or after this, reuses it
            norm = step_norm(grads, optimizer, trainer.global_step)
        clip = trainer.gradient_clip_val
        if norm is not None and clip:  # the Trainer's clipping, which comes next, fires above its threshold
            if trainer.gradient_clip_algorithm == "value":
                fired = torch.stack([g.abs().max() for g in grads]).max() > clip
            else:
                fired = norm > clip
            self._count(suffix, fired)
        elif norm is not None:  # a module that clips itself: measured again at the batch's end
            self._before[suffix] = (grads, norm)
        if not (self._due or trainer.should_stop):
            return
        step, values = self._pending or (trainer.global_step, {})
        for index, group in enumerate(groups, start=1):
            name = "" if len(groups) == 1 else f"/{group.get('name', f'pg{index}')}"
            values[f"train/optimization/lr{suffix}{name}"] = float(group["lr"])  # the optimizer's own number
        if norm is not None:
            values[f"train/optimization/grad_norm{suffix}"] = norm
        self._pending = (step, values)

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        for suffix, (grads, before) in self._before.items():
            self._count(suffix, total_norm(grads) < before)
        self._before = {}
        if self._pending is None:
            return
        step, values = self._pending
        self._pending = None
        for suffix, (clipped, steps) in self._interval.items():
            values[f"train/optimization/clipped{suffix}"] = clipped / steps
        self._interval = {}
        loss = step_loss(trainer, pl_module, outputs)
        if loss is not None:
            values["train/optimization/loss"] = loss
        write(trainer, values, step)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if "" in self._fit:  # one optimizer: the fit's share so far, for the run's summary (not logged)
            clipped, steps = self._fit[""]
            pl_module.log(CLIPPED_SHARE, clipped / steps, logger=False)

    def _count(self, suffix: str, fired: torch.Tensor) -> None:
        """Add one step, clipped or not, on the device: no read-back."""
        for counts in (self._interval, self._fit):
            clipped, steps = counts.get(suffix, (torch.zeros((), device=fired.device), 0))
            counts[suffix] = (clipped + fired.float(), steps + 1)
