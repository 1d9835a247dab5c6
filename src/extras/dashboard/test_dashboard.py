"""The TensorBoard dashboard, read back from finished runs' event files as TensorBoard itself reads them."""

import functools
import io
import math
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
import yaml
from lightning.pytorch.loggers import TensorBoardLogger
from PIL import Image
from sklearn.metrics import confusion_matrix
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
from tensorboard.util import tensor_util

from src.cli import CLI, main
from src.errors import UserInputError
from src.extras.dashboard import HEADLINE, ROOT, Dashboard, scalars_layout
from src.extras.dashboard.logger import read_scalars
from src.extras.tables import TabularDataModule
from src.models import Classifier, Regressor
from src.nets import MLP
from tests.conftest import CONFIGS, QUIET
from tests.helpers import MANY_LABELS, MANY_VALUES

# these tests also need the extras below; without one of them they are skipped
ValidationFigures = pytest.importorskip("src.extras.figures.callback").ValidationFigures
drawing_extra = pytest.importorskip("src.extras.figures.drawing")
DPI, MIN_CELL_IN = drawing_extra.DPI, drawing_extra.MIN_CELL_IN

EPOCHS, BATCHES, BATCH_SIZE = 3, 4, 64  # digits: 4 training batches of 64 per epoch
CLIP = 0.8  # below the first steps' gradient norms, so clipping fires now and then
HISTOGRAM_EVERY = 2  # epochs 0 and 2 of 3
NET = functools.partial(MLP, hidden_sizes=[8])

# SummaryWriter.add_graph traces with torch.jit.trace, which torch 2.13 marks deprecated; the Graphs tab
# has no other way in, and the option is off by default
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.trace(_method)?` is deprecated:DeprecationWarning")


@dataclass
class Run:
    """A finished run: the CLI object and what TensorBoard reads from its folder."""

    cli: CLI
    log_dir: Path
    events: EventAccumulator

    def scalars(self, name: str) -> tuple[list[int], list[float]]:
        """A logged value's points, by the name it was logged under, wherever the logger put it."""
        points = read_scalars(self.log_dir)[name]
        return [step for step, _ in points], [value for _, value in points]

    def texts(self, tag: str) -> list[tuple[int, str]]:
        return [
            (e.step, tensor_util.make_ndarray(e.tensor_proto).item().decode())
            for e in self.events.Tensors(f"{tag}/text_summary")
        ]

    def plugin_content(self, tag: str) -> bytes:
        return self.events.SummaryMetadata(tag).plugin_data.content


def read_events(log_dir: Path) -> EventAccumulator:
    events = EventAccumulator(
        str(log_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0, "histograms": 0}
    )
    return events.Reload()


def config_with_dashboard(tmp: Path, config: str, **dashboard: object) -> Path:
    """A fragment to stack on ``config`` that gives the Dashboard the given init_args; every other
    setting and callback stays as shipped (a callback's section merges into defaults.yaml's)."""
    path = tmp / f"dashboard-{config}"
    path.write_text(yaml.safe_dump({"dashboard": {"init_args": dashboard}}))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Digits fit + test after fit (histograms and graph on), digits test alone, diabetes fit (defaults)."""
    tmp = tmp_path_factory.mktemp("dashboard")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp)
        patch.setattr(sys, "argv", ["src.cli"])
        digits = str(CONFIGS / "digits.yaml")
        options = config_with_dashboard(
            tmp, "digits.yaml", histogram_every_n_epochs=HISTOGRAM_EVERY, log_graph=True
        )
        fit = main(
            [
                "fit",
                "--config", digits,
                "--config", str(options),
                f"--trainer.max_epochs={EPOCHS}",
                f"--trainer.limit_train_batches={BATCHES}",
                "--trainer.log_every_n_steps=1",
                f"--trainer.gradient_clip_val={CLIP}",
                f"--model.init_args.scheduler.init_args.T_max={EPOCHS}",
                "--test_after_fit=true",
                *QUIET,
            ]
        )  # fmt: skip
        best = fit.trainer.checkpoint_callback.best_model_path
        test = main(["test", "--config", digits, "--ckpt_path", best, *QUIET])
        diabetes = main(
            [
                "fit",
                "--config", str(CONFIGS / "diabetes.yaml"),
                "--trainer.max_epochs=2",
                "--trainer.limit_train_batches=3",
                "--trainer.log_every_n_steps=1",
                *QUIET,
            ]
        )  # fmt: skip
    return {
        name: Run(cli, tmp / cli.trainer.log_dir, read_events(tmp / cli.trainer.log_dir))
        for name, cli in {"fit": fit, "test": test, "diabetes": diabetes}.items()
    }


# -- scalars -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_scalars_follow_one_naming_scheme(runs: dict[str, Run]) -> None:
    names = set(read_scalars(runs["fit"].log_dir))
    expected = {
        *(f"{stage}/{name}" for stage in ("train", "val", "test") for name in ("loss", "acc", "f1")),
        "train/optimization/lr",
        "train/optimization/grad_norm",
        "train/optimization/clipped",
        "train/optimization/loss",
        "train/speed/samples_per_sec",
        "train/speed/data_time_share",
        "train/speed/epoch_time",
        "val/speed/epoch_time",
        "val/generalization_gap",
    }
    assert expected <= names
    # nothing outside the scheme but the best epoch's summary: no `epoch` counter, no placeholder hp_metric
    assert {n for n in names if not re.match(r"(train|val|test|summary)/", n)} == set()


def stage_tags(run: Run, folder: str) -> set[str]:
    return set(read_events(run.log_dir / folder).Tags()["scalars"])


@pytest.mark.slow
def test_train_and_validation_are_runs_of_their_own_sharing_tags(runs: dict[str, Run]) -> None:
    """Keras' convention: one chart per tag, a colour per run, so train and validation read apart."""
    run = runs["fit"]
    train, validation, test = (stage_tags(run, folder) for folder in ("train", "validation", "test"))
    assert {"metrics/loss", "metrics/acc", "metrics/f1"} <= train & validation & test
    assert {"optimization/lr", "optimization/grad_norm", "optimization/clipped"} <= train
    assert {"metrics/generalization_gap", "metrics/acc_hgb", "speed/epoch_time"} <= validation
    # the folder itself holds no curve: the best epoch's values only (and the text, figures, session)
    assert {tag.split("/")[0] for tag in run.events.Tags()["scalars"]} == {"summary"}
    # no folder beside the stages: no hparams sub-run
    # (the separate test of its best checkpoint is a run folder of its own inside it, test-best-…)
    assert sorted(p.name for p in run.log_dir.iterdir() if p.is_dir() and "-" not in p.name) == [
        "checkpoints",
        "test",
        "train",
        "validation",
    ]


def test_learning_rate_is_the_schedulers(runs: dict[str, Run]) -> None:
    steps, lrs = runs["fit"].scalars("train/optimization/lr")
    # CosineAnnealingLR, stepped per epoch; closed form, eta_min = 0; written on every logging step
    # (log_every_n_steps=1 here) with the rate that step used
    base = 0.002  # configs/digits.yaml
    assert steps == list(range(EPOCHS * BATCHES))
    expected = [base * (1 + math.cos(math.pi * (step // BATCHES) / EPOCHS)) / 2 for step in steps]
    torch.testing.assert_close(torch.tensor(lrs), torch.tensor(expected), rtol=1e-6, atol=0)


class TwoGroups(Classifier):
    """A classifier whose optimizer has two parameter groups: the net's body, and its head by name."""

    def configure_optimizers(self) -> dict:
        head = set(self.net.head.parameters())
        body = [p for p in self.parameters() if p not in head]
        optimizer = torch.optim.SGD(
            [{"params": body, "lr": 0.1}, {"params": list(head), "lr": 0.01, "name": "head"}]
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5),
        }


def test_learning_rate_per_parameter_group(tmp_path: Path) -> None:
    data = TabularDataModule(source="spiral", num_samples=300, batch_size=64)
    model = TwoGroups(
        in_features=data.in_features, out_features=data.out_features, net=NET, label_smoothing=0.1
    )
    logger = TensorBoardLogger(tmp_path, name="groups", default_hp_metric=False)
    trainer = L.Trainer(
        max_epochs=3,
        limit_train_batches=2,
        limit_val_batches=1,
        logger=logger,
        log_every_n_steps=1,
        callbacks=[Dashboard()],  # its StepValues write train/lr
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=data)
    run = Run(None, Path(logger.log_dir), read_events(Path(logger.log_dir)))  # type: ignore[arg-type]
    halving = [0.5**epoch for epoch in range(3) for _ in range(2)]  # StepLR per epoch; 2 steps an epoch
    # an unnamed group is numbered (pg1), a named one keeps its name
    for tag, base in {"train/optimization/lr/pg1": 0.1, "train/optimization/lr/head": 0.01}.items():
        torch.testing.assert_close(run.scalars(tag)[1], [base * h for h in halving])
    assert "train/optimization/lr" not in read_scalars(run.log_dir)
    # outside the CLI the HParams come from the same public state: the optimizer, the net, the data
    hparams = session_hparams(run)
    assert hparams["model"] == f"{TwoGroups.__module__}.TwoGroups"
    assert hparams["lr"] == pytest.approx(0.1)  # the first group's, as the scheduler started it
    assert hparams["optimizer"] == "torch.optim.sgd.SGD"
    assert hparams["net_params"] == sum(p.numel() for p in model.net.parameters())
    assert hparams["data"] == "spiral"
    assert hparams["batch_size"] == 64
    assert hparams["epochs"] == 3


def test_gradient_norm_is_positive_and_clipping_fires_above_the_threshold(runs: dict[str, Run]) -> None:
    steps, norms = runs["fit"].scalars("train/optimization/grad_norm")
    clipped_steps, clipped = runs["fit"].scalars("train/optimization/clipped")
    assert len(steps) == EPOCHS * BATCHES  # log_every_n_steps=1
    assert clipped_steps == steps
    assert all(n > 0 and math.isfinite(n) for n in norms)
    # a logging interval of one step: the share of its steps clipped is 0 or 1
    assert clipped == [float(n > CLIP) for n in norms]


def test_speed_is_measured_per_epoch(runs: dict[str, Run]) -> None:
    run = runs["fit"]
    epoch_steps, epoch_time = run.scalars("train/speed/epoch_time")
    _, val_time = run.scalars("val/speed/epoch_time")
    _, throughput = run.scalars("train/speed/samples_per_sec")
    _, data_share = run.scalars("train/speed/data_time_share")
    assert epoch_steps == run.scalars("train/loss")[0]
    assert len(epoch_time) == len(val_time) == len(throughput) == len(data_share) == EPOCHS
    for epoch in range(EPOCHS):
        # validation runs inside the training epoch; the throughput leaves it (and checkpointing) out,
        # so it is at least the epoch's samples over the whole epoch
        assert 0 < val_time[epoch] < epoch_time[epoch]
        assert throughput[epoch] >= BATCHES * BATCH_SIZE / epoch_time[epoch]
        assert 0 < data_share[epoch] < 1


def test_generalization_gap_is_val_loss_minus_train_loss(runs: dict[str, Run]) -> None:
    run = runs["fit"]
    steps, gap = run.scalars("val/generalization_gap")
    val_steps, val_loss = run.scalars("val/loss")
    train_steps, train_loss = run.scalars("train/loss")
    assert steps == val_steps == train_steps
    assert len(steps) == EPOCHS
    torch.testing.assert_close(torch.tensor(gap), torch.tensor(val_loss) - torch.tensor(train_loss))


# -- images --------------------------------------------------------------------------------------------


def decode_png(encoded: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(encoded))
    assert image.format == "PNG"
    return image


def parse_counts(markdown: str) -> np.ndarray:
    rows = [line for line in markdown.splitlines()[2:]]  # header and rule first
    return np.array([[int(cell) for cell in row.strip("|").split("|")[1:]] for row in rows])


def last_epoch_val_logits(run: Run) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) logits and (N,) targets on the validation split, from the weights that ended the fit."""
    model = Classifier.load_from_checkpoint(run.log_dir / "checkpoints" / "last.ckpt").eval()
    with torch.no_grad():
        batches = [(model(x), y) for x, y in run.cli.datamodule.val_dataloader()]
    return torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])


def test_confusion_matrix_each_validation_epoch(runs: dict[str, Run]) -> None:
    run = runs["fit"]
    figures = next(c for c in run.cli.trainer.callbacks if isinstance(c, ValidationFigures))
    images = run.events.Images("val/confusion_matrix")
    val_steps = run.scalars("val/loss")[0]
    # every n-th epoch from the first, and the last; none from the sanity check
    drawn = [e for e in range(EPOCHS) if e % figures.every_n_epochs == 0 or e == EPOCHS - 1]
    assert figures.every_n_epochs > 1  # the shipped setting, so that the schedule is what is tested
    val_steps = [val_steps[e] for e in drawn]
    assert [image.step for image in images] == val_steps
    # sized to the class count (src/extras/figures/callback.py), every one alike, decoded at the size it says
    assert len({(image.width, image.height) for image in images}) == 1
    for image in images:
        assert decode_png(image.encoded_image_string).size == (image.width, image.height)
        assert image.width >= 10 * MIN_CELL_IN * DPI

    texts = run.texts("val/confusion_counts")
    assert [step for step, _ in texts] == val_steps
    val_size = len(run.cli.datamodule.split_rows["val"])
    assert all(parse_counts(text).sum() == val_size for _, text in texts)
    # the last epoch's counts are those of the weights that ended the fit (last.ckpt)
    logits, targets = last_epoch_val_logits(run)
    expected = confusion_matrix(targets, logits.argmax(-1), labels=range(10))
    np.testing.assert_array_equal(parse_counts(texts[-1][1]), expected)


def test_the_fit_ends_with_the_best_epochs_confusion_matrix(runs: dict[str, Run]) -> None:
    run = runs["fit"]
    steps, losses = run.scalars("val/loss")
    best = min(range(len(losses)), key=losses.__getitem__)
    [image] = run.events.Images("summary/confusion_matrix")
    [(step, text)] = run.texts("summary/confusion_counts")
    assert image.step == step == steps[best]
    # the counts are those of the best checkpoint's weights, the one that was tested
    path = Path(run.cli.trainer.checkpoint_callback.best_model_path)
    model = Classifier.load_from_checkpoint(run.log_dir / "checkpoints" / path.name).eval()
    with torch.no_grad():
        batches = [(model(x), y) for x, y in run.cli.datamodule.val_dataloader()]
    logits, targets = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    expected = confusion_matrix(targets, logits.argmax(-1), labels=range(10))
    np.testing.assert_array_equal(parse_counts(text), expected)


def test_predicted_vs_true_for_regression(runs: dict[str, Run]) -> None:
    run = runs["diabetes"]
    images = run.events.Images("val/predicted_vs_true")
    assert [image.step for image in images] == run.scalars("val/loss")[0]
    assert len(images) == 2
    size = ValidationFigures().image_size  # diabetes.yaml keeps the default
    assert all(decode_png(i.encoded_image_string).size == (size, size) for i in images)
    assert "val/confusion_matrix" not in run.events.Tags()["images"]
    assert [i.step for i in run.events.Images("summary/predicted_vs_true")] in (
        [steps] for steps in run.scalars("val/loss")[0]
    )
    assert "val/predicted_vs_true" not in runs["fit"].events.Tags()["images"]


# -- HParams, layout, text, histograms, graph ----------------------------------------------------------


def session(run: Run) -> EventAccumulator:
    """The run's HParams session: the run folder itself, TensorBoard's convention (its stages are runs
    below it)."""
    return run.events


def session_content(run: Run, tag: str) -> bytes:
    return session(run).SummaryMetadata(tag).plugin_data.content


def session_status(run: Run) -> int:
    data = plugin_data_pb2.HParamsPluginData.FromString(session_content(run, "_hparams_/session_end_info"))
    return data.session_end_info.status


def session_hparams(run: Run) -> dict[str, object]:
    data = plugin_data_pb2.HParamsPluginData.FromString(session_content(run, "_hparams_/session_start_info"))
    values = data.session_start_info.hparams
    return {name: getattr(value, value.WhichOneof("kind")) for name, value in values.items()}


def experiment(run: Run) -> api_pb2.Experiment:
    content = session_content(run, "_hparams_/experiment")
    return plugin_data_pb2.HParamsPluginData.FromString(content).experiment


def test_hparams_are_the_few_people_compare_read_from_the_run_itself(runs: dict[str, Run]) -> None:
    run = runs["fit"]
    hparams = session_hparams(run)
    assert len(hparams) <= 15
    assert hparams["model"] == "src.models.classifier.Classifier"
    assert hparams["net"] == "src.nets.mlp.MLP"
    assert hparams["net_params"] == sum(p.numel() for p in run.cli.model.net.parameters())
    assert hparams["optimizer"] == "torch.optim.adamw.AdamW"
    assert hparams["lr"] == pytest.approx(0.002)  # configs/digits.yaml, not the cosine's last value
    assert hparams["batch_size"] == BATCH_SIZE
    assert hparams["data"] == "digits"
    assert hparams["epochs"] == EPOCHS
    assert hparams["clip"] == pytest.approx(CLIP)
    assert hparams["seed"] == "42"
    assert session_status(run) == api_pb2.STATUS_SUCCESS
    assert "hp_metric" not in read_scalars(run.log_dir)
    # the columns TensorBoard shows first: the headline hyperparameters, marked so
    shown = sorted(experiment(run).hparam_infos, key=lambda info: (not info.differs, info.name))[:5]
    assert {info.name for info in shown} == set(HEADLINE)


def test_hparams_metrics_are_the_best_epochs_first_then_the_test(runs: dict[str, Run]) -> None:
    run = runs["fit"]
    columns = [(m.name.group, m.name.tag) for m in experiment(run).metric_infos]
    assert columns[:5] == [
        ("", "summary/best_loss"),  # the monitored value leads
        ("", "summary/best_acc"),
        ("", "summary/best_f1"),
        ("", "summary/best_epoch"),
        ("test", "metrics/loss"),
    ]
    assert columns[5:7] == [("test", "metrics/acc"), ("test", "metrics/f1")]
    assert {tag for _, tag in columns[7:]} == {
        f"summary/best_{m}_{b}" for m in ("loss", "acc", "f1") for b in ("hgb", "linear")
    }
    # each column's value is where the table reads it: the best epoch's, at its step; the test's
    steps, losses = run.scalars("val/loss")
    best = min(range(len(losses)), key=losses.__getitem__)
    summary = read_scalars(run.log_dir)
    assert summary["summary/best_loss"] == [(steps[best], pytest.approx(losses[best]))]
    assert summary["summary/best_epoch"] == [(steps[best], best)]
    assert summary["summary/best_acc"] == [(steps[best], pytest.approx(run.scalars("val/acc")[1][best]))]
    metrics = run.cli.trainer.callback_metrics
    for tag in ("test/loss", "test/acc", "test/f1"):
        assert run.scalars(tag)[1] == [pytest.approx(metrics[tag].item())]


def test_a_separate_test_run_carries_its_hparams_and_test_metrics(runs: dict[str, Run]) -> None:
    fit, test = runs["fit"], runs["test"]
    assert test.log_dir != fit.log_dir
    hparams = session_hparams(test)
    assert hparams["net_params"] == session_hparams(fit)["net_params"]
    assert hparams["batch_size"] == BATCH_SIZE
    # the same best checkpoint on the same split: the same test metrics as the test after fit
    for tag in ("test/loss", "test/acc", "test/f1"):
        assert test.scalars(tag)[1] == pytest.approx(fit.scalars(tag)[1])
    assert "train/loss" not in read_scalars(test.log_dir)
    assert session_status(test) == api_pb2.STATUS_SUCCESS
    # an evaluation names no columns of its own: the fit's experiment has its test values' columns
    assert "_hparams_/experiment" not in test.events.Tags()["tensors"]


class Crashes(Classifier):
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if batch_idx == 1:
            raise RuntimeError("boom")
        return super().training_step(batch, batch_idx)


def test_a_run_that_raises_is_marked_failed(tmp_path: Path) -> None:
    data = TabularDataModule(source="spiral", num_samples=300, batch_size=64)
    logger = TensorBoardLogger(tmp_path, name="crash", default_hp_metric=False)
    trainer = L.Trainer(
        max_epochs=1,
        logger=logger,
        callbacks=[Dashboard()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Crashes(in_features=2, out_features=3, net=NET), datamodule=data)
    run = Run(None, Path(logger.log_dir), read_events(Path(logger.log_dir)))  # type: ignore[arg-type]
    assert session_status(run) == api_pb2.STATUS_FAILURE


def test_layout_puts_train_and_val_on_one_chart_and_every_chart_has_data(runs: dict[str, Run]) -> None:
    run = runs["fit"]
    content = tensor_util.make_ndarray(run.events.Tensors("custom_scalars__config__")[0].tensor_proto).item()
    layout = layout_pb2.Layout.FromString(content)
    charts = {chart.title: list(chart.multiline.tag) for cat in layout.category for chart in cat.chart}
    # the baselines' values (digits is a table: the shipped Baselines are on) beside the net's
    assert charts["loss"] == ["^metrics/loss(_[^/]+)?$"]
    assert charts["acc"] == ["^metrics/acc(_[^/]+)?$"]
    tags = {folder: stage_tags(run, folder) for folder in ("train", "validation")}
    assert re.match(charts["acc"][0], "metrics/acc_hgb")
    assert not re.match(charts["acc"][0], "metrics/acc/x")
    for title, regexes in charts.items():
        for regex in regexes:
            found = [f for f, names in tags.items() if any(re.match(regex, name) for name in names)]
            assert found, f"chart {title!r}: nothing matches {regex}"
    # train and validation both on each metric's chart: two runs, two colours
    for name in ("loss", "acc", "f1"):
        assert all(any(re.match(charts[name][0], n) for n in names) for names in tags.values())


def test_layout_charts_each_logged_validation_value_once() -> None:
    logged = {
        name: torch.tensor(0.0)
        for name in ("train/loss", "val/loss", "val/mae", "val/r2", "val/r2_hgb", "val/speed/epoch_time")
    }
    train_vs_val = scalars_layout(logged)["train vs validation"]
    # the loss first, then the others in name order; a baseline on its metric's chart, speed elsewhere
    assert list(train_vs_val) == ["loss", "mae", "r2", "generalization gap (val loss - train loss)"]
    assert list(scalars_layout({})["train vs validation"]) == [
        "loss",
        "generalization gap (val loss - train loss)",
    ]


def test_config_and_environment_are_written_as_text(runs: dict[str, Run]) -> None:
    run = runs["fit"]
    [(_, config)] = run.texts("run/config")
    assert (run.log_dir / "config.yaml").read_text().strip() in config
    [(_, environment)] = run.texts("run/environment")
    assert f"| torch | {torch.__version__} |" in environment
    assert f"| lightning | {L.__version__} |" in environment
    assert "| device | cpu |" in environment
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    if git.returncode == 0:
        assert git.stdout.strip() in environment


def test_histograms_and_graph_when_asked_for(runs: dict[str, Run]) -> None:
    run = runs["fit"]
    tags = run.events.Tags()
    params = dict(run.cli.model.named_parameters())
    assert set(tags["histograms"]) == {
        tag for name in params for tag in (f"weights/{name}", f"weights/{name}/grad")
    }
    # epochs 0 and 2: the first optimizer step of each
    for name, param in params.items():
        histograms = run.events.Histograms(f"weights/{name}")
        assert [h.step for h in histograms] == [0, 2 * BATCHES]
        assert all(h.histogram_value.num == param.numel() for h in histograms)
    graph = run.events.Graph()
    assert any("Linear" in node.name or "addmm" in node.op for node in graph.node)
    # the net's graph alone (the task's metric modules would be traced too): every node inside the MLP
    inside = [node.name for node in graph.node if node.op != "IO Node"]
    assert inside
    assert all(name.startswith(f"{type(run.cli.model.net).__name__}/") for name in inside)
    # the shipped defaults leave both off
    assert not runs["diabetes"].events.Tags()["histograms"]
    assert not runs["diabetes"].events.Tags()["graph"]


# -- configuration --------------------------------------------------------------------------------------


def test_every_shipped_config_keeps_the_dashboard() -> None:
    """The dashboard and the figures are sections of defaults.yaml; no shipped config switches them off or
    swaps their class, but bare.yaml, whose point is a Trainer without the shipped callbacks, and the
    language model's, whose "classes" are the next character: a confusion matrix of its vocabulary
    answers no question (its samples go to the Text tab instead)."""
    off = {"bare.yaml": {"dashboard", "validation_figures"}, "charlm.yaml": {"validation_figures"}}
    shipped = {
        "dashboard": "src.extras.dashboard.Dashboard",
        "validation_figures": "src.extras.figures.callback.ValidationFigures",
    }
    defaults = yaml.safe_load((CONFIGS / "defaults.yaml").read_text())
    assert {section: defaults[section]["class_path"] for section in shipped} == shipped
    for path in CONFIGS.rglob("*.yaml"):
        config = yaml.safe_load(path.read_text()) or {}
        for section, class_path in shipped.items():
            if section in off.get(path.name, ()):
                assert config[section] is None
            elif section in config:
                assert config[section] is not None, f"{path.name} switches off {section}"
                assert config[section].get("class_path", class_path) == class_path, path.name


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (lambda: Dashboard(histogram_every_n_epochs=-1), "histogram_every_n_epochs=-1"),
        (lambda: ValidationFigures(every_n_epochs=0), "every_n_epochs=0"),
        (lambda: ValidationFigures(image_size=0), "image_size=0"),
    ],
)
def test_bad_options_are_refused(build, words: str) -> None:
    with pytest.raises(UserInputError, match=re.escape(words)):
        build()


def test_regressor_run_logs_its_metrics_under_the_scheme(runs: dict[str, Run]) -> None:
    tags = set(read_scalars(runs["diabetes"].log_dir))
    assert {f"{s}/{m}" for s in ("train", "val") for m in ("loss", "mae", "rmse", "r2")} <= tags
    assert "train/optimization/lr" in tags
    assert isinstance(runs["diabetes"].cli.model, Regressor)


def test_the_session_is_named_after_the_run(runs: dict[str, Run]) -> None:
    start = plugin_data_pb2.HParamsPluginData.FromString(
        session_content(runs["fit"], "_hparams_/session_start_info")
    )
    # the HParams table's trial name: the logger's name and version, which tell two runs apart
    assert start.session_start_info.group_name == f"digits/{runs['fit'].log_dir.name}"


# -- a task of the user's own with K targets at once -------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "own"), [("labels", ["loss", "acc", "f1"]), ("values", ["loss", "mae", "r2"])]
)
def test_a_users_k_target_task_gets_its_own_values_as_the_best_epochs_columns(
    cli, kind: str, own: list[str]
) -> None:
    """tests/helpers.py's multi-label and multi-output tasks under every shipped default: the HParams
    columns are the values the module logs itself, each the best epoch's (by val/loss), and the layout
    charts each once."""
    words = MANY_LABELS if kind == "labels" else MANY_VALUES
    fit = cli("fit", *words, "--trainer.max_epochs=3", "--trainer.log_every_n_steps=1")
    run = Run(fit, Path(fit.trainer.log_dir), read_events(Path(fit.trainer.log_dir)))
    columns = [m.name.tag for m in experiment(run).metric_infos if not m.name.group]
    assert columns == [*(f"summary/best_{name}" for name in own), "summary/best_epoch"]
    steps, losses = run.scalars("val/loss")
    best = min(range(len(losses)), key=losses.__getitem__)
    assert best > 0  # the net learned: the best epoch is not the first
    summary = read_scalars(run.log_dir)
    for name in own:
        assert summary[f"summary/best_{name}"] == [
            (steps[best], pytest.approx(run.scalars(f"val/{name}")[1][best]))
        ]
    charts = scalars_layout(fit.trainer.callback_metrics)["train vs validation"]
    assert [name for name in charts if "gap" not in name] == own
