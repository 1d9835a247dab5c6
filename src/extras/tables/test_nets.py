"""The table nets: the periodic embedding and the ensemble, trained member by member by the table tasks."""

import functools
import re
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from src.extras.tables import tasks
from src.extras.tables.nets import PeriodicEmbedding, TableMLP
from src.extras.tables.tasks import TableClassifier, TableRegressor
from tests.test_mutations import mutate


def test_the_periodic_embedding_is_the_papers_formula_and_feeds_the_mlp() -> None:
    torch.manual_seed(0)
    net = TableMLP(3, 2, hidden_sizes=[8], periodic_frequencies=4, periodic_dim=5, periodic_scale=0.1)
    embedding = net.embedding
    assert isinstance(embedding, PeriodicEmbedding)
    x = torch.randn(6, 3)
    # feature by feature: ReLU(W [cos(2π c_f x_f), sin(2π c_f x_f)] + b), concatenated in feature order
    expected = torch.cat(
        [
            torch.relu(
                embedding.linear(
                    torch.cat(
                        [
                            torch.cos(2 * torch.pi * x[:, [f]] * embedding.frequencies[f]),
                            torch.sin(2 * torch.pi * x[:, [f]] * embedding.frequencies[f]),
                        ],
                        dim=1,
                    )
                )
            )
            for f in range(3)
        ],
        dim=1,
    )
    torch.testing.assert_close(embedding(x), expected)
    assert net.body[0].in_features == 3 * 5  # the first hidden layer reads every feature's embedding
    assert net(x).shape == (6, 2)
    assert embedding.frequencies.requires_grad  # trained, not fixed
    # on by default, with 8 frequencies and embeddings 16 wide (benchmarks/results/tables.md); 0: off
    default = TableMLP(3, 2)
    assert isinstance(default.embedding, PeriodicEmbedding)
    assert default.embedding.frequencies.shape == (3, 8)
    assert default.body[0].in_features == 3 * 16
    assert not any(isinstance(m, PeriodicEmbedding) for m in TableMLP(3, 2, periodic_frequencies=0).modules())
    # up to 128 input columns; a wider input goes in as it is, unless the limit is lifted
    assert isinstance(TableMLP(128, 2).embedding, PeriodicEmbedding)
    assert isinstance(TableMLP(129, 2).embedding, nn.Identity)
    assert isinstance(TableMLP(129, 2, periodic_max_features=None).embedding, PeriodicEmbedding)
    with pytest.raises(ValueError, match=re.escape("TableMLP periodic_frequencies=-1, periodic_dim=16")):
        TableMLP(3, 2, periodic_frequencies=-1)


def test_an_ensemble_trains_each_member_on_every_row_and_predicts_their_mean() -> None:
    torch.manual_seed(0)
    net = TableMLP(5, 3, hidden_sizes=[8], ensemble_size=4, periodic_frequencies=0)
    x, y = torch.randn(6, 5), torch.tensor([0, 1, 2, 0, 1, 2])
    # member i: its own signs on the input, the shared hidden layer, its own head
    members = [
        net.body(x * net.signs[i]) @ net.heads_weight[i] + net.heads_bias[i] for i in range(4)
    ]  # each (6, 3)
    torch.testing.assert_close(net(x), torch.stack(members, dim=1))  # training: (B, k, out)
    net.eval()
    torch.testing.assert_close(net(x), torch.stack(members).mean(0))  # evaluation: their mean
    net.train()
    # the task's training loss is the mean of the members' own losses, not the loss of their mean
    task = TableClassifier(in_features=5, out_features=3, net=lambda i, o: net)
    loss = task.training_step((x, y), 0)
    torch.testing.assert_close(loss, torch.stack([F.cross_entropy(m, y) for m in members]).mean())
    assert not torch.allclose(loss, F.cross_entropy(torch.stack(members).mean(0), y))
    regressor = TableRegressor(
        in_features=5, out_features=1, net=functools.partial(TableMLP, ensemble_size=3)
    )
    assert regressor.training_step((x, torch.randn(6)), 0).dim() == 0
    with pytest.raises(ValueError, match=re.escape("TableMLP ensemble_size=0 must be at least 1")):
        TableMLP(5, 3, ensemble_size=0)


@pytest.mark.filterwarnings(
    "ignore:You are trying to `self.log\\(\\)`:UserWarning"
)  # a step without a Trainer
def test_the_ensemble_test_catches_a_task_that_trains_the_members_mean(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mutate(
        monkeypatch,
        tasks,
        "each_member",
        "(output.flatten(0, 1), target.repeat_interleave(k, dim=0))",
        "(output.mean(dim=1), target)",
    )
    with pytest.raises(AssertionError, match="not close"):
        sys.modules[__name__].test_an_ensemble_trains_each_member_on_every_row_and_predicts_their_mean()
