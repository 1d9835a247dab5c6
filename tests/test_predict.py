"""From a messy file to predictions you can trust: a checkpoint alone predicts on new rows as the run did."""

import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from src.cli import CLI, main
from src.errors import UserInputError
from src.files import check_output
from src.predict import Predictor, prediction_frame
from tests.conftest import BARE, PLANTED, QUIET, Trained
from tests.helpers import LABEL_NAMES, MANY_LABELS, MANY_VALUES, VALUE_NAMES

TINY = ["--trainer.max_epochs=3", "--trainer.limit_val_batches=2"]


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
    run = trained.run
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
    run, frame = trained.run, trained.frame
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


def test_the_output_rule_covers_a_folder_the_run_reads_at_any_depth_and_through_links(tmp_path: Path) -> None:
    folder = tmp_path / "inputs"
    (folder / "part" / "deeper").mkdir(parents=True)
    inside = folder / "part" / "deeper" / "000.csv"
    inside.write_bytes(b"x\n1\n")
    (tmp_path / "via").symlink_to(folder)
    (tmp_path / "hard.csv").hardlink_to(inside)
    outputs = [
        inside,
        folder / "new.csv",
        tmp_path / "via" / "part" / "000.csv",  # through a link to the folder
        tmp_path / "hard.csv",  # another name of a file in it
        folder / ".." / "inputs" / "part" / "new.csv",
    ]
    for output in outputs:
        with pytest.raises(UserInputError, match=r"a folder this run reads; name a file outside it\.$"):
            check_output(output, [None, [str(tmp_path / "elsewhere.csv"), str(folder)]], overwrite=True)
    assert check_output(tmp_path / "out.csv", [str(folder)], overwrite=True) == tmp_path / "out.csv"
    assert inside.read_bytes() == b"x\n1\n"


def last_checkpoint(run: CLI) -> Path:
    return Path(str(run.trainer.log_dir)) / "checkpoints" / "last.ckpt"


# -- a task of the user's own whose predict_step returns (N, K) outputs ------------------------------


def k_target_predictions(cli, kind: str) -> tuple[pd.DataFrame, dict[str, torch.Tensor]]:
    """A short fit of the user's K-target task (tests/helpers.py), then ``predict`` from its last
    checkpoint: the CSV file, and what the fitted model's own ``predict_step`` gives for the rows."""
    words = MANY_LABELS if kind == "labels" else MANY_VALUES
    last = ["--last_checkpoint=src.callbacks.LatestCheckpoint"]
    run = cli("fit", *words, *BARE, *last, "--trainer.max_epochs=2")
    writer = ["--prediction_writer=src.callbacks.PredictionWriter", "--output=out.csv"]
    cli("predict", "--ckpt_path", str(last_checkpoint(run)), *writer)
    run.model.eval()
    data = run.datamodule
    with torch.inference_mode():
        expected = run.model.predict_step((data.x[data.val_rows],), 0)
    return pd.read_csv("out.csv"), expected


@pytest.mark.parametrize(("kind", "names"), [("labels", LABEL_NAMES), ("values", VALUE_NAMES)])
def test_a_users_k_target_task_predicts_a_column_per_entry_named_by_the_datas_names(cli, kind, names) -> None:
    written, expected = k_target_predictions(cli, kind)
    columns = [f"{key}({name})" for key in expected for name in names]
    assert list(written.columns) == ["row", *columns]  # probs(spam) … preds(personal), or preds(price) …
    assert written["row"].tolist() == list(range(len(written)))
    for key, value in expected.items():
        got = written[[f"{key}({name})" for name in names]].to_numpy()
        torch.testing.assert_close(torch.from_numpy(got).to(value.dtype), value)
    if kind == "labels":  # the task's own 0/1 choice, as it made it, not a label of a class id
        assert set(np.unique(written[[f"preds({n})" for n in names]])) <= {0, 1}


def test_prediction_columns_are_numbered_without_k_names_and_a_shorter_output_is_one_sentence() -> None:
    probs = torch.tensor([[0.2, 0.9, 0.6], [0.7, 0.1, 0.4]])  # (N, K) of a multi-label task
    outputs = {"probs": probs, "preds": probs > 0.5, "spread": torch.tensor([1.5, 2.5])}
    frame = prediction_frame(outputs, ["a", "b"], range(2))  # two names for three labels: numbered
    assert list(frame.columns) == [
        "row", "probs(0)", "probs(1)", "probs(2)", "preds(0)", "preds(1)", "preds(2)", "spread",
    ]  # fmt: skip
    assert frame[["preds(0)", "preds(1)", "preds(2)"]].to_numpy().tolist() == [[0, 1, 1], [1, 0, 0]]
    assert frame["spread"].tolist() == [1.5, 2.5]
    # the shipped classifier's outputs keep their columns: the chosen label, a probability per class
    shipped = prediction_frame({"probs": probs, "preds": probs.argmax(-1)}, ["a", "b", "c"], range(2))
    probabilities = ["probability(a)", "probability(b)", "probability(c)"]
    assert list(shipped.columns) == ["row", "prediction", *probabilities]
    assert shipped["prediction"].tolist() == ["b", "a"]
    with pytest.raises(UserInputError, match=r"^predict_step returned 'spread' of shape \(3,\) for 2 items"):
        prediction_frame({"preds": probs, "spread": torch.ones(3)}, None, range(2))


def test_each_predicted_line_is_the_row_it_names(trained: Trained, tmp_path: Path) -> None:
    """Without a file to predict: the validation rows, each line checked against its own source row."""
    best = trained.run.trainer.checkpoint_callback.best_model_path
    main(["predict", "--ckpt_path", best, f"--output={tmp_path / 'val.csv'}", *QUIET])
    written = pd.read_csv(tmp_path / "val.csv")
    assert sorted(written["row"]) == sorted(trained.run.datamodule.split_rows["val"].tolist())
    lines_name_their_rows(written, trained.frame.drop(columns="label"), Predictor.from_checkpoint(best))


def lines_name_their_rows(written: pd.DataFrame, source: pd.DataFrame, predictor: Predictor) -> None:
    """Each line holds the prediction of the source row its ``row`` names, predicted alone."""
    probability_columns = [c for c in written.columns if c.startswith("probability(")]
    for _, line in written.sample(min(8, len(written)), random_state=0).iterrows():
        alone = predictor.predict(source.loc[[int(line["row"])]])
        expected = alone[probability_columns].to_numpy()[0]
        np.testing.assert_allclose(line[probability_columns].to_numpy(np.float64), expected, rtol=1e-5)
        assert line["prediction"] == alone["prediction"].iloc[0]


@pytest.mark.parametrize("cell", ["seven", "", "inf"])
def test_a_cell_that_is_not_a_number_is_one_sentence(trained: Trained, tmp_path: Path, capsys, cell: str):
    rows = trained.raw_rows("test").head(4).astype(object)
    rows.iloc[2, 5] = cell
    rows.to_csv(tmp_path / "new.csv", index=False)
    with pytest.raises(SystemExit) as exit_:
        main(["predict", f"--ckpt_path={trained.checkpoint}", f"--data.predict_path={tmp_path / 'new.csv'}",
              f"--output={tmp_path / 'out.csv'}", *QUIET])  # fmt: skip
    assert exit_.value.code == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    where = f"the first in row 2, column {rows.columns[5]!r}"
    assert said.endswith(
        f"1 cell(s) are empty or not a finite number, {where}; give every feature column a number."
    )
    assert not (tmp_path / "out.csv").exists()
