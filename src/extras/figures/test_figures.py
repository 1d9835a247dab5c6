"""Validation figures: every n-th epoch, the first and the last always, drawn off the training thread."""

import functools
import itertools
import logging
import threading
import time
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Literal

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from sklearn.metrics import multilabel_confusion_matrix
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from typing_extensions import override

import tests.test_any_module as any_module
from src.cli import main
from src.extras import painter
from src.extras.figures.callback import THREAD_EPOCHS, ValidationFigures
from src.extras.figures.drawing import DPI, MIN_CELL_IN, confusion_figure
from src.extras.tables import TabularDataModule
from src.models import Classifier
from src.nets import MLP
from tests.conftest import QUIET
from tests.helpers import LABEL_NAMES, VALUE_NAMES, MultiLabelTask, many_targets

BATCHES = 3
NET = functools.partial(MLP, hidden_sizes=[8])


class StopAfter(Callback):
    """Ends the fit after the given epoch's validation, as early stopping would."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == self.epoch:
            trainer.should_stop = True


class Threads(ValidationFigures):
    """Records the thread each figure is drawn on."""

    threads: list[str]

    @override
    def _figure(self) -> Figure:
        self.threads.append(threading.current_thread().name)
        return super()._figure()


def fit(
    tmp_path: Path,
    epochs: int,
    every: int,
    *callbacks: Callback,
    validate_every: int = 1,
    draw_in: Literal["auto", "process", "thread"] = "thread",
    max_share: float | None = None,
) -> tuple[Threads, dict[str, list[int]]]:
    """A fit's figure steps; drawn on a thread, where :class:`Threads` records which one each is drawn on."""
    data = TabularDataModule(source="spiral", num_samples=300, batch_size=50)
    model = Classifier(in_features=data.in_features, out_features=data.out_features, net=NET)
    figures = Threads(every_n_epochs=every, image_size=120, draw_in=draw_in, max_share=max_share)
    figures.threads = []
    logger = TensorBoardLogger(tmp_path, name="figures", default_hp_metric=False)
    L.Trainer(
        max_epochs=epochs,
        limit_train_batches=BATCHES,
        logger=logger,
        callbacks=[figures, *callbacks],
        check_val_every_n_epoch=validate_every,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    ).fit(model, datamodule=data)
    events = EventAccumulator(
        logger.log_dir, size_guidance={"images": 0, "tensors": 0, "scalars": 0}
    ).Reload()
    losses = {point.step: point.value for point in events.Scalars("val/loss")}
    steps = {
        "images": [image.step for image in events.Images("val/confusion_matrix")],
        "texts": [text.step for text in events.Tensors("val/confusion_counts/text_summary")],
        "best": [image.step for image in events.Images("summary/confusion_matrix")],
        "best texts": [text.step for text in events.Tensors("summary/confusion_counts/text_summary")],
        "lowest val/loss": [min(losses, key=losses.__getitem__)],
    }
    return figures, steps


@pytest.mark.parametrize(
    ("epochs", "every", "stop", "drawn"),
    [
        (7, 3, None, [0, 3, 6]),  # the last epoch falls on the schedule: drawn once
        (6, 3, None, [0, 3, 5]),  # the last epoch is drawn though off the schedule
        (10, 4, 1, [0, 1]),  # stopped early after epoch 1: that one is the last
        (3, 1, None, [0, 1, 2]),
    ],
)
def test_figures_every_n_epochs_and_the_first_and_the_last(
    tmp_path: Path, epochs: int, every: int, stop: int | None, drawn: list[int]
) -> None:
    callbacks = [StopAfter(stop)] if stop is not None else []
    figures, steps = fit(tmp_path, epochs, every, *callbacks)
    # an epoch's images sit at its last optimizer step, as its validation scalars do
    expected = [(epoch + 1) * BATCHES - 1 for epoch in drawn]
    assert steps["images"] == steps["texts"] == expected
    # and the best epoch's (the lowest val/loss: no checkpoint monitors another), once, at the fit's end;
    # drawn again only when its validation was not drawn
    assert steps["best"] == steps["best texts"] == steps["lowest val/loss"]
    assert len(figures.threads) == len(drawn) + (steps["best"][0] not in expected)
    assert all(name.startswith("validation-figures") for name in figures.threads)
    assert threading.current_thread().name not in figures.threads


def test_figures_keep_to_their_share_of_the_fit(tmp_path: Path) -> None:
    """Asked for every epoch, with a share no drawing fits in: the first epoch's and the last's alone."""
    _, steps = fit(tmp_path, 4, 1, max_share=1e-9)
    assert steps["images"] == [BATCHES - 1, 4 * BATCHES - 1]


class Broken(ValidationFigures):
    @override
    def _figure(self) -> Any:
        raise RuntimeError("no canvas")


def test_a_drawing_error_is_raised_by_the_fit(tmp_path: Path) -> None:
    data = TabularDataModule(source="spiral", num_samples=300, batch_size=50)
    model = Classifier(in_features=data.in_features, out_features=data.out_features, net=NET)
    trainer = L.Trainer(
        max_epochs=1,
        limit_train_batches=BATCHES,
        logger=TensorBoardLogger(tmp_path, name="broken"),
        callbacks=[Broken(draw_in="thread")],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with pytest.raises(RuntimeError, match="no canvas"):
        trainer.fit(model, datamodule=data)


class Slow(ValidationFigures):
    """Takes its time over each figure and says when one is done."""

    done = 0

    @override
    def _figure(self) -> Figure:
        time.sleep(0.3)
        self.done += 1
        return super()._figure()


class FailAfterValidation(Callback):
    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        raise RuntimeError("the run failed")


def test_a_failed_run_waits_for_the_figure_being_drawn(tmp_path: Path) -> None:
    # a failed run's folder may be removed right after: nothing may still be writing into it
    data = TabularDataModule(source="spiral", num_samples=300, batch_size=50)
    model = Classifier(in_features=data.in_features, out_features=data.out_features, net=NET)
    slow = Slow(image_size=120, draw_in="thread")
    trainer = L.Trainer(
        max_epochs=3,
        limit_train_batches=BATCHES,
        logger=TensorBoardLogger(tmp_path, name="failed"),
        callbacks=[slow, FailAfterValidation()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with pytest.raises(RuntimeError, match="the run failed"):
        trainer.fit(model, datamodule=data)
    assert slow.done == 1  # epoch 0's figure, begun before the failure, was finished first
    assert not [t for t in threading.enumerate() if t.name.startswith("validation-figures")]


def test_the_first_and_the_last_validation_are_drawn_when_validation_skips_epochs(tmp_path: Path) -> None:
    # validation after epochs 1, 3 and 5 of 0..6; none of them a multiple of 4
    _, steps = fit(tmp_path, 7, 4, validate_every=2)
    assert steps["images"] == [(epoch + 1) * BATCHES - 1 for epoch in (1, 5)]


class Named(TabularDataModule):
    """The spiral data, its classes named as a CSV file might name them (Markdown's own signs in two)."""

    @property
    def label_names(self) -> list[str]:
        return ["red|dish", "green_ish", "blue"]


def counts_header(tmp_path: Path, **fit: Any) -> str:
    """The header row of the one confusion-counts table a one-epoch fit writes."""
    logger = TensorBoardLogger(tmp_path, name="labels", default_hp_metric=False)
    L.Trainer(
        max_epochs=1,
        limit_train_batches=BATCHES,
        logger=logger,
        callbacks=[ValidationFigures()],  # the default size: room for the names beside the matrix
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    ).fit(Classifier(in_features=2, out_features=3, net=NET), **fit)
    events = EventAccumulator(logger.log_dir, size_guidance={"tensors": 0}).Reload()
    [text] = events.Tensors("val/confusion_counts/text_summary")
    return text.tensor_proto.string_val[0].decode().splitlines()[0]


def test_classes_are_named_by_the_datamodules_label_names_and_else_numbered(tmp_path: Path) -> None:
    named = Named(source="spiral", num_samples=300, batch_size=50)
    assert (
        counts_header(tmp_path, datamodule=named) == "| true \\ predicted | red\\|dish | green\\_ish | blue |"
    )
    # no DataModule at all (plain loaders), so no names: the class ids
    plain = TabularDataModule(source="spiral", num_samples=300, batch_size=50)
    plain.setup("fit")
    loaders = {"train_dataloaders": plain.train_dataloader(), "val_dataloaders": plain.val_dataloader()}
    assert counts_header(tmp_path, **loaders) == "| true \\ predicted | 0 | 1 | 2 |"


class Silent(Classifier):
    """A task whose validation_step returns nothing, as many LightningModules' do."""

    @override
    def validation_step(self, batch: Any, batch_idx: int) -> None:  # type: ignore[override]
        super().validation_step(batch, batch_idx)


def test_a_module_that_returns_no_preds_gets_one_line_and_no_figures(tmp_path: Path, caplog) -> None:
    data = TabularDataModule(source="spiral", num_samples=300, batch_size=50)
    logger = TensorBoardLogger(tmp_path, name="silent", default_hp_metric=False)
    with caplog.at_level(logging.INFO):
        L.Trainer(
            max_epochs=2,
            limit_train_batches=BATCHES,
            logger=logger,
            callbacks=[ValidationFigures(every_n_epochs=1, image_size=120, max_share=None)],
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        ).fit(Silent(in_features=2, out_features=3, net=NET), datamodule=data)
    said = [record.getMessage() for record in caplog.records if "ValidationFigures" in record.getMessage()]
    # once for the run, not once per batch or epoch
    assert said == [
        "ValidationFigures draws from the {'preds', 'target'} dict validation_step returns; "
        "Silent.validation_step returns none, so no figures are drawn."
    ]
    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0}).Reload()
    assert events.Tags()["images"] == []
    assert "val/loss" in events.Tags()["scalars"]  # the validation itself ran and logged


# -- the confusion matrix a person reads: 2 to 100 classes, long labels --------------------------------

LONG = [f"{letter} a rather long class name" for letter in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"]


def confusion(k: int) -> torch.Tensor:
    """(K, K) counts: a strong diagonal and a few confusions."""
    counts = torch.diag(torch.full((k,), 20))
    counts[torch.arange(k), (torch.arange(k) + 1) % k] += 2
    return counts


def boxes(texts: list[Any], renderer: Any) -> list[Any]:
    return [t.get_window_extent(renderer) for t in texts if t.get_visible() and t.get_text()]


@pytest.mark.parametrize(
    "labels",
    [
        ["FEMALE", "MALE"],
        ["Adelie", "Chinstrap", "Gentoo"],  # the README's penguins
        [str(k) for k in range(10)],
        ["a rather long label", "another long label here", "short", "mid length one", "x"],
        LONG,
        [f"class_{k}" for k in range(100)],
    ],
    ids=["2", "penguins", "10", "wrapped", "26-long", "100"],
)
def test_confusion_matrix_labels_never_overlap_and_stay_on_the_image(labels: list[str]) -> None:
    figure = Figure(dpi=DPI)
    confusion_figure(figure, confusion(len(labels)), labels, "validation, epoch 0")
    canvas = FigureCanvasAgg(figure)
    canvas.draw()  # the rendered text extents, as matplotlib lays them out in the PNG
    renderer = canvas.get_renderer()
    [ax] = figure.axes
    page = figure.bbox
    xticks, yticks = boxes(ax.get_xticklabels(), renderer), boxes(ax.get_yticklabels(), renderer)
    legend = boxes(figure.texts, renderer)
    others = boxes([ax.xaxis.label, ax.yaxis.label, ax.title], renderer)
    for group in (xticks, yticks):
        assert len(group) == len(labels)
        assert not [(a, b) for a, b in itertools.combinations(group, 2) if a.overlaps(b)]
    every = [*xticks, *yticks, *legend, *others]
    assert all(page.x0 <= b.x0 and b.x1 <= page.x1 and page.y0 <= b.y0 and b.y1 <= page.y1 for b in every)
    assert not [(a, b) for a in [*xticks, *yticks] for b in [*legend, *others] if a.overlaps(b)]
    # the figure grows with the class count: a cell stays at least a few pixels wide
    assert ax.bbox.width / len(labels) >= MIN_CELL_IN * DPI - 1
    # long labels: numbered on the axes, written out whole in the legend
    if labels is LONG:
        assert [t.get_text() for t in ax.get_xticklabels()] == [str(k) for k in range(26)]
        assert all(
            f"{k}: {label}" in "\n".join(t.get_text() for t in figure.texts) for k, label in enumerate(LONG)
        )


def test_confusion_cells_say_count_and_rate_only_where_non_zero() -> None:
    figure = Figure(dpi=DPI)
    counts = torch.tensor([[8, 2, 0], [0, 5, 0], [1, 0, 9]])
    confusion_figure(figure, counts, ["a", "b", "c"], "t")
    [ax] = figure.axes
    assert sorted(t.get_text() for t in ax.texts) == sorted(
        ["8\n80%", "2\n20%", "5\n100%", "1\n10%", "9\n90%"]
    )


class Planted(Callback):
    """Logs ``val/planted``, lowest at epoch 1 of 4: the best epoch by a checkpoint monitoring it."""

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.log("val/planted", [0.5, 0.1, 0.3, 0.4][trainer.current_epoch])


def test_the_fit_ends_with_the_figure_of_the_best_checkpoints_epoch_not_the_last(tmp_path: Path) -> None:
    torch.manual_seed(0)  # weights whose epoch-1 and last confusion counts differ, as asserted below
    data = TabularDataModule(source="spiral", num_samples=300, batch_size=50)
    fast = functools.partial(torch.optim.Adam, lr=0.05)  # predictions that change from epoch to epoch
    model = Classifier(in_features=data.in_features, out_features=data.out_features, net=NET, optimizer=fast)
    logger = TensorBoardLogger(tmp_path, name="best", default_hp_metric=False)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val/planted", mode="min")
    L.Trainer(
        max_epochs=4,
        limit_train_batches=BATCHES,
        logger=logger,
        callbacks=[
            Planted(),
            checkpoint,
            ValidationFigures(every_n_epochs=1, image_size=120, max_share=None),
        ],
        enable_progress_bar=False,
        enable_model_summary=False,
    ).fit(model, datamodule=data)
    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0, "tensors": 0}).Reload()
    texts = {
        tag: {e.step: e.tensor_proto.string_val[0].decode() for e in events.Tensors(f"{tag}/text_summary")}
        for tag in ("val/confusion_counts", "summary/confusion_counts")
    }
    epoch_1 = 2 * BATCHES - 1  # the last optimizer step of epoch 1, where its values sit
    assert list(texts["summary/confusion_counts"]) == [epoch_1]
    assert texts["summary/confusion_counts"][epoch_1] == texts["val/confusion_counts"][epoch_1]
    last = max(texts["val/confusion_counts"])
    assert texts["val/confusion_counts"][last] != texts["val/confusion_counts"][epoch_1]  # it matters which
    [image] = events.Images("summary/confusion_matrix")
    assert image.step == epoch_1
    assert checkpoint.best_model_path.endswith(f"step={epoch_1 + 1}.ckpt")


def test_a_worker_process_draws_the_very_pixels_and_texts_of_a_thread(tmp_path: Path) -> None:
    """A worker process (which shares no interpreter lock with the training) writes the same figures at
    the same steps as the shipped way, a thread of the training's process."""
    written = {}
    for draw_in in ("process", "thread"):
        folder = tmp_path / draw_in
        L.seed_everything(0)  # the same net, trained the same way
        figures, steps = fit(folder, 4, 2, draw_in=draw_in)
        # Threads records the figures drawn in this process: none when a worker process draws them; the
        # best epoch's is drawn again only when its validation was not drawn
        drawings = len(steps["images"]) + (steps["best"][0] not in steps["images"])
        assert len(figures.threads) == (0 if draw_in == "process" else drawings)
        events = EventAccumulator(
            str(next(folder.glob("figures/version_*"))), size_guidance={"images": 0, "tensors": 0}
        ).Reload()
        tags = events.Tags()
        images = {
            tag: [(i.step, i.encoded_image_string) for i in events.Images(tag)] for tag in tags["images"]
        }
        texts = {
            tag: [(t.step, t.tensor_proto.string_val) for t in events.Tensors(tag)] for tag in tags["tensors"]
        }
        written[draw_in] = (steps, images, texts)
    assert written["process"] == written["thread"]
    steps, images, _ = written["process"]
    assert len(images["val/confusion_matrix"]) == 3  # epochs 0, 2 and the last, 3
    assert len(images["summary/confusion_matrix"]) == 1


def test_a_killed_drawing_worker_costs_a_figure_not_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def killed(purpose: str, *args: Any) -> Future:
        future: Future = Future()
        future.set_exception(BrokenProcessPool("a worker process was killed (SIGKILL)"))
        return future

    monkeypatch.setattr(painter.workers, "submit", killed)
    data = TabularDataModule(source="spiral", num_samples=300, batch_size=50)
    model = Classifier(in_features=data.in_features, out_features=data.out_features, net=NET)
    logger = TensorBoardLogger(tmp_path, name="killed", default_hp_metric=False)
    trainer = L.Trainer(
        max_epochs=2, limit_train_batches=BATCHES, logger=logger,
        callbacks=[ValidationFigures(draw_in="process")], enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    with pytest.warns(UserWarning, match="worker process ended before it drew"):
        trainer.fit(model, datamodule=data)
    assert trainer.current_epoch == 2  # the fit ran to its end
    events = EventAccumulator(logger.log_dir).Reload()
    assert events.Tags()["images"] == []  # the figures are what was lost
    assert len(events.Scalars("val/loss")) == 2


def test_the_confusion_matrix_names_the_classes(trained) -> None:
    dashboard = pytest.importorskip("src.extras.dashboard.test_dashboard")  # reads the run's events
    Run, parse_counts, read_events = dashboard.Run, dashboard.parse_counts, dashboard.read_events
    run = trained.run  # the shared fit of the digits (tests/conftest.py), its classes named 0 … 9
    log_dir = Path(run.trainer.log_dir)
    texts = Run(run, log_dir, read_events(log_dir)).texts("val/confusion_counts")
    header = texts[-1][1].splitlines()[0]
    assert header == "| true \\ predicted | " + " | ".join(map(str, range(10))) + " |"
    counts = parse_counts(texts[-1][1])
    validated = min(len(run.datamodule.split_rows["val"]), 2 * run.datamodule.hparams["batch_size"])
    assert counts.sum() == validated  # the shared fit validates its first 2 batches


# -- a LightningModule of the user's own (tests/test_any_module.py's), under every shipped default ---------


class SilentModule(any_module.TutorialModule):
    """The same, with a validation_step that returns nothing, as many do."""

    @override
    def validation_step(self, batch: Any, batch_idx: int) -> None:  # type: ignore[override]
        super().validation_step(batch, batch_idx)


def images(run_dir: Path) -> list[str]:
    events = EventAccumulator(str(run_dir), size_guidance={"images": 0})
    events.Reload()
    return list(events.Tags()["images"])


def test_a_plain_lightning_module_trains_under_every_shipped_default(workdir: Path) -> None:
    run = any_module.fit(workdir)
    # ValidationFigures: the module returns preds and target, so the confusion matrix is drawn
    drawn = sorted(images(Path(run.trainer.logger.log_dir)))
    assert drawn == ["summary/confusion_matrix", "val/confusion_matrix"]


def test_figures_say_in_one_line_what_they_need(workdir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO"):
        words = [f"--model={__name__}.SilentModule", *any_module.DIGITS, "--trainer.max_epochs=1", *QUIET]
        run = main(["fit", *words])
    said = [r.getMessage() for r in caplog.records if "ValidationFigures" in r.getMessage()]
    assert said == [
        "ValidationFigures draws from the {'preds', 'target'} dict validation_step returns; "
        "SilentModule.validation_step returns none, so no figures are drawn."
    ]
    assert images(Path(run.trainer.logger.log_dir)) == []


# -- a task of the user's own with K targets: K labels, or K values --------------------------------------


class Recorded(ValidationFigures):
    """Records what each figure is drawn from (drawn on a thread: the arguments of ``_draw``)."""

    drawn: list[dict[str, Any]]

    @override
    def _draw(
        self,
        group: str,
        title: str,
        counts: Any,
        labels: list[str] | None,
        preds: Any,
        target: Any,
    ) -> Any:
        self.drawn.append(
            {"group": group, "counts": counts, "labels": labels, "preds": preds, "target": target}
        )
        return super()._draw(group, title, counts, labels, preds, target)


class LogitLabels(MultiLabelTask):
    """The multi-label task whose metrics read the raw logits (torchmetrics applies the sigmoid itself)."""

    @override
    def metric_inputs(self, output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return output, target


def fit_k_targets(
    tmp_path: Path, kind: Literal["labels", "values"], task: type | None = None
) -> tuple[Recorded, EventAccumulator, torch.Tensor, torch.Tensor]:
    """Two epochs of the user's K-target task (tests/helpers.py), its validation figures drawn: the callback,
    the run's events, and the fitted net's outputs and the targets of the validation rows."""
    torch.manual_seed(0)
    model, data = many_targets(kind)
    fast = functools.partial(torch.optim.Adam, lr=0.05)  # a net that predicts both 0 and 1 by epoch 1
    model = (task or type(model))(
        in_features=data.in_features, out_features=data.out_features, net=NET, optimizer=fast
    )
    figures = Recorded(every_n_epochs=1, image_size=120, draw_in="thread", max_share=None)
    figures.drawn = []
    logger = TensorBoardLogger(tmp_path, name=kind, default_hp_metric=False)
    L.Trainer(
        max_epochs=2,
        logger=logger,
        callbacks=[figures],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    ).fit(model, datamodule=data)
    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0, "tensors": 0}).Reload()
    model.eval()
    with torch.inference_mode():
        output = model(data.x[data.val_rows])  # the weights the last validation ran with
    return figures, events, output, data.y[data.val_rows]


def counts_of(text: str) -> tuple[list[str], np.ndarray]:
    """The labels and (K, 2, 2) counts of a per-label counts table."""
    header, *_ = text.splitlines()
    assert header == (
        "| label | true 0, predicted 0 | true 0, predicted 1 | true 1, predicted 0 | true 1, predicted 1 |"
    )  # one row per label, not a class-by-class matrix
    rows = [line.strip("| ").split(" | ") for line in text.splitlines()[2:]]
    return [row[0] for row in rows], np.array([[int(n) for n in row[1:]] for row in rows]).reshape(-1, 2, 2)


@pytest.mark.parametrize("task", [MultiLabelTask, LogitLabels], ids=["probabilities", "logits"])
def test_k_labels_get_a_2x2_matrix_each_that_counts_every_validation_row_once(tmp_path: Path, task) -> None:
    figures, events, logits, target = fit_k_targets(tmp_path, "labels", task)
    text = max(events.Tensors("val/confusion_counts/text_summary"), key=lambda t: t.step)  # the last epoch's
    labels, counts = counts_of(text.tensor_proto.string_val[0].decode())
    assert labels == LABEL_NAMES  # the DataModule's names of its K labels, not a class each
    expected = multilabel_confusion_matrix(target.int().numpy(), (logits.sigmoid() > 0.5).int().numpy())
    np.testing.assert_array_equal(counts, expected)  # (K, 2, 2): true 0/1 by predicted 0/1, per label
    assert (counts.sum(axis=(1, 2)) == len(target)).all()  # each label counts each of the N rows once
    # it predicts 0s and 1s, each right and wrong: every cell has rows to count
    assert (expected.sum(axis=0) > 0).all()
    assert max(image.step for image in events.Images("val/confusion_matrix")) == text.step
    # two epochs, each drawn once: the best (the lowest val/loss) of them is written again, not redrawn
    assert [d["counts"].shape for d in figures.drawn] == [(3, 2, 2)] * 2
    assert len(events.Images("summary/confusion_matrix")) == 1


def test_k_values_get_a_panel_each_of_every_validation_row(tmp_path: Path) -> None:
    figures, events, output, target = fit_k_targets(tmp_path, "values")
    assert events.Tags()["tensors"] == []  # no counts: these are values, not labels
    assert events.Images("val/predicted_vs_true")
    drawn = figures.drawn[1]  # the last epoch's
    assert drawn["counts"] is None
    assert drawn["labels"] == VALUE_NAMES
    np.testing.assert_array_equal(drawn["preds"], output.numpy())  # (N, K): every row, every output
    np.testing.assert_array_equal(drawn["target"], target.numpy())


class Sequences(MultiLabelTask):
    """A task whose validation preds have a shape the figures do not draw: (B, K, 2)."""

    @override
    def validation_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:  # type: ignore[override]
        out = super().validation_step(batch, batch_idx)
        return {"preds": torch.stack([out["preds"], 1 - out["preds"]], -1), "target": out["target"]}


def test_preds_of_a_shape_no_figure_reads_get_one_line_and_no_figures(tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.INFO):
        _, events, _, _ = fit_k_targets(tmp_path, "labels", Sequences)
    said = [r.getMessage() for r in caplog.records if "ValidationFigures" in r.getMessage()]
    assert said == [
        "ValidationFigures draws (B, K) scores against (B,) classes, or preds against targets of their own "
        "(B,) or (B, K) shape; Sequences.validation_step returns preds (40, 3, 2) and target (40, 3), so no "
        "figures are drawn."
    ]
    assert events.Tags()["images"] == []


def test_auto_draws_a_short_fit_on_a_thread_and_a_longer_one_in_a_worker_process(tmp_path: Path) -> None:
    """``draw_in: auto`` (the shipped default): a fit of at most THREAD_EPOCHS epochs draws its few figures
    on a thread of the training's process; a longer one in a worker process, shut down with the fit."""
    short, _ = fit(tmp_path / "short", 2, 1, draw_in="auto")
    assert short.threads
    assert not short._painter.processes
    long, steps = fit(tmp_path / "long", THREAD_EPOCHS + 1, 5, draw_in="auto")
    assert long._painter.processes
    assert long.threads == []  # none drawn in this process
    assert steps["images"]  # and drawn all the same, by the worker
    assert not painter.workers.running("validation-figures")
