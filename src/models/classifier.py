"""Classification: raw logits into cross-entropy; accuracy and macro F1 per stage. With several targets
(multi-label), one logit per label into binary cross-entropy, each label thresholded at 0.5."""

from typing import Any

import torch
import torch.nn.functional as F
from torchmetrics import MetricCollection
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassF1Score,
    MultilabelAccuracy,
    MultilabelF1Score,
)
from typing_extensions import override

from src.errors import UserInputError
from src.models.base import BaseTask


class Classifier(BaseTask):
    """Predicts one of ``out_features`` classes or, with several targets, whether each label holds.

    Args:
        label_smoothing: Mass moved from the true class to all classes (0: off); a label's 1 is ``1 - s/2``.
        class_weights: Weigh the loss by the training split's balanced class weights (labels: ``pos_weight``).
        **kwargs: :class:`BaseTask`'s arguments.
    """

    #: (K,) loss weight per class, or per label's positives, a buffer registered in ``__init__``
    class_weight: torch.Tensor

    def __init__(self, *, label_smoothing: float = 0.0, class_weights: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # filled from the training split in setup(); a buffer, so the checkpoint carries it
        self.register_buffer("class_weight", torch.ones(self.hparams["out_features"]))

    @property
    def multilabel(self) -> bool:
        """Several targets, each a label of its own: a sigmoid per label, not a softmax over classes."""
        return self.hparams.get("target_names") is not None

    @override
    def check_shapes(self) -> None:
        k, targets = self.hparams["out_features"], self.hparams.get("target_names")
        if targets is not None and len(targets) != k:
            raise UserInputError(f"model Classifier has {k} outputs for {len(targets)} targets {targets}.")
        if k < 2:
            raise UserInputError(
                f"model Classifier needs at least 2 classes but the data gives out_features={k}; "
                "regression data goes to src.models.Regressor."
            )

    @override
    def build_metrics(self) -> MetricCollection:
        k = self.hparams["out_features"]
        if self.multilabel:  # each label's probability above 0.5 is a 1
            return MetricCollection(
                {"acc": MultilabelAccuracy(k, average="micro"), "f1": MultilabelF1Score(k, average="macro")}
            )
        return MetricCollection(
            {"acc": MulticlassAccuracy(k, average="micro"), "f1": MulticlassF1Score(k, average="macro")}
        )

    @override
    def setup(self, stage: str) -> None:
        datamodule = self.trainer.datamodule  # type: ignore[attr-defined]  # public, undeclared on Trainer
        if stage == "fit" and self.hparams["class_weights"] and datamodule is not None:
            self.class_weight.copy_(datamodule.class_weights())

    @override
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        weight = self.class_weight if self.hparams["class_weights"] else None
        smoothing = self.hparams["label_smoothing"]
        if self.multilabel:
            if target.is_floating_point():  # values, not 0/1: shapes alone cannot tell them apart
                raise UserInputError(
                    "model Classifier reads several targets as labels, but the data's are values "
                    "(data.task: regression); use src.models.Regressor."
                )
            # (B, K) logits, never sigmoided (the loss does it); 0/1 targets smoothed to s/2 and 1 - s/2
            soft = target.to(output.dtype) * (1 - smoothing) + smoothing / 2
            return F.binary_cross_entropy_with_logits(output, soft, pos_weight=weight)
        # output: (B, K) raw logits, never softmaxed: cross_entropy applies log-softmax itself
        return F.cross_entropy(output, target, weight=weight, label_smoothing=smoothing)

    @override
    def metric_inputs(self, output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return output, target

    @override
    def predict_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> dict[str, torch.Tensor]:
        return self.predictions(self(batch[0]))

    def predictions(self, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """What :meth:`predict_step` gives for the net's ``(B, K)`` logits: for a callback that has them
        (validation_step's ``output``) and names predictions without running the net again."""
        if self.multilabel:
            probs = logits.sigmoid()  # (B, K): each label's own probability, thresholded as the metrics do
            return {"probs": probs, "preds": (probs > 0.5).long()}
        probs = logits.softmax(dim=-1)
        return {"probs": probs, "preds": probs.argmax(dim=-1)}
