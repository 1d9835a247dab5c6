"""Activation checkpointing in the MLP: blocks are recomputed in backward and the gradients do not change."""

from pathlib import Path

import pytest
import torch

from src.cli import main
from src.nets import MLP
from tests.conftest import CONFIGS, QUIET


def gradients_and_first_layer_calls(net: MLP, x: torch.Tensor, y: torch.Tensor) -> tuple[list, int]:
    calls = 0

    def count(*_: object) -> None:
        nonlocal calls
        calls += 1

    handle = net.body[0].register_forward_hook(count)
    torch.manual_seed(1)  # the same dropout masks in both runs
    torch.nn.functional.cross_entropy(net(x), y).backward()
    handle.remove()
    return [p.grad.clone() for p in net.parameters()], calls


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_checkpointed_gradients_equal_the_plain_ones(dropout: float) -> None:
    torch.manual_seed(0)
    plain = MLP(6, 4, hidden_sizes=[16, 16, 8], dropout=dropout)
    checkpointed = MLP(6, 4, hidden_sizes=[16, 16, 8], dropout=dropout, activation_checkpointing=True)
    checkpointed.load_state_dict(plain.state_dict())
    x, y = torch.randn(32, 6), torch.randint(0, 4, (32,))

    expected, plain_calls = gradients_and_first_layer_calls(plain, x, y)
    got, checkpointed_calls = gradients_and_first_layer_calls(checkpointed, x, y)
    torch.testing.assert_close(got, expected)
    # the first block ran again in backward: checkpointing was really on (dropout masks replayed)
    assert (plain_calls, checkpointed_calls) == (1, 2)


def test_fragment_turns_it_on_in_the_experiments_net(workdir: Path) -> None:
    run = main(
        ["--config", str(CONFIGS / "spiral.yaml"),
         "--config", str(CONFIGS / "trainer" / "activation_checkpointing.yaml"), *QUIET],
        run=False,
    )  # fmt: skip
    # one argument of the net the experiment names, set on top of the others it gives
    net = run.model.hparams.net
    assert net["class_path"] == "src.nets.MLP"
    assert net["init_args"]["activation_checkpointing"] is True
    assert net["init_args"]["hidden_sizes"] == [64, 64]  # configs/spiral.yaml's, kept
    assert isinstance(run.model.net, MLP)
    assert run.model.net.activation_checkpointing
