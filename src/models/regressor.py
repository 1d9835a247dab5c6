"""Regression: MSE or Huber on optionally log-transformed and standardized targets; MAE, RMSE and R² in
original units. With several targets, each is transformed and standardized on its own, and each metric is
logged per target (``val/r2(<target>)``) and as their mean (``val/r2``)."""

from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torchmetrics import MeanAbsoluteError, MeanSquaredError, MetricCollection, R2Score
from typing_extensions import override

from src.errors import UserInputError
from src.models.base import BaseTask


class Regressor(BaseTask):
    """Predicts one continuous value, or one per target when the data has several (``target_names``).

    Args:
        loss_fn: ``mse`` or ``huber``.
        huber_delta: Where the Huber loss turns from quadratic to linear (in standardized units).
        standardize_target: Train on ``(y - mean) / std`` of the training split; metrics stay in its units.
        target_transform: ``log``: train on ``log(1 + y)`` (targets at least 0); ``auto``: ``log`` for
            right-skewed targets (above :data:`SKEWED`) the log makes less skewed; ``none``: as they are
            (the default: a net fitting the log's mean under-predicts the large values an RMSE weighs).
        **kwargs: :class:`BaseTask`'s arguments.
    """

    #: the training split's target mean and std (of what the net learns), and 1 where it learns the log:
    #: buffers, scalars for one target, ``(K,)`` for several
    target_mean: torch.Tensor
    target_std: torch.Tensor
    target_log: torch.Tensor

    def __init__(
        self,
        *,
        loss_fn: Literal["mse", "huber"] = "mse",
        huber_delta: float = 1.0,
        standardize_target: bool = True,
        target_transform: Literal["auto", "log", "none"] = "none",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # identity until setup() fits them on the training split; buffers, so checkpoints carry them
        shape = () if self.hparams.get("target_names") is None else (self.hparams["out_features"],)
        self.register_buffer("target_mean", torch.zeros(shape))
        self.register_buffer("target_std", torch.ones(shape))
        self.register_buffer("target_log", torch.zeros(shape))
        self.register_load_state_dict_pre_hook(_without_log)

    @override
    def check_shapes(self) -> None:
        k, targets = self.hparams["out_features"], self.hparams.get("target_names")
        if targets is not None and len(targets) != k:
            raise UserInputError(f"model Regressor has {k} outputs for the {len(targets)} targets {targets}.")
        if targets is None and k != 1:
            raise UserInputError(
                f"model Regressor predicts one value but the data gives out_features={k} (classes?); "
                "classification data goes to src.models.Classifier."
            )

    @override
    def build_metrics(self) -> MetricCollection:
        targets = self.hparams.get("target_names")
        if targets is None:
            return MetricCollection(
                {"mae": MeanAbsoluteError(), "rmse": MeanSquaredError(squared=False), "r2": R2Score()}
            )
        k = len(targets)  # each metric (K,), one value per target: logged per target and as their mean
        return MetricCollection(
            {
                "mae": MeanAbsoluteError(num_outputs=k),
                "rmse": MeanSquaredError(squared=False, num_outputs=k),
                "r2": R2Score(multioutput="raw_values"),
            }
        )

    @override
    def setup(self, stage: str) -> None:
        datamodule = self.trainer.datamodule  # type: ignore[attr-defined]  # public, undeclared on Trainer
        if stage == "fit" and datamodule is not None:
            self.fit_target_scaling(datamodule.train_targets())

    def fit_target_scaling(self, targets: np.ndarray) -> None:
        """Set each target's transform and standardization from training targets ``(N,)`` or ``(N, K)``."""
        y = np.asarray(targets, dtype=np.float64).reshape(len(targets), -1)  # (N, K), K = 1 for one target
        logs = [use_log(column, self.hparams["target_transform"]) for column in y.T]
        learnt = np.stack([np.log1p(c) if log else c for c, log in zip(y.T, logs, strict=True)], axis=1)
        standardize, std = self.hparams["standardize_target"], learnt.std(axis=0)
        mean = learnt.mean(axis=0) if standardize else np.zeros(len(logs))
        std = np.where(std == 0, 1.0, std) if standardize else np.ones(len(logs))  # a constant target: 1
        for buffer, values in ((self.target_log, logs), (self.target_mean, mean), (self.target_std, std)):
            buffer.copy_(torch.as_tensor(np.asarray(values, np.float64)).reshape(buffer.shape))

    def learnt_units(self, target: torch.Tensor) -> torch.Tensor:
        """(B,) or (B, K) targets in original units → the units the net learns: transformed, standardized."""
        learnt = torch.where(self.target_log > 0, torch.log1p(target.clamp(min=0)), target)
        return (learnt - self.target_mean) / self.target_std

    @override
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # output: (B, 1) or (B, K) in the learnt units; target: (B,) or (B, K) in original units
        if not target.is_floating_point():  # class ids: several labels have the shape of several values
            raise UserInputError(
                "model Regressor reads the targets as values, but the data's are labels "
                "(data.task: classification); use src.models.Classifier."
            )
        scaled = self.learnt_units(target)
        if self.hparams["loss_fn"] == "huber":
            return F.huber_loss(output.squeeze(-1), scaled, delta=self.hparams["huber_delta"])
        return F.mse_loss(output.squeeze(-1), scaled)

    def to_original_units(self, output: torch.Tensor) -> torch.Tensor:
        """(B, 1) net output → (B,) predictions in the target's units; (B, K) → (B, K) with several."""
        # the squeeze only where there is one target: an exported graph keeps a squeeze of a K-wide axis
        values = (output if self.hparams.get("target_names") else output.squeeze(-1)) * self.target_std
        values = values + self.target_mean
        return torch.where(self.target_log > 0, torch.expm1(values), values)

    @override
    def metric_inputs(self, output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.to_original_units(output), target

    @override
    def predict_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> dict[str, torch.Tensor]:
        return {"preds": self.to_original_units(self(batch[0]))}


#: ``target_transform: auto`` takes the logarithm of targets more skewed than this (and all at least 0)
SKEWED = 1.0


def use_log(y: np.ndarray, transform: str) -> bool:
    """Whether the net learns ``log(1 + y)`` of the training targets ``y`` under ``transform``."""
    if transform == "none" or len(y) == 0:
        return False
    if transform == "log":
        if y.min() < 0:
            raise UserInputError(
                f"model.init_args.target_transform=log needs targets of at least 0, but a training target is "
                f"{y.min():g}; use auto or none."
            )
        return True
    if y.min() < 0:
        return False
    skew = pd.Series(y).skew()
    return bool(skew > SKEWED and abs(pd.Series(np.log1p(y)).skew()) < skew)


def _without_log(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """An older checkpoint without ``target_log`` learnt the target as it is."""
    state_dict.setdefault(f"{prefix}target_log", torch.tensor(0.0))
