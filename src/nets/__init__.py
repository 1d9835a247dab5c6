"""Plain `nn.Module`s that know nothing of Lightning: lift them out and use them anywhere."""

from src.nets.mlp import MLP

__all__ = ["MLP"]
