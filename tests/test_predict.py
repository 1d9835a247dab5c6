"""From a messy file to predictions you can trust: a checkpoint alone predicts on new rows as the run did."""

import logging
import shutil
import sys
import warnings
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
from src.files import check_output
from src.predict import Predictor
from tests.conftest import PLANTED, QUIET, fit_in

TINY = ["--trainer.max_epochs=3", "--trainer.limit_val_batches=2"]


@pytest.fixture
def trained(messy_trained):
    """The shared fit on a messy CSV (tests/conftest.py): its CLI run, its folder and the raw frame."""
    run = messy_trained.run
    return run, Path(run.trainer.log_dir).parents[2], messy_trained.frame


def in_run_probabilities(run, x: torch.Tensor) -> np.ndarray:
    """What the trained model of the run itself gives for encoded rows (in eval mode, without a graph)."""
    run.model.eval()
    with torch.inference_mode():
        return run.model(x).softmax(-1).numpy()


def test_a_messy_csv_trains_end_to_end(trained) -> None:
    run, _, _ = trained
    assert run.trainer.state.finished
    assert np.isfinite(run.trainer.callback_metrics["train/loss"].item())
    assert run.datamodule.label_names == ["high", "low", "mid"]
    assert run.model.hparams.in_features == len(run.datamodule.preprocessor.feature_names)


def test_a_moved_checkpoint_predicts_a_new_file_as_the_run_did(trained, tmp_path: Path, monkeypatch, capsys):
    run, folder, frame = trained
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
def test_each_predicted_line_is_the_row_it_names(trained, tmp_path: Path, monkeypatch) -> None:
    """Without a file to predict: the validation rows, each line checked against its own source row."""
    run, folder, frame = trained
    best = run.trainer.checkpoint_callback.best_model_path
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "argv", ["src.cli"])
    predict = main(["predict", "--ckpt_path", best, f"--output={tmp_path / 'val.csv'}", *QUIET])
    written = pd.read_csv(tmp_path / "val.csv")
    assert sorted(written["row"]) == sorted(run.datamodule.split_rows["val"].tolist())
    assert not set(written["row"]) & set(predict.datamodule.split_rows["test"].tolist())
    lines_name_their_rows(written, frame.drop(columns="label"), Predictor.from_checkpoint(best))


def lines_name_their_rows(written: pd.DataFrame, source: pd.DataFrame, predictor: Predictor) -> None:
    """Each line holds the prediction of the source row its ``row`` names, predicted alone."""
    probability_columns = [c for c in written.columns if c.startswith("probability(")]
    for _, line in written.sample(min(8, len(written)), random_state=0).iterrows():
        alone = predictor.predict(source.loc[[int(line["row"])]])
        expected = alone[probability_columns].to_numpy()[0]
        np.testing.assert_allclose(line[probability_columns].to_numpy(np.float64), expected, rtol=1e-5)
        assert line["prediction"] == alone["prediction"].iloc[0]


@pytest.mark.slow
def test_test_needs_only_the_checkpoint(trained, monkeypatch) -> None:
    run, folder, _ = trained
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


def test_unseen_categories_and_empty_cells_predict(trained) -> None:
    run, _, _ = trained
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


def test_a_missing_column_is_one_sentence(trained, tmp_path: Path, monkeypatch, capsys) -> None:
    run, _, frame = trained
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


def test_the_checkpoint_is_plain_data_and_self_contained(trained) -> None:
    run, _, _ = trained
    checkpoint = torch.load(run.trainer.checkpoint_callback.best_model_path, weights_only=True)
    state = checkpoint["TabularDataModule"]["preprocessing"]
    assert state["labels"] == ["high", "low", "mid"]
    assert [c["name"] for c in state["numeric"]] == ["income", "age"]
    assert checkpoint["config"]["data"]["init_args"]["target_column"] == "label"
    assert checkpoint["config"]["model"]["class_path"] == "src.models.Classifier"


@pytest.mark.slow
def test_regression_predictions_are_in_the_targets_units(cli) -> None:
    run = cli("fit", "--config", "friedman.yaml", "--data.num_samples=400", *TINY)
    dm = run.datamodule
    predictor = Predictor.from_checkpoint(Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt")
    out = predictor.predict(dm.predict_frame)  # the validation rows' feature columns
    assert list(out.columns) == ["row", "prediction"]
    run.model.eval()
    with torch.inference_mode():
        expected = run.model.predict_step((dm.dataset("val").tensors[0],), 0)["preds"]
    torch.testing.assert_close(torch.tensor(out["prediction"].to_numpy(), dtype=torch.float32), expected)
    assert out["row"].tolist() == dm.predict_frame.index.tolist()


def test_a_checkpoint_does_not_choose_what_code_to_import(trained, planted: Path, tmp_path: Path) -> None:
    run, _, _ = trained
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


def test_the_confusion_matrix_names_the_classes(trained) -> None:
    pytest.importorskip("src.extras.figures")  # draws the matrix
    dashboard = pytest.importorskip("src.extras.dashboard.test_dashboard")
    Run, parse_counts, read_events = dashboard.Run, dashboard.parse_counts, dashboard.read_events
    run, _, _ = trained
    log_dir = Path(run.trainer.log_dir)
    texts = Run(run, log_dir, read_events(log_dir)).texts("val/confusion_counts")
    header = texts[-1][1].splitlines()[0]
    assert header == "| true \\ predicted | high | low | mid |"
    counts = parse_counts(texts[-1][1])
    assert counts.sum() == len(run.datamodule.split_rows["val"])


@pytest.mark.parametrize("subcommand", ["fit", "validate", "test", "predict"])
def test_a_checkpoint_url_is_refused_before_anything_loads(subcommand: str, cli, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli(subcommand, "--config", "spiral.yaml", "--ckpt_path", "http://127.0.0.1:9/model.ckpt")
    assert exit_.value.code == 2
    assert "checkpoint 'http://127.0.0.1:9/model.ckpt' is a URL; download it" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["hyperparameters", "hyperparameters-and-settings"])
def test_the_cli_does_not_import_a_class_a_checkpoint_names(
    trained, planted: Path, tmp_path: Path, capsys, where: str
) -> None:
    run, _, _ = trained
    checkpoint = torch.load(run.trainer.checkpoint_callback.best_model_path, weights_only=True)
    checkpoint["hyper_parameters"]["_class_path"] = f"{PLANTED}.Model"  # importable from here
    if where == "hyperparameters-and-settings":
        checkpoint["config"]["model"]["class_path"] = f"{PLANTED}.Model"
    torch.save(checkpoint, tmp_path / "foreign.ckpt")
    with pytest.raises(SystemExit) as exit_:
        main(["test", "--ckpt_path", str(tmp_path / "foreign.ckpt"), *QUIET])
    assert exit_.value.code == 2
    assert (
        f"names '{PLANTED}.Model' (at hyper_parameters._class_path), code outside this "
        "project that is not imported on a checkpoint's word" in capsys.readouterr().err
    )
    assert PLANTED not in sys.modules
    assert not planted.exists()
    # a module that cannot be imported from here is refused too, and nothing is imported
    checkpoint["hyper_parameters"]["_class_path"] = "planted_module_for_the_cli.Model"
    if where == "hyperparameters-and-settings":
        checkpoint["config"]["model"]["class_path"] = "planted_module_for_the_cli.Model"
    torch.save(checkpoint, tmp_path / "foreign.ckpt")
    with pytest.raises(SystemExit) as exit_:
        main(["test", "--ckpt_path", str(tmp_path / "foreign.ckpt"), *QUIET])
    assert exit_.value.code == 2
    assert "planted_module_for_the_cli" not in sys.modules


def test_predicting_a_moved_checkpoint_under_the_trainer_says_nothing_of_its_old_folder(
    trained, tmp_path: Path, monkeypatch
) -> None:
    """The checkpoint callbacks' state is restored in any evaluation, and Lightning says their folder moved;
    only a fit acts on that state."""
    run, _, frame = trained
    moved = tmp_path / "model.ckpt"
    shutil.copy(Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt", moved)
    frame.drop(columns="label").head(8).to_csv(tmp_path / "new.csv", index=False)
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(["predict", "--ckpt_path", str(moved), "--data.predict_path=new.csv", "--output=o.csv", *QUIET])
    assert (tmp_path / "o.csv").is_file()
    assert not [w for w in caught if "dirpath has changed" in str(w.message)]


# -- where predict may write -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def image_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short fit on tiny generated PNG files: its last checkpoint."""
    from src.extras.images.test_images import tiny, write_images

    folder = tmp_path_factory.mktemp("image-run")
    last = ["--last_checkpoint=src.callbacks.LatestCheckpoint"]
    fit_in(folder, *tiny(write_images(folder / "train")), *last)
    return next(folder.rglob("last.ckpt"))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["--output", "the prediction writer's output_path"])
@pytest.mark.parametrize(
    "target",
    ["an image in it", "an image in a sub-folder", "a new file in it", "a hard link to an image in it"],
)
def test_no_output_lands_inside_a_folder_predict_reads_even_when_overwriting(
    image_checkpoint: Path, workdir: Path, capsys, target: str, how: str
) -> None:
    from src.extras.images.test_images import write_images

    folder = write_images(workdir / "imgs" / "a", per_class=2)
    output = {
        "an image in it": folder / "cat" / "000.png",
        "an image in a sub-folder": folder / "dog" / "001.png",
        "a new file in it": folder / "predictions.csv",
        "a hard link to an image in it": workdir / "linked.png",
    }[target]
    if target.startswith("a hard link"):
        output.hardlink_to(folder / "owl" / "000.png")
    before = {path: path.read_bytes() for path in workdir.rglob("*") if path.is_file()}
    option = "--output" if how == "--output" else "--prediction_writer.init_args.output_path"
    words = ["predict", "--ckpt_path", str(image_checkpoint), f"--data.predict_path={folder}"]
    overwrite = "--overwrite=true" if how == "--output" else "--prediction_writer.init_args.overwrite=true"
    with pytest.raises(SystemExit) as exit_:
        main([*words, f"{option}={output}", overwrite, *QUIET])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: --output={str(output)!r} is inside {str(folder)!r}, a folder this run reads; name a file "
        "outside it."
    )
    assert {path: path.read_bytes() for path in workdir.rglob("*") if path.is_file()} == before


def test_the_output_rule_covers_a_folder_the_run_reads_at_any_depth_and_through_links(tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    (folder / "cat" / "deeper").mkdir(parents=True)
    image = folder / "cat" / "deeper" / "000.png"
    image.write_bytes(b"an image")
    (tmp_path / "via").symlink_to(folder)
    (tmp_path / "hard.png").hardlink_to(image)
    outputs = [
        image,
        folder / "new.csv",
        tmp_path / "via" / "cat" / "000.png",  # through a link to the folder
        tmp_path / "hard.png",  # another name of a file in it
        folder / ".." / "imgs" / "cat" / "new.csv",
    ]
    for output in outputs:
        with pytest.raises(UserInputError, match=r"a folder this run reads; name a file outside it\.$"):
            check_output(output, [None, [str(tmp_path / "elsewhere.csv"), str(folder)]], overwrite=True)
    assert check_output(tmp_path / "out.csv", [str(folder)], overwrite=True) == tmp_path / "out.csv"
    assert image.read_bytes() == b"an image"
