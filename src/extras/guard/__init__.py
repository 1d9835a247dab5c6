"""Non-finite steps are skipped, never taken, and a run whose weights blow up is never saved."""

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from torch.distributed.tensor import DTensor
from typing_extensions import override

from src.errors import UserInputError
from src.extras.gradients import step_norm


class NonFiniteGuard(Callback):
    """Skips an optimizer step whose gradients hold a NaN or an infinity, and stops a run that keeps at it.

    (Precisely: a step whose gradients' global L2 norm is not finite; with finite elements that takes a
    norm beyond the dtype's range, about 1.8e19 in float32.)

    After backward (and after unscaling under mixed precision), before clipping and the update: if any
    gradient is not finite on any process (all processes agree), every gradient is dropped, so the
    optimizer leaves weights and moments as they were, and a per-step scheduler is set back as if that
    step had not happened. The first offending parameters (on several processes, the process too) and the
    batch are named, and the skipped steps are counted (``train/skipped_steps``, per epoch). After
    ``max_consecutive`` skipped steps in a row, or an epoch whose every step was skipped, the run stops
    with one sentence and a non-zero exit. A checkpoint whose weights are not finite is never written.

    The check reads one flag back from the device per optimizer step.

    Args:
        max_consecutive: Skipped steps in a row after which the run stops.
    """

    def __init__(self, max_consecutive: int = 10) -> None:
        if max_consecutive < 1:
            raise UserInputError(f"NonFiniteGuard max_consecutive={max_consecutive} must be at least 1.")
        self.max_consecutive = max_consecutive
        self.skipped = 0
        self.consecutive = 0
        self._epoch_steps = self._epoch_skipped = 0
        self._rewind: list[tuple[Any, dict[str, Any], list[float]]] = []
        self._parameters: list[tuple[str, torch.nn.Parameter]] = []
        self._batch_idx = 0

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # once: walking the module tree on every step costs more than the check itself; the parameters
        # are final here (a strategy that shards them has done so in configure_model)
        self._parameters = list(pl_module.named_parameters())

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch_idx = batch_idx  # to name the batch of a skipped step

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        named = [(name, p.grad) for name, p in self._parameters if p.grad is not None]
        if not named:
            return
        self._epoch_steps += 1
        # one fused norm over all gradients instead of a check per tensor: it is NaN or infinite when any
        # element is (or, with every element finite, when the norm itself exceeds the dtype's range,
        # a step that clipping would turn into a zero update anyway); StepValues reuses it
        norm = step_norm([grad for _, grad in named], optimizer, trainer.global_step)
        finite = torch.isfinite(norm)
        if trainer.world_size > 1:  # all processes skip the step together, or none does
            finite = trainer.strategy.reduce((~finite).float(), reduce_op="max") == 0
        if bool(finite.item()):
            self.consecutive = 0
            return
        self.skipped += 1
        self.consecutive += 1
        self._epoch_skipped += 1
        culprit = self.culprit(trainer, named, norm.device)
        for param in pl_module.parameters():
            param.grad = None  # an optimizer leaves a parameter without a gradient untouched
        # per-step schedulers step after this, in the same batch: remember where they stood
        self._rewind = [
            (
                config.scheduler,
                config.scheduler.state_dict(),
                [group["lr"] for group in optimizer.param_groups],
            )
            for config in trainer.lr_scheduler_configs
            if config.interval == "step"
        ]
        where = f"epoch {trainer.current_epoch}, batch {self._batch_idx}"
        rank_zero_info(
            f"Skipped the optimizer step at {where}: {culprit} ({self.consecutive} in a row, "
            f"{self.skipped} in all)."
        )
        if self.consecutive >= self.max_consecutive:
            raise UserInputError(
                f"{self.consecutive} optimizer steps in a row had non-finite gradients (last at {where}: "
                f"{culprit}); the run stops: lower the learning rate, enable clipping, or look for extreme "
                "values in the data."
            )

    @staticmethod
    def trouble(named: list[tuple[str, torch.Tensor]]) -> str | None:
        """What is wrong with this process's gradients (its shards, when sharded), naming the first
        parameters; ``None`` when they are finite. Tensor by tensor: only on the rare skipped step."""
        local = [(name, grad.to_local() if isinstance(grad, DTensor) else grad) for name, grad in named]
        broken = [name for name, grad in local if not torch.isfinite(grad).all()]
        if broken:
            return f"non-finite gradients in {', '.join(broken[:3])}"
        norm = torch.nn.utils.get_total_norm([grad for _, grad in local])
        if torch.isfinite(norm):
            return None
        # every element finite, their squares' sum beyond the dtype's range: the largest are to blame
        largest = sorted(local, key=lambda pair: -pair[1].abs().max().item())[:3]
        dtype = str(norm.dtype).removeprefix("torch.")
        names = ", ".join(name for name, _ in largest)
        return f"gradients too large for {dtype} (their norm overflows; largest in {names})"

    def culprit(self, trainer: L.Trainer, named: list[tuple[str, torch.Tensor]], device: torch.device) -> str:
        """Which gradients made the step non-finite, and on several processes, on which process."""
        trouble = self.trouble(named)
        if trainer.world_size == 1:
            return trouble or "gradients whose norm overflows"
        # the first process whose own gradients broke (every process asks: a collective)
        mine = trainer.global_rank if trouble is not None else trainer.world_size
        first = int(trainer.strategy.reduce(torch.tensor(mine, device=device), reduce_op="min").item())
        if trouble is not None:
            return f"{trouble} on process {trainer.global_rank}"
        if first < trainer.world_size:
            return f"non-finite gradients on another process (process {first})"
        # each process's shards finite, their norm across the processes not
        return "gradients whose norm across the processes overflows"

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        for scheduler, state, lrs in self._rewind:
            scheduler.load_state_dict(state)
            for group, lr in zip(scheduler.optimizer.param_groups, lrs, strict=True):
                group["lr"] = lr
        self._rewind = []

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch_steps = self._epoch_skipped = 0

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.log(
            "train/skipped_steps", float(self.skipped), on_step=False, on_epoch=True, reduce_fx="max"
        )
        if self._epoch_steps and self._epoch_skipped == self._epoch_steps:
            # a whole epoch without one finite step trained nothing: not a run to end with exit status 0
            raise UserInputError(
                f"every optimizer step of epoch {trainer.current_epoch} ({self._epoch_steps}) had non-finite "
                "gradients, so nothing was trained; look for a NaN in the loss or the data, or lower the "
                "learning rate."
            )

    @override
    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # this process's shards of sharded (FSDP2) weights: each process checks what it holds
        floats = {
            name: t.to_local() if isinstance(t, DTensor) else t
            for name, t in checkpoint["state_dict"].items()
            if t.is_floating_point()
        }
        # one fused norm first (as for the gradients); tensor by tensor only to name the broken ones
        if not floats or torch.isfinite(torch.nn.utils.get_total_norm(list(floats.values()))):
            return
        broken = [name for name, t in floats.items() if not t.isfinite().all()] or ["their norm overflows"]
        raise UserInputError(
            f"the weights are no longer finite at epoch {trainer.current_epoch} (first {broken[:3]}), so "
            "no checkpoint was written and the run stops: lower the learning rate or enable clipping."
        )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped, "consecutive": self.consecutive}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped = state_dict["skipped"]
        self.consecutive = state_dict["consecutive"]
