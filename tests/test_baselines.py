"""The baselines: fitted on the very rows and encoding the net gets, scored as the task scores itself."""

import logging
import math
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.metrics import accuracy_score, f1_score, log_loss, r2_score, root_mean_squared_error
from threadpoolctl import threadpool_limits

from src.callbacks import Baselines
from src.callbacks.baselines import TAG, boosting_schedule
from src.cli import main
from src.data import TabularDataModule
from tests.conftest import BARE, CONFIGS, QUIET
from tests.test_preprocessing import messy_frame

ON = ["--baselines=src.callbacks.Baselines"]  # back after bare.yaml
EPOCHS = ["--trainer.max_epochs=2", "--trainer.logger=false", "--trainer.enable_checkpointing=false"]


def fit(*words: str):
    return main(["fit", "--config", str(CONFIGS / "digits.yaml"), *BARE, *ON, *EPOCHS, *words, *QUIET])


def rows(loader) -> tuple[np.ndarray, np.ndarray]:
    batches = list(loader)
    return (torch.cat([b[0] for b in batches]).numpy(), torch.cat([b[1] for b in batches]).numpy())


def test_classification_baselines_are_fitted_on_the_nets_rows_and_scored_as_by_hand(workdir: Path) -> None:
    messy_frame(n=240).to_csv("messy.csv", index=False)
    run = fit(
        "--data.source=csv", "--data.path=messy.csv", "--data.target_column=label",
        "--data.task=classification",
    )  # fmt: skip
    data, metrics = run.datamodule, run.trainer.callback_metrics
    x_val, y_val = data.encoded("val")
    # the arrays are the validation loader's rows, in its order: what the net was scored on
    loaded = rows(run.trainer.val_dataloaders)
    np.testing.assert_array_equal(loaded[0], x_val)
    np.testing.assert_array_equal(loaded[1], y_val)
    x, y = data.encoded("train")
    assert len(x) + len(x_val) + len(data.encoded("test")[0]) == 240
    with threadpool_limits(1):  # as the callback fits them; many times faster on shared cores
        hgb = HistGradientBoostingClassifier(max_iter=100, random_state=0).fit(x, y)
        linear = LogisticRegression(max_iter=1000).fit(x, y)
    assert float(metrics["val/acc_hgb"]) == pytest.approx(accuracy_score(y_val, hgb.predict(x_val)))
    assert float(metrics["val/f1_linear"]) == pytest.approx(
        f1_score(y_val, linear.predict(x_val), average="macro"), abs=1e-6
    )
    labels = list(range(data.out_features))
    probs = linear.predict_proba(x_val)
    assert float(metrics["val/loss_linear"]) == pytest.approx(log_loss(y_val, probs, labels=labels))
    # and it is the task's own val/loss, had the net output those log-probabilities
    own = run.model.loss(torch.log(torch.as_tensor(probs, dtype=torch.float32)), torch.as_tensor(y_val))
    assert float(metrics["val/loss_linear"]) == pytest.approx(float(own), rel=1e-5)

    run.trainer.test(run.model, datamodule=data, verbose=False)
    x_test, y_test = data.encoded("test")
    assert float(run.trainer.callback_metrics["test/acc_hgb"]) == pytest.approx(
        accuracy_score(y_test, hgb.predict(x_test))
    )


def test_regression_baselines_score_in_the_tasks_units_and_loss(workdir: Path) -> None:
    run = fit(
        "--model=src.models.Regressor", "--model.loss_fn=huber", "--data.source=friedman",
        "--data.num_samples=300",
    )  # fmt: skip
    data, metrics = run.datamodule, run.trainer.callback_metrics
    x, y = data.encoded("train")
    x_val, y_val = data.encoded("val")
    ridge = Ridge().fit(x, y)
    preds = ridge.predict(x_val)
    assert float(metrics["val/rmse_linear"]) == pytest.approx(root_mean_squared_error(y_val, preds), rel=1e-5)
    assert float(metrics["val/r2_linear"]) == pytest.approx(r2_score(y_val, preds), abs=1e-5)
    # val_loss is the Regressor's own loss (Huber on standardized targets), had the net output these
    output = (torch.as_tensor(preds, dtype=torch.float32) - run.model.target_mean) / run.model.target_std
    own = run.model.loss(output[:, None], torch.as_tensor(y_val))
    assert float(metrics["val/loss_linear"]) == pytest.approx(float(own), rel=1e-5)
    with threadpool_limits(1):
        hgb = HistGradientBoostingRegressor(max_iter=100, random_state=0).fit(x, y)
    assert float(metrics["val/mae_hgb"]) == pytest.approx(np.abs(hgb.predict(x_val) - y_val).mean(), rel=1e-5)


def test_many_classes_boost_fewer_larger_steps_and_score_as_that_model_by_hand(workdir: Path) -> None:
    run = fit()  # digits: 10 classes
    data, metrics = run.datamodule, run.trainer.callback_metrics
    assert data.out_features == 10
    x, y = data.encoded("train")
    x_val, y_val = data.encoded("val")
    # 300 trees in 30 iterations of 10, each step 100 / 30 times scikit-learn's 0.1
    with threadpool_limits(1):
        hgb = HistGradientBoostingClassifier(max_iter=30, learning_rate=1 / 3, random_state=0).fit(x, y)
    assert float(metrics["val/acc_hgb"]) == pytest.approx(accuracy_score(y_val, hgb.predict(x_val)))
    assert float(metrics["val/loss_hgb"]) == pytest.approx(
        log_loss(y_val, hgb.predict_proba(x_val), labels=list(range(10))), rel=1e-5
    )


def test_a_big_table_fits_them_on_a_seeded_sample_and_scores_every_validation_row(workdir: Path) -> None:
    run = fit("--model=src.models.Regressor", "--data.source=friedman", "--data.num_samples=600",
              "--baselines.max_rows=100", "--baselines.seed=3")  # fmt: skip
    data, metrics = run.datamodule, run.trainer.callback_metrics
    x, y = data.encoded("train")
    x_val, y_val = data.encoded("val")
    assert len(x) > 100
    kept = np.sort(np.random.default_rng(3).choice(len(x), 100, replace=False))
    ridge = Ridge().fit(x[kept], y[kept])
    assert float(metrics["val/rmse_linear"]) == pytest.approx(
        root_mean_squared_error(y_val, ridge.predict(x_val)), rel=1e-5
    )
    everything = Ridge().fit(x, y)  # and not the model of every row, which scores otherwise
    assert float(metrics["val/rmse_linear"]) != pytest.approx(
        root_mean_squared_error(y_val, everything.predict(x_val)), rel=1e-5
    )


def test_the_boosting_schedule_keeps_scikit_learns_for_few_classes_and_a_given_max_iter() -> None:
    assert boosting_schedule("regression", 1, None) == (100, 0.1)
    assert boosting_schedule("classification", 2, None) == (100, 0.1)  # binary: one tree per iteration
    assert boosting_schedule("classification", 3, None) == (100, 0.1)
    assert boosting_schedule("classification", 10, None) == (30, pytest.approx(1 / 3))
    assert boosting_schedule("classification", 100, None) == (20, pytest.approx(0.5))  # MIN_ITER
    assert boosting_schedule("classification", 10, 100) == (100, 0.1)  # as asked, at scikit-learn's rate


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


def test_a_net_far_behind_gets_one_sentence_and_a_level_one_none(workdir: Path, caplog) -> None:
    # spirals after one epoch: boosting is near perfect, the net is not
    words = ["--data.source=spiral", "--data.num_samples=300", "--trainer.max_epochs=1"]
    with caplog.at_level(logging.INFO):
        run = fit(*words)
    said = [r.getMessage() for r in caplog.records if "trails" in r.getMessage()]
    assert len(said) == 1
    net = max(float(run.trainer.callback_metrics["val/acc"]), 0)
    hgb = float(run.trainer.callback_metrics["val/acc_hgb"])
    assert said[0].startswith(f"The net's best val/acc {net:.4g} trails HistGradientBoosting's {hgb:.4g}")
    caplog.clear()
    with caplog.at_level(logging.INFO):
        fit(*words, "--baselines.margin=0.99")  # a shortfall within the margin counts as level
    assert not [r for r in caplog.records if "trails" in r.getMessage()]


def test_a_module_level_with_the_baseline_is_not_told_anything() -> None:
    baselines = Baselines(margin=0.01)
    baselines.scores = {"hgb": {"val_rmse": 2.0}, "linear": {"val_rmse": 3.0}}
    baselines._data = type("Table", (), {"task": "regression"})()  # type: ignore[assignment]
    baselines._net_best = 2.019  # within 1 % of the better RMSE: level
    assert baselines.verdict() is None
    baselines._net_best = 2.03
    assert baselines.verdict() is not None
    assert "(1.5% behind)" in baselines.verdict()


def test_data_that_is_not_a_table_gets_no_baselines(tmp_path: Path) -> None:
    baselines = Baselines()
    trainer = L.Trainer(
        max_epochs=1, limit_train_batches=2, limit_val_batches=2, callbacks=[baselines], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(BoringModel(), datamodule=BoringDataModule())
    assert baselines.models == {}
    assert baselines.scores == {}
    assert not [key for key in trainer.callback_metrics if TAG.fullmatch(key)]


# -- the defaults that fit the data they get ------------------------------------------------------------


def test_a_small_table_repeats_its_rows_to_fill_the_minimum_of_batches() -> None:
    data = TabularDataModule(source="spiral", num_samples=100, batch_size=16, min_batches_per_epoch=8)
    x, _ = data.encoded("train")  # each row once: what the baselines and the statistics see
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
    assert len(large.dataset("train")) == len(large.encoded("train")[0])  # enough batches: one pass


def test_refit_trains_on_the_validation_rows_too_and_leaves_the_test_rows_alone() -> None:
    plain = TabularDataModule(source="spiral", num_samples=200).split_rows
    refit = TabularDataModule(source="spiral", num_samples=200, train_on_validation=True).split_rows
    np.testing.assert_array_equal(refit["train"], np.sort(np.concatenate([plain["train"], plain["val"]])))
    np.testing.assert_array_equal(refit["val"], plain["val"])
    np.testing.assert_array_equal(refit["test"], plain["test"])
