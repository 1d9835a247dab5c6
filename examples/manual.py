"""The classifier with the optimization loop spelled out in ``training_step`` (manual optimization).

``python -m src.cli fit --config configs/manual.yaml`` runs it. It trains exactly as
:class:`src.models.Classifier` does under the Trainer's automatic optimization, and as the hand-written
loop in :mod:`examples.loop` does (``examples/test_parity.py``); start from here when a step needs more than
one optimizer call (GANs, several optimizers, a custom update).
"""

import math
from typing import Any, Literal

import torch
from torch.optim.lr_scheduler import ReduceLROnPlateau
from typing_extensions import override

from src.errors import UserInputError
from src.models.classifier import Classifier


class ManualClassifier(Classifier):
    """:class:`Classifier` with ``automatic_optimization = False``; metrics, validation and test as the base.

    With manual optimization Lightning refuses its own accumulation and clipping, so the Trainer's
    ``accumulate_grad_batches`` stays 1, its ``gradient_clip_val`` stays unset, and the same settings
    are given to the model instead.

    Its own arguments are below; the rest are :class:`Classifier`'s and :class:`BaseTask`'s, passed
    through ``**kwargs`` (``--help`` lists them too).

    Args:
        accumulate_grad_batches: Micro-batches whose gradients add up to one optimizer step.
        gradient_clip_val: Clip threshold after the group's last backward; ``None`` or 0 does not clip.
        gradient_clip_algorithm: ``norm`` (global L2 norm of all gradients) or ``value`` (each element).
        **kwargs: :class:`Classifier`'s and :class:`BaseTask`'s arguments.
    """

    def __init__(
        self,
        *,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: Literal["norm", "value"] = "norm",
        **kwargs: Any,
    ) -> None:
        if accumulate_grad_batches < 1:
            raise UserInputError(
                f"model.init_args.accumulate_grad_batches={accumulate_grad_batches} must be at least 1."
            )
        super().__init__(**kwargs)
        self.automatic_optimization = False

    @override
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        optimizer = self.optimizers()
        # a list only when configure_optimizers returns several; the base returns one
        assert not isinstance(optimizer, list)
        k = self.hparams["accumulate_grad_batches"]
        # Groups of k micro-batches, counted from the start of each epoch (batch_idx restarts at 0);
        # the last batch of the epoch closes a group even when it holds fewer than k, as in Lightning.
        last_of_epoch = batch_idx + 1 == self.trainer.num_training_batches
        if batch_idx % k == 0:
            # first micro-batch of a group: clear once, so the group's gradients add up
            optimizer.zero_grad(set_to_none=True)
        # forward, loss, epoch metrics and logging: the base's shared step; (B, K) raw logits inside
        loss = super().training_step(batch, batch_idx)
        # always / k, also in a shorter last group: what Lightning's automatic loop does;
        # manual_backward applies what the precision plugin needs (loss scaling under 16-mixed)
        self.manual_backward(loss / k)
        if (batch_idx + 1) % k == 0 or last_of_epoch:
            # clipping happens inside step(), in on_before_optimizer_step below
            optimizer.step()
            self._step_scheduler("step")
        if last_of_epoch:
            # after the epoch's last optimizer step and before validation, where Lightning steps it
            self._step_scheduler("epoch")
        return loss.detach()

    @override
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Lightning calls this inside optimizer.step(), after the group's last backward and after the
        # precision plugin unscaled the gradients (16-mixed), before the update: where clipping belongs
        self.clip_gradients(
            optimizer, self.hparams["gradient_clip_val"], self.hparams["gradient_clip_algorithm"]
        )

    @override
    def run_length(self, argument: str = "T_max") -> int:
        # the Trainer's estimate counts batches here: its own accumulate_grad_batches is 1 under manual
        # optimization, while this module steps once per group of k
        length = super().run_length(argument)  # also makes the Trainer count the training batches
        if self.hparams["scheduler_interval"] != "step":
            return length
        k = self.hparams["accumulate_grad_batches"]
        steps = math.ceil(self.trainer.num_training_batches / k) * max(self.trainer.max_epochs or 1, 1)
        return min(steps, self.trainer.max_steps) if self.trainer.max_steps != -1 else steps

    @override
    def configure_optimizers(self) -> Any:
        config = super().configure_optimizers()
        if isinstance(config, dict) and isinstance(config.get("lr_scheduler"), dict):
            # the base names the watched metric for Lightning's automatic stepping; here
            # on_train_epoch_end reads it from the hyperparameters, and Lightning warns about the key
            config["lr_scheduler"].pop("monitor", None)
        return config

    @override
    def on_train_epoch_end(self) -> None:
        super().on_train_epoch_end()  # the epoch's values
        scheduler = self.lr_schedulers()
        if isinstance(scheduler, ReduceLROnPlateau):
            # after validation: it watches this epoch's validation metric
            monitor = self.hparams["scheduler_monitor"]
            if monitor not in self.trainer.callback_metrics:
                raise UserInputError(
                    f"ReduceLROnPlateau watches model.init_args.scheduler_monitor={monitor!r}, which was not "
                    f"logged this epoch; choose one of {sorted(self.trainer.callback_metrics)}."
                )
            scheduler.step(self.trainer.callback_metrics[monitor])

    def _step_scheduler(self, interval: Literal["epoch", "step"]) -> None:
        scheduler = self.lr_schedulers()
        if scheduler is None or isinstance(scheduler, ReduceLROnPlateau):
            return
        assert not isinstance(scheduler, list)  # the base configures at most one scheduler
        if self.hparams["scheduler_interval"] == interval:
            scheduler.step()
