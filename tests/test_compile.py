"""torch.compile as an option: the net is compiled (not the LightningModule) and trains as eager does."""

import functools
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from src.cli import CLI, main
from src.models import Classifier
from src.nets import MLP
from tests.conftest import BARE, CONFIGS, QUIET

TRAINER = CONFIGS / "trainer"
SPIRAL = [
    "--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=300", "--data.batch_size=32",
    "--trainer.max_epochs=2", "--trainer.limit_train_batches=5", "--trainer.limit_val_batches=0",
    *BARE, "--trainer.logger=false", "--trainer.enable_checkpointing=false",
]  # fmt: skip


def build(*args: str) -> CLI:
    return main([*SPIRAL, *args, *QUIET], run=False)


def test_compile_option_compiles_the_net_in_place(workdir: Path) -> None:
    compiled = build("--config", str(TRAINER / "compile.yaml")).model
    # the net configs/spiral.yaml names, built eagerly
    net = functools.partial(MLP, hidden_sizes=[64, 64], activation="tanh")
    eager = Classifier(in_features=2, out_features=3, net=net)
    assert compiled.hparams.compile_net
    assert type(compiled.net) is type(eager.net)  # compiled in place, not wrapped in an OptimizedModule
    assert compiled.net._compiled_call_impl is not None  # what nn.Module.compile() sets
    assert eager.net._compiled_call_impl is None
    # the LightningModule itself is not compiled: self.log inside its steps would break the graph
    assert compiled._compiled_call_impl is None
    # same parameter names as eager, so checkpoints move freely between compiled and eager runs
    assert compiled.state_dict().keys() == eager.state_dict().keys()


@pytest.mark.slow  # the cold compile of forward and backward takes about 40 s on 2 CPU cores
def test_compiled_net_trains_to_the_same_losses_as_eager(workdir: Path) -> None:
    losses = {}
    for fragment in ("fp32.yaml", "compile.yaml"):
        run = build("--config", str(TRAINER / fragment))
        seen: list[torch.Tensor] = []
        step = run.model.training_step

        def recording_step(
            batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int, step=step, seen=seen
        ) -> torch.Tensor:
            loss = step(batch, batch_idx)
            seen.append(loss.detach())
            return loss

        run.model.training_step = recording_step
        counters.clear()
        run.trainer.fit(run.model, datamodule=run.datamodule)
        losses[fragment] = torch.stack(seen)
        graphs = counters["stats"]["unique_graphs"]
        assert graphs > 0 if fragment == "compile.yaml" else graphs == 0
    # same seed, same batches; inductor fuses and reorders float32 ops, so allow a few ulp per step,
    # compounding over 10 Adam steps
    torch.testing.assert_close(losses["compile.yaml"], losses["fp32.yaml"], rtol=1e-4, atol=1e-5)
