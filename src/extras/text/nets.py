"""Character language models in plain PyTorch: a small causal Transformer (GPT-shaped) and a GRU.

Both read ``(B, T)`` int64 character ids and return ``(B, T, V)`` raw logits: position ``t``'s logits
score the character that follows position ``t``, seeing only positions ``0 … t``.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which a position attends to itself and the positions before it."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)  # queries, keys and values in one matmul
        self.proj = nn.Linear(d_model, d_model)
        self.dropout = dropout
        self.out_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, C) → (B, T, C)."""
        b, t, c = x.shape
        # (B, T, 3C) → three (B, nh, T, hs)
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, c // self.n_heads).permute(2, 0, 3, 1, 4)
        # is_causal: position t sees 0 … t only; attention dropout only while training
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )  # (B, nh, T, hs)
        return self.out_dropout(self.proj(y.transpose(1, 2).reshape(b, t, c)))


class Block(nn.Module):
    """A pre-norm Transformer block: ``x + attention(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attention = CausalSelfAttention(d_model, n_heads, dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, C) → (B, T, C)."""
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class CharTransformer(nn.Module):
    """Token and learned position embeddings, ``n_layers`` causal pre-norm blocks, a final LayerNorm and a
    linear head.

    Weights start as GPT-2's do (normal, std 0.02; the projections into the residual stream scaled down
    by ``sqrt(2 * n_layers)``), so an untrained net's logits are near zero and its loss near
    ``log(out_features)``: every character equally likely.

    Args:
        in_features: Vocabulary size: the ids it embeds.
        out_features: Vocabulary size: one logit per possible next character.
        block_size: The longest input it reads (learned positions exist for ``0 … block_size - 1``).
        d_model: Width of the residual stream.
        n_heads: Attention heads per block; must divide ``d_model``.
        n_layers: Transformer blocks.
        dropout: Drop probability on the embeddings, the attention weights and each block's outputs.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        block_size: int = 128,
        d_model: int = 128,
        n_heads: int = 4,
        n_layers: int = 4,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        # ValueError: plain PyTorch, usable without this project; the CLI shows the sentence as it is
        if d_model % n_heads:
            raise ValueError(f"CharTransformer d_model={d_model} must be a multiple of n_heads={n_heads}.")
        if min(block_size, d_model, n_heads, n_layers) < 1:
            raise ValueError("CharTransformer block_size, d_model, n_heads and n_layers must be at least 1.")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"CharTransformer dropout={dropout} must lie in [0, 1).")
        self.block_size = block_size
        self.token = nn.Embedding(in_features, d_model)
        self.position = nn.Embedding(block_size, d_model)
        self.dropout = nn.Dropout(dropout)
        # nn.Sequential, not a Python list: a list would hide the blocks from .parameters() and .to()
        self.blocks = nn.Sequential(*(Block(d_model, n_heads, dropout) for _ in range(n_layers)))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, out_features)
        for name, parameter in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(parameter)
            elif parameter.ndim == 2:  # embeddings and linear weights; LayerNorm keeps its ones
                scaled = name.endswith(("attention.proj.weight", "mlp.2.weight"))
                std = 0.02 / math.sqrt(2 * n_layers) if scaled else 0.02
                nn.init.normal_(parameter, mean=0.0, std=std)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) int64 ids, T <= block_size → (B, T, out_features) raw logits."""
        t = ids.shape[-1]
        if t > self.block_size:
            raise ValueError(
                f"CharTransformer got {t} characters, more than its block_size={self.block_size}; crop the "
                "input to its last block_size characters."
            )
        positions = torch.arange(t, device=ids.device)  # (T,), broadcast over the batch
        x = self.dropout(self.token(ids) + self.position(positions))  # (B, T, C)
        return self.head(self.norm(self.blocks(x)))


class CharGRU(nn.Module):
    """An embedding, a stacked GRU and a linear head: the recurrent baseline, with no context limit.

    Args:
        in_features: Vocabulary size: the ids it embeds.
        out_features: Vocabulary size: one logit per possible next character.
        embedding_dim: Width of each character's embedding.
        hidden_size: Width of the GRU's state.
        num_layers: Stacked GRU layers.
        dropout: Drop probability between GRU layers (with more than one) and before the head.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        embedding_dim: int = 64,
        hidden_size: int = 256,
        num_layers: int = 2,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if min(embedding_dim, hidden_size, num_layers) < 1:
            raise ValueError("CharGRU embedding_dim, hidden_size and num_layers must be at least 1.")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"CharGRU dropout={dropout} must lie in [0, 1).")
        self.embedding = nn.Embedding(in_features, embedding_dim)
        self.gru = nn.GRU(
            embedding_dim,
            hidden_size,
            num_layers,
            batch_first=True,
            dropout=dropout if num_layers > 1 else 0.0,
        )
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(hidden_size, out_features)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) int64 ids → (B, T, out_features) raw logits; the state starts at zero for every input."""
        hidden, _ = self.gru(self.embedding(ids))  # (B, T, H)
        return self.head(self.dropout(hidden))
