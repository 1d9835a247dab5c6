"""The loop doctor against bugs planted in user-style code: one module, dataset or config per check.

The planted bugs live here, not in ``src/``: each test writes the kind of code a person who cloned the
template would write (their own net, loss, optimizer, scheduler, validation, data), runs the doctor on it
and expects the check's id. ``test_a_healthy_model_on_clean_data_has_no_findings`` runs the same doctor on
the unmodified code, so a check that fired on everything would fail there; the shipped configs must come
out clean too.
"""

import importlib.util
import logging
import math
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LinearLR, OneCycleLR, StepLR
from torch.utils.data import DataLoader, TensorDataset

from src.apps.doctor import Doctor, Finding, examine
from src.apps.doctor import callback as doctor_callback
from src.apps.doctor.__main__ import main as doctor_main
from src.apps.doctor.model import layers_in_python_lists
from src.apps.doctor.probe import OVERFIT_STEPS, input_free_loss, overfit_one_batch
from src.cli import main
from src.data.loading import Stage, TensorBatches
from src.extras.tables import TabularDataModule
from src.models import BaseTask, Classifier, Regressor
from src.nets import MLP
from tests.conftest import CONFIGS, QUIET
from tests.helpers import ManyTargets, MultiLabelTask, MultiOutputTask

ADAM = partial(torch.optim.Adam, lr=0.01)
EXPERIMENTS = sorted(p for p in CONFIGS.glob("*.yaml") if p.name != "defaults.yaml")


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)


def spiral(**settings: Any) -> TabularDataModule:
    return TabularDataModule(
        source="spiral", num_samples=300, batch_size=32, min_batches_per_epoch=None, **settings
    )


def mlp(**settings: Any) -> partial[MLP]:
    """The shipped net as a task's net factory: ``mlp()(in_features, out_features)``."""
    return partial(MLP, hidden_sizes=[64, 64], **settings)


def classifier(cls: type[Classifier] = Classifier, **settings: Any) -> Classifier:
    settings = {"net": mlp(), "optimizer": ADAM, **settings}
    return cls(in_features=2, out_features=3, **settings)


def doctor(model: L.LightningModule, data: L.LightningDataModule, **trainer: Any) -> dict[str, Finding]:
    """The doctor's findings by id, for ``model`` on ``data`` under a Trainer with ``trainer``'s settings."""
    settings = {"max_epochs": 3, "accelerator": "cpu", "logger": False, "enable_checkpointing": False}
    found = examine(model, data, L.Trainer(**{**settings, **trainer}), steps=8, overfit_steps=30)
    assert len({f.id for f in found}) == len(found)  # each problem once
    return {f.id: f for f in found}


def test_a_healthy_model_on_clean_data_has_no_findings() -> None:
    assert doctor(classifier(), spiral()) == {}


def test_a_finding_is_one_line_with_what_was_seen_why_and_the_fix() -> None:
    line = Finding("some-check", "saw 3", "it matters", "change it").line()
    assert line == "[some-check] saw: saw 3 | why: it matters | fix: change it"


# -- the model ------------------------------------------------------------------------------------------


def loud_head(in_features: int, out_features: int) -> nn.Module:
    """A last layer initialized 30x too large: overconfident from the first step."""
    net = mlp()(in_features, out_features)
    with torch.no_grad():
        net.head.weight.mul_(30.0)
    return net


def test_initial_loss_far_above_ln_c() -> None:
    finding = doctor(classifier(net=loud_head), spiral())["initial-loss"]
    assert f"scores {math.log(3):.4g}" in finding.saw  # ln(3): uniform over the 3 classes


def softmax_net(in_features: int, out_features: int) -> nn.Module:
    """Probabilities out of the net, into the classifier's cross_entropy, which expects logits."""
    return nn.Sequential(mlp()(in_features, out_features), nn.Softmax(dim=-1))


def sigmoid_net(in_features: int, out_features: int) -> nn.Module:
    """One probability out, whatever ``out_features`` says (:class:`SigmoidBinary` takes one)."""
    return nn.Sequential(nn.Linear(in_features, 16), nn.ReLU(), nn.Linear(16, 1), nn.Sigmoid())


class SigmoidBinary(Classifier):
    """One sigmoid output into binary_cross_entropy_with_logits, which applies the sigmoid itself."""

    def check_shapes(self) -> None:
        pass

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(output.squeeze(-1), (target > 0).float())

    def metric_inputs(self, output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cat([1 - output, output, torch.zeros_like(output)], dim=-1), (target > 0).long()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "layer"),
    [
        pytest.param(lambda: classifier(net=softmax_net), "a softmax", id="softmax"),
        pytest.param(lambda: classifier(SigmoidBinary, net=sigmoid_net), "a sigmoid", id="sigmoid"),
    ],
)
def test_probabilities_into_a_loss_that_expects_logits(model: Callable[[], Classifier], layer: str) -> None:
    finding = doctor(model(), spiral())["probabilities-into-loss"]
    assert f"the net ends with {layer}" in finding.saw


def unused_branch(in_features: int, out_features: int) -> nn.Module:
    """A layer built but never called in forward."""
    net = mlp()(in_features, out_features)
    net.add_module("aux_head", nn.Linear(64, out_features))
    return net


@pytest.mark.slow
def test_parameters_that_get_no_gradient() -> None:
    finding = doctor(classifier(net=unused_branch), spiral())["param-no-grad"]
    assert "net.aux_head.weight" in finding.saw


class BodyOnlyOptimizer(Classifier):
    """An optimizer built from the body only: the head trains never."""

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.net.body.parameters(), lr=0.01)


@pytest.mark.slow
def test_parameters_missing_from_the_optimizer() -> None:
    finding = doctor(classifier(BodyOnlyOptimizer), spiral())["param-not-in-optimizer"]
    assert "net.head.weight" in finding.saw


class ListedLayers(nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.blocks = [nn.Linear(in_features, 16), nn.Tanh()]  # BUG: a plain list, not nn.ModuleList
        self.head = nn.Linear(16, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_layers_kept_in_a_plain_python_list() -> None:
    finding = doctor(classifier(net=ListedLayers), spiral())["layers-in-python-list"]
    assert "net.blocks (2 layers)" in finding.saw
    # a plain list of layers that are registered as well is only an ordering: not reported
    net = nn.Module()
    net.first, net.second = nn.Linear(2, 4), nn.Linear(4, 3)
    net.order = [net.first, net.second]
    assert layers_in_python_lists(net) is None


class BroadcastingLoss(Regressor):
    """Its own MSE: output (B, 1) against target (B,) broadcasts to (B, B) and learns only the mean."""

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        scaled = (target - self.target_mean) / self.target_std
        return ((output - scaled) ** 2).mean()  # BUG: output is (B, 1)


def test_a_model_that_cannot_overfit_one_batch() -> None:
    data = TabularDataModule(source="friedman", num_samples=300, batch_size=32, min_batches_per_epoch=None)
    settings = {
        "in_features": 10,
        "out_features": 1,
        "net": partial(MLP, hidden_sizes=[32]),
        "optimizer": ADAM,
    }
    found = doctor(BroadcastingLoss(**settings), data)
    assert "one fixed batch of 32 rows" in found["overfit-one-batch"].saw
    assert "initial-loss" not in found  # the broadcast also makes the loss of a zero output: no alarm there
    assert doctor(Regressor(**settings), data) == {}  # the same, fixed


def test_the_bar_is_the_loss_of_the_best_prediction_that_ignores_the_input() -> None:
    """Fitted with the task's own loss, it is the closed form: the entropy of the batch's class (or
    character) frequencies for cross-entropy, the variance of its standardized targets for squared error."""
    labels = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 2])
    frequencies = torch.bincount(labels).double() / len(labels)
    entropy = float(-(frequencies * frequencies.log()).sum())
    task = classifier()
    assert input_free_loss(task.loss, torch.zeros(10, 3), labels) == pytest.approx(entropy, rel=1e-5)
    # a language model's characters, where the text extra is part of the project
    if importlib.util.find_spec("src.extras.text") is not None:
        from src.extras.text.model import LanguageModel
        from src.extras.text.nets import CharTransformer

        characters = labels.reshape(2, 5)  # (B, T): every position of every window is one target
        language = LanguageModel(in_features=3, out_features=3, net=partial(CharTransformer, block_size=5))
        assert input_free_loss(language.loss, torch.zeros(2, 5, 3), characters) == pytest.approx(
            entropy, rel=1e-5
        )
    regressor = Regressor(in_features=2, out_features=1, net=mlp(), optimizer=ADAM)
    regressor.target_mean.fill_(3.0)  # as setup() fits them on a training split
    regressor.target_std.fill_(2.0)
    values = torch.tensor([1.0, 2.0, 4.0, 8.0, 9.0])
    variance = float(((values - 3.0) / 2.0).var(unbiased=False))
    assert input_free_loss(regressor.loss, torch.zeros(5, 1), values) == pytest.approx(variance, rel=1e-5)
    # label smoothing moves the best constant away from the frequencies: fitted, not assumed
    smoothed = classifier(label_smoothing=0.3)
    fitted = input_free_loss(smoothed.loss, torch.zeros(10, 3), labels)
    assert fitted < float(smoothed.loss(frequencies.log().float().expand(10, 3), labels)) - 1e-4


class Unigram(nn.Module):
    """BUG: the same next-character logits at every position, whatever the characters before it."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.zeros(out_features))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(*ids.shape, -1)


def test_a_language_model_learns_one_batch_by_heart_and_one_cut_off_from_its_input_cannot(
    tmp_path: Path,
) -> None:
    """A batch of 8 windows of 64 characters is cut to its first 2 (128 targets): a working transformer
    goes well below the characters' frequencies in 40 steps; a net that ignores its input stays on them."""
    text_extra = pytest.importorskip("src.extras.text")
    LanguageModel = pytest.importorskip("src.extras.text.model").LanguageModel
    CharTransformer = pytest.importorskip("src.extras.text.nets").CharTransformer
    bundled_text, TextDataModule = text_extra.bundled_text, text_extra.TextDataModule
    text = tmp_path / "text.txt"
    text.write_text(bundled_text()[:20_000], encoding="utf-8")
    data = TextDataModule(path=str(text), block_size=64, batch_size=8)
    vocabulary = data.in_features

    def language(net: Callable[[int, int], nn.Module]) -> Any:
        return LanguageModel(in_features=vocabulary, out_features=vocabulary, net=net, optimizer=ADAM)

    transformer = partial(CharTransformer, block_size=64, d_model=64, n_heads=4, n_layers=2, dropout=0.0)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False)
    assert overfit_one_batch(language(transformer), data, trainer, OVERFIT_STEPS) is None
    found = overfit_one_batch(language(Unigram), data, trainer, OVERFIT_STEPS)
    assert found is not None
    assert "on one fixed batch of 2 rows (128 targets)" in found.saw
    assert "where the best prediction that ignores the input scores" in found.saw


class ZeroGradBeforeStep(Classifier):
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.zero_grad()  # BUG: wipes the gradients backward just computed


@pytest.mark.parametrize(
    "model",
    [
        pytest.param(
            lambda: classifier(ZeroGradBeforeStep, optimizer=torch.optim.AdamW), id="zero_grad-before-step"
        ),
        pytest.param(lambda: classifier(optimizer=partial(torch.optim.AdamW, lr=0.0)), id="lr-0"),
    ],
)
def test_a_loss_that_does_not_move(model: Callable[[], Classifier]) -> None:
    # AdamW's default weight decay still shrinks every weight a little: that is not training
    finding = doctor(model(), spiral())["loss-not-moving"]
    assert "none of the 6 trainable parameter tensors moved in 8 optimizer steps" in finding.saw


def test_frozen_weights() -> None:
    model = classifier()
    model.requires_grad_(False)
    found = doctor(model, spiral())
    assert "requires a gradient" in found["loss-not-moving"].saw
    assert "probe-failed" in found  # backward has nothing to differentiate: the run itself fails


def test_clipping_on_every_step() -> None:
    finding = doctor(classifier(), spiral(), gradient_clip_val=1e-3)["clipping-every-step"]
    assert "fired on 8 of 8 optimizer steps (threshold 0.001" in finding.saw


# the NaN loss that follows reaches the task's metrics, and torchmetrics says so
@pytest.mark.filterwarnings("ignore:Encountered `nan` values:UserWarning")
def test_a_gradient_norm_that_explodes() -> None:
    data = TabularDataModule(source="friedman", num_samples=300, batch_size=32, min_batches_per_epoch=None)
    model = Regressor(
        in_features=10,
        out_features=1,
        net=partial(MLP, hidden_sizes=[32]),
        optimizer=partial(torch.optim.SGD, lr=3.0),
    )
    assert "grad-norm-exploding" in doctor(model, data, gradient_clip_val=None)


# -- the schedule ---------------------------------------------------------------------------------------


def scheduled(make: Callable[[torch.optim.Optimizer], Any], interval: str = "epoch") -> Classifier:
    class Scheduled(Classifier):
        """configure_optimizers written by hand, as the Lightning docs show it."""

        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.Adam(self.parameters(), lr=0.01)
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": make(optimizer), "interval": interval},
            }

    return classifier(Scheduled)


@pytest.mark.slow
def test_a_schedule_sized_by_hand_to_another_length_than_the_run() -> None:
    # T_max typed as 60 beside max_epochs, then the run made longer
    model = scheduled(lambda o: CosineAnnealingLR(o, T_max=60))
    finding = doctor(model, spiral(), max_epochs=120)["schedule-length"]
    assert "CosineAnnealingLR has T_max=60, but the run steps it 120 times (epochs)" in finding.saw
    # total_steps typed for 2 epochs of 7 batches, in a run of 3: OneCycleLR would stop the run at step 15
    model = scheduled(lambda o: OneCycleLR(o, max_lr=0.01, total_steps=14), interval="step")
    finding = doctor(model, spiral(), max_epochs=3)["schedule-length"]
    assert (
        "OneCycleLR refuses to be stepped as often as the run steps it (Tried to step 15 times" in finding.saw
    )
    assert "schedule-length" not in doctor(
        scheduled(lambda o: CosineAnnealingLR(o, T_max=120)), spiral(), max_epochs=120
    )


def test_a_schedule_that_climbs_back_up_before_the_run_ends() -> None:
    # a period of 10 epochs in a run of 40: nothing to compare a T_max with, the LR curve shows it
    model = scheduled(lambda o: LambdaLR(o, lambda epoch: 0.5 * (1 + math.cos(math.pi * epoch / 10))))
    assert "schedule-restarts" in doctor(model, spiral(), max_epochs=40)


@pytest.mark.slow
def test_an_epoch_schedule_stepped_per_step_collapses() -> None:
    model = scheduled(lambda o: StepLR(o, step_size=1, gamma=0.5), interval="step")
    finding = doctor(model, spiral(), max_epochs=10)["schedule-collapses"]
    assert "after 10 of 70 optimizer steps" in finding.saw  # 0.5**10 < 1/1000; 7 batches x 10 epochs


@pytest.mark.slow
def test_a_warmup_longer_than_the_run() -> None:
    model = scheduled(lambda o: LinearLR(o, start_factor=0.01, total_iters=1000), interval="step")
    assert "schedule-warmup-longer-than-run" in doctor(model, spiral())


# -- validation -----------------------------------------------------------------------------------------


class TrainModeValidation(Classifier):
    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> Any:
        self.train()  # BUG: dropout and BatchNorm back in training mode
        return super().validation_step(batch, batch_idx)


class FunctionalDropout(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.dropout(self.body(x), 0.5))  # BUG: F.dropout drops even in eval mode


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "saw"),
    [
        pytest.param(
            lambda: classifier(TrainModeValidation, net=mlp(dropout=0.2)),
            "net.body.2, net.body.5 still in training mode",
            id="train-in-validation_step",
        ),
        pytest.param(
            lambda: classifier(net=partial(FunctionalDropout, hidden_sizes=[64, 64], dropout=0.2)),
            "gave different outputs",
            id="functional-dropout",
        ),
    ],
)
def test_dropout_still_active_in_validation(model: Callable[[], Classifier], saw: str) -> None:
    finding = doctor(model(), spiral())["val-train-mode"]
    assert saw in finding.saw


class GradInValidation(Classifier):
    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> Any:
        with torch.enable_grad():  # BUG: builds and keeps a graph for every validation batch
            return super().validation_step(batch, batch_idx)


def test_validation_outputs_that_carry_a_graph() -> None:
    assert "val-output-graph" in doctor(classifier(GradInValidation), spiral())


# -- data -----------------------------------------------------------------------------------------------


class Machine:
    """A controlled clock for the doctor's timing: time passes only where a test spends it (a loader
    building a batch, a net computing) and, on a busy machine, where another process takes the CPU before
    the loop's next step starts, which the kernel reports as time this thread waited for a CPU."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waited = 0.0
        #: seconds another process holds the CPU just before each step starts (a busy machine)
        self.preempted = 0.0
        self._readings = 0

    def spend(self, seconds: float) -> None:
        self.now += seconds

    def perf_counter(self) -> float:
        # the doctor reads the clock as a step starts, then as it ends: every other reading starts a step
        if self._readings % 2 == 0:
            self.now += self.preempted
            self.waited += self.preempted
        self._readings += 1
        return self.now

    def waited_for_cpu(self) -> float:
        return self.waited


#: the machine of the running test: a module global, so that the probes' deep copies of a model share it
MACHINE = Machine()


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> Machine:
    fresh = Machine()
    monkeypatch.setattr(sys.modules[__name__], "MACHINE", fresh)
    monkeypatch.setattr(doctor_callback, "perf_counter", fresh.perf_counter)
    monkeypatch.setattr(doctor_callback, "waited_for_cpu", fresh.waited_for_cpu)
    return fresh


class Computing(nn.Module):
    """The shipped MLP, whose forward pass takes 5 ms of the controlled clock."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.net = mlp()(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        MACHINE.spend(0.005)
        return self.net(x)


class TimedLoaders(TabularDataModule):
    """Training batches that take ``train_seconds`` each to build, validation batches ``val_seconds``."""

    def __init__(self, train_seconds: float, val_seconds: float = 0.0) -> None:
        super().__init__(source="spiral", num_samples=300, batch_size=32, min_batches_per_epoch=None)
        self.seconds = {"train": train_seconds, "val": val_seconds}

    def _timed(self, stage: Stage) -> DataLoader:
        def build(batch: Any) -> Any:
            MACHINE.spend(self.seconds[stage])
            return batch

        return DataLoader(self.dataset(stage), batch_size=32, collate_fn=build)

    def train_dataloader(self) -> DataLoader:
        return self._timed("train")

    def val_dataloader(self) -> DataLoader:
        return self._timed("val")


def test_the_loader_takes_most_of_the_step_time(machine: Machine) -> None:
    """BUG planted: each batch takes 100 ms to build (per-row work in the loader) for a 5 ms step."""
    found = doctor(classifier(net=Computing), TimedLoaders(train_seconds=0.1))["loader-share"]
    assert "waited for the next batch 95% of the time over 6 steps (100 ms of 105 ms per step)" in found.saw


@pytest.mark.slow
def test_a_fast_loader_on_a_busy_machine_is_not_reported(
    machine: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process takes the CPU for 50 ms before every step: the loop is not waiting for data then,
    and the kernel says so; the wall clock alone would have reported the loader."""
    machine.preempted = 0.05
    assert "loader-share" not in doctor(classifier(net=Computing), TimedLoaders(train_seconds=0.0005))
    monkeypatch.setattr(doctor_callback, "waited_for_cpu", lambda: 0.0)  # a kernel that does not say
    assert "loader-share" in doctor(classifier(net=Computing), TimedLoaders(train_seconds=0.0005))


def test_a_validation_inside_the_epoch_is_no_wait_for_data(machine: Machine) -> None:
    """val_check_interval runs a validation between two steps; its slow batches are not the loader's."""
    watcher = Doctor(steps=6, report=False)
    trainer = L.Trainer(
        max_epochs=1, val_check_interval=3, limit_val_batches=1, num_sanity_val_steps=0, accelerator="cpu",
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[watcher],
    )  # fmt: skip
    trainer.fit(classifier(net=Computing), TimedLoaders(train_seconds=0.0005, val_seconds=1.0))
    assert trainer.global_step == 7  # the watch ended with the run, two validations inside it
    assert [f.id for f in watcher.findings if f.id == "loader-share"] == []


def test_the_clock_leaves_out_the_time_the_kernel_says_the_thread_waited_for_a_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedstat = tmp_path / "schedstat"
    schedstat.write_text("81200000 2500000000 731\n")  # ns on a CPU, ns waiting for one, time slices
    monkeypatch.setattr(doctor_callback, "SCHEDSTAT", schedstat)
    assert doctor_callback.waited_for_cpu() == pytest.approx(2.5)
    monkeypatch.setattr(doctor_callback, "perf_counter", lambda: 10.0)
    assert doctor_callback.clock() == pytest.approx(7.5)
    monkeypatch.setattr(doctor_callback, "SCHEDSTAT", tmp_path / "absent")  # not Linux: the wall clock
    assert doctor_callback.clock() == 10.0


class LogFeature(TabularDataModule):
    """Its own feature transform after scaling: the log of a standardized column is NaN below the mean."""

    def dataset(self, stage: Stage) -> TensorBatches:
        x, y = super().dataset(stage).tensors
        return TensorBatches(torch.cat([x[:, :1].log(), x[:, 1:]], dim=1), y)


@pytest.mark.filterwarnings("ignore:Encountered `nan` values:UserWarning")  # the NaN reaches the metrics
def test_non_finite_values_in_the_data() -> None:
    found = doctor(classifier(), LogFeature(source="spiral", num_samples=300, batch_size=32))
    assert "106 in the train features ('x')" in found["data-non-finite"].saw
    # and what it does: NaN before the first step, not an explosion
    assert "the loss of the very first batch is nan" in found["loss-non-finite"].saw
    assert "grad-norm-exploding" not in found


class ShiftedLabels(TabularDataModule):
    """Labels 1..C, as a file may number its classes, with C outputs."""

    def dataset(self, stage: Stage) -> TensorBatches:
        x, y = super().dataset(stage).tensors
        return TensorBatches(x, y + 1)


def test_labels_out_of_range() -> None:
    found = doctor(classifier(), ShiftedLabels(source="spiral", num_samples=300, batch_size=32))
    assert (
        "the training labels run from 1 to 3, but the net has 3 outputs"
        in found["data-label-out-of-range"].saw
    )


def table(path: Path, rows: int = 300, **columns: Callable[[pd.DataFrame], Any]) -> Path:
    """A two-feature, three-class CSV file, with extra columns computed from it."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"a": rng.normal(size=rows), "b": rng.normal(size=rows)})
    frame["label"] = np.digitize(frame["a"] + 0.5 * frame["b"], [-0.5, 0.5])
    for name, make in columns.items():
        frame[name] = make(frame)
    frame.to_csv(path, index=False)
    return path


def on_file(path: Path, **settings: Any) -> dict[str, Finding]:
    data = TabularDataModule(path=str(path), target_column="label", task="classification", batch_size=32)
    model = Classifier(
        in_features=data.in_features,
        out_features=data.out_features,
        net=partial(MLP, hidden_sizes=[32]),
        optimizer=ADAM,
        **settings,
    )
    return doctor(model, data)


def test_clean_file_has_no_findings(tmp_path: Path) -> None:
    assert on_file(table(tmp_path / "clean.csv")) == {}


def test_a_feature_constant_in_training_that_varies_later(tmp_path: Path) -> None:
    # a sensor that reads 0 in every training row and something else in validation and test
    path = table(tmp_path / "data.csv")
    split = TabularDataModule(path=str(path), target_column="label", task="classification").split_rows
    held_out = np.zeros(300, dtype=bool)
    held_out[np.concatenate([split["val"], split["test"]])] = True
    table(path, sensor=lambda f: np.where(held_out, np.random.default_rng(1).normal(size=len(f)), 0.0))
    finding = on_file(path)["data-constant-feature"]
    assert "'sensor' constant over all 210 training rows but not over 90 validation/test rows" in finding.saw


def test_rows_shared_between_training_and_validation(tmp_path: Path) -> None:
    path = table(tmp_path / "data.csv", rows=150)
    pd.concat([pd.read_csv(path)] * 2).to_csv(path, index=False)  # every row twice, then a random split
    finding = on_file(path)["data-duplicates-across-splits"]
    assert "val rows" in finding.saw


def test_a_feature_that_nearly_determines_the_target(tmp_path: Path) -> None:
    # not a copy (the DataModule refuses copies): the label, scaled and blurred
    path = table(
        tmp_path / "data.csv", code=lambda f: 10 * f["label"] + np.random.default_rng(2).normal(size=len(f))
    )
    finding = on_file(path)["data-feature-determines-target"]
    assert "'code' alone predicts the validation targets with balanced accuracy 1.000" in finding.saw


def test_heavy_class_imbalance_without_weights(tmp_path: Path) -> None:
    path = tmp_path / "rare.csv"
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"a": rng.normal(size=400), "b": rng.normal(size=400)})
    frame["label"] = (frame["a"] + rng.normal(scale=0.5, size=400) > 1.9).astype(int)  # about 1 row in 20
    frame.to_csv(path, index=False)
    assert "the largest class has" in on_file(path)["data-class-imbalance"].saw
    assert "data-class-imbalance" not in on_file(path, class_weights=True)


# -- any LightningModule --------------------------------------------------------------------------------


class OwnModule(L.LightningModule):
    """A LightningModule written from Lightning's docs, no BaseTask: the doctor sees only public state."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.01)


@pytest.mark.slow
def test_a_module_of_its_own_is_examined_too() -> None:
    assert doctor(OwnModule(mlp()(2, 3)), spiral()) == {}
    assert (
        "the net ends with a softmax"
        in doctor(OwnModule(softmax_net(2, 3)), spiral())["probabilities-into-loss"].saw
    )
    assert (
        "net.blocks (2 layers)"
        in doctor(OwnModule(ListedLayers(2, 3)), spiral())["layers-in-python-list"].saw
    )
    finding = doctor(OwnModule(mlp()(2, 3)), spiral(), gradient_clip_val=1e-3)["clipping-every-step"]
    assert "fired on 8 of 8 optimizer steps (threshold 0.001" in finding.saw


# -- the front doors: make doctor, and the callback in any run ----------------------------------------------


def test_a_probe_that_fails_is_reported() -> None:
    class Crashes(Classifier):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            raise RuntimeError("shapes do not match")

    finding = doctor(classifier(Crashes), spiral())["probe-failed"]
    assert "RuntimeError: shapes do not match" in finding.saw


@pytest.mark.slow
def test_make_doctor_exits_1_on_findings_and_0_when_clean(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spiral_yaml = ["fit", "--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=600"]
    assert doctor_main([*spiral_yaml, *QUIET]) == 0
    assert "doctor: no findings" in capsys.readouterr().out
    assert doctor_main([*spiral_yaml, "--trainer.gradient_clip_val=0.0001"]) == 1
    out = capsys.readouterr().out
    assert "[clipping-every-step] saw: clipping fired on 16 of 16 optimizer steps (threshold 0.0001" in out
    assert "doctor: 1 finding" in out
    assert not (workdir / "logs").exists()  # the probes write nothing


@pytest.mark.parametrize(
    "config",
    [pytest.param(c, marks=[] if c.name == "digits.yaml" else pytest.mark.slow) for c in EXPERIMENTS],
    ids=lambda p: p.name,
)
def test_the_shipped_configs_come_out_clean(
    config: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert doctor_main(["--config", str(config), *QUIET]) == 0, capsys.readouterr().out


@pytest.mark.slow
def test_the_callback_watches_a_real_run_switched_on_in_yaml(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    switch = workdir / "doctor.yaml"
    switch.write_text("trainer:\n  callbacks+:\n    - class_path: src.apps.doctor.Doctor\n")
    words = [
        "fit", "--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=1000", "--trainer.max_epochs=2",
        "--trainer.gradient_clip_val=0.0001", *QUIET,
        # extra passes could move them
        "--model.init_args.net.init_args.batch_norm=true", "--model.init_args.net.init_args.dropout=0.2",
    ]  # fmt: skip
    watched = main([*words, "--config", str(switch)])
    (doctor_callback,) = [c for c in watched.trainer.callbacks if isinstance(c, Doctor)]
    assert [f.id for f in doctor_callback.findings] == ["clipping-every-step"]
    assert "[clipping-every-step] saw:" in capsys.readouterr().out
    # it draws none of the run's random numbers and moves no BatchNorm statistics: the same as without it
    unwatched = main(words)
    torch.testing.assert_close(watched.model.state_dict(), unwatched.model.state_dict(), rtol=0, atol=0)


# -- other kinds of data: the same checks, no change to the doctor -------------------------------------


def image_classifier(tmp_path: Path, net: Callable[[int, int], nn.Module]) -> tuple[Classifier, Any]:
    ImageDataModule = pytest.importorskip("src.extras.images").ImageDataModule
    write_images = pytest.importorskip("src.extras.images.test_images").write_images
    data = ImageDataModule(folder=str(write_images(tmp_path / "images")), batch_size=16, crop_padding=0)
    model = Classifier(in_features=data.in_features, out_features=data.out_features, net=net, optimizer=ADAM)
    return model, data


def loud_cnn(in_features: int, out_features: int) -> nn.Module:
    """The shipped CNN with a last layer drawn far too large (its pooled features are small)."""
    SmallCNN = pytest.importorskip("src.extras.images.nets").SmallCNN
    net = SmallCNN(in_features, out_features, widths=[8, 16], batch_norm=False)
    nn.init.normal_(net.head.weight, std=30.0)
    return net


@pytest.mark.slow
def test_an_image_classifier_is_examined_like_a_table_classifier(tmp_path: Path) -> None:
    SmallCNN = pytest.importorskip("src.extras.images.nets").SmallCNN
    CLASSES = pytest.importorskip("src.extras.images.test_images").CLASSES
    healthy = partial(SmallCNN, widths=[8, 16], batch_norm=False)
    assert doctor(*image_classifier(tmp_path, healthy), gradient_clip_val=None) == {}
    found = doctor(*image_classifier(tmp_path, loud_cnn), gradient_clip_val=None)
    classes = len(CLASSES)
    assert f"scores {math.log(classes):.4g}" in found["initial-loss"].saw  # ln(K): uniform over K classes


# -- a task of the user's own with K targets at once ----------------------------------------------------


def many(kind: str, net: Callable[[int, int], nn.Module] | None = None) -> tuple[BaseTask, ManyTargets]:
    """tests/helpers.py's multi-label or multi-output task on its DataModule of random tensors."""
    data = ManyTargets(kind)  # type: ignore[arg-type]
    task = MultiLabelTask if kind == "labels" else MultiOutputTask
    model = task(
        in_features=data.in_features, out_features=data.out_features, net=net or mlp(), optimizer=ADAM
    )
    return model, data


@pytest.mark.parametrize("kind", ["labels", "values"])
def test_a_users_k_target_task_on_clean_data_has_no_findings(kind: str) -> None:
    assert doctor(*many(kind)) == {}


def sigmoid_labels(in_features: int, out_features: int) -> nn.Module:
    """K probabilities out of the net, into binary_cross_entropy_with_logits, which expects logits."""
    return nn.Sequential(mlp()(in_features, out_features), nn.Sigmoid())


def test_k_labels_of_a_net_that_ends_in_a_sigmoid_are_probabilities_into_the_loss() -> None:
    """(B, K) float targets of 0s and 1s beside a (B, K) output are K labels: a sigmoid before the loss is
    the classic bug there too, though no target is an integer and the task is no Classifier."""
    finding = doctor(*many("labels", sigmoid_labels))["probabilities-into-loss"]
    assert finding.saw == (
        "all 120 outputs of the first batch lie in [0, 1]: the net ends with a sigmoid, so the loss gets "
        "probabilities"
    )  # 40 rows of 3 labels; no row sums to 1: a sigmoid, not a softmax


class KTargetTable:
    """What the data checks read of a table DataModule, with (N, K) targets: its splits' tensors and the
    names of its features (a table of K target columns, as a DataModule of the user's own may offer)."""

    preprocessor = SimpleNamespace(feature_names=["a", "b"])

    def dataset(self, stage: Stage) -> TensorDataset:
        x = torch.arange(40.0).reshape(20, 2)  # every split the same rows: all of them repeated
        return TensorDataset(x, torch.randint(0, 2, (20, 3)))


def test_the_data_checks_of_one_target_per_row_say_they_do_not_apply_to_k_targets(caplog) -> None:
    from src.apps.doctor.data import check_data

    with caplog.at_level(logging.INFO):
        found = check_data(KTargetTable(), weighs_classes=False)  # type: ignore[arg-type]
    assert [f.id for f in found] == ["data-duplicates-across-splits"]  # the others ran
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("doctor:")] == [
        "doctor: the checks of one target per row (a feature that alone predicts it, class imbalance) do "
        "not apply to 3 targets per row; the other data checks ran."
    ]
