"""Convolutional nets for images in plain PyTorch: a small CNN and a small ResNet.

Both take ``(B, C, H, W)`` images and end in global average pooling, so they serve any image size;
their first two arguments are the input channels and the class count, as the data gives them.
"""

from collections.abc import Sequence

import torch
from torch import nn


def _check(name: str, widths: Sequence[int], dropout: float) -> None:
    # ValueError: plain PyTorch, usable without this project; the CLI shows the sentence as it is
    if not widths or any(width < 1 for width in widths):
        raise ValueError(f"{name} widths={list(widths)}: give at least one width, each at least 1.")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"{name} dropout={dropout} must lie in [0, 1).")


class SmallCNN(nn.Module):
    """Per width: two 3x3 convolutions (each → [BatchNorm] → ReLU) and a 2x2 max pool; then global
    average pooling, [Dropout] and a linear head.

    Args:
        in_features: Input channels (1 for grayscale, 3 for RGB).
        out_features: Classes: the width of the head.
        widths: Channels of each stage; each stage halves the height and width.
        dropout: Drop probability before the head; 0 disables it.
        batch_norm: Put a ``BatchNorm2d`` after each convolution. Without it the loss of a batch is a
            plain mean over its images (what an equivalence test of gradient accumulation needs).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        widths: Sequence[int] = (32, 64),
        dropout: float = 0.0,
        batch_norm: bool = True,
    ) -> None:
        super().__init__()
        _check("SmallCNN", widths, dropout)
        layers: list[nn.Module] = []
        channels = in_features
        for width in widths:
            for _ in range(2):
                # bias is redundant right before BatchNorm, which subtracts the mean anyway
                layers.append(nn.Conv2d(channels, width, 3, padding=1, bias=not batch_norm))
                if batch_norm:
                    layers.append(nn.BatchNorm2d(width))
                layers.append(nn.ReLU())
                channels = width
            layers.append(nn.MaxPool2d(2))
        self.body = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(channels, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) → (B, out_features) raw logits."""
        features = self.pool(self.body(x)).flatten(1)  # (B, widths[-1])
        return self.head(self.dropout(features))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm and a shortcut (ResNet-18's block).

    Args:
        in_channels: Channels in.
        out_channels: Channels out.
        stride: 2 halves the height and width (the first convolution strides); the shortcut is then a
            strided 1x1 convolution, as it is when the channels change.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in_channels, H, W) → (B, out_channels, H / stride, W / stride)."""
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """A small ResNet: a 3x3 stem, one stage of :class:`BasicBlock`\\ s per width (every stage after the
    first halves the height and width), global average pooling, [Dropout] and a linear head.

    Args:
        in_features: Input channels (1 for grayscale, 3 for RGB).
        out_features: Classes: the width of the head.
        widths: Channels of each stage (the stem has the first).
        depth: Blocks per stage.
        dropout: Drop probability before the head; 0 disables it.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        widths: Sequence[int] = (16, 32, 64),
        depth: int = 1,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        _check("ResNet", widths, dropout)
        if depth < 1:
            raise ValueError(f"ResNet depth={depth} must be at least 1 block per stage.")
        self.stem = nn.Sequential(
            nn.Conv2d(in_features, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        blocks: list[nn.Module] = []
        channels = widths[0]
        for stage, width in enumerate(widths):
            for block in range(depth):
                stride = 2 if stage > 0 and block == 0 else 1
                blocks.append(BasicBlock(channels, width, stride))
                channels = width
        self.stages = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(channels, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) → (B, out_features) raw logits."""
        features = self.pool(self.stages(self.stem(x))).flatten(1)  # (B, widths[-1])
        return self.head(self.dropout(features))
