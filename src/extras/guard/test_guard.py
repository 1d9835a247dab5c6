"""A non-finite step is skipped, never taken; a run that keeps at it stops; blown-up weights are not saved."""

import math
from pathlib import Path
from typing import Any, NamedTuple

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

import src.extras.guard
import tests.test_any_module as any_module
import tests.test_distributed as distributed
from src.cli import CLI, main
from src.errors import UserInputError
from src.extras.gradients import step_norm, total_norm
from src.extras.guard import NonFiniteGuard
from src.models import Classifier
from tests.conftest import BARE, CONFIGS, QUIET

# these tests also need the extras below; without one of them they are skipped
pytest.importorskip("src.extras.dashboard.steps")
read_scalars = pytest.importorskip("src.extras.dashboard.logger").read_scalars
StepValues = pytest.importorskip("src.extras.dashboard.steps").StepValues

STEPS = 10  # 2 epochs of 5 batches
SPIRAL = [
    "--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=1500", "--trainer.max_epochs=2",
    "--trainer.limit_train_batches=5", "--trainer.limit_val_batches=1",
    "--model.init_args.optimizer=torch.optim.SGD", "--model.init_args.optimizer.init_args.lr=0.1",
]  # fmt: skip
PER_STEP_SCHEDULE = [
    "--model.init_args.scheduler=torch.optim.lr_scheduler.LinearLR",
    "--model.init_args.scheduler.init_args.total_iters=20", "--model.init_args.scheduler_interval=step",
]  # fmt: skip


def build(workdir: Path, *extra: str) -> CLI:
    return main([*SPIRAL, *extra, *QUIET], run=False)


def scale_loss_at(run: CLI, steps: set[int], factor: float) -> None:
    """Multiply the training loss by ``factor`` (NaN, or 0) at the given optimizer steps."""
    real = run.model.loss

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        value = real(output, target)
        return value * factor if run.model.training and run.trainer.global_step in steps else value

    run.model.loss = loss


def guard(run: CLI) -> NonFiniteGuard:
    return next(c for c in run.trainer.callbacks if isinstance(c, NonFiniteGuard))


def test_a_nan_step_is_skipped_exactly_as_if_it_had_never_happened(workdir: Path, caplog) -> None:
    skipped = build(workdir)
    scale_loss_at(skipped, {3}, math.nan)
    skipped.trainer.fit(skipped.model, datamodule=skipped.datamodule)
    assert skipped.trainer.global_step == STEPS
    assert guard(skipped).skipped == 1
    assert "Skipped the optimizer step at epoch 0, batch 3: non-finite gradients in net." in caplog.text
    assert skipped.trainer.callback_metrics["train/skipped_steps"] == 1
    # plain SGD: a step with zero gradients leaves the weights where they were, as a skipped step must
    zeroed = build(workdir)
    scale_loss_at(zeroed, {3}, 0.0)
    zeroed.trainer.fit(zeroed.model, datamodule=zeroed.datamodule)
    for (name, a), b in zip(
        skipped.model.state_dict().items(), zeroed.model.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
        assert torch.isfinite(a).all()


def test_a_step_whose_norm_overflows_names_its_parameters_on_one_process(workdir: Path, caplog) -> None:
    # a loss of about 1e30: every gradient element finite (below float32's 3.4e38), their squared sum
    # not, so the step's norm is infinite while no element is (what a learning rate ramping to divergence
    # does): the culprit is this process's largest gradients, not "another process"
    run = build(workdir)
    scale_loss_at(run, {3}, 1e30)
    run.trainer.fit(run.model, datamodule=run.datamodule)
    assert guard(run).skipped == 1
    skipped = [line for line in caplog.text.splitlines() if "Skipped the optimizer step" in line]
    assert len(skipped) == 1
    assert "another process" not in skipped[0]
    assert (
        "epoch 0, batch 3: gradients too large for float32 (their norm overflows; largest in net."
        in (skipped[0])
    )


class Strategy:
    """What the guard asks of a strategy: a reduction over the processes, answered from a script."""

    def __init__(self, answers: list[float]) -> None:
        self.answers = answers
        self.ops: list[str] = []

    def reduce(self, tensor: torch.Tensor, reduce_op: str) -> torch.Tensor:
        self.ops.append(reduce_op)
        return torch.tensor(self.answers.pop(0))


class Trainer(NamedTuple):
    """The state of one process of a multi-process fit, as the guard reads it."""

    strategy: Strategy
    global_rank: int
    world_size: int = 4
    global_step: int = 7
    current_epoch: int = 1
    lr_scheduler_configs: tuple = ()


@pytest.mark.parametrize(
    ("mine", "answers", "culprit"),
    [
        (1.0, [1.0, 2.0], "non-finite gradients on another process (process 2)"),  # this one finite
        (math.nan, [1.0, 0.0], "non-finite gradients in net.weight on process 0"),
        (1e30, [1.0, 0.0], "gradients too large for float32 (their norm overflows; largest in net.bias, "),
    ],
    ids=["another", "this-one-nan", "this-one-overflows"],
)  # fmt: skip
def test_several_processes_name_the_process_whose_gradients_were_not_finite(
    caplog, mine: float, answers: list[float], culprit: str
) -> None:
    net = torch.nn.Linear(3, 2)
    net.weight.grad = torch.full((2, 3), mine)
    net.bias.grad = torch.full((2,), 2 * mine if math.isfinite(mine) else 1.0)
    module = L.LightningModule()
    module.net = net
    strategy = Strategy(answers)
    trainer: Any = Trainer(strategy, global_rank=0)
    checker = NonFiniteGuard()
    checker.on_train_start(trainer, module)
    checker.on_before_optimizer_step(trainer, module, torch.optim.SGD(net.parameters()))
    assert strategy.ops == ["max", "min"]  # all agree to skip; then the first process that broke
    assert f"Skipped the optimizer step at epoch 1, batch 0: {culprit}" in caplog.text
    assert net.weight.grad is None


def test_a_per_step_schedule_is_set_back_for_the_skipped_step_only(workdir: Path) -> None:
    run = build(workdir, *PER_STEP_SCHEDULE)
    scale_loss_at(run, {3}, math.nan)
    run.trainer.fit(run.model, datamodule=run.datamodule)
    scheduler = run.trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.last_epoch == STEPS - 1
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    reference = torch.optim.lr_scheduler.LinearLR(optimizer, total_iters=20)
    for _ in range(STEPS - 1):
        optimizer.step()
        reference.step()
    assert scheduler.get_last_lr() == pytest.approx(reference.get_last_lr())
    assert run.trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(reference.get_last_lr()[0])


def test_adam_keeps_its_moments_through_a_skipped_step(workdir: Path) -> None:
    run = main([*SPIRAL, "--model.init_args.optimizer=torch.optim.Adam", *QUIET], run=False)
    scale_loss_at(run, {2, 7}, math.inf)
    run.trainer.fit(run.model, datamodule=run.datamodule)
    states = run.trainer.optimizers[0].state.values()
    assert {int(state["step"]) for state in states} == {STEPS - 2}


def test_steps_that_stay_non_finite_stop_the_run_with_a_sentence(workdir: Path) -> None:
    run = build(workdir)
    guard(run).max_consecutive = 3
    scale_loss_at(run, set(range(4, STEPS)), math.nan)
    with pytest.raises(
        UserInputError, match=r"3 optimizer steps in a row had non-finite gradients \(last at epoch"
    ):
        run.trainer.fit(run.model, datamodule=run.datamodule)


class BlowUpAfterTheLastStep(Callback):
    """Weights that become infinite after the second epoch's last step, just before it is saved."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: object) -> None:
        if trainer.current_epoch == 1 and trainer.global_step == STEPS:
            with torch.no_grad():
                next(pl_module.parameters()).fill_(math.inf)


def test_a_checkpoint_with_non_finite_weights_is_never_written(workdir: Path) -> None:
    run = build(workdir)
    run.trainer.callbacks.append(BlowUpAfterTheLastStep())
    # refused at the first save after the blow-up: last.ckpt's at the fit's end (nothing improved on the best)
    with pytest.raises(UserInputError, match="the weights are no longer finite at epoch 2"):
        run.trainer.fit(run.model, datamodule=run.datamodule)
    checkpoints = Path(run.trainer.log_dir) / "checkpoints"
    for path in checkpoints.glob("*.ckpt"):
        checkpoint = torch.load(path, weights_only=True)
        assert checkpoint["epoch"] == 0
        assert all(
            torch.isfinite(t).all() for t in checkpoint["state_dict"].values() if t.is_floating_point()
        )


class NaNLoss(Classifier):
    """A user's loss that went wrong: NaN from the first step on."""

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return super().loss(output, target) * math.nan


def test_the_cli_ends_a_hopeless_run_with_one_sentence(cli, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli("fit", *SPIRAL, "--model", "src.extras.guard.test_guard.NaNLoss", "--trainer.max_epochs=5")
    assert exit_.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert "every optimizer step of epoch 0 (5) had non-finite gradients, so nothing was trained" in errors[0]


@pytest.fixture
def lightning_clipped(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The steps at which Lightning's clipping ran: its precision plugin calls the module's
    ``configure_gradient_clipping``, whose default calls ``clip_gradients``."""
    steps: list[int] = []
    clip_gradients = Classifier.clip_gradients

    def counted(self: Classifier, *args: object, **kwargs: object) -> None:
        steps.append(self.trainer.global_step)
        clip_gradients(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Classifier, "clip_gradients", counted)
    return steps


@pytest.fixture
def clipped_norms(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The total norm each call of ``torch.nn.utils.clip_grad_norm_`` clipped with (what it returns)."""
    norms: list[float] = []
    clip_grad_norm_ = torch.nn.utils.clip_grad_norm_

    def recorded(*args: Any, **kwargs: Any) -> torch.Tensor:
        norm = clip_grad_norm_(*args, **kwargs)
        norms.append(norm.item())
        return norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recorded)
    return norms


class NormProbe(Callback):
    """The total L2 norm of the gradients every optimizer step is about to use, before clipping."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        self.norms.append(torch.nn.utils.get_total_norm(grads).item())


def test_the_guard_and_lightnings_clipping_train_to_the_very_bits_of_a_run_without_the_guard(
    workdir: Path, lightning_clipped: list[int], clipped_norms: list[float]
) -> None:
    """With every step finite, the guard changes nothing: Lightning clips as it would without it, and
    StepValues writes the very norm Lightning clipped with."""
    clip = ["--trainer.gradient_clip_val=0.05", "--trainer.log_every_n_steps=1"]  # clipping acts every step
    guarded = build(workdir, *clip)
    assert guard(guarded).max_consecutive == 10  # the shipped guard is on
    probe = NormProbe()
    guarded.trainer.callbacks.append(probe)
    guarded.trainer.fit(guarded.model, datamodule=guarded.datamodule)
    assert guard(guarded).skipped == 0
    assert lightning_clipped == list(range(STEPS))  # Lightning's own clipping, on every step
    assert len(clipped_norms) == STEPS
    assert all(norm > 0.05 for norm in clipped_norms)  # the precondition: clipping had something to do
    # the norm before clipping that a callback sees is the very float32 number Lightning clipped with ...
    assert probe.norms == clipped_norms
    # ... and the one StepValues wrote as train/grad_norm at each step, beside train/grad_clipped
    written = read_scalars(guarded.trainer.log_dir)
    logged = dict(written["train/optimization/grad_norm"])
    assert sorted(logged) == list(range(STEPS))
    assert [logged[step] for step in range(STEPS)] == clipped_norms
    # a logging interval of one step: clipped on each of them
    assert [value for _, value in written["train/optimization/clipped"]] == [1.0] * STEPS

    unguarded = build(workdir, *clip, "--nonfinite_guard=null")
    assert not any(isinstance(c, NonFiniteGuard) for c in unguarded.trainer.callbacks)
    unguarded.trainer.fit(unguarded.model, datamodule=unguarded.datamodule)
    assert lightning_clipped == list(range(STEPS)) * 2
    for (name, a), b in zip(
        guarded.model.state_dict().items(), unguarded.model.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    # step by step, the unguarded run clipped the same norms
    assert clipped_norms[STEPS:] == clipped_norms[:STEPS]


def test_lightnings_clipping_acts_beside_the_guard_under_mixed_precision_too(
    workdir: Path, lightning_clipped: list[int]
) -> None:
    # MixedPrecision unscales before on_before_optimizer_step and clips its own way; the guard's check
    # comes first and leaves the clipping to Lightning
    mixed = build(workdir, "--trainer.precision=bf16-mixed")
    mixed.trainer.fit(mixed.model, datamodule=mixed.datamodule)
    assert guard(mixed).skipped == 0
    assert lightning_clipped == list(range(STEPS))


# -- the norm both callbacks take, once per step ---------------------------------------------------------


#: values written at every step, and no checkpoint (whose weights the guard checks with a norm of its own)
ONLY_STEPS = ["--trainer.log_every_n_steps=1", "--trainer.enable_checkpointing=false"]


class Run(NamedTuple):
    calls: int  # of torch.nn.utils.get_total_norm
    scalars: dict[str, list[tuple[int, float]]]
    weights: dict[str, torch.Tensor]
    guard: NonFiniteGuard


def fit_beside_step_values(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, guard_first: bool, shared: bool, nan_at: set[int]
) -> Run:
    """A fit with only the guard and StepValues, in the order given, writing every step's values; the
    norm shared between them, or taken by each as if the other were not there."""
    calls = 0
    get_total_norm = torch.nn.utils.get_total_norm

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        nonlocal calls
        calls += 1
        return get_total_norm(*args, **kwargs)

    with monkeypatch.context() as patch:
        if not shared:  # what each callback did on its own: its own norm, every step
            for module in (src.extras.guard, src.extras.dashboard.steps):
                patch.setattr(module, "step_norm", lambda grads, optimizer, step: total_norm(grads))
        patch.setattr(torch.nn.utils, "get_total_norm", counted)  # Lightning's clipping does not call it
        run = build(workdir, *BARE, *ONLY_STEPS, "--trainer.gradient_clip_val=0.05")
        both: list[Callback] = [NonFiniteGuard(), StepValues()]
        run.trainer.callbacks.extend(both if guard_first else both[::-1])
        scale_loss_at(run, nan_at, math.nan)
        run.trainer.fit(run.model, datamodule=run.datamodule)
    return Run(calls, read_scalars(run.trainer.log_dir), run.model.state_dict(), guard(run))


def assert_same_run(a: Run, b: Run) -> None:
    """Every logged value and every weight to the bit (a NaN where the other has one)."""
    assert a.scalars.keys() == b.scalars.keys()
    for tag, values in a.scalars.items():
        assert [step for step, _ in values] == [step for step, _ in b.scalars[tag]], tag
        torch.testing.assert_close(
            torch.tensor([v for _, v in values]), torch.tensor([v for _, v in b.scalars[tag]]), rtol=0,
            atol=0, equal_nan=True, msg=tag,
        )  # fmt: skip
    for name, weight in a.weights.items():
        torch.testing.assert_close(weight, b.weights[name], rtol=0, atol=0, msg=name)
    assert a.guard.skipped == b.guard.skipped


@pytest.mark.slow
@pytest.mark.parametrize("guard_first", [False, True], ids=["step_values_first", "guard_first"])
def test_the_guard_and_step_values_take_one_norm_per_step_and_log_and_train_as_with_two(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, guard_first: bool
) -> None:
    shared = fit_beside_step_values(workdir, monkeypatch, guard_first, shared=True, nan_at=set())
    separate = fit_beside_step_values(workdir, monkeypatch, guard_first, shared=False, nan_at=set())
    assert separate.calls == 2 * STEPS  # the precondition: each callback's own norm, every step
    assert shared.calls == STEPS
    assert sorted(dict(shared.scalars["train/optimization/grad_norm"])) == list(range(STEPS))
    assert_same_run(shared, separate)


@pytest.mark.slow
@pytest.mark.parametrize("guard_first", [False, True], ids=["step_values_first", "guard_first"])
def test_step_values_beside_a_guard_that_drops_a_step_logs_as_with_its_own_norm(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, guard_first: bool
) -> None:

    shared = fit_beside_step_values(workdir, monkeypatch, guard_first, shared=True, nan_at={3})
    separate = fit_beside_step_values(workdir, monkeypatch, guard_first, shared=False, nan_at={3})
    assert shared.guard.skipped == 1
    # after the guard StepValues finds no gradients at the dropped step: no norm (its learning rate all
    # the same); before it, the step's NaN norm
    logged = dict(shared.scalars["train/optimization/grad_norm"])
    assert sorted(logged) == [step for step in range(STEPS) if not (guard_first and step == 3)]
    assert guard_first or math.isnan(logged[3])
    assert 3 in dict(shared.scalars["train/optimization/lr"])
    assert shared.calls == STEPS
    assert separate.calls == 2 * STEPS - guard_first
    assert_same_run(shared, separate)


def test_step_norm_is_reused_only_for_the_same_optimizer_step_and_gradients() -> None:
    grads = [torch.randn(3, 2), torch.randn(3)]
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)])
    first = step_norm(grads, optimizer, 5)
    torch.testing.assert_close(first, torch.nn.utils.get_total_norm(grads), rtol=0, atol=0)
    assert step_norm(list(grads), optimizer, 5) is first  # another list of the same tensors
    others = [
        (grads, optimizer, 6),  # the next step: gradients written in place by an accumulating loop
        (grads[::-1], optimizer, 5),  # another order: another float sum
        (grads[:1], optimizer, 5),  # fewer gradients: one optimizer's of several
        ([g.clone() for g in grads], optimizer, 5),  # new tensors
        (grads, torch.optim.SGD([torch.zeros(1, requires_grad=True)]), 5),  # another optimizer
    ]
    for args in others:
        assert step_norm(*args) is not first
        first = step_norm(grads, optimizer, 5)


def test_the_guard_skips_a_plain_modules_nan_step(workdir: Path) -> None:
    """A LightningModule of the user's own (tests/test_any_module.py's, which knows nothing of this project)
    under every shipped default: its one NaN step is skipped, counted and logged."""
    run = any_module.fit(workdir, "--model.init_args.nan_at=4", "--trainer.max_epochs=1")
    guard = next(c for c in run.trainer.callbacks if isinstance(c, NonFiniteGuard))
    assert guard.skipped == 1
    assert all(torch.isfinite(p).all() for p in run.model.parameters())
    assert run.trainer.global_step == run.trainer.num_training_batches  # the skipped step is still counted
    assert read_scalars(Path(run.trainer.logger.log_dir))["train/skipped_steps"][-1][1] == 1.0


@pytest.mark.slow
def test_fsdp2_shards_checkpoints_resumes_and_consolidates(tmp_path: Path, cli, workdir: Path) -> None:
    """tests/test_distributed.py's FSDP2 runs with the guard back on after BARE: its checks work on sharded
    (DTensor) gradients and weights."""
    distributed.fsdp2_round_trip(tmp_path, cli, workdir, "--nonfinite_guard=src.extras.guard.NonFiniteGuard")
