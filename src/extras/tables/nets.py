"""Nets for tables: a periodic embedding of each input, and an ensemble of MLPs in one (TabM-mini).

model:
  class_path: src.extras.tables.TableClassifier   # or TableRegressor: trains each member on every row
  init_args:
    net:
      class_path: src.extras.tables.nets.TableMLP
      init_args: {hidden_sizes: [128, 128], ensemble_size: 8}
"""

import math
from collections.abc import Sequence

import torch
from torch import nn

from src.nets.mlp import MLP, Activation


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


class TableMLP(nn.Module):
    """[PeriodicEmbedding], then the hidden layers of :class:`src.nets.MLP`, then one head, or one per member.

    With ``ensemble_size`` k above 1 it is k nets in one, after "TabM-mini" (Gorishniy et al., *TabM:
    Advancing Tabular Deep Learning with Parameter-Efficient Ensembling*, 2024): each member multiplies
    the (embedded) input by its own signs (drawn ±1, then trained), shares the hidden layers, and has its
    own head. In training the output is ``(B, k, out_features)``, one prediction per member, and each
    member is trained on every row (:class:`src.extras.tables.tasks.EnsembleSteps`); in evaluation it is
    the members' mean, ``(B, out_features)``, so predicting and exporting see a plain net.

    Args:
        in_features: Width of the input.
        out_features: Width of the output (class count for logits, target count for regression).
        hidden_sizes: Width of each hidden layer, in order; empty for a linear model.
        activation: One of ``relu``, ``gelu``, ``silu``, ``tanh``, ``leaky_relu``.
        dropout: Drop probability after each hidden activation; 0 disables it.
        batch_norm: Put a ``BatchNorm1d`` after each hidden linear layer.
        periodic_frequencies: Embed each input with :class:`PeriodicEmbedding` of this many frequencies
            (on small tables it lifts the net toward gradient boosting: benchmarks/results/tables.md); 0
            feeds the input as it is.
        periodic_dim: Width of each feature's periodic embedding.
        periodic_scale: Initial spread of the periodic embedding's frequencies.
        periodic_max_features: The widest input the embedding is used on; a wider one (many one-hot
            columns, say) goes in as it is, since the embedding makes the first layer ``periodic_dim``
            times as wide. ``None``: no limit.
        ensemble_size: Members of the ensemble above; 1 is a single net.
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
    ) -> None:
        super().__init__()
        # ValueError: plain PyTorch, usable without this project; the CLI shows the sentence as it is
        if periodic_frequencies < 0 or periodic_dim < 1 or periodic_scale <= 0:
            raise ValueError(
                f"TableMLP periodic_frequencies={periodic_frequencies}, periodic_dim={periodic_dim} and "
                f"periodic_scale={periodic_scale}: the frequencies must be 0 (off) or more, the width at "
                "least 1 and the scale above 0."
            )
        if ensemble_size < 1:
            raise ValueError(f"TableMLP ensemble_size={ensemble_size} must be at least 1.")
        self.embedding: nn.Module = nn.Identity()
        width = in_features
        if periodic_frequencies and (periodic_max_features is None or in_features <= periodic_max_features):
            self.embedding = PeriodicEmbedding(
                in_features, periodic_frequencies, periodic_dim, periodic_scale
            )
            width = in_features * periodic_dim
        mlp = MLP(width, out_features, hidden_sizes, activation, dropout, batch_norm)
        self.body = mlp.body  # the hidden layers, shared by the members
        self.ensemble_size = ensemble_size
        hidden = hidden_sizes[-1] if hidden_sizes else width
        if ensemble_size == 1:
            self.head = mlp.head
            return
        # each member's signs on the first layer's input, drawn once and trained from there
        self.signs = nn.Parameter(torch.randint(0, 2, (ensemble_size, width)).float() * 2 - 1)  # (k, W)
        self.heads_weight = nn.Parameter(torch.randn(ensemble_size, hidden, out_features) / math.sqrt(hidden))
        self.heads_bias = nn.Parameter(torch.zeros(ensemble_size, out_features))  # (k, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in_features) → (B, out_features); raw outputs, no softmax. An ensemble in training:
        (B, ensemble_size, out_features)."""
        h = self.embedding(x)  # (B, W)
        if self.ensemble_size == 1:
            return self.head(self.body(h))
        k = self.ensemble_size
        h = (h.unsqueeze(1) * self.signs).flatten(0, 1)  # (B * k, W): each row once per member
        h = self.body(h).unflatten(0, (-1, k))  # (B, k, H), the hidden layers shared
        out = torch.einsum("bkh,kho->bko", h, self.heads_weight) + self.heads_bias  # (B, k, out)
        return out if self.training else out.mean(dim=1)
