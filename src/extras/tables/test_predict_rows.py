"""From a messy file to predictions you can trust: a checkpoint alone predicts on new rows as the run did."""

import logging
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from src.cli import main
from src.errors import UserInputError
from src.extras.tables.preprocessing import (
    CategoricalColumn,
    CellReport,
    Location,
    NumericColumn,
    Preprocessor,
)
from src.predict import Predictor
from tests.conftest import PLANTED, QUIET
from tests.test_predict import lines_name_their_rows


@pytest.fixture
def table_run(messy_trained):
    """The shared fit on a messy CSV (tests/conftest.py): its CLI run, its folder and the raw frame."""
    run = messy_trained.run
    return run, Path(run.trainer.log_dir).parents[2], messy_trained.frame


def in_run_probabilities(run, x: torch.Tensor) -> np.ndarray:
    """What the trained model of the run itself gives for encoded rows (in eval mode, without a graph)."""
    run.model.eval()
    with torch.inference_mode():
        return run.model(x).softmax(-1).numpy()


def test_a_messy_csv_trains_end_to_end(table_run) -> None:
    run, _, _ = table_run
    assert run.trainer.state.finished
    assert np.isfinite(run.trainer.callback_metrics["train/loss"].item())
    assert run.datamodule.label_names == ["high", "low", "mid"]
    assert run.model.hparams.in_features == len(run.datamodule.preprocessor.feature_names)


def test_a_moved_checkpoint_predicts_a_new_file_as_the_run_did(
    table_run, tmp_path: Path, monkeypatch, capsys
):
    run, folder, frame = table_run
    # the checkpoint alone, in another folder, with the training file gone
    moved = tmp_path / "elsewhere" / "model.ckpt"
    moved.parent.mkdir()
    shutil.copy(Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt", moved)
    training_file = tmp_path / "gone.csv"
    shutil.move(folder / "train.csv", training_file)
    try:
        # new rows without the target, columns in another order, one column the model never saw
        rows = frame.iloc[run.datamodule.split_rows["val"]].drop(columns="label")
        new = rows[rows.columns[::-1]].assign(notes="ignored").reset_index(drop=True)
        new.to_csv(tmp_path / "new.csv", index=False)
        monkeypatch.chdir(tmp_path)
        monkeypatch.setattr(sys, "argv", ["src.cli"])
        main(
            ["predict", "--ckpt_path", str(moved), "--data.predict_path=new.csv", "--output=out.csv", *QUIET]
        )
    finally:
        shutil.move(training_file, folder / "train.csv")
    assert f"Predictions for {len(new)} rows written to out.csv" in capsys.readouterr().out
    written = pd.read_csv(tmp_path / "out.csv")
    labels = ["high", "low", "mid"]
    assert list(written.columns) == ["row", "prediction", *(f"probability({label})" for label in labels)]
    assert written["row"].tolist() == list(range(len(new)))  # every row, in order
    expected = in_run_probabilities(run, run.datamodule.dataset("val").tensors[0])
    probabilities = written[[f"probability({label})" for label in labels]].to_numpy(np.float32)
    torch.testing.assert_close(torch.from_numpy(probabilities), torch.from_numpy(expected))
    assert written["prediction"].tolist() == [labels[k] for k in expected.argmax(1)]
    # the Python API is the same path: the same table from the same checkpoint
    api = Predictor.from_checkpoint(moved).predict(pd.read_csv(tmp_path / "new.csv"))
    pd.testing.assert_frame_equal(api, written, check_dtype=False, rtol=1e-6)


@pytest.mark.slow
def test_each_predicted_line_is_the_row_it_names(table_run, tmp_path: Path, monkeypatch) -> None:
    """Without a file to predict: the validation rows, each line checked against its own source row."""
    run, folder, frame = table_run
    best = run.trainer.checkpoint_callback.best_model_path
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "argv", ["src.cli"])
    predict = main(["predict", "--ckpt_path", best, f"--output={tmp_path / 'val.csv'}", *QUIET])
    written = pd.read_csv(tmp_path / "val.csv")
    assert sorted(written["row"]) == sorted(run.datamodule.split_rows["val"].tolist())
    assert not set(written["row"]) & set(predict.datamodule.split_rows["test"].tolist())
    lines_name_their_rows(written, frame.drop(columns="label"), Predictor.from_checkpoint(best))


@pytest.mark.slow
def test_test_needs_only_the_checkpoint(table_run, monkeypatch) -> None:
    run, folder, _ = table_run
    best = run.trainer.checkpoint_callback.best_model_path
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "argv", ["src.cli"])
    alone = main(["test", "--ckpt_path", best, *QUIET]).trainer.callback_metrics
    configured = main(
        ["test", "--config", str(Path(run.trainer.log_dir) / "config.yaml"), "--ckpt_path", best, *QUIET]
    ).trainer.callback_metrics
    assert alone.keys() == configured.keys() >= {"test/acc", "test/loss"}
    for key in alone:
        torch.testing.assert_close(alone[key], configured[key], rtol=0, atol=0)


def test_a_checkpoint_from_before_several_targets_predicts_as_it_did(table_run, tmp_path: Path) -> None:
    """One target, as every checkpoint was before ``target_names``: the model's hyperparameters lack it,
    and the preprocessing names one target column with its classes."""
    run, _, frame = table_run
    last = Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["hyper_parameters"].pop("target_names") is None
    preprocessing = checkpoint["TabularDataModule"]["preprocessing"]
    assert (preprocessing["target"], preprocessing["labels"]) == ("label", ["high", "low", "mid"])
    torch.save(checkpoint, tmp_path / "before.ckpt")
    rows = frame.iloc[run.datamodule.split_rows["val"]].drop(columns="label")
    before = Predictor.from_checkpoint(tmp_path / "before.ckpt")
    assert before.model.hparams["target_names"] is None
    pd.testing.assert_frame_equal(before.predict(rows), Predictor.from_checkpoint(last).predict(rows))


def test_unseen_categories_and_empty_cells_predict(table_run) -> None:
    run, _, _ = table_run
    predictor = Predictor.from_checkpoint(run.trainer.checkpoint_callback.best_model_path)
    new = pd.DataFrame(
        {
            "income": [None, 61.0],
            "region": ["atlantis", None],
            "member": ["maybe", "yes"],
            "age": ["?", None],
            "verified": [None, True],
            "city": ["nowhere", "city3"],
        }
    )
    out = predictor.predict(new)
    probabilities = out.filter(like="probability(").to_numpy()
    np.testing.assert_allclose(probabilities.sum(1), 1.0, rtol=1e-5)
    assert set(out["prediction"]) <= {"high", "low", "mid"}


def test_a_missing_column_is_one_sentence(table_run, tmp_path: Path, monkeypatch, capsys) -> None:
    run, _, frame = table_run
    frame.drop(columns=["label", "region", "age"]).head(5).to_csv(tmp_path / "partial.csv", index=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["src.cli"])
    best = run.trainer.checkpoint_callback.best_model_path
    with pytest.raises(SystemExit) as exit_:
        main(["predict", "--ckpt_path", best, "--data.predict_path=partial.csv", "--output=out.csv", *QUIET])
    assert exit_.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: CSV file 'partial.csv' has no column(s) ['age', 'region'], which the model was trained on; "
        "add them (empty cells are fine)."
    ]
    assert not (tmp_path / "out.csv").exists()


def test_the_checkpoint_is_plain_data_and_self_contained(table_run) -> None:
    run, _, _ = table_run
    checkpoint = torch.load(run.trainer.checkpoint_callback.best_model_path, weights_only=True)
    state = checkpoint["TabularDataModule"]["preprocessing"]
    assert state["labels"] == ["high", "low", "mid"]
    assert [c["name"] for c in state["numeric"]] == ["income", "age"]
    assert checkpoint["config"]["data"]["init_args"]["target_column"] == "label"
    assert checkpoint["config"]["model"]["class_path"] == "src.models.Classifier"


def test_a_checkpoint_does_not_choose_what_code_to_import(table_run, planted: Path, tmp_path: Path) -> None:
    run, _, _ = table_run
    checkpoint = torch.load(run.trainer.checkpoint_callback.best_model_path, weights_only=True)
    checkpoint["hyper_parameters"]["_class_path"] = f"{PLANTED}.Model"  # importable from here
    torch.save(checkpoint, tmp_path / "foreign.ckpt")
    with pytest.raises(
        UserInputError,
        match=rf"names '{PLANTED}.Model' \(at hyper_parameters._class_path\), code outside this project",
    ):
        Predictor.from_checkpoint(tmp_path / "foreign.ckpt")
    assert PLANTED not in sys.modules
    assert not planted.exists()
    # a module that cannot be imported from here is refused too, and nothing is imported
    checkpoint["hyper_parameters"]["_class_path"] = "planted_module_that_must_not_load.Model"
    torch.save(checkpoint, tmp_path / "foreign.ckpt")
    with pytest.raises(UserInputError):
        Predictor.from_checkpoint(tmp_path / "foreign.ckpt")
    assert "planted_module_that_must_not_load" not in sys.modules


def test_text_and_numbers_beyond_float32_in_a_numeric_column_read_as_missing_in_one_notice(caplog) -> None:
    """The one cell rule: never fatal for one cell, counted per column, one warning for the call."""
    prep = Preprocessor(
        "regression",
        "y",
        [NumericColumn("income", 7.0, 1.0, 2.0, True)],
        [CategoricalColumn("region", ["north"], False), CategoricalColumn("city", ["a"], True)],
    )
    rows = pd.DataFrame(
        {
            "income": [3.0, "lots", 1e39, None, float("-inf"), "5"],
            "region": ["north", "atlantis", None, " north ", "", "south"],
            "city": ["a", "b", "a", "a", "a", "a"],
        }
    )
    with caplog.at_level(logging.WARNING, logger="src.extras.tables.preprocessing"):
        x = prep.transform(rows, Location("the request"))
    filled = (7.0 - 1.0) / 2.0
    np.testing.assert_array_equal(x[:, 0], [1.0, filled, filled, filled, filled, 2.0])
    np.testing.assert_array_equal(x[:, 1], [0, 1, 1, 1, 1, 0])  # the indicator: missing, whatever the cause
    np.testing.assert_array_equal(x[:, 2], [1, 0, 0, 1, 0, 0])  # an unseen region: no category at all
    np.testing.assert_array_equal(x[:, 4], [0, 1, 0, 0, 0, 0])  # an unseen city: its (other) column
    [record] = caplog.records
    assert record.getMessage().startswith(
        "the request: 'income': 3 cell(s) read as missing (e.g. 'lots'); 'region': 4 cell(s) read as no "
        "category (e.g. 'atlantis'); 'city': 1 cell(s) read as (other) (e.g. 'b') ("
    )
    caplog.clear()
    report = CellReport()  # asked for: counted there, not logged
    np.testing.assert_array_equal(prep.transform(rows, Location("the request"), report=report), x)
    assert not caplog.records
    assert report.as_json()["income"] == {"count": 3, "example": "lots", "read_as": "missing"}
