"""LR-schedule fragments: the learning rate of every optimizer step equals the same torch scheduler's
sequence stepped by hand at the fragment's interval."""

import itertools
import math
from collections.abc import Callable
from functools import partial
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch.optim.lr_scheduler import (
    CosineAnnealingLR,
    LinearLR,
    LRScheduler,
    OneCycleLR,
    ReduceLROnPlateau,
    SequentialLR,
)
from typing_extensions import override

from src.cli import CLI, main
from src.errors import UserInputError
from tests.conftest import BARE, CONFIGS, ONE_PASS, QUIET, plant_val_loss

TRAINER = CONFIGS / "trainer"
LR, EPOCHS, BATCHES = 0.01, 4, 3
SPIRAL = [
    "--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=300", "--data.batch_size=32", *ONE_PASS,
    "--model.init_args.optimizer=torch.optim.Adam", f"--model.init_args.optimizer.init_args.lr={LR}",
    f"--trainer.max_epochs={EPOCHS}", f"--trainer.limit_train_batches={BATCHES}",
    "--trainer.num_sanity_val_steps=0", *BARE,  # only the schedule matters here
]  # fmt: skip


class LearningRates(Callback):
    """The learning rate each optimizer step runs with."""

    def __init__(self) -> None:
        self.per_step: list[float] = []

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: object, batch_idx: int
    ) -> None:
        self.per_step.append(trainer.optimizers[0].param_groups[0]["lr"])


def fit_recording(*args: str, patch: Callable[[CLI], None] | None = None) -> tuple[CLI, list[float]]:
    run = main([*SPIRAL, *args, *QUIET], run=False)
    if patch is not None:
        patch(run)
    rates = LearningRates()
    run.trainer.callbacks.append(rates)
    run.trainer.fit(run.model, datamodule=run.datamodule)
    assert len(rates.per_step) == EPOCHS * BATCHES
    return run, rates.per_step


def by_hand(make: Callable[[torch.optim.Optimizer], LRScheduler], interval: str) -> list[float]:
    """Step a fresh scheduler on a dummy optimizer: the LR of each of EPOCHS * BATCHES steps."""
    optimizer = torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=LR)
    scheduler = make(optimizer)
    rates = []
    for _ in range(EPOCHS):
        for _ in range(BATCHES):
            rates.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            if interval == "step":
                scheduler.step()
        if interval == "epoch":
            scheduler.step()
    return rates


def test_cosine_steps_once_per_epoch_over_the_whole_run(workdir: Path) -> None:
    run, rates = fit_recording("--config", str(TRAINER / "cosine.yaml"))
    assert run.trainer.lr_scheduler_configs[0].scheduler.T_max == EPOCHS  # filled in by the task
    assert rates == pytest.approx(by_hand(lambda o: CosineAnnealingLR(o, T_max=EPOCHS), "epoch"))
    assert len(set(rates)) == EPOCHS  # constant within an epoch, new at each
    assert run.trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)  # eta_min


def test_cosine_stepped_per_step_spans_the_runs_optimizer_steps(workdir: Path) -> None:
    run, rates = fit_recording(
        "--config", str(TRAINER / "cosine.yaml"), "--model.init_args.scheduler_interval=step"
    )  # fmt: skip
    assert run.trainer.lr_scheduler_configs[0].scheduler.T_max == EPOCHS * BATCHES
    assert rates == pytest.approx(by_hand(lambda o: CosineAnnealingLR(o, T_max=EPOCHS * BATCHES), "step"))


def test_a_longer_run_stretches_digits_cosine_to_its_last_epoch(workdir: Path) -> None:
    """``--trainer.max_epochs=120`` on digits: the LR falls for all 120 epochs and reaches eta_min at the
    end. With T_max typed as 60 beside it (as the YAML once had) it climbed back to its peak by epoch 120."""
    epochs = 120
    run = main(
        [
            "--config", str(CONFIGS / "digits.yaml"), f"--trainer.max_epochs={epochs}",
            "--data.batch_size=2048", *ONE_PASS,  # one small step per epoch
            "--model.init_args.net.init_args.hidden_sizes=[8]",
            "--trainer.limit_val_batches=0", *BARE,
            "--trainer.logger=false", "--trainer.enable_checkpointing=false", *QUIET,
        ],
        run=False,
    )  # fmt: skip
    rates = LearningRates()
    run.trainer.callbacks.append(rates)
    run.trainer.fit(run.model, datamodule=run.datamodule)
    base = 0.002  # configs/digits.yaml
    assert run.trainer.lr_scheduler_configs[0].scheduler.T_max == epochs
    assert rates.per_step == pytest.approx(
        [base * (1 + math.cos(math.pi * e / epochs)) / 2 for e in range(epochs)]
    )
    assert all(later < earlier for earlier, later in itertools.pairwise(rates.per_step))  # never climbs back
    assert run.trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)  # eta_min at 120


@pytest.mark.parametrize(("given", "effect"), [(EPOCHS - 1, "ends before"), (EPOCHS + 1, "is not done when")])
def test_a_typed_t_max_that_is_not_the_runs_length_runs_as_typed_and_says_so(
    workdir: Path, given: int, effect: str, caplog: pytest.LogCaptureFixture
) -> None:
    # torch's own scheduler with its length written out: a short smoke run of the config still runs
    _, rates = fit_recording(
        "--model.init_args.scheduler=torch.optim.lr_scheduler.CosineAnnealingLR",
        f"--model.init_args.scheduler.init_args.T_max={given}",
    )  # fmt: skip
    assert rates == pytest.approx(by_hand(lambda o: CosineAnnealingLR(o, T_max=given), "epoch"))
    said = [r.getMessage() for r in caplog.records if "T_max=" in r.getMessage()]
    assert len(said) == 1
    assert f"T_max={given}, but this run is {EPOCHS} epochs long, so the schedule {effect}" in said[0]


def test_torchs_cosine_with_the_runs_length_typed_out_is_accepted(workdir: Path) -> None:
    _, rates = fit_recording(
        "--model.init_args.scheduler=torch.optim.lr_scheduler.CosineAnnealingLR",
        f"--model.init_args.scheduler.init_args.T_max={EPOCHS}",
    )  # fmt: skip
    assert rates == pytest.approx(by_hand(lambda o: CosineAnnealingLR(o, T_max=EPOCHS), "epoch"))


def test_a_typed_total_steps_that_is_not_the_runs_length_says_so(
    workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fit_recording(
        "--config", str(TRAINER / "onecycle.yaml"), "--model.init_args.scheduler.init_args.total_steps=100"
    )
    assert f"total_steps=100, but this run is {EPOCHS * BATCHES} optimizer steps long" in caplog.text


def test_warmup_then_cosine_steps_once_per_optimizer_step(workdir: Path) -> None:
    warmup, total = 5, EPOCHS * BATCHES
    run, rates = fit_recording(
        "--config", str(TRAINER / "warmup_cosine.yaml"),
        f"--model.init_args.scheduler.init_args.warmup_steps={warmup}",
    )  # fmt: skip
    scheduler = run.trainer.lr_scheduler_configs[0].scheduler
    assert isinstance(scheduler, SequentialLR)
    assert [type(s) for s in scheduler._schedulers] == [LinearLR, CosineAnnealingLR]

    def expected(optimizer: torch.optim.Optimizer) -> LRScheduler:
        ramp = LinearLR(optimizer, start_factor=0.01, total_iters=warmup)
        decay = CosineAnnealingLR(optimizer, T_max=total - warmup)  # the task filled in total_steps
        return SequentialLR(optimizer, [ramp, decay], milestones=[warmup])

    assert rates == pytest.approx(by_hand(expected, "step"))
    assert rates[0] == pytest.approx(0.01 * LR)
    assert max(rates) == pytest.approx(LR)


def test_warmup_longer_than_the_run_is_refused(workdir: Path) -> None:
    with pytest.raises(UserInputError, match="warmup_steps=100 must lie in"):
        fit_recording("--config", str(TRAINER / "warmup_cosine.yaml"))  # 100 warmup steps, 12 in the run


def test_one_cycle_steps_once_per_optimizer_step_over_the_whole_run(workdir: Path) -> None:
    run, rates = fit_recording("--config", str(TRAINER / "onecycle.yaml"))
    keywords = run.model.scheduler.keywords
    assert run.trainer.lr_scheduler_configs[0].scheduler.total_steps == EPOCHS * BATCHES
    expected = by_hand(
        lambda o: OneCycleLR(
            o, max_lr=keywords["max_lr"], pct_start=keywords["pct_start"], total_steps=EPOCHS * BATCHES
        ),
        "step",
    )
    assert rates == pytest.approx(expected)


def test_plateau_halves_the_rate_when_the_monitored_metric_stalls(workdir: Path) -> None:
    # a scripted val/loss per epoch: improves, stalls, improves; train/loss stays real
    script = [1.0, 0.5, 0.6, 0.6]

    run, rates = fit_recording(
        "--config", str(TRAINER / "plateau.yaml"), "--model.init_args.scheduler.init_args.patience=0",
        patch=partial(plant_val_loss, script=script),
    )  # fmt: skip
    config = run.trainer.lr_scheduler_configs[0]
    assert (config.monitor, config.interval) == ("val/loss", "epoch")
    keywords = run.model.scheduler.keywords

    optimizer = torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=LR)
    plateau = ReduceLROnPlateau(optimizer, mode="min", factor=keywords["factor"], patience=0)
    expected = []
    for value in script:
        expected += [optimizer.param_groups[0]["lr"]] * BATCHES
        plateau.step(value)  # Lightning steps it after validation, with the monitored value
    assert rates == pytest.approx(expected)
    assert rates[-1] == pytest.approx(LR * keywords["factor"])  # the stall cost one halving


class Momentum(Callback):
    """The momentum (or Adam's first beta) each optimizer step runs with."""

    def __init__(self) -> None:
        self.per_step: list[float] = []

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: object, batch_idx: int
    ) -> None:
        group = trainer.optimizers[0].param_groups[0]
        self.per_step.append(group["betas"][0] if "betas" in group else group["momentum"])


ONE_CYCLE = ["--config", str(TRAINER / "onecycle.yaml")]
CYCLIC = [
    "--model.init_args.scheduler=torch.optim.lr_scheduler.CyclicLR",
    "--model.init_args.scheduler_interval=step",
    "--model.init_args.scheduler.init_args.base_lr=0.001",
    "--model.init_args.scheduler.init_args.max_lr=0.01",
    "--model.init_args.scheduler.init_args.step_size_up=3",
]
SGD = ["--model.init_args.optimizer=torch.optim.SGD", "--model.init_args.optimizer.init_args.momentum=0.7"]


@pytest.mark.parametrize(
    ("words", "said", "first"),
    [
        ([*SGD, *ONE_CYCLE], "OneCycleLR cycles the optimizer's momentum between 0.85 and 0.95 and replaces "
         "momentum=0.7; give cycle_momentum: false to keep it.", 0.95),
        (ONE_CYCLE, "OneCycleLR cycles the optimizer's first beta (its momentum) between 0.85 and 0.95 and "
         "replaces betas[0]=0.9; give cycle_momentum: false to keep it.", 0.95),
        ([*SGD, *CYCLIC], "CyclicLR cycles the optimizer's momentum between 0.8 and 0.9 and replaces "
         "momentum=0.7; give cycle_momentum: false to keep it.", 0.9),
        ([*SGD, *ONE_CYCLE, "--model.init_args.scheduler.init_args.cycle_momentum=false"], None, 0.7),
    ],
    ids=["one-cycle-sgd", "one-cycle-adam", "cyclic-sgd", "one-cycle-told-to-keep-it"],
)  # fmt: skip
def test_a_scheduler_that_replaces_the_optimizers_momentum_says_so_once(
    workdir: Path, caplog: pytest.LogCaptureFixture, words: list[str], said: str | None, first: float
) -> None:
    momentum = Momentum()
    fit_recording(*words, patch=lambda run: run.trainer.callbacks.append(momentum))
    notices = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("model.init_args.scheduler:")
    ]
    assert notices == ([f"model.init_args.scheduler: {said}"] if said else [])
    assert momentum.per_step[0] == pytest.approx(first)  # what the optimizer ran with, as said
