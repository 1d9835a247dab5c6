"""What reaches TensorBoard means what its name says: the step values StepValues writes, the epoch metrics
the task logs, and what the progress bar shows.

``StepValues`` writes ``train/loss_step``, ``train/lr``, ``train/grad_norm`` and ``train/grad_clipped``
every ``log_every_n_steps`` optimizer steps; the task logs its epoch loss and metrics once per epoch,
from metric objects that took in every batch. The tests hold each written value against the ground
truth a probe records on every batch and every optimizer step, and the steps they are written at
against the schedule.
"""

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from sklearn.metrics import accuracy_score, f1_score
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from typing_extensions import override

from examples.manual import ManualClassifier
from src.extras.dashboard import Dashboard
from src.extras.dashboard.logger import TensorBoardLogger, read_scalars
from src.extras.dashboard.steps import StepValues
from src.extras.tables import TabularDataModule
from src.models import BaseTask, Classifier
from src.nets import MLP

# these tests also need the extras below; without one of them they are skipped
NonFiniteGuard = pytest.importorskip("src.extras.guard").NonFiniteGuard
ProgressBar = pytest.importorskip("src.extras.summary.progress").ProgressBar

BATCHES, EPOCHS, EVERY, CLIP, LR = 7, 2, 3, 0.4, 0.05
ROWS = 50  # per batch; the spiral's training split fills every one of the 7


@dataclass
class Batch:
    """One batch as the net saw it: the epoch, the (B, K) logits and the (B,) targets."""

    epoch: int
    logits: torch.Tensor
    target: torch.Tensor

    @property
    def loss(self) -> float:
        """The loss ``training_step`` returned for the batch: the classifier's cross-entropy."""
        return F.cross_entropy(self.logits, self.target).item()


class Probe(Callback):
    """Every batch the net sees, training and validation (not the sanity check); every optimizer step: the
    step's index, the total gradient norm and the largest gradient element, both before clipping."""

    def __init__(self) -> None:
        self.train: list[Batch] = []
        self.val: list[Batch] = []
        self.steps: list[int] = []
        self.norms: list[float] = []
        self.largest: list[float] = []
        self._target: torch.Tensor | None = None

    def of_epoch(self, epoch: int, stage: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        """``(N, K)`` logits and ``(N,)`` targets of every batch of one epoch."""
        batches = [b for b in (self.train if stage == "train" else self.val) if b.epoch == epoch]
        return torch.cat([b.logits for b in batches]), torch.cat([b.target for b in batches])

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        assert isinstance(pl_module, BaseTask)

        def keep(module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> None:
            if trainer.sanity_checking or self._target is None:
                return
            batch = Batch(trainer.current_epoch, output.detach().clone(), self._target)
            (self.train if module.training else self.val).append(batch)
            self._target = None

        pl_module.net.register_forward_hook(keep)

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int
    ) -> None:
        self._target = batch[1].clone()

    @override
    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int, dataloader_idx: int = 0
    ) -> None:
        self._target = batch[1].clone()

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        # callbacks run before the module's own hook and before Lightning clips: the norm before clipping
        self.steps.append(trainer.global_step)
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        self.norms.append(torch.nn.utils.get_total_norm(grads).item())
        self.largest.append(max(g.abs().max().item() for g in grads))


def data() -> TabularDataModule:
    return TabularDataModule(source="spiral", num_samples=600, batch_size=ROWS, min_batches_per_epoch=None)


def fit(
    tmp_path: Path,
    model: BaseTask,
    clip: float | None = CLIP,
    callbacks: tuple[Callback, ...] = (),
    **trainer: Any,
) -> tuple[Probe, EventAccumulator]:
    probe = Probe()
    logger = TensorBoardLogger(tmp_path, name="steps", default_hp_metric=False)
    settings: dict[str, Any] = {"max_epochs": EPOCHS, "limit_train_batches": BATCHES, "limit_val_batches": 2}
    L.Trainer(
        **{**settings, **trainer},
        log_every_n_steps=EVERY,
        gradient_clip_val=clip,
        logger=logger,
        callbacks=[StepValues(), probe, *callbacks],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    ).fit(model, datamodule=data())
    return probe, read_scalars(logger.log_dir)


Written = dict[str, list[tuple[int, float]]]


def scalars(events: Written, tag: str) -> dict[int, float]:
    return dict(events[tag])


def shares(fired: list[bool], logged: list[int]) -> dict[int, float]:
    """At each logged step, the share of the optimizer steps since the previous one (that one excluded)
    on which clipping ``fired``."""
    starts = [0, *(step + 1 for step in logged)]
    return {
        step: pytest.approx(sum(fired[start : step + 1]) / (step + 1 - start))
        for start, step in zip(starts, logged, strict=False)
    }


def model(cls: type[BaseTask] = Classifier, **hparams: Any) -> BaseTask:
    torch.manual_seed(0)  # the same initial weights in every run: the preconditions below hold in each
    sgd = functools.partial(torch.optim.SGD, lr=LR)  # a constant learning rate to compare with
    net = functools.partial(MLP, hidden_sizes=[16])  # the norms the preconditions hold for
    return cls(in_features=2, out_features=3, **{"net": net, "optimizer": sgd, **hparams})


# -- StepValues -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("manual", "accumulate"),
    [(False, 1), (False, 2), (True, 2)],
    ids=["automatic", "accumulate2", "manual2"],
)
def test_step_values_are_written_every_n_optimizer_steps(
    tmp_path: Path, manual: bool, accumulate: int
) -> None:
    if manual:  # the task steps, accumulates and clips itself; the Trainer's settings stay off
        task = model(ManualClassifier, accumulate_grad_batches=accumulate, gradient_clip_val=CLIP)
        probe, events = fit(tmp_path, task, clip=None)
    else:
        probe, events = fit(tmp_path, model(), accumulate_grad_batches=accumulate)
    # optimizer steps per epoch: groups of `accumulate` batches, the last one shorter
    steps_per_epoch = -(-BATCHES // accumulate)
    steps = EPOCHS * steps_per_epoch
    assert probe.steps == list(range(steps))  # the probe saw each optimizer step once, in order
    assert len(probe.train) == EPOCHS * BATCHES
    # every EVERY optimizer steps, at the index of the step (global_step before it is taken)
    logged = [s for s in range(steps) if (s + 1) % EVERY == 0]
    # each tag once per logged step, never per micro-batch (TensorBoard gets no `epoch` counter: its step
    # axis says as much, and the counter's chart opened first in Time Series)
    for tag in ("train/optimization/loss", "train/optimization/lr", "train/optimization/grad_norm"):
        assert [step for step, _ in events[tag]] == logged, tag
    assert "epoch" not in events
    assert scalars(events, "train/optimization/lr") == {step: pytest.approx(LR) for step in logged}
    # the norm before clipping; clipping fired on some of these steps, not on others
    assert {probe.norms[step] > CLIP for step in logged} == {True, False}
    norms = scalars(events, "train/optimization/grad_norm")
    assert norms == {step: pytest.approx(probe.norms[step], rel=1e-6) for step in logged}
    # the share of the interval's steps whose gradients clipping cut: the Trainer's, or under manual
    # optimization the task's own; counted at every step, not only the logged ones
    fired = [norm > CLIP for norm in probe.norms]
    assert scalars(events, "train/optimization/clipped") == shares(fired, logged)
    starts = [0, *(step + 1 for step in logged)]
    raw = {sum(fired[a : b + 1]) / (b + 1 - a) for a, b in zip(starts, logged, strict=False)}
    assert raw - {0.0, 1.0}  # within an interval, clipping fired on some steps and not on others
    # a step's loss is the one training_step returned for its last micro-batch (the one that ends the group)
    last_batch_of_step = [
        epoch * BATCHES + min((k + 1) * accumulate, BATCHES) - 1
        for epoch in range(EPOCHS)
        for k in range(steps_per_epoch)
    ]
    loss_step = scalars(events, "train/optimization/loss")
    assert loss_step == {
        step: pytest.approx(probe.train[last_batch_of_step[step]].loss, rel=1e-6) for step in logged
    }


def test_clipping_is_reported_whatever_the_optimizer_does_with_the_gradients(tmp_path: Path) -> None:
    nesterov = functools.partial(torch.optim.SGD, lr=LR, momentum=0.9, nesterov=True, foreach=True)
    clip = 0.2  # below some logged steps' norms
    probe, events = fit(tmp_path, model(optimizer=nesterov), clip=clip)
    logged = [s for s in range(EPOCHS * BATCHES) if (s + 1) % EVERY == 0]
    assert any(probe.norms[step] > clip for step in logged)
    fired = [norm > clip for norm in probe.norms]
    assert scalars(events, "train/optimization/clipped") == shares(fired, logged)


class StopAtBatch(Callback):
    """Stops the run at the start of a batch, as a time limit or a signal would: that batch is the last."""

    def __init__(self, epoch: int, batch: int) -> None:
        self.epoch, self.batch = epoch, batch

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int
    ) -> None:
        if trainer.current_epoch == self.epoch and idx == self.batch:
            trainer.should_stop = True


def test_the_step_a_stop_ends_the_run_with_is_written_off_the_schedule(tmp_path: Path) -> None:
    probe, events = fit(tmp_path, model(), callbacks=(StopAtBatch(epoch=1, batch=3),))
    last = BATCHES + 3  # the run's last optimizer step: not one of every EVERY
    assert probe.steps[-1] == last
    assert (last + 1) % EVERY
    loss_step = scalars(events, "train/optimization/loss")
    assert sorted(loss_step) == [s for s in range(last) if (s + 1) % EVERY == 0] + [last]
    assert loss_step[last] == pytest.approx(probe.train[last].loss, rel=1e-6)
    assert scalars(events, "train/optimization/grad_norm")[last] == pytest.approx(probe.norms[last], rel=1e-6)


VALUE = 0.14  # above some steps' largest gradient element, below others'


class OwnClipping(Classifier):
    """A user's task that clips by value in its own configure_gradient_clipping, whatever the Trainer says."""

    @override
    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: Any = None,
        gradient_clip_algorithm: Any = None,
    ) -> None:
        self.clip_gradients(optimizer, VALUE, "value")


def test_a_task_that_clips_its_own_way_gets_the_norm_before_and_whether_it_fired(tmp_path: Path) -> None:
    probe, events = fit(tmp_path, model(OwnClipping), clip=None)  # Lightning refuses two thresholds
    logged = [s for s in range(EPOCHS * BATCHES) if (s + 1) % EVERY == 0]
    assert {probe.largest[step] > VALUE for step in logged} == {True, False}  # fired on some steps only
    norms = scalars(events, "train/optimization/grad_norm")
    assert norms == {step: pytest.approx(probe.norms[step], rel=1e-6) for step in logged}
    fired = scalars(events, "train/optimization/clipped")
    assert fired == shares([largest > VALUE for largest in probe.largest], logged)
    assert sorted(scalars(events, "train/optimization/loss")) == logged


class TwoOptimizers(L.LightningModule):
    """Two nets, each with its own optimizer, stepped one after the other on every batch (a GAN's shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.first, self.second = torch.nn.Linear(2, 3), torch.nn.Linear(2, 3)

    @override
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        for optimizer, net in zip(self.optimizers(), (self.first, self.second), strict=True):
            optimizer.zero_grad()
            loss = F.cross_entropy(net(x), y)
            self.manual_backward(loss)
            optimizer.step()
        return loss.detach()

    @override
    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [
            torch.optim.SGD(self.first.parameters(), lr=0.1),
            torch.optim.SGD(self.second.parameters(), lr=0.2),
        ]


class Written(L.pytorch.loggers.Logger):
    """Keeps what it is given: ``(step, names)`` per call."""

    name, version = "written", 0

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int | None, set[str]]] = []

    @override
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, set(metrics)))

    @override
    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass


def test_every_optimizers_values_are_written_on_a_logging_step() -> None:
    spiral = data()
    spiral.setup("fit")
    loader = spiral.train_dataloader()
    written = Written()
    L.Trainer(
        max_epochs=1,
        limit_train_batches=6,
        log_every_n_steps=2,
        logger=written,
        callbacks=[StepValues()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    ).fit(TwoOptimizers(), train_dataloaders=loader)
    rows = [names for _, names in written.rows if "train/optimization/loss" in names]
    assert rows
    for names in rows:
        # each optimizer's own tags, suffixed /opt<N>
        assert {
            "train/optimization/lr/opt1",
            "train/optimization/lr/opt2",
            "train/optimization/grad_norm/opt1",
            "train/optimization/grad_norm/opt2",
            "train/optimization/clipped/opt1",
        } <= names


# -- the epoch metrics ----------------------------------------------------------------------------------


def expected_metrics(logits: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """Loss, accuracy and macro F1 over every row at once: the mean over rows, whatever the batches."""
    preds, truth = logits.argmax(-1).numpy(), target.numpy()
    return {
        "loss": F.cross_entropy(logits, target).item(),
        "acc": accuracy_score(truth, preds),
        "f1": f1_score(truth, preds, average="macro", labels=[0, 1, 2]),
    }


def test_epoch_metrics_hold_every_batch_of_the_epoch(tmp_path: Path) -> None:
    probe, events = fit(tmp_path, model())
    for stage in ("train", "val"):
        logged = {name: scalars(events, f"{stage}/{name}") for name in ("loss", "acc", "f1")}
        assert all(len(values) == EPOCHS for values in logged.values()), stage
        for epoch in range(EPOCHS):
            logits, target = probe.of_epoch(epoch, stage)
            # the whole validation split (60 rows) in batches of 50 and 10: a mean over batches would differ
            assert len(target) == (BATCHES * ROWS if stage == "train" else 60)
            for name, value in expected_metrics(logits, target).items():
                step = sorted(logged[name])[epoch]
                assert logged[name][step] == pytest.approx(value, rel=1e-5), (stage, name, epoch)


def test_a_run_that_max_steps_ends_mid_epoch_counts_each_of_its_batches(tmp_path: Path) -> None:
    probe, events = fit(tmp_path, model(), max_steps=5)  # 5 of the epoch's 7 batches
    logits, target = probe.of_epoch(0)
    assert len(target) == 5 * ROWS
    for name, value in expected_metrics(logits, target).items():
        [logged] = scalars(events, f"train/{name}").values()
        assert logged == pytest.approx(value, rel=1e-5), name


# the step is called without a Trainer, to compare the epoch's loss with a direct computation; Lightning
# warns that its self.log calls then log nothing, which is all this test needs
@pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`:UserWarning")
def test_the_train_loss_leaves_out_a_nan_batch_and_weighs_by_rows() -> None:
    task = model()
    generator = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(rows, 2, generator=generator), torch.randint(0, 3, (rows,), generator=generator))
        for rows in (50, 20, 30)
    ]
    batches[1][0][0, 0] = float("nan")  # one row makes the whole batch's loss NaN
    with torch.no_grad():
        losses = [task._shared_step(batch, task.train_loss, task.train_metrics)["loss"] for batch in batches]
    assert losses[1].isnan()
    torch.testing.assert_close(task.train_loss.compute(), (50 * losses[0] + 30 * losses[2]) / 80)


class NaNAtStep(Classifier):
    """A loss that turns NaN at one optimizer step, as a bad batch would make it."""

    nan_at = 3

    @override
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        value = super().loss(output, target)
        return value * float("nan") if self.training and self.trainer.global_step == self.nan_at else value


def test_a_run_skipping_a_nan_step_logs_the_train_loss_of_the_other_batches(tmp_path: Path) -> None:
    guard = NonFiniteGuard()
    probe, events = fit(tmp_path, model(NaNAtStep), callbacks=(guard,))
    assert guard.skipped == 1
    train = scalars(events, "train/loss")
    for epoch, step in enumerate(sorted(train)):
        kept = [b for i, b in enumerate(probe.train) if b.epoch == epoch and i != NaNAtStep.nan_at]
        assert len(kept) == BATCHES - (epoch == 0)
        expected = F.cross_entropy(torch.cat([b.logits for b in kept]), torch.cat([b.target for b in kept]))
        assert train[step] == pytest.approx(expected.item(), rel=1e-5)


class FailAt(Callback):
    """Raises in the middle of the first training epoch, as a crash would."""

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        if idx == 4:
            raise RuntimeError("crash")


def test_a_second_fit_of_the_same_module_after_a_crash_starts_from_empty_metrics(tmp_path: Path) -> None:
    task = model()
    crashing = L.Trainer(
        max_epochs=1,
        limit_train_batches=BATCHES,
        logger=False,
        callbacks=[FailAt()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with pytest.raises(RuntimeError, match="crash"):
        crashing.fit(task, datamodule=data())
    probe, events = fit(tmp_path, task)
    for epoch, step in enumerate(sorted(scalars(events, "train/acc"))):
        expected = expected_metrics(*probe.of_epoch(epoch))["acc"]
        assert scalars(events, "train/acc")[step] == pytest.approx(expected)
    assert len(scalars(events, "val/loss")) == EPOCHS  # handed to self.log again in the second fit


class StopMidEpoch(Callback):
    """Stops the run after batch 4 of epoch 1, as a time limit would: after a step, unforeseen by the task."""

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        if trainer.current_epoch == 1 and idx == 4:
            trainer.should_stop = True


def test_an_epoch_stopped_unforeseen_still_counts_every_batch_in_its_train_loss_and_gap(
    tmp_path: Path,
) -> None:

    probe, events = fit(tmp_path, model(), callbacks=(Dashboard(), StopMidEpoch()), max_epochs=3)
    train, val, gap = (scalars(events, tag) for tag in ("train/loss", "val/loss", "val/generalization_gap"))
    assert len(train) == len(val) == len(gap) == 2  # the second epoch, stopped after 5 batches, too
    for epoch, step in enumerate(sorted(train)):
        logits, target = probe.of_epoch(epoch)
        assert len(target) == (BATCHES if epoch == 0 else 5) * ROWS
        assert train[step] == pytest.approx(F.cross_entropy(logits, target).item(), rel=1e-5)
        # the gap is val/loss - train/loss of the same epoch, at the same step
        assert gap[step] == pytest.approx(val[step] - train[step], rel=1e-5, abs=1e-6)


# -- the progress bar -----------------------------------------------------------------------------------


class CountingBar(ProgressBar):
    """Counts the training refreshes, each of which reads the values back, and keeps what each showed."""

    refreshes = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.shown: list[tuple[int, dict[str, Any]]] = []  # (optimizer steps done, the bar's values)

    @override
    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        if trainer.training:
            self.refreshes += 1
            self.shown.append((trainer.global_step, metrics))
        return metrics


def run_bar(bar: CountingBar, epochs: int = 1, val_batches: int = 0) -> Probe:
    probe = Probe()
    L.Trainer(
        max_epochs=epochs,
        limit_train_batches=BATCHES,
        limit_val_batches=val_batches,
        log_every_n_steps=EVERY,
        logger=False,
        callbacks=[bar, probe],
        enable_checkpointing=False,
        enable_model_summary=False,
    ).fit(model(), datamodule=data())
    return probe


@pytest.mark.parametrize(("refresh_rate", "refreshes"), [(None, 4), (1, BATCHES + 1)])
def test_the_progress_bar_refreshes_on_logging_steps(refresh_rate: int | None, refreshes: int) -> None:
    bar = CountingBar(refresh_rate=refresh_rate, min_interval_s=0)
    probe = run_bar(bar)
    # following the logging steps: batches 3 and 6 of 7 (every EVERY), the last one and the epoch's end;
    # at refresh_rate 1 every batch and the epoch's end
    assert bar.refreshes == refreshes
    # the loss is not a prog_bar value, which Lightning would read back after every step; the bar reads
    # the one training_step returned when it refreshes: the loss of the batch just done
    assert "loss" not in bar.trainer.progress_bar_metrics
    for steps, shown in bar.shown:
        # to 4 significant digits
        assert float(shown["loss"]) == pytest.approx(probe.train[steps - 1].loss, rel=1e-3)
        assert "val/loss" not in shown  # no validation here


def test_the_progress_bar_shows_the_latest_validation_loss() -> None:
    bar = CountingBar(refresh_rate=1, min_interval_s=0)
    probe = run_bar(bar, epochs=2, val_batches=2)
    val_loss = [F.cross_entropy(*probe.of_epoch(epoch, "val")).item() for epoch in range(2)]
    # a refresh per batch and one at each epoch's end, after that epoch's validation: nothing before the
    # first validation (the sanity check's loss is no value), then the latest epoch's
    expected = [None] * BATCHES + [val_loss[0]] * (BATCHES + 1) + [val_loss[1]]
    assert [shown.get("val/loss") for _, shown in bar.shown] == [
        None if value is None else f"{value:.4g}" for value in expected
    ]
    for steps, shown in bar.shown:
        # to 4 significant digits
        assert float(shown["loss"]) == pytest.approx(probe.train[steps - 1].loss, rel=1e-3)


def test_the_progress_bar_leaves_out_refreshes_within_its_interval_but_never_the_last_batchs() -> None:
    bar = CountingBar(refresh_rate=1, min_interval_s=3600)
    run_bar(bar, epochs=2)
    # per epoch: the first batch (nothing refreshed yet this epoch), the last batch, the epoch's end
    assert [steps for steps, _ in bar.shown] == [1, BATCHES, BATCHES, BATCHES + 1, 2 * BATCHES, 2 * BATCHES]


def test_refresh_rate_0_turns_the_bar_off_as_in_lightning() -> None:
    assert not ProgressBar(refresh_rate=0).is_enabled
    assert ProgressBar().is_enabled


# -- the logger -----------------------------------------------------------------------------------------


def test_the_logger_saves_at_most_once_in_its_interval_and_always_at_the_end(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path, name="saves", save_every_s=3600)
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"train/loss": 1.0}, step=0)
    logger.save()
    hparams = Path(logger.log_dir) / "hparams.yaml"
    assert hparams.is_file()  # the first save runs
    hparams.unlink()
    logger.log_metrics({"train/loss": 0.5}, step=1)
    logger.save()
    assert not hparams.exists()  # within the interval: skipped
    logger.finalize("success")
    assert hparams.is_file()  # the end always saves
    assert scalars(read_scalars(logger.log_dir), "train/loss") == {0: 1.0, 1: 0.5}  # nothing logged is lost


def test_the_logger_writes_each_stage_as_a_run_under_shared_tags(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path, name="stages")
    values = {"train/loss": 1.0, "val/loss": 2.0, "test/loss": 3.0, "train/optimization/lr": 0.1, "mine": 4.0}
    logger.log_metrics({**values, "epoch": 0}, step=5)
    logger.finalize("success")
    folder = Path(logger.log_dir)
    runs = {
        run: {tag: [(p.step, p.value) for p in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
        for run in ("train", "validation", "test", "")
        for events in [EventAccumulator(str(folder / run), size_guidance={"scalars": 0}).Reload()]
    }
    # one tag per value across the stage runs: TensorBoard draws them on one chart, a colour per run
    assert runs == {
        "train": {"metrics/loss": [(5, 1.0)], "optimization/lr": [(5, pytest.approx(0.1))]},
        "validation": {"metrics/loss": [(5, 2.0)]},
        "test": {"metrics/loss": [(5, 3.0)]},
        "": {"mine": [(5, 4.0)]},  # a name without a stage stays in the run folder; no `epoch`
    }
    assert read_scalars(folder) == {name: [(5, pytest.approx(v))] for name, v in values.items()}
