"""Regression: MSE or Huber on optionally standardized targets; MAE, RMSE and R² in original units."""

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torchmetrics import MeanAbsoluteError, MeanSquaredError, MetricCollection, R2Score
from typing_extensions import override

from src.errors import UserInputError
from src.models.base import BaseTask


class Regressor(BaseTask):
    """Predicts one continuous value.

    Its own arguments are below; the rest (``net``, ``optimizer``, ``scheduler`` ...) are
    :class:`BaseTask`'s and pass through ``**kwargs`` (``--help`` lists them too).

    Args:
        loss_fn: ``mse`` or ``huber``.
        huber_delta: Where the Huber loss turns from quadratic to linear (in standardized units when
            ``standardize_target`` is on).
        standardize_target: Train on ``(y - mean) / std`` with the training split's statistics; metrics
            and predictions are always in original units.
        **kwargs: :class:`BaseTask`'s arguments.
    """

    #: the training split's target mean and std, scalar buffers registered in ``__init__``
    target_mean: torch.Tensor
    target_std: torch.Tensor

    def __init__(
        self,
        *,
        loss_fn: Literal["mse", "huber"] = "mse",
        huber_delta: float = 1.0,
        standardize_target: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # identity until setup() fits them on the training split; buffers, so checkpoints carry them
        self.register_buffer("target_mean", torch.tensor(0.0))
        self.register_buffer("target_std", torch.tensor(1.0))

    @override
    def check_shapes(self) -> None:
        if (k := self.hparams["out_features"]) != 1:
            raise UserInputError(
                f"model Regressor predicts one value but the data gives out_features={k} (classes?); "
                "classification data goes to src.models.Classifier."
            )

    @override
    def build_metrics(self) -> MetricCollection:
        return MetricCollection(
            {"mae": MeanAbsoluteError(), "rmse": MeanSquaredError(squared=False), "r2": R2Score()}
        )

    @override
    def setup(self, stage: str) -> None:
        # Trainer.datamodule is public and documented, but Lightning assigns it in its data connector
        # without declaring it on the class, so mypy cannot see it
        datamodule = self.trainer.datamodule  # type: ignore[attr-defined]
        if stage == "fit" and self.hparams["standardize_target"] and datamodule is not None:
            mean, std = datamodule.target_stats()
            self.target_mean.fill_(mean)
            self.target_std.fill_(std)

    @override
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # output: (B, 1) in standardized units; target: (B,) in original units
        scaled = (target - self.target_mean) / self.target_std
        if self.hparams["loss_fn"] == "huber":
            return F.huber_loss(output.squeeze(-1), scaled, delta=self.hparams["huber_delta"])
        return F.mse_loss(output.squeeze(-1), scaled)

    def to_original_units(self, output: torch.Tensor) -> torch.Tensor:
        """(B, 1) net output → (B,) predictions in the target's units."""
        return output.squeeze(-1) * self.target_std + self.target_mean

    @override
    def metric_inputs(self, output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.to_original_units(output), target

    @override
    def predict_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> dict[str, torch.Tensor]:
        return {"preds": self.to_original_units(self(batch[0]))}
