"""The shipped tasks, for an ensemble net (:class:`src.extras.tables.nets.TableMLP` with ``ensemble_size``):
each member trained on every row, their losses averaged; the metrics see the members' mean."""

import torch
from torch import nn
from typing_extensions import override

from src.extras.tables.nets import TableMLP
from src.models import Classifier, Regressor


def members(net: nn.Module, training: bool) -> int:
    """The members whose outputs the net returns side by side, ``(B, k, ...)``: 1 for a plain net or in
    evaluation, where an ensemble returns their mean."""
    return net.ensemble_size if training and isinstance(net, TableMLP) else 1


def each_member(
    net: nn.Module, training: bool, output: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """``(B, k, K)`` outputs → ``(B * k, K)``, each row's target once per member: their mean loss is the
    members' mean loss."""
    k = members(net, training)
    return (output, target) if k == 1 else (output.flatten(0, 1), target.repeat_interleave(k, dim=0))


def their_mean(net: nn.Module, training: bool, output: torch.Tensor) -> torch.Tensor:
    """``(B, k, K)`` outputs → ``(B, K)``, the ensemble's answer."""
    return output.mean(dim=1) if members(net, training) > 1 else output


class TableClassifier(Classifier):
    """:class:`src.models.Classifier` that trains an ensemble net's members on every row."""

    @override
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return super().loss(*each_member(self.net, self.training, output, target))

    @override
    def metric_inputs(self, output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return super().metric_inputs(their_mean(self.net, self.training, output), target)


class TableRegressor(Regressor):
    """:class:`src.models.Regressor` that trains an ensemble net's members on every row."""

    @override
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return super().loss(*each_member(self.net, self.training, output, target))

    @override
    def metric_inputs(self, output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return super().metric_inputs(their_mean(self.net, self.training, output), target)
