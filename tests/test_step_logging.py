"""What the task logs reaches TensorBoard with the meaning it says, though it is logged sparingly.

Per-step values (``train/loss_step``, ``train/lr``, ``train/grad_norm``, ``train/grad_clipped``) are logged
only on the steps the Trainer writes, and the epoch metrics are handed to Lightning once per epoch. The
tests hold each written value against the ground truth a probe records on every step, and the steps
they are written at against Lightning's own schedule.
"""

from collections import Counter
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torchmetrics.functional.classification import multiclass_accuracy, multiclass_f1_score
from typing_extensions import override

from src.callbacks import Dashboard, ProgressBar
from src.data import TabularDataModule
from src.loggers import TensorBoardLogger
from src.models import BaseTask, Classifier, ManualClassifier, base

BATCHES, EPOCHS, EVERY, CLIP = 7, 2, 3, 0.5


class Probe(Callback):
    """Every batch: its loss, logits and targets; every optimizer step: the gradient norm before clipping."""

    def __init__(self) -> None:
        self.logits: dict[int, list[torch.Tensor]] = {}
        self.targets: dict[int, list[torch.Tensor]] = {}
        self.norms: list[float] = []

    def losses(self) -> list[tuple[int, float, int]]:
        """``(epoch, loss, rows)`` per training batch, from the logits and targets the probe kept."""
        return [
            (epoch, F.cross_entropy(logits, target).item(), len(target))
            for epoch in sorted(self.logits)
            for logits, target in zip(self.logits[epoch], self.targets[epoch], strict=True)
        ]

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        assert isinstance(pl_module, BaseTask)

        def keep(module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> None:
            if module.training:
                self.logits.setdefault(trainer.current_epoch, []).append(output.detach().clone())

        pl_module.net.register_forward_hook(keep)

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int
    ) -> None:
        self.targets.setdefault(trainer.current_epoch, []).append(batch[1].clone())

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        self.norms.append(torch.nn.utils.get_total_norm(grads).item())


def fit(
    tmp_path: Path, model: BaseTask, clip: float | None = CLIP, **trainer: Any
) -> tuple[Probe, EventAccumulator]:
    data = TabularDataModule(source="spiral", num_samples=600, batch_size=50)
    probe = Probe()
    logger = TensorBoardLogger(tmp_path, name="steps", default_hp_metric=False)
    L.Trainer(
        max_epochs=EPOCHS,
        limit_train_batches=BATCHES,
        limit_val_batches=2,
        log_every_n_steps=EVERY,
        gradient_clip_val=clip,
        logger=logger,
        callbacks=[probe],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **trainer,
    ).fit(model, datamodule=data)
    events = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0}).Reload()
    return probe, events


def scalars(events: EventAccumulator, tag: str) -> dict[int, float]:
    return {point.step: point.value for point in events.Scalars(tag)}


def model(cls: type[BaseTask] = Classifier, **hparams: Any) -> BaseTask:
    return cls(in_features=2, out_features=3, hidden_sizes=[16], **hparams)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_step_values_are_written_on_lightnings_logging_steps(tmp_path: Path, accumulate: int) -> None:
    probe, events = fit(
        tmp_path,
        model(optimizer=lambda params: torch.optim.SGD(params, lr=0.05)),
        accumulate_grad_batches=accumulate,
    )
    # optimizer steps per epoch: groups of `accumulate` batches, the last one shorter
    steps_per_epoch = -(-BATCHES // accumulate)
    steps = EPOCHS * steps_per_epoch
    assert len(probe.norms) == steps
    # Lightning writes step values every EVERY optimizer steps
    logged = [s for s in range(steps) if (s + 1) % EVERY == 0]
    # a step's loss is its last micro-batch's (the one that ends the group)
    last_batch_of_step = [
        epoch * BATCHES + min((k + 1) * accumulate, BATCHES) - 1
        for epoch in range(EPOCHS)
        for k in range(steps_per_epoch)
    ]
    loss_step = scalars(events, "train/loss_step")
    assert sorted(loss_step) == logged
    for step in logged:
        assert loss_step[step] == pytest.approx(probe.losses()[last_batch_of_step[step]][1], rel=1e-6)
    norms, clipped = scalars(events, "train/grad_norm"), scalars(events, "train/grad_clipped")
    assert sorted(norms) == sorted(clipped) == logged
    for step in logged:
        assert norms[step] == pytest.approx(probe.norms[step], rel=1e-5)
        assert clipped[step] == float(probe.norms[step] > CLIP)
    assert scalars(events, "train/lr") == {step: pytest.approx(0.05) for step in logged}
    # once per optimizer step, not once per micro-batch, and with its epoch, as Lightning writes its own
    for tag in ("train/loss_step", "train/lr", "train/grad_norm", "train/grad_clipped"):
        assert [point.step for point in events.Scalars(tag)] == logged, tag
    epochs = Counter((point.step, point.value) for point in events.Scalars("epoch"))
    assert {step: epochs[(step, step // steps_per_epoch)] for step in logged} == dict.fromkeys(logged, 1)


@pytest.mark.parametrize("metric_batches", [None, 3])
def test_epoch_metrics_hold_every_step_of_the_epoch(
    tmp_path: Path, metric_batches: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if metric_batches is not None:  # the train metrics updated every 3 batches, the last group shorter
        monkeypatch.setattr(base, "METRIC_BATCHES", metric_batches)
    probe, events = fit(tmp_path, model())
    loss, acc, f1 = (scalars(events, f"train/{name}") for name in ("loss", "acc", "f1"))
    assert len(loss) == len(acc) == len(f1) == EPOCHS
    for epoch, step in enumerate(sorted(loss)):
        rows = [(value, n) for e, value, n in probe.losses() if e == epoch]
        mean = sum(value * n for value, n in rows) / sum(n for _, n in rows)  # weighted by rows
        assert loss[step] == pytest.approx(mean, rel=1e-6)
        logits, target = torch.cat(probe.logits[epoch]), torch.cat(probe.targets[epoch])
        assert len(target) == BATCHES * 50
        assert acc[step] == pytest.approx(multiclass_accuracy(logits, target, 3, average="micro").item())
        assert f1[step] == pytest.approx(multiclass_f1_score(logits, target, 3, average="macro").item())


def test_manual_optimization_logs_on_its_batches(tmp_path: Path) -> None:
    # under manual optimization Lightning's logging schedule counts batches; with groups of 2 micro-batches
    # the optimizer steps on every second batch and at the epoch's end
    task = model(ManualClassifier, accumulate_grad_batches=2, gradient_clip_val=CLIP)
    probe, events = fit(tmp_path, task, clip=None)  # the task clips itself
    batches = EPOCHS * BATCHES
    logged = [b for b in range(batches) if (b + 1) % EVERY == 0]
    loss_step = scalars(events, "train/loss_step")
    assert sorted(loss_step) == logged
    for batch in logged:
        assert loss_step[batch] == pytest.approx(probe.losses()[batch][1], rel=1e-6)
    # on each logged batch, the gradient norm of the latest optimizer step (steps end each group of 2)
    stepping = [
        e * BATCHES + b for e in range(EPOCHS) for b in range(BATCHES) if (b + 1) % 2 == 0 or b == BATCHES - 1
    ]
    norms = scalars(events, "train/grad_norm")
    assert sorted(norms) == logged
    for batch in logged:
        latest = max(i for i, stepped in enumerate(stepping) if stepped <= batch)
        assert norms[batch] == pytest.approx(probe.norms[latest], rel=1e-5)


class CountingBar(ProgressBar):
    """Counts the training refreshes, each of which reads the metrics back, and keeps what each showed."""

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


@pytest.mark.parametrize(("refresh_rate", "refreshes"), [(None, 4), (1, BATCHES + 1)])
def test_the_progress_bar_refreshes_on_logging_steps(refresh_rate: int | None, refreshes: int) -> None:
    data = TabularDataModule(source="spiral", num_samples=600, batch_size=50)
    bar = CountingBar(refresh_rate=refresh_rate, min_interval_s=0)
    trainer = L.Trainer(
        max_epochs=1,
        limit_train_batches=BATCHES,
        limit_val_batches=0,
        log_every_n_steps=EVERY,
        logger=False,
        callbacks=[bar],
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    probe = Probe()
    trainer.callbacks.append(probe)  # type: ignore[attr-defined]
    trainer.fit(model(), datamodule=data)
    # following the logging steps: batches 3 and 6 of 7 (every EVERY), the last one and the epoch's end;
    # at refresh_rate 1 every batch and the epoch's end
    assert bar.refreshes == refreshes
    # the loss is not a prog_bar value, which Lightning would read back after every step; the bar reads
    # it when it refreshes: the loss of the latest logging step
    assert "train/loss_step" not in trainer.progress_bar_metrics
    true_losses = [loss for _, loss, _ in probe.losses()]
    for steps, shown in bar.shown:
        latest = steps - steps % EVERY  # steps taken up to the latest logging step
        if latest:
            assert shown["train/loss_step"] == pytest.approx(true_losses[latest - 1], rel=1e-6)
        else:
            assert "train/loss_step" not in shown


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
    events = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0}).Reload()
    assert scalars(events, "train/loss") == {0: 1.0, 1: 0.5}  # nothing logged is lost


def test_a_run_that_max_steps_ends_mid_epoch_counts_each_of_its_batches(tmp_path: Path) -> None:
    probe, events = fit(tmp_path, model(), max_steps=5)  # 5 of the epoch's 7 batches
    [acc] = scalars(events, "train/acc").values()
    logits, target = torch.cat(probe.logits[0]), torch.cat(probe.targets[0])
    assert len(target) == 5 * 50
    assert acc == pytest.approx(multiclass_accuracy(logits, target, 3, average="micro").item())


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
    data = TabularDataModule(source="spiral", num_samples=600, batch_size=50)
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
        crashing.fit(task, datamodule=data)
    probe, events = fit(tmp_path, task)
    for epoch, step in enumerate(sorted(scalars(events, "train/acc"))):
        logits, target = torch.cat(probe.logits[epoch]), torch.cat(probe.targets[epoch])
        expected = multiclass_accuracy(logits, target, 3, average="micro").item()
        assert scalars(events, "train/acc")[step] == pytest.approx(expected)
    assert len(scalars(events, "val/loss")) == EPOCHS  # handed to self.log again in the second fit


def test_the_progress_bar_leaves_out_refreshes_within_its_interval_but_never_the_last_batchs() -> None:
    data = TabularDataModule(source="spiral", num_samples=600, batch_size=50)
    bar = CountingBar(refresh_rate=1, min_interval_s=3600)
    trainer = L.Trainer(
        max_epochs=2,
        limit_train_batches=BATCHES,
        limit_val_batches=0,
        logger=False,
        callbacks=[bar],
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(model(), datamodule=data)
    # per epoch: the first batch (nothing refreshed yet this epoch), the last batch, the epoch's end
    assert [steps for steps, _ in bar.shown] == [1, BATCHES, BATCHES, BATCHES + 1, 2 * BATCHES, 2 * BATCHES]


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
    logger = TensorBoardLogger(tmp_path, name="stop", default_hp_metric=False)
    probe = Probe()
    L.Trainer(
        max_epochs=3,
        limit_train_batches=BATCHES,
        limit_val_batches=2,
        logger=logger,
        callbacks=[Dashboard(), StopMidEpoch(), probe],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    ).fit(model(), datamodule=TabularDataModule(source="spiral", num_samples=600, batch_size=50))
    events = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0}).Reload()
    train, val, gap = (scalars(events, tag) for tag in ("train/loss", "val/loss", "val/generalization_gap"))
    assert len(train) == len(val) == len(gap) == 2  # the second epoch, stopped after 5 batches, too
    for epoch, step in enumerate(sorted(train)):
        rows = [(value, n) for e, value, n in probe.losses() if e == epoch]
        assert len(rows) == (BATCHES if epoch == 0 else 5)
        assert train[step] == pytest.approx(sum(v * n for v, n in rows) / sum(n for _, n in rows), rel=1e-6)
        # the dashboard read the train loss before the task's own epoch-end hook, which Lightning calls later
        assert gap[step] == pytest.approx(val[step] - train[step], rel=1e-5, abs=1e-6)


def test_refresh_rate_0_turns_the_bar_off_as_in_lightning() -> None:
    assert not ProgressBar(refresh_rate=0).is_enabled
    assert ProgressBar().is_enabled


def test_the_train_loss_of_a_group_of_batches_leaves_out_a_nan_batch_and_weighs_by_rows() -> None:
    task = model()
    generator = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(rows, 2, generator=generator), torch.randint(0, 3, (rows,))) for rows in (50, 20, 30)
    ]
    batches[1][0][0, 0] = float("nan")  # one row makes the whole batch's loss NaN
    with torch.no_grad(), pytest.warns(UserWarning, match="self.trainer"):  # a step by hand: no Trainer
        losses = [task._shared_step(batch, "train", last=False)["loss"] for batch in batches]
    assert losses[1].isnan()
    assert task.epoch_loss("train").update_count == 0  # gathered, not yet taken in
    task.update_train_metrics()
    expected = (50 * losses[0] + 30 * losses[2]) / 80
    torch.testing.assert_close(task.epoch_loss("train").compute(), expected)


class OwnClipping(Classifier):
    """A user's task that clips in its own configure_gradient_clipping, without calling the task's."""

    @override
    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: Any = None,
        gradient_clip_algorithm: Any = None,
    ) -> None:
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)


def test_a_task_with_its_own_clipping_still_writes_its_step_loss_at_its_step(tmp_path: Path) -> None:
    probe, events = fit(tmp_path, model(OwnClipping))
    steps = EPOCHS * BATCHES
    logged = [s for s in range(steps) if (s + 1) % EVERY == 0]
    loss_step = scalars(events, "train/loss_step")
    assert [point.step for point in events.Scalars("train/loss_step")] == logged
    for step in logged:
        assert loss_step[step] == pytest.approx(probe.losses()[step][1], rel=1e-6)
    assert "train/grad_norm" not in events.Tags()["scalars"]  # the task's own clipping logs no norm


def test_a_step_value_is_one_number() -> None:
    with pytest.raises(ValueError, match="step value 'train/odd' has 2 elements"):
        model().write_step_values({"train/odd": torch.ones(2)})
