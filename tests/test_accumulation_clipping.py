"""Gradient accumulation equals a big batch; clipping bounds the gradients the optimizer really uses."""

from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from src.cli import CLI, main
from tests.conftest import BARE, CONFIGS, ONE_PASS, QUIET

TRAINER = CONFIGS / "trainer"
# spiral's net: Linear/tanh only, no dropout or BatchNorm, so the loss of a batch is a plain mean
# the callbacks of defaults.yaml play no part here and only cost time
SPIRAL = ["--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=600", *ONE_PASS, *BARE]


def build(*args: str) -> CLI:
    return main([*SPIRAL, *args, *QUIET], run=False)


def parameters(run: CLI) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in run.model.named_parameters()}


def test_accumulating_k_batches_equals_one_batch_k_times_bigger(workdir: Path) -> None:
    k, batch, steps = 4, 16, 3  # accumulate.yaml's k; 3 optimizer steps per epoch, 2 epochs
    # the loader draws one seeded permutation per epoch whatever the batch size, so the 4 small batches
    # of each step hold exactly the rows of the big batch; no clipping, which would act on the sums.
    # Plain SGD moves the weights by lr times the gradient, so a gradient k times too small or too large
    # shows; Adam's update hardly depends on the gradient's scale and would hide it.
    sgd = (
        "--model.init_args.optimizer=torch.optim.SGD", "--model.init_args.optimizer.init_args.lr=0.1",
        "--model.init_args.optimizer.init_args.weight_decay=0",
    )  # fmt: skip
    small = build(
        "--config", str(TRAINER / "accumulate.yaml"), "--config", str(TRAINER / "no_clip.yaml"), *sgd,
        f"--data.batch_size={batch}", f"--trainer.limit_train_batches={k * steps}", "--trainer.max_epochs=2",
    )  # fmt: skip
    big = build(
        "--config", str(TRAINER / "no_clip.yaml"), *sgd,
        f"--data.batch_size={k * batch}", f"--trainer.limit_train_batches={steps}", "--trainer.max_epochs=2",
    )  # fmt: skip
    assert small.trainer.accumulate_grad_batches == k
    assert small.trainer.gradient_clip_val is None
    assert not any(isinstance(m, torch.nn.Dropout | torch.nn.BatchNorm1d) for m in small.model.modules())
    torch.testing.assert_close(parameters(small), parameters(big))  # same seed, same initial weights
    initial = parameters(small)
    for run in (small, big):
        run.trainer.fit(run.model, datamodule=run.datamodule)
    # global_step counts optimizer steps, not batches
    assert small.trainer.global_step == big.trainer.global_step == 2 * steps
    assert small.trainer.fit_loop.epoch_loop.batch_progress.total.completed == 2 * k * steps
    # float32 sums in another order: differences of a few ulp, which 6 SGD steps keep well below 1e-5
    torch.testing.assert_close(parameters(small), parameters(big), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(initial["net.head.weight"], parameters(small)["net.head.weight"])


class GradientProbe(Callback):
    """Per optimizer step: gradients before clipping, and the gradients and update the optimizer used."""

    def __init__(self) -> None:
        self.before_clip: list[list[torch.Tensor]] = []
        self.used: list[list[torch.Tensor]] = []
        self.updates: list[list[torch.Tensor]] = []

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        optimizer = trainer.optimizers[0]
        params = [p for group in optimizer.param_groups for p in group["params"]]
        start: list[torch.Tensor] = []

        def pre(*_: object) -> None:
            start[:] = [p.detach().clone() for p in params]

        def post(*_: object) -> None:
            # the optimizer has just read p.grad; nothing touches it between its step and this hook
            self.used.append([p.grad.clone() for p in params])
            self.updates.append([before - p.detach() for before, p in zip(start, params, strict=True)])

        optimizer.register_step_pre_hook(pre)
        optimizer.register_step_post_hook(post)

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        # Lightning calls this after backward and before it clips
        self.before_clip.append([p.grad.clone() for p in pl_module.parameters()])


def global_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.flatten() for g in grads]).norm()


def fit_probed(fragment: str, clip: float, *words: str) -> tuple[CLI, GradientProbe]:
    """Five SGD steps of the spiral under ``fragment`` with ``clip`` and ``words``, probed."""
    lr = 0.1
    run = build(
        "--config", str(TRAINER / fragment), f"--trainer.gradient_clip_val={clip}",
        "--model.init_args.optimizer=torch.optim.SGD", f"--model.init_args.optimizer.init_args.lr={lr}",
        "--model.init_args.optimizer.init_args.weight_decay=0",
        "--model.init_args.scheduler=null", "--data.batch_size=32", "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=5", "--trainer.log_every_n_steps=1", *words,
    )  # fmt: skip
    probe = GradientProbe()
    run.trainer.callbacks.append(probe)
    run.trainer.fit(run.model, datamodule=run.datamodule)
    assert len(probe.used) == len(probe.before_clip) == 5
    # plain SGD moves each parameter by lr * the gradient it used: the hook saw the real gradients
    for used, update in zip(probe.used, probe.updates, strict=True):
        torch.testing.assert_close(update, [lr * g for g in used], rtol=1e-3, atol=1e-6)
    return run, probe


def test_norm_clipping_bounds_the_global_norm_the_optimizer_uses(workdir: Path) -> None:
    max_norm = 0.05  # below the gradients' norm here, so clipping acts on every step
    run, probe = fit_probed("clip_norm.yaml", max_norm)
    assert run.trainer.gradient_clip_algorithm == "norm"
    for before, used in zip(probe.before_clip, probe.used, strict=True):
        norm = global_norm(before)
        assert norm > max_norm  # the precondition: clipping had something to do
        assert global_norm(used) <= max_norm * (1 + 1e-5)
        # clipping rescales the whole gradient: same direction, shorter
        torch.testing.assert_close(used, [g * (global_norm(used) / norm) for g in before])


def test_value_clipping_bounds_every_element(workdir: Path) -> None:
    value = 0.01
    run, probe = fit_probed("clip_value.yaml", value)
    assert run.trainer.gradient_clip_algorithm == "value"
    for before, used in zip(probe.before_clip, probe.used, strict=True):
        assert max(g.abs().max() for g in before) > value  # the precondition
        assert max(g.abs().max() for g in used) <= value
        torch.testing.assert_close(used, [g.clamp(-value, value) for g in before])
