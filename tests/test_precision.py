"""Precision fragments: which dtype the activations and parameters really have, and that bf16 still learns."""

from pathlib import Path

import pytest
import torch
from lightning.pytorch.plugins import MixedPrecision

from src.cli import CLI, main
from tests.conftest import BARE, CONFIGS, QUIET

TRAINER = CONFIGS / "trainer"
SPIRAL = [
    "--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=300", "--trainer.max_epochs=1",
    *BARE,  # only the dtypes matter here
]  # fmt: skip
# Lightning says so when it turns fp16 into bf16 on CPU; the test asserts the swap itself
CPU_FP16 = "ignore:You passed `Trainer\\(accelerator='cpu', precision='16-mixed'\\)`:UserWarning"


def build(*args: str) -> CLI:
    """The objects the CLI builds from these words, without running a subcommand."""
    return main([*args, *QUIET], run=False)


def fit_recording_dtypes(run: CLI) -> dict[str, set[torch.dtype]]:
    """Fit, recording the dtype of the first hidden layer's output and of every parameter it trains with."""
    seen: dict[str, set[torch.dtype]] = {"activation": set(), "parameter": set(), "loss": set()}
    first = run.model.net.body[0]  # nn.Linear

    def hook(module: torch.nn.Module, inputs: tuple[torch.Tensor], output: torch.Tensor) -> None:
        if module.training:
            seen["activation"].add(output.dtype)
            seen["parameter"].update(p.dtype for p in run.model.parameters())

    first.register_forward_hook(hook)
    original = run.model.training_step

    def training_step(batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = original(batch, batch_idx)
        seen["loss"].add(loss.dtype)
        return loss

    run.model.training_step = training_step
    run.trainer.fit(run.model, datamodule=run.datamodule)
    return seen


@pytest.mark.parametrize(
    ("fragment", "ran", "activation", "parameter"),
    [
        ("bf16.yaml", "bf16-mixed", torch.bfloat16, torch.float32),
        ("fp32.yaml", "32-true", torch.float32, torch.float32),
        ("fp64.yaml", "64-true", torch.float64, torch.float64),
        pytest.param("fp16.yaml", "bf16-mixed", torch.bfloat16, torch.float32, id="fp16.yaml-on-cpu"),
    ],
)
@pytest.mark.filterwarnings(CPU_FP16)
def test_precision_fragment_sets_the_dtypes_that_run(
    fragment: str, ran: str, activation: torch.dtype, parameter: torch.dtype, workdir: Path
) -> None:
    run = build(*SPIRAL, "--trainer.accelerator=cpu", "--config", str(TRAINER / fragment))
    assert run.trainer.precision == ran  # fp16.yaml on CPU: Lightning runs bf16-mixed instead
    seen = fit_recording_dtypes(run)
    assert seen["activation"] == {activation}
    assert seen["parameter"] == {parameter}
    # under autocast the loss is computed in float32 (cross_entropy is on autocast's fp32 list)
    assert seen["loss"] == {parameter}


def test_bf16_mixed_learns_as_well_as_fp32(workdir: Path) -> None:
    accuracy = {}
    for fragment in ("fp32.yaml", "bf16.yaml"):
        run = build(
            "--config", str(CONFIGS / "digits.yaml"), "--config", str(TRAINER / fragment),
            "--trainer.max_epochs=3", "--model.init_args.scheduler=null",
            "--model.init_args.net.init_args.hidden_sizes=[64]",
            "--model.init_args.optimizer.init_args.lr=0.005",
            *BARE, "--trainer.logger=false", "--trainer.enable_checkpointing=false",
        )  # fmt: skip
        run.trainer.fit(run.model, datamodule=run.datamodule)
        accuracy[fragment] = run.trainer.callback_metrics["val/acc"].item()
    # both learn (chance is 0.1) and bf16's 8-bit mantissa costs at most 3 points of validation accuracy
    # (val holds 180 digits: 3 points are about 5 of them)
    assert accuracy["fp32.yaml"] > 0.8
    assert accuracy["bf16.yaml"] == pytest.approx(accuracy["fp32.yaml"], abs=0.03)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="16-mixed is a CUDA precision; no CUDA device here")
def test_fp16_fragment_on_cuda_runs_fp16_with_a_grad_scaler(workdir: Path) -> None:
    run = build(*SPIRAL, "--trainer.accelerator=gpu", "--config", str(TRAINER / "fp16.yaml"))
    assert run.trainer.precision == "16-mixed"
    plugin = run.trainer.precision_plugin
    assert isinstance(plugin, MixedPrecision)
    assert isinstance(plugin.scaler, torch.amp.GradScaler)
    seen = fit_recording_dtypes(run)
    assert seen["activation"] == {torch.float16}
    assert seen["parameter"] == {torch.float32}
