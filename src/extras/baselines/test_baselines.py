"""The baselines: fitted on the very rows and encoding the net gets, scored as the task scores itself."""

import logging
import math
import os
import threading
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Literal

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.trainer.states import TrainerFn
from sklearn.compose import ColumnTransformer
from sklearn.datasets import make_blobs
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.metrics import accuracy_score, f1_score, log_loss, r2_score, root_mean_squared_error
from sklearn.multioutput import MultiOutputClassifier, MultiOutputRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, OrdinalEncoder, StandardScaler
from threadpoolctl import threadpool_limits

import src.extras.baselines.callback as callback_module
import src.extras.baselines.models as fitting
from src.cli import main
from src.extras.baselines.callback import TAG, Baselines
from src.extras.tables import Split, TabularDataModule
from src.extras.tables.preprocessing import MISSING
from src.extras.tables.test_preprocessing import messy_frame
from src.models import Classifier
from tests.conftest import BARE, CONFIGS, QUIET
from tests.helpers import ManyTargets, many_targets

ON = ["--baselines=src.extras.baselines.callback.Baselines"]  # back after bare.yaml
#: the table kind's DataModule in place of the core's array one digits.yaml names: a file's raw cells
TABLE = "--data=src.extras.tables.TabularDataModule"
EPOCHS = ["--trainer.max_epochs=2", "--trainer.logger=false", "--trainer.enable_checkpointing=false"]
#: boosting's budget in a fit of 2 epochs, for a model growing one tree an iteration (a value, two
#: classes): 10 trees per epoch; a budget of at most 33 iterations boosts in steps of 0.3
ITERATIONS = 20
STEP = 0.3


def iterations(trees: int, epochs: int = 2) -> int:
    """Boosting's budget for ``trees`` trees an iteration (K classes or targets): 10 trees per epoch, a K-th
    of them as iterations, rounded up, and at least 5."""
    return max(-(-10 * epochs // trees), 5)


def fit(*words: str):
    return main(["fit", "--config", str(CONFIGS / "digits.yaml"), *BARE, *ON, *EPOCHS, *words, *QUIET])


def rows(loader) -> tuple[np.ndarray, np.ndarray]:
    batches = list(loader)
    return (torch.cat([b[0] for b in batches]).numpy(), torch.cat([b[1] for b in batches]).numpy())


def stops_early(y: np.ndarray, task: str = "classification") -> bool:
    """Whether boosting holds out a stratified tenth of the training targets ``y`` to stop early: 10 rows
    of each class of each target or more (a regression: 100 rows or more)."""
    if task != "classification":
        return len(y) >= 100
    return all(np.unique(column, return_counts=True)[1].min() >= 10 for column in y.reshape(len(y), -1).T)


def by_hand(task: str, numeric: list[str], categorical: list[str], y: np.ndarray, max_iter: int = ITERATIONS):
    """The two baselines written out with scikit-learn: boosting on numbers as they are and native
    categories, within a fit's budget and stopping early where ``y``, its training targets, allow; a
    linear model on filled, standardized numbers and one-hot categories."""
    trees = ColumnTransformer([
        ("n", "passthrough", numeric),
        ("c", OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=np.nan), categorical),
    ])  # fmt: skip
    mask = [False] * len(numeric) + [True] * len(categorical)
    lines = ColumnTransformer([
        ("n", make_pipeline(SimpleImputer(strategy="median", add_indicator=True), StandardScaler()), numeric),
        ("c", OneHotEncoder(handle_unknown="ignore"), categorical),
    ])  # fmt: skip
    if task == "classification":
        hgb = HistGradientBoostingClassifier(
            max_iter=max_iter, learning_rate=STEP, early_stopping=stops_early(y), random_state=0,
            categorical_features=mask,
        )  # fmt: skip
        return make_pipeline(trees, hgb), make_pipeline(lines, LogisticRegression(max_iter=1000))
    hgb = HistGradientBoostingRegressor(
        max_iter=max_iter, learning_rate=STEP, early_stopping=stops_early(y, task), random_state=0,
        categorical_features=mask,
    )  # fmt: skip
    return make_pipeline(trees, hgb), make_pipeline(lines, Ridge())


def arrays(data: Any, split: str) -> tuple[pd.DataFrame, np.ndarray]:
    """A split of the core's arrays as drawn, and its targets."""
    rows = data.split_rows[split]
    return pd.DataFrame(data.x[rows], columns=data.columns, dtype=np.float64), data.y[rows]


def raw(data: TabularDataModule, split: str) -> tuple[pd.DataFrame, np.ndarray]:
    """A split's raw cells, numbers read by hand (the "?" of ``age`` missing), and the net's targets."""
    frame = data.table.features.iloc[data.split_rows[split]].reset_index(drop=True)
    for column in data.preprocessor.numeric:
        frame[column.name] = pd.to_numeric(frame[column.name], errors="coerce")
    for column in data.preprocessor.categorical:
        frame[column.name] = frame[column.name].map(lambda v: MISSING if pd.isna(v) else str(v).strip())
    return frame, data.dataset(split).tensors[1].numpy()


@pytest.mark.slow
def test_classification_baselines_fit_the_raw_columns_of_the_nets_rows_and_score_as_by_hand(
    workdir: Path,
) -> None:
    messy_frame(n=240).to_csv("messy.csv", index=False)
    run = fit(
        TABLE, "--data.source=csv", "--data.path=messy.csv", "--data.target_column=label",
        "--data.task=classification",
    )  # fmt: skip
    data, metrics = run.datamodule, run.trainer.callback_metrics
    numeric = [c.name for c in data.preprocessor.numeric]
    categorical = [c.name for c in data.preprocessor.categorical]
    assert "city" in categorical  # 30 values: a category each for boosting, one-hot for the linear model
    (x, y), (x_val, y_val) = raw(data, "train"), raw(data, "val")
    # the targets are the validation loader's, in its order: the rows the net was scored on
    np.testing.assert_array_equal(rows(run.trainer.val_dataloaders)[1], y_val)
    assert len(x) + len(x_val) + len(data.split_rows["test"]) == 240
    assert data.out_features == 3  # three trees an iteration
    hgb, linear = by_hand("classification", numeric, categorical, y, iterations(3))
    with threadpool_limits(1):  # as the callback fits them
        hgb.fit(x, y)
        linear.fit(x, y)
    assert float(metrics["val/acc_hgb"]) == pytest.approx(accuracy_score(y_val, hgb.predict(x_val)))
    assert float(metrics["val/f1_linear"]) == pytest.approx(
        f1_score(y_val, linear.predict(x_val), average="macro"), abs=1e-6
    )
    labels = list(range(data.out_features))
    probs = linear.predict_proba(x_val)
    assert float(metrics["val/loss_linear"]) == pytest.approx(log_loss(y_val, probs, labels=labels), rel=1e-5)
    # and it is the task's own val/loss, had the net output those log-probabilities
    own = run.model.loss(torch.log(torch.as_tensor(probs, dtype=torch.float32)), torch.as_tensor(y_val))
    assert float(metrics["val/loss_linear"]) == pytest.approx(float(own), rel=1e-5)

    run.trainer.test(run.model, datamodule=data, verbose=False)
    x_test, y_test = raw(data, "test")
    assert float(run.trainer.callback_metrics["test/acc_hgb"]) == pytest.approx(
        accuracy_score(y_test, hgb.predict(x_test))
    )


@pytest.mark.slow
def test_regression_baselines_score_in_the_targets_units(workdir: Path) -> None:
    run = fit(
        "--model=src.models.Regressor", "--model.loss_fn=huber", "--data.source=friedman",
        "--data.num_samples=300",
    )  # fmt: skip
    data, metrics = run.datamodule, run.trainer.callback_metrics
    (x, y), (x_val, y_val) = arrays(data, "train"), arrays(data, "val")
    hgb, linear = by_hand("regression", list(x.columns), [], y)
    with threadpool_limits(1):
        preds = linear.fit(x, y).predict(x_val)
        hgb.fit(x, y)
    assert float(metrics["val/rmse_linear"]) == pytest.approx(root_mean_squared_error(y_val, preds), rel=1e-5)
    assert float(metrics["val/r2_linear"]) == pytest.approx(r2_score(y_val, preds), abs=1e-5)
    assert float(metrics["val/mae_hgb"]) == pytest.approx(np.abs(hgb.predict(x_val) - y_val).mean(), rel=1e-5)
    # no loss: the net's is in units of its own (a standardized or log target) that the data cannot tell
    assert "val/loss_hgb" not in metrics


@pytest.mark.slow
def test_many_classes_boost_with_scikit_learns_steps_and_beat_guessing(workdir: Path) -> None:
    """15 classes grow 15 trees an iteration: a fit's budget of trees gives them fewer iterations (two
    epochs: the least, 5), in steps of 0.3; boosting of this many classes diverges at 0.5 (0.19 after 20
    iterations on such rows), which is why the steps stop at 0.3."""
    x, label = make_blobs(1500, n_features=6, centers=15, cluster_std=2.5, random_state=0)
    frame = pd.DataFrame(x, columns=[f"x{i}" for i in range(6)]).assign(kind=[f"k{v}" for v in label])
    frame.to_csv("blobs.csv", index=False)
    run = fit(
        TABLE,
        "--data.source=csv",
        "--data.path=blobs.csv",
        "--data.target_column=kind",
        "--data.task=classification",
    )
    data, metrics = run.datamodule, run.trainer.callback_metrics
    assert data.out_features == 15
    (x, y), (x_val, y_val) = raw(data, "train"), raw(data, "val")
    hgb, _ = by_hand("classification", list(x.columns), [], y, iterations(15))
    with threadpool_limits(1):
        hgb.fit(x, y)
    assert float(metrics["val/acc_hgb"]) == pytest.approx(accuracy_score(y_val, hgb.predict(x_val)))
    assert float(metrics["val/acc_hgb"]) >= 0.7  # 1/15 by guessing
    assert float(metrics["val/acc_hgb"]) >= float(metrics["val/acc_linear"]) - 0.1


@pytest.mark.slow
def test_a_big_table_fits_them_on_a_seeded_sample_and_scores_every_validation_row(workdir: Path) -> None:
    run = fit("--model=src.models.Regressor", "--data.source=friedman", "--data.num_samples=600",
              "--baselines.max_rows=100", "--baselines.seed=3")  # fmt: skip
    data, metrics = run.datamodule, run.trainer.callback_metrics
    (x, y), (x_val, y_val) = arrays(data, "train"), arrays(data, "val")
    assert len(x) > 100
    kept = np.sort(np.random.default_rng(3).choice(len(x), 100, replace=False))
    ridge = by_hand("regression", list(x.columns), [], y[kept])[1].fit(x.iloc[kept], y[kept])
    assert float(metrics["val/rmse_linear"]) == pytest.approx(
        root_mean_squared_error(y_val, ridge.predict(x_val)), rel=1e-5
    )
    everything = by_hand("regression", list(x.columns), [], y)[1].fit(x, y)  # not the model of every row
    assert float(metrics["val/rmse_linear"]) != pytest.approx(
        root_mean_squared_error(y_val, everything.predict(x_val)), rel=1e-5
    )


def test_checkpoints_carry_the_figures_as_plain_floats(workdir: Path) -> None:
    run = fit("--data.source=spiral", "--data.num_samples=300")
    run.trainer.save_checkpoint(workdir / "run.ckpt")
    run.trainer.strategy.checkpoint_io.wait()  # the shipped plugin writes in the background
    saved = torch.load(workdir / "run.ckpt", weights_only=True)["baselines"]
    assert set(saved) == {"hgb", "linear"}
    assert {type(value) for values in saved.values() for value in values.values()} == {float}
    assert saved["hgb"]["val_acc"] == pytest.approx(float(run.trainer.callback_metrics["val/acc_hgb"]))
    assert set(saved["linear"]) == {"val_acc", "val_f1", "val_loss"}  # no test figures before a test


def test_one_switch_turns_them_off(workdir: Path) -> None:
    words = ["fit", "--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=200", *EPOCHS[:1], *QUIET]
    on = main(words)
    off = main([*words, "--baselines=null"])
    assert any(isinstance(c, Baselines) for c in on.trainer.callbacks)  # on in defaults.yaml
    assert "val/acc_hgb" in on.trainer.callback_metrics
    assert not any(isinstance(c, Baselines) for c in off.trainer.callbacks)
    assert not [key for key in off.trainer.callback_metrics if TAG.fullmatch(key)]


def test_a_net_far_behind_gets_one_sentence_and_a_level_one_no_advice(workdir: Path, caplog) -> None:
    # spirals after one epoch: boosting is near perfect, the net is not
    words = ["--data.source=spiral", "--data.num_samples=300", "--trainer.max_epochs=1"]
    with caplog.at_level(logging.INFO):
        run = fit(*words)
    said = [r.getMessage() for r in caplog.records if "trails" in r.getMessage()]
    assert len(said) == 1
    net = max(float(run.trainer.callback_metrics["val/acc"]), 0)
    hgb = float(run.trainer.callback_metrics["val/acc_hgb"])
    assert said[0].startswith(f"The net's best val/acc {net:.4g} trails HistGradientBoosting's {hgb:.4g}")
    # and the budget they had: a one-epoch fit's 10 trees, of three classes' three a round: the least, 5
    baselines = next(c for c in run.trainer.callbacks if isinstance(c, Baselines))
    assert said[0].endswith(f"boosting ran 5 of at most 5 iterations at learning rate 0.3, on 1 thread, "
                            f"{baselines.seconds:.1f} s beside the training.)")  # fmt: skip
    caplog.clear()
    with caplog.at_level(logging.INFO):
        fit(*words, "--baselines.margin=0.99")  # a shortfall within the margin counts as level
    assert not [r for r in caplog.records if "trails" in r.getMessage()]
    [level] = [r.getMessage() for r in caplog.records if "is level with" in r.getMessage()]
    assert "Baselines' budget: boosting ran 5 of at most 5 iterations" in level


def test_a_module_level_with_the_baseline_is_told_no_advice() -> None:
    baselines = Baselines(margin=0.01)
    baselines.scores = {"hgb": {"val_rmse": 2.0}, "linear": {"val_rmse": 3.0}}
    baselines._data = type("Data", (), {"task": "regression"})()  # type: ignore[assignment]
    baselines._net_best = 2.019  # within 1 % of the better RMSE: level
    assert baselines.verdict().startswith(
        "The net's best val/rmse 2.019 is level with HistGradientBoosting's 2. "
    )
    baselines._net_best = 1.9
    assert baselines.verdict().startswith(
        "The net's best val/rmse 1.9 is ahead of HistGradientBoosting's 2. "
    )
    baselines._net_best = 2.03
    assert "(1.5% behind): try more rows" in baselines.verdict()


def test_data_that_is_not_a_table_gets_one_line_and_no_baselines(tmp_path: Path, caplog) -> None:
    baselines = Baselines()
    trainer = L.Trainer(
        max_epochs=1, limit_train_batches=2, limit_val_batches=2, callbacks=[baselines], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp_path,
    )  # fmt: skip
    with caplog.at_level(logging.INFO):
        trainer.fit(BoringModel(), datamodule=BoringDataModule())
        trainer.validate(BoringModel(), datamodule=BoringDataModule())
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Baselines")]
    assert said == [  # once for the run, however many stages start
        "Baselines fit on the raw rows of each split (a DataModule with task, out_features and raw_split); "
        "BoringDataModule offers none, so this run has no baselines."
    ]
    assert baselines.models == {}
    assert baselines.scores == {}
    assert not [key for key in trainer.callback_metrics if TAG.fullmatch(key)]


# -- a table of K targets at once: K labels of 0 or 1, or K values ------------------------------------------


class RowsOfTargets(ManyTargets):
    """The user's K-target DataModule (tests/helpers.py) offering its rows raw, as
    :class:`~src.extras.baselines.callback.RawSplits` reads them: K target columns, numbers as they are."""

    @property
    def task(self) -> str:
        return "classification" if self.kind == "labels" else "regression"

    def raw_split(self, split: str) -> tuple[pd.DataFrame, np.ndarray]:
        rows = {"train": self.train_rows, "val": self.val_rows}.get(split, slice(0, 0))
        columns = [f"x{j}" for j in range(self.in_features)]
        return pd.DataFrame(self.x[rows].numpy().astype(np.float64), columns=columns), self.y[rows].numpy()


@pytest.mark.parametrize("kind", ["labels", "values"])
def test_k_targets_get_scikit_learns_multi_output_baselines_scored_as_the_task_scores_itself(
    tmp_path: Path, kind: Literal["labels", "values"]
) -> None:
    model, _ = many_targets(kind)
    data = RowsOfTargets(kind)
    assert isinstance(data, callback_module.RawSplits)
    baselines = Baselines(fit_in="thread")
    trainer = L.Trainer(
        max_epochs=2, callbacks=[baselines], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(model, datamodule=data)
    metrics = trainer.callback_metrics
    x, y = data.x.numpy().astype(np.float64), data.y.numpy()
    (x_train, y_train), (x_val, y_val) = (
        (x[data.train_rows], y[data.train_rows]),
        (x[data.val_rows], y[data.val_rows]),
    )
    if kind == "labels":
        hgb = MultiOutputClassifier(
            HistGradientBoostingClassifier(
                max_iter=iterations(3),
                learning_rate=STEP,
                early_stopping=stops_early(y_train),
                random_state=0,
            )
        )
        linear = make_pipeline(
            SimpleImputer(strategy="median", add_indicator=True), StandardScaler(),
            MultiOutputClassifier(LogisticRegression(max_iter=1000)),
        )  # fmt: skip
        with threadpool_limits(1):
            labels = hgb.fit(x_train, y_train.astype(int)).predict(x_val)
            probs = np.stack(
                [p[:, 1] for p in linear.fit(x_train, y_train.astype(int)).predict_proba(x_val)], 1
            )
        # each label's accuracy, averaged over the K labels: the net's own MultilabelAccuracy
        assert float(metrics["val/acc_hgb"]) == pytest.approx((labels == y_val).mean())
        assert float(metrics["val/f1_linear"]) == pytest.approx(
            f1_score(y_val, probs > 0.5, average="macro"), abs=1e-6
        )
        bce = -(y_val * np.log(probs) + (1 - y_val) * np.log(1 - probs)).mean()
        assert float(metrics["val/loss_linear"]) == pytest.approx(bce, rel=1e-5)  # the task's own loss
        assert 0.5 < float(metrics["val/acc_linear"]) < 1  # the labels are learnable, not learnt whole
    else:
        hgb = MultiOutputRegressor(
            HistGradientBoostingRegressor(
                max_iter=iterations(3),
                learning_rate=STEP,
                early_stopping=stops_early(y_train, "regression"),
                random_state=0,
            )
        )
        linear = make_pipeline(
            SimpleImputer(strategy="median", add_indicator=True), StandardScaler(), Ridge()
        )
        with threadpool_limits(1):
            values = hgb.fit(x_train, y_train).predict(x_val)
            lines = linear.fit(x_train, y_train).predict(x_val)
        assert float(metrics["val/mae_hgb"]) == pytest.approx(np.abs(values - y_val).mean(), rel=1e-5)
        assert float(metrics["val/r2_linear"]) == pytest.approx(
            r2_score(y_val, lines), abs=1e-5
        )  # K averaged
        assert float(metrics["val/rmse_linear"]) == pytest.approx(
            np.sqrt(((lines - y_val) ** 2).mean()), rel=1e-5
        )
        assert "val/loss_hgb" not in metrics


# -- the defaults that fit the data they get ------------------------------------------------------------


def test_a_small_table_repeats_its_rows_to_fill_the_minimum_of_batches() -> None:
    data = TabularDataModule(source="spiral", num_samples=100, batch_size=16, min_batches_per_epoch=8)
    x, _ = tuple(
        t.numpy() for t in data.dataset("train").tensors
    )  # each row once: what the baselines and the statistics see
    n = len(x)  # 69 of the 100
    batches = list(data.train_dataloader())
    assert len(batches) >= 8
    seen = torch.cat([b[0] for b in batches])
    # every training row equally often (ceil(8 * 16 / 69) = 2 passes)
    rows, counts = torch.unique(seen, dim=0, return_counts=True)
    assert len(rows) == n
    assert set(counts.tolist()) == {math.ceil(8 * 16 / n)} == {2}
    one_pass = TabularDataModule(source="spiral", num_samples=100, batch_size=16, min_batches_per_epoch=None)
    assert len(one_pass.train_dataloader()) == math.ceil(n / 16) == 5
    large = TabularDataModule(source="spiral", num_samples=1000, batch_size=16, min_batches_per_epoch=8)
    assert len(large.dataset("train")) == len(large.dataset("train").tensors[0])  # enough batches: one pass


def test_refit_trains_on_the_validation_rows_too_and_leaves_the_test_rows_alone() -> None:
    plain = TabularDataModule(source="spiral", num_samples=200).split_rows
    refit = TabularDataModule(
        source="spiral", num_samples=200, split=Split(train_on_validation=True)
    ).split_rows
    np.testing.assert_array_equal(refit["train"], np.sort(np.concatenate([plain["train"], plain["val"]])))
    np.testing.assert_array_equal(refit["val"], plain["val"])
    np.testing.assert_array_equal(refit["test"], plain["test"])


# -- beside the training ------------------------------------------------------------------------------


class Stepped(Callback):
    """Says when the training has taken a step."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def on_train_batch_end(self, *args, **kwargs) -> None:
        self.event.set()


@pytest.mark.slow
def test_they_fit_on_a_thread_of_their_own_while_the_training_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A baseline's fit that waits until the net has taken a training step: it can only end if the
    training goes on meanwhile (fitted on the training thread, before the training, it would wait out its
    timeout)."""
    built, stepped = fitting.build_models, Stepped()
    seen: list[tuple[str, bool]] = []  # in a thread of this process, where the patch below reaches

    def waiting(*args, **kwargs):
        models = built(*args, **kwargs)
        fit = models["linear"].fit

        def fit_after_a_step(*fit_args, **fit_kwargs):
            seen.append((threading.current_thread().name, stepped.event.wait(timeout=60)))
            return fit(*fit_args, **fit_kwargs)

        models["linear"].fit = fit_after_a_step
        return models

    monkeypatch.setattr(fitting, "build_models", waiting)
    data = TabularDataModule(source="spiral", num_samples=300)
    model = Classifier(in_features=data.in_features, out_features=data.out_features)
    trainer = L.Trainer(
        max_epochs=2, callbacks=[Baselines(fit_in="thread"), stepped], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(model, datamodule=data)
    [(thread, took_a_step)] = seen
    assert thread != threading.main_thread().name
    assert took_a_step  # the training took a step while the baselines were being fitted
    # and their figures were there when first logged, at the first validation's end
    assert "val/acc_linear" in trainer.callback_metrics


class Seen(Callback):
    """Whether each validation epoch's values held ``val/acc_linear``; lets the baselines' fit go on once
    epoch ``release_at``'s validation has ended."""

    def __init__(self, release_at: int, stop: bool = False) -> None:
        self.release_at, self.stop = release_at, stop
        self.released = threading.Event()
        self.epochs: dict[int, bool] = {}

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.epochs[trainer.current_epoch] = "val/acc_linear" in trainer.callback_metrics
            if trainer.current_epoch == self.release_at:
                self.released.set()
                trainer.should_stop = self.stop  # as early stopping ends a fit


def late(monkeypatch: pytest.MonkeyPatch, seen: Seen) -> None:
    """Baselines whose linear model fits only once ``seen`` releases it."""
    built = fitting.build_models

    def waiting(*args, **kwargs):
        models = built(*args, **kwargs)
        fit = models["linear"].fit

        def fit_later(*fit_args, **fit_kwargs):
            seen.released.wait(timeout=60)
            return fit(*fit_args, **fit_kwargs)

        models["linear"].fit = fit_later
        return models

    monkeypatch.setattr(fitting, "build_models", waiting)


def late_fit(tmp_path: Path, seen: Seen, logger: Any = False) -> L.Trainer:
    data = TabularDataModule(source="spiral", num_samples=300)
    model = Classifier(in_features=data.in_features, out_features=data.out_features)
    trainer = L.Trainer(
        max_epochs=4, callbacks=[Baselines(fit_in="thread"), seen], logger=logger, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(model, datamodule=data)
    return trainer


@pytest.mark.slow
def test_the_training_never_waits_for_them_but_at_its_last_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A baseline's fit that ends only after the net's second validation: logged from then on, and waited
    for at the last epoch of the cap; a training that waited for it at the first validation would wait out
    the timeout, and log it there."""
    seen = Seen(release_at=1)
    late(monkeypatch, seen)
    late_fit(tmp_path, seen)
    assert [seen.epochs[0], seen.epochs[1]] == [False, False]  # the training went on without them
    assert seen.epochs[3] is True  # the cap's last epoch waited for them


def test_a_fit_that_stops_before_they_are_in_still_writes_them_to_its_logger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = Seen(release_at=1, stop=True)
    late(monkeypatch, seen)
    trainer = late_fit(tmp_path, seen, CSVLogger(tmp_path))
    assert seen.epochs == {0: False, 1: False}  # stopped after epoch 1, before they were logged
    written = pd.read_csv(Path(trainer.logger.log_dir) / "metrics.csv")
    [value] = written["val/acc_linear"].dropna()
    assert written.loc[written["val/acc_linear"].notna(), "step"].item() == trainer.global_step
    [baselines] = [c for c in trainer.callbacks if isinstance(c, Baselines)]
    assert value == pytest.approx(baselines.scores["linear"]["val_acc"])


@pytest.mark.slow
def test_in_a_process_of_their_own_they_score_as_in_a_thread(tmp_path: Path) -> None:
    """A worker process (which boosting's Python shares no interpreter lock with) and the shipped way, a
    thread of the training's process, give the very same figures."""
    scores = {}
    for fit_in in ("process", "thread"):
        baselines = Baselines(fit_in=fit_in)
        data = TabularDataModule(source="penguins")
        model = Classifier(in_features=data.in_features, out_features=data.out_features)
        trainer = L.Trainer(
            max_epochs=1, callbacks=[baselines], logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
        )  # fmt: skip
        trainer.fit(model, datamodule=data)
        trainer.test(model, datamodule=data, verbose=False)
        assert (baselines.fitted_by != os.getpid()) is (fit_in == "process")
        scores[fit_in] = baselines.scores
    assert scores["process"] == scores["thread"]
    assert {"val_acc", "test_acc", "val_loss"} <= set(scores["process"]["hgb"])


def test_a_worker_process_killed_costs_the_baselines_not_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def killed(*args: Any) -> Future:
        future: Future = Future()
        future.set_exception(BrokenProcessPool("a worker process was killed (SIGKILL)"))
        return future

    monkeypatch.setattr(callback_module, "_submit", killed)
    data = TabularDataModule(source="spiral", num_samples=300)
    model = Classifier(in_features=data.in_features, out_features=data.out_features)
    trainer = L.Trainer(
        max_epochs=2, callbacks=[Baselines()], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    with pytest.warns(UserWarning, match="worker process ended before it answered"):
        trainer.fit(model, datamodule=data)
    assert trainer.current_epoch == 2  # the run went on to its end
    assert not [key for key in trainer.callback_metrics if TAG.fullmatch(key)]
    assert "val/acc" in trainer.callback_metrics


def test_auto_fits_a_few_epochs_budget_on_a_thread_and_a_longer_one_in_a_process(workdir: Path) -> None:
    """``fit_in: auto`` (the shipped default) decides by the budget: a one-epoch fit's 5 iterations of the
    ten digits' 10 trees each on a thread of the training's process, 11 epochs' 11 (110 trees) in a worker
    process, which is shut down at the fit's end; the verdict says which."""
    where = {}
    for epochs in (1, 11):
        run = fit(f"--trainer.max_epochs={epochs}", "--trainer.limit_train_batches=2")
        baselines = next(c for c in run.trainer.callbacks if isinstance(c, Baselines))
        assert baselines.fit_in == "auto"
        assert baselines.budget_iterations == max(epochs, 5)
        where[epochs] = baselines.fitted_in, baselines.fitted_by != os.getpid()
        assert ("in a process of their own" in (baselines.verdict() or "")) is (epochs == 11)
    assert where == {1: ("thread", False), 11: ("process", True)}
    assert not callback_module.workers.running("baselines")  # its worker shut down at the fit's end


@pytest.mark.parametrize(
    ("epochs", "trees", "budget", "step"),
    [
        (1, 1, 10, 0.3),  # a value or two classes: 10 iterations an epoch
        (10, 1, 100, 0.1),  # ... scikit-learn's 100 at 0.1 from 10 epochs on
        (60, 1, 100, 0.1),  # at most max_iter
        (1, 10, 5, 0.3),  # ten classes, one epoch: 10 trees, the least 5 iterations
        (30, 10, 30, 0.3),  # 300 trees: 30 iterations, in steps of at most 0.3
        (60, 10, 60, 10 / 60),  # make train's digits: the steps of 100 at 0.1 in 60
        (60, 15, 40, 0.25),
    ],
)
def test_the_budget_counts_the_trees_a_fit_affords_and_steps_to_fit_it(
    epochs: int, trees: int, budget: int, step: float
) -> None:
    """The budget is trees per epoch (10), an iteration of K classes growing K of them; fewer iterations than
    scikit-learn's 100 take the same way in larger steps, at most 0.3."""
    trainer = L.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False)
    trainer.state.fn = TrainerFn.FITTING
    assert Baselines().budget(trainer, trees) == budget
    assert fitting.learning_rate(budget) == pytest.approx(step)
    trainer.state.fn = TrainerFn.TESTING  # a test keeps pace with no fit: scikit-learn's own budget
    assert Baselines().budget(trainer, trees) == 100
