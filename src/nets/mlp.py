"""A multi-layer perceptron in plain PyTorch."""

import math
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


class PeriodicEmbedding(nn.Module):
    """Each feature as ``ReLU(Linear([cos(2π c x), sin(2π c x)]))`` with trained frequencies ``c``: the
    "PLR (lite)" numeric embedding of Gorishniy et al., *On Embeddings for Numerical Features in Tabular
    Deep Learning* (2022), which lets an MLP draw the sharp, local shapes trees draw.

    Args:
        in_features: Width of the input ``F``.
        frequencies: Frequencies ``k`` per feature.
        dim: Width ``d`` of each feature's embedding; the output is ``(B, F * d)``.
        scale: Standard deviation of the frequencies' initial normal draw (in units of the input, which
            is standardized): larger is more local.
    """

    def __init__(self, in_features: int, frequencies: int, dim: int, scale: float) -> None:
        super().__init__()
        self.frequencies = nn.Parameter(torch.randn(in_features, frequencies) * scale)  # (F, k)
        self.linear = nn.Linear(2 * frequencies, dim)  # shared by all features ("lite")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, F) → (B, F * d)."""
        angles = 2 * math.pi * x.unsqueeze(-1) * self.frequencies  # (B, F, k)
        periodic = torch.cat([angles.cos(), angles.sin()], dim=-1)  # (B, F, 2k)
        return torch.relu(self.linear(periodic)).flatten(1)


class MLP(nn.Module):
    """[PeriodicEmbedding], then Linear → [BatchNorm] → activation → [Dropout] once per hidden size, then a
    linear head.

    With ``ensemble_size`` k above 1 it is k nets in one, after "TabM-mini" (Gorishniy et al., *TabM:
    Advancing Tabular Deep Learning with Parameter-Efficient Ensembling*, 2024): each member multiplies
    the (embedded) input by its own signs (drawn ±1, then trained), shares the hidden layers, and has its
    own head. In training the output is ``(B, k, out_features)``, one prediction per member, and each
    member is trained on every row (:class:`src.models.BaseTask` averages the members' losses); in
    evaluation it is the members' mean, ``(B, out_features)``, so predicting and exporting see a plain net.

    Args:
        in_features: Width of the input.
        out_features: Width of the output (class count for logits, target count for regression).
        hidden_sizes: Width of each hidden layer, in order; empty for a linear model.
        activation: One of ``relu``, ``gelu``, ``silu``, ``tanh``, ``leaky_relu``.
        dropout: Drop probability after each hidden activation; 0 disables it.
        batch_norm: Put a ``BatchNorm1d`` after each hidden linear layer.
        periodic_frequencies: Embed each input feature with :class:`PeriodicEmbedding` of this many
            frequencies before the first layer (on small tables it lifts the net toward gradient
            boosting: benchmarks/results/tables.md); 0 feeds the input as it is.
        periodic_dim: Width of each feature's periodic embedding.
        periodic_scale: Initial spread of the periodic embedding's frequencies.
        periodic_max_features: The widest input the embedding is used on; a wider one (many one-hot
            columns, say) goes in as it is, since the embedding makes the first layer ``periodic_dim``
            times as wide: a step of 64 rows costs 6 times a plain one at 64 columns, 36 times at 1,024
            (one thread). ``None``: no limit.
        ensemble_size: Members of the ensemble above; 1 is a plain MLP.
        activation_checkpointing: While gradients are being recorded, keep only each hidden block's input
            and recompute the block in backward: less memory for one more forward per block. The last
            block runs normally, since backward needs its activations at once.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        hidden_sizes: Sequence[int] = (128, 64),
        activation: Activation = "relu",
        dropout: float = 0.0,
        batch_norm: bool = False,
        periodic_frequencies: int = 8,
        periodic_dim: int = 16,
        periodic_scale: float = 0.1,
        periodic_max_features: int | None = 128,
        ensemble_size: int = 1,
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
        if periodic_frequencies < 0 or periodic_dim < 1 or periodic_scale <= 0:
            raise ValueError(
                f"MLP periodic_frequencies={periodic_frequencies}, periodic_dim={periodic_dim} and "
                f"periodic_scale={periodic_scale}: the frequencies must be 0 (off) or more, the width at "
                "least 1 and the scale above 0."
            )
        if ensemble_size < 1 or (ensemble_size > 1 and activation_checkpointing):
            raise ValueError(
                f"MLP ensemble_size={ensemble_size} must be at least 1, and 1 with activation_checkpointing."
            )
        layers: list[nn.Module] = []
        width = in_features
        if periodic_frequencies and (periodic_max_features is None or in_features <= periodic_max_features):
            layers.append(PeriodicEmbedding(in_features, periodic_frequencies, periodic_dim, periodic_scale))
            width = in_features * periodic_dim
        first = width  # what the first hidden layer reads
        for hidden in hidden_sizes:
            # bias is redundant right before BatchNorm, which subtracts the mean anyway
            layers.append(nn.Linear(width, hidden, bias=not batch_norm))
            if batch_norm:
                layers.append(nn.BatchNorm1d(hidden))
            layers.append(ACTIVATIONS[activation]())
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = hidden
        # nn.Sequential, not a Python list: a list would hide the layers from .parameters() and .to()
        self.body = nn.Sequential(*layers)
        self.activation_checkpointing = activation_checkpointing
        self.num_blocks = len(hidden_sizes)
        self.ensemble_size = ensemble_size
        if ensemble_size == 1:
            self.head = nn.Linear(width, out_features)
            return
        self.embedded = len(self.body) > 0 and isinstance(self.body[0], PeriodicEmbedding)
        # each member's signs on the first layer's input, drawn once and trained from there
        self.signs = nn.Parameter(torch.randint(0, 2, (ensemble_size, first)).float() * 2 - 1)  # (k, W)
        self.heads_weight = nn.Parameter(torch.randn(ensemble_size, width, out_features) / math.sqrt(width))
        self.heads_bias = nn.Parameter(torch.zeros(ensemble_size, out_features))  # (k, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in_features) → (B, out_features); raw outputs, no softmax. An ensemble in training:
        (B, ensemble_size, out_features)."""
        if self.ensemble_size > 1:
            return self._ensemble(x)
        if self.activation_checkpointing and self.num_blocks > 1 and torch.is_grad_enabled():
            # one segment per hidden block; non-reentrant, so it works with inputs that need no grad
            # and restores the RNG state for dropout when it recomputes
            hidden = checkpoint_sequential(self.body, self.num_blocks, x, use_reentrant=False)
        else:
            hidden = self.body(x)
        return self.head(hidden)

    def _ensemble(self, x: torch.Tensor) -> torch.Tensor:
        k, start = self.ensemble_size, int(self.embedded)
        h = self.body[0](x) if self.embedded else x  # (B, W)
        h = (h.unsqueeze(1) * self.signs).flatten(0, 1)  # (B * k, W): each row once per member
        h = self.body[start:](h).unflatten(0, (-1, k))  # (B, k, H), the hidden layers shared
        out = torch.einsum("bkh,kho->bko", h, self.heads_weight) + self.heads_bias  # (B, k, out)
        return out if self.training else out.mean(dim=1)
