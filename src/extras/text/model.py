"""A character language model: next-character cross-entropy at every position, and text generation
(:mod:`src.extras.text.decoding`, re-exported here)."""

import torch
import torch.nn.functional as F
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.text import Perplexity
from torchmetrics.wrappers import LambdaInputTransformer
from typing_extensions import override

from src.errors import UserInputError
from src.extras.text.decoding import (
    SEEDS,
    Strategy,
    check_decoding,
    filter_top_k,
    filter_top_p,
    generate,
    next_token,
    stream,
)
from src.models.base import BaseTask

__all__ = [
    "SEEDS",
    "LanguageModel",
    "Strategy",
    "check_decoding",
    "filter_top_k",
    "filter_top_p",
    "generate",
    "next_token",
    "one_sequence",
    "stream",
]


class LanguageModel(BaseTask):
    """Predicts the next character at every position of a window.

    The net maps ``(B, T)`` ids to ``(B, T, V)`` logits (:class:`src.extras.text.nets.CharTransformer`,
    :class:`~src.extras.text.nets.CharGRU`); loss and metrics see the ``B * T`` positions as one batch.
    The loss is the mean cross-entropy per character in nats (natural log); the metrics are accuracy
    (``acc``: how often the most likely next character is right) and ``perplexity``: ``exp(loss)``, the
    number of equally likely characters the model is as unsure as. Its arguments are
    :class:`BaseTask`'s; ``net`` must be given (the default MLP reads feature rows, not characters).
    """

    @override
    def check_shapes(self) -> None:
        if (k := self.hparams["out_features"]) < 2:
            raise UserInputError(
                f"model LanguageModel needs a vocabulary of at least 2 ids but the data gives {k}; "
                "give it a text (src.extras.text.TextDataModule)."
            )

    @override
    def setup(self, stage: str) -> None:
        # a net with a longest input (CharTransformer's block_size) must read the data's whole windows;
        # said once here rather than by the first forward pass, as a ValueError
        longest = getattr(self.net, "block_size", None)
        window = getattr(self.trainer.datamodule, "block_size", None)  # type: ignore[attr-defined]
        if isinstance(longest, int) and isinstance(window, int) and window > longest:
            raise UserInputError(
                f"data.block_size={window} is longer than the net's block_size={longest}, the longest input "
                "it reads; make the net's at least as long."
            )

    @override
    def build_metrics(self) -> MetricCollection:
        # torchmetrics' Perplexity reads (B, T, V) sequences; the metrics are handed (B*T, V) positions,
        # which are one sequence of B*T characters as far as perplexity is concerned
        perplexity = LambdaInputTransformer(
            Perplexity(), transform_pred=one_sequence, transform_target=one_sequence
        )
        accuracy = MulticlassAccuracy(self.hparams["out_features"], average="micro")
        return MetricCollection({"acc": accuracy, "perplexity": perplexity})

    @override
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # output: (B, T, V) raw logits, never softmaxed: cross_entropy applies log-softmax itself (nats)
        return F.cross_entropy(output.flatten(0, 1), target.flatten())

    @override
    def metric_inputs(self, output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return output.flatten(0, 1), target.flatten()  # (B*T, V), (B*T,): classification per position

    @override
    def predict_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> dict[str, torch.Tensor]:
        return self.predictions(self(batch[0])[:, -1])  # (B, V) logits: the character after each window

    def predictions(self, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """What :meth:`predict_step` gives for ``(..., V)`` next-character logits, and the id greedy
        generation picks (:func:`~src.extras.text.decoding.stream`): the likeliest."""
        probs = logits.softmax(dim=-1)
        return {"probs": probs, "preds": probs.argmax(dim=-1)}

    def generate(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        strategy: Strategy = "greedy",
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int = 0,
        block_size: int | None = None,
    ) -> torch.Tensor:
        """:func:`generate` with this model's net; the context is cropped to ``block_size``, by default
        the net's own (a ``CharTransformer``'s; a recurrent net has none)."""
        if block_size is None:
            block_size = getattr(self.net, "block_size", None)  # the nets' public attribute, when it has one
        return generate(
            self, prompt_ids, max_new_tokens, strategy, temperature, top_k, top_p, seed, block_size
        )


def one_sequence(tensor: torch.Tensor) -> torch.Tensor:
    """(N, ...) positions → (1, N, ...): one sequence of N characters."""
    return tensor.unsqueeze(0)
