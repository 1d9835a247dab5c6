"""Classification: raw logits into cross-entropy; accuracy and macro F1 per stage."""

from typing import Any

import torch
import torch.nn.functional as F
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score
from typing_extensions import override

from src.errors import UserInputError
from src.models.base import BaseTask


class Classifier(BaseTask):
    """Predicts one of ``out_features`` classes; ``net``, ``optimizer``, ``scheduler`` ... are
    :class:`BaseTask`'s, passed through ``**kwargs`` (``--help`` lists them too).

    Args:
        label_smoothing: Mass moved from the true class to all classes in the loss (0 turns it off).
        class_weights: Weigh the loss by balanced class weights computed on the training split.
        **kwargs: :class:`BaseTask`'s arguments.
    """

    #: (K,) loss weight per class, a buffer registered in ``__init__`` (declared here for type checkers)
    class_weight: torch.Tensor

    def __init__(self, *, label_smoothing: float = 0.0, class_weights: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # filled from the training split in setup(); a buffer, so the checkpoint carries it
        self.register_buffer("class_weight", torch.ones(self.hparams["out_features"]))

    @override
    def check_shapes(self) -> None:
        if (k := self.hparams["out_features"]) < 2:
            raise UserInputError(
                f"model Classifier needs at least 2 classes but the data gives out_features={k}; "
                "regression data goes to src.models.Regressor."
            )

    @override
    def build_metrics(self) -> MetricCollection:
        k = self.hparams["out_features"]
        return MetricCollection(
            {"acc": MulticlassAccuracy(k, average="micro"), "f1": MulticlassF1Score(k, average="macro")}
        )

    @override
    def setup(self, stage: str) -> None:
        # Trainer.datamodule is public and documented, but Lightning assigns it in its data connector
        # without declaring it on the class, so mypy cannot see it
        datamodule = self.trainer.datamodule  # type: ignore[attr-defined]
        if stage == "fit" and self.hparams["class_weights"] and datamodule is not None:
            self.class_weight.copy_(datamodule.class_weights())

    @override
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # output: (B, K) raw logits, never softmaxed: cross_entropy applies log-softmax itself
        return F.cross_entropy(
            output,
            target,
            weight=self.class_weight if self.hparams["class_weights"] else None,
            label_smoothing=self.hparams["label_smoothing"],
        )

    @override
    def metric_inputs(self, output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return output, target

    @override
    def predict_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> dict[str, torch.Tensor]:
        logits = self(batch[0])  # (B, K)
        probs = logits.softmax(dim=-1)
        return {"probs": probs, "preds": probs.argmax(dim=-1)}
