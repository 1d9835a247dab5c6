"""A multi-layer perceptron in plain PyTorch."""

from collections.abc import Sequence
from typing import Literal, get_args

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential

Activation = Literal["relu", "gelu", "silu", "tanh", "leaky_relu"]
ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "tanh": nn.Tanh,
    "leaky_relu": nn.LeakyReLU,
}
assert set(ACTIVATIONS) == set(get_args(Activation))


class MLP(nn.Module):
    """Linear → [BatchNorm] → activation → [Dropout] once per hidden size, then a linear head.

    Args:
        in_features: Width of the input.
        out_features: Width of the output (class count for logits, target count for regression).
        hidden_sizes: Width of each hidden layer, in order; empty for a linear model.
        activation: One of ``relu``, ``gelu``, ``silu``, ``tanh``, ``leaky_relu``.
        dropout: Drop probability after each hidden activation; 0 disables it.
        batch_norm: Put a ``BatchNorm1d`` after each hidden linear layer.
        activation_checkpointing: Recompute each hidden block (but the last) in backward: less memory.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        hidden_sizes: Sequence[int] = (128, 64),
        activation: Activation = "relu",
        dropout: float = 0.0,
        batch_norm: bool = False,
        activation_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        # ValueError: plain PyTorch, usable without this project; the CLI shows the sentence as it is
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"MLP activation={activation!r} is unknown; choose one of {sorted(ACTIVATIONS)}."
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"MLP dropout={dropout} must lie in [0, 1).")
        if any(size < 1 for size in hidden_sizes):
            raise ValueError(f"MLP hidden_sizes={list(hidden_sizes)}: every width must be at least 1.")
        layers: list[nn.Module] = []
        width = in_features
        for hidden in hidden_sizes:
            layers.append(nn.Linear(width, hidden, bias=not batch_norm))  # BatchNorm subtracts the mean
            if batch_norm:
                layers.append(nn.BatchNorm1d(hidden))
            layers.append(ACTIVATIONS[activation]())
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = hidden
        self.body = nn.Sequential(*layers)  # a list would hide the layers from .parameters() and .to()
        self.head = nn.Linear(width, out_features)
        self.activation_checkpointing = activation_checkpointing
        self.num_blocks = len(hidden_sizes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in_features) → (B, out_features); raw outputs, no softmax."""
        if self.activation_checkpointing and self.num_blocks > 1 and torch.is_grad_enabled():
            # non-reentrant: works with inputs that need no grad, and restores dropout's RNG state
            hidden = checkpoint_sequential(self.body, self.num_blocks, x, use_reentrant=False)
        else:
            hidden = self.body(x)
        return self.head(hidden)
