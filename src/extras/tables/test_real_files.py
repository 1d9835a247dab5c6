"""Files as users bring them: dates, spreadsheets' habits, stray values, typos; the API reads as the CLI."""

import logging
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from src.cli import main
from src.errors import UserInputError
from src.extras.tables import Columns, TabularDataModule, sources
from src.extras.tables.preprocessing import Location, infer_kinds
from src.extras.tables.test_preprocessing import messy_frame
from src.predict import Predictor
from tests.conftest import CONFIGS, QUIET

#: the table DataModule in place of the array one the shipped array configs name
TABLE_DATA = "--data=src.extras.tables.TabularDataModule"
SPIRAL_TABLE = ["--config", str(CONFIGS / "spiral.yaml"), TABLE_DATA, "--data.num_samples=300"]

TINY = ["--trainer.max_epochs=2", "--trainer.limit_val_batches=2"]


def data(path: Path, **kwargs) -> TabularDataModule:
    return TabularDataModule(path=str(path), target_column="label", task="classification", **kwargs)


def write(frame: pd.DataFrame, path: Path, **kwargs) -> Path:
    if path.suffix == ".parquet":
        frame.assign(age=frame["age"].astype(str)).to_parquet(path, **kwargs)  # one type per Parquet column
    else:
        frame.to_csv(path, index=False, **kwargs)
    return path


def test_a_date_column_is_refused_with_a_sentence(tmp_path: Path) -> None:
    frame = messy_frame().assign(seen=pd.date_range("2021-01-01", periods=200, freq="D"))
    with pytest.raises(
        UserInputError, match="column 'seen' holds dates or durations; turn them into numbers"
    ):
        data(write(frame, tmp_path / "dates.parquet")).preprocessor  # noqa: B018


def test_a_numeric_column_without_training_values_is_left_out(tmp_path: Path, caplog) -> None:
    frame = messy_frame().assign(sparse=np.nan)
    probe = data(write(frame, tmp_path / "probe.csv"))
    frame.loc[probe.split_rows["test"][0], "sparse"] = 7.0  # its one value lands in the test split
    with caplog.at_level(logging.INFO):
        dm = data(write(frame, tmp_path / "sparse.csv"))
        assert "sparse" not in dm.preprocessor.columns
    assert "the column(s) ['sparse'] have no value in the training rows and are left out" in caplog.text
    assert torch.isfinite(dm.dataset("test").tensors[0]).all()


def test_a_file_whose_only_feature_is_empty_is_refused(tmp_path: Path) -> None:
    frame = pd.DataFrame({"notes": [None] * 20, "label": ["a", "b"] * 10})
    with pytest.raises(UserInputError, match="has no feature column with values besides 'label'"):
        data(write(frame, tmp_path / "empty.csv")).preprocessor  # noqa: B018


def test_spreadsheet_habits_semicolons_decimal_commas_latin1_and_a_saved_index(tmp_path: Path) -> None:
    frame = messy_frame()
    reference = data(write(frame, tmp_path / "plain.csv"))
    european = frame.assign(
        income=frame["income"].map(lambda v: "" if pd.isna(v) else f"{v}".replace(".", ","))
    )
    european = european.assign(region=european["region"].replace({"north": "nörth"}))
    path = tmp_path / "european.csv"
    european.to_csv(path, sep=";", index=True, encoding="latin-1")  # with the row numbers pandas adds
    dm = data(path)
    assert dm.preprocessor.columns == reference.preprocessor.columns  # no "Unnamed: 0", income numeric
    assert next(c for c in dm.preprocessor.numeric if c.name == "income") == next(
        c for c in reference.preprocessor.numeric if c.name == "income"
    )
    assert "nörth" in next(c for c in dm.preprocessor.categorical if c.name == "region").categories


def test_parquet_rows_count_from_zero_and_categoricals_stay_categories(tmp_path: Path) -> None:
    frame = messy_frame()
    frame.index = np.arange(200)[::-1]  # a stored index that is not the row order
    dm = data(write(frame, tmp_path / "typed.parquet"))
    assert dm.table.features.index.tolist()[:3] == [0, 1, 2]
    # a pandas categorical of numbers (codes 1, 2, 3) is read as categories, not as a quantity
    codes = pd.DataFrame({"code": pd.Categorical(np.arange(30) % 3 + 1), "x": np.arange(30.0)})
    numeric, categorical, _ = infer_kinds(codes, Location("codes"))
    assert (numeric, categorical) == (["x"], ["code"])


@pytest.mark.parametrize(
    ("override", "sentence"),
    [
        (
            {"columns": Columns(categorical=["regoin"])},
            "has no feature column(s) ['regoin']; fix data.columns.categorical",
        ),
        ({"columns": Columns(numeric=["agee"])}, "has no feature column(s) ['agee']"),
    ],
)
def test_a_typo_in_a_column_override_is_named(messy_csv_path: Path, override, sentence: str) -> None:
    with pytest.raises(UserInputError) as error:
        data(messy_csv_path, **override).preprocessor  # noqa: B018
    assert sentence in str(error.value)


@pytest.fixture
def messy_csv_path(tmp_path: Path) -> Path:
    return write(messy_frame(), tmp_path / "messy.csv")


def test_targets_that_do_not_fit_the_task(tmp_path: Path) -> None:
    frame = messy_frame()
    with pytest.raises(
        UserInputError, match="holds the single value 'same'; a classifier needs at least two"
    ):
        data(write(frame.assign(label="same"), tmp_path / "one.csv")).preprocessor  # noqa: B018
    quantity = frame.assign(label=np.arange(200) * 1.5)
    with pytest.raises(
        UserInputError, match=r"looks like a quantity, not classes; set data\.task: regression"
    ):
        data(write(quantity, tmp_path / "quantity.csv")).preprocessor  # noqa: B018
    words = TabularDataModule(
        path=str(write(frame, tmp_path / "words.csv")), target_column="label", task="regression"
    )
    with pytest.raises(
        UserInputError, match=r"holds 'high', which is not a number.*data.task: classification"
    ):
        words.preprocessor  # noqa: B018


def test_a_missing_file_to_predict_names_its_setting() -> None:
    with pytest.raises(UserInputError, match=r"data.predict_path='nowhere.csv' does not exist"):
        TabularDataModule(predict_path="nowhere.csv")


class TestTheApiReadsRowsAsTheCli:
    """``Predictor.predict`` on a frame the user read however they like gives what ``predict`` gives."""

    @pytest.mark.slow
    def test_na_values_and_spaced_headers(self, tmp_path: Path, monkeypatch) -> None:
        frame = messy_frame(n=300)
        frame["region"] = frame["region"].fillna("?")
        write(frame, tmp_path / "train.csv")
        monkeypatch.chdir(tmp_path)
        monkeypatch.setattr(sys, "argv", ["src.cli"])
        run = main(["fit", "--config", str(CONFIGS / "spiral.yaml"), TABLE_DATA, "--data.source=csv",
                    "--data.path=train.csv", "--data.target_column=label", "--data.task=classification",
                    '--data.columns.na_values=["?"]', *TINY, *QUIET])  # fmt: skip
        checkpoint = next((tmp_path / "logs").rglob("last.ckpt"))
        new = frame.drop(columns="label").head(30)
        new.to_csv(tmp_path / "new.csv", index=False)
        main(
            [
                "predict",
                "--ckpt_path",
                str(checkpoint),
                "--data.predict_path=new.csv",
                "--output=cli.csv",
                *QUIET,
            ]
        )
        by_cli = pd.read_csv(tmp_path / "cli.csv")
        # read by hand: "?" kept as text, a space before every column name
        by_hand = new.rename(columns=lambda c: f" {c}")
        by_api = Predictor.from_checkpoint(checkpoint).predict(by_hand)
        pd.testing.assert_frame_equal(by_api, by_cli, check_dtype=False, rtol=1e-6)
        assert (
            "?"
            not in next(c for c in run.datamodule.preprocessor.categorical if c.name == "region").categories
        )


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["folder", "input", "under-a-file"])
def test_an_output_that_cannot_be_written_is_refused(tmp_path: Path, monkeypatch, capsys, kind: str) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["src.cli"])
    fit = main(["fit", *SPIRAL_TABLE, *TINY, *QUIET])
    checkpoint = str(next((tmp_path / "logs").rglob("last.ckpt")))
    fit.datamodule.table.features.head(5).to_csv(tmp_path / "new.csv", index=False)
    (tmp_path / "a_folder").mkdir()
    output = {"folder": "a_folder", "input": "new.csv", "under-a-file": "new.csv/out.csv"}[kind]
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "predict",
                "--ckpt_path",
                checkpoint,
                "--data.predict_path=new.csv",
                f"--output={output}",
                *QUIET,
            ]
        )
    assert exit_.value.code == 2
    assert f"error: --output={output!r}" in capsys.readouterr().err
    assert len(pd.read_csv(tmp_path / "new.csv")) == 5  # the input is untouched


def test_a_failed_prediction_leaves_no_folder(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["src.cli"])
    main(["fit", *SPIRAL_TABLE, *TINY, *QUIET])
    run = next((tmp_path / "logs").rglob("checkpoints")).parent
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "logs").rglob("*"))
    pd.DataFrame({"x": [0.1]}).to_csv(tmp_path / "partial.csv", index=False)  # no column "y"
    with pytest.raises(SystemExit):
        main(["predict", "--ckpt_path", str(run / "checkpoints" / "last.ckpt"),
              "--data.predict_path=partial.csv", *QUIET])  # fmt: skip
    assert "has no column(s) ['y']" in capsys.readouterr().err
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "logs").rglob("*")) == before


@pytest.mark.parametrize("prefix", [3, 10_000])
def test_a_renamed_copy_of_the_target_is_found_past_the_first_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefix: int
) -> None:
    # the first rows are counted first, to rule out a many-valued column cheaply; a copy whose first
    # rows hold fewer values than there are classes must still be found
    monkeypatch.setattr(sources, "SAME_AS_TARGET_PREFIX", prefix)
    labels = ["cat"] * 10 + ["dog", "bird"] * 10
    frame = pd.DataFrame(
        {
            "a": np.arange(30.0),  # 30 values, more than 3 classes already in its first rows
            "copy": [{"cat": 7, "dog": 3, "bird": 1}[v] for v in labels],
            "label": labels,
        }
    )
    with pytest.raises(UserInputError, match="column 'copy' is a copy of the target 'label'"):
        data(write(frame, tmp_path / "copy.csv")).table  # noqa: B018
    frame["copy"] = frame["copy"].where(np.arange(30) != 25, 9)  # one row off: not a copy
    assert data(write(frame, tmp_path / "near.csv")).table.features.columns.tolist() == ["a", "copy"]


# -- a column name written twice ------------------------------------------------------------------------


def twice(path: Path, name: str) -> str:
    """The sentence that refuses ``name`` written twice in ``path``, as a pattern."""
    what = sources.file_location(path, sources.file_format(path)).what
    return re.escape(f"{what} has the column name(s) [{name!r}] more than once; rename them")


def write_text(path: Path, header: str, sep: str = ",", encoding: str = "utf-8") -> Path:
    """A CSV file of ``header`` and 40 rows of two numbers and a label."""
    rows = [f"{i}{sep}{i % 7}{sep}{'ab'[i % 2]}" for i in range(40)]
    path.write_text("\n".join([header, *rows]) + "\n", encoding=encoding)
    return path


def write_parquet(path: Path, names: list[str]) -> Path:
    """A Parquet file with the field names ``names`` (pyarrow writes a name twice; pandas will not)."""
    columns = [pa.array(np.arange(40.0)), pa.array(np.arange(40.0) % 7), pa.array(["a", "b"] * 20)]
    pq.write_table(pa.table(columns, names=names), path)
    return path


@pytest.mark.parametrize(
    ("header", "sep", "encoding", "name"),
    [
        ("x,x,label", ",", "utf-8", "x"),  # pandas reads "x", "x.1"
        ("\ufeffx,x,label", ",", "utf-8", "x"),  # a byte-order mark before the first name
        ('"x","x",label', ",", "utf-8", "x"),
        ("x;x;label", ";", "utf-8", "x"),
        ("é\té\tlabel", "\t", "latin-1", "é"),  # not UTF-8: read as Latin-1
        ("x, x,label", ",", "utf-8", "x"),  # the space skipped, then the repeat renamed by pandas
        ('x," x",label', ",", "utf-8", "x"),  # the same but for a quoted space: not renamed by pandas
    ],
)
def test_a_csv_column_name_written_twice_is_refused(
    tmp_path: Path, header: str, sep: str, encoding: str, name: str
) -> None:
    path = write_text(tmp_path / "twice.csv", header, sep, encoding)
    with pytest.raises(UserInputError, match=twice(path, name)):
        data(path).table  # noqa: B018


def test_names_like_a_renamed_repeat_and_blank_header_cells_are_kept(tmp_path: Path) -> None:
    # "x" and "x.1" are two names as written, not a repeat pandas renamed; blank header cells are not
    # names, and keep the names pandas gives them
    path = tmp_path / "distinct.csv"
    path.write_text(
        "x,x.1,,,label\n" + "".join(f"{i},{i % 7},{i % 3},{i % 5},{'ab'[i % 2]}\n" for i in range(40))
    )
    features = data(path).table.features
    assert features.columns.tolist() == ["x", "x.1", "Unnamed: 2", "Unnamed: 3"]
    assert features["x.1"].tolist() == [i % 7 for i in range(40)]


@pytest.mark.parametrize("names", [["x", "x", "label"], ["x", " x", "label"]])
def test_a_parquet_field_name_written_twice_is_refused_before_any_column_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, names: list[str]
) -> None:
    # refused from the schema: a file too large to read whole is refused with the same sentence
    path = write_parquet(tmp_path / "twice.parquet", names)

    def read(*args: object, **kwargs: object) -> None:
        raise AssertionError("a column was read")

    monkeypatch.setattr(pq.ParquetFile, "read", read)
    with pytest.raises(UserInputError, match=twice(path, "x")):
        sources.read_file(path, "parquet")


@pytest.mark.slow
def test_a_name_written_twice_is_refused_by_fit_and_predict(workdir: Path, capsys) -> None:
    fit = main(["fit", *SPIRAL_TABLE, *TINY, *QUIET])
    checkpoint = str(next((workdir / "logs").rglob("last.ckpt")))
    files = [
        write_text(workdir / "twice.csv", "x,x,label"),
        write_parquet(workdir / "twice.parquet", ["x", "x", "label"]),
    ]
    for path in files:
        source = sources.file_format(path)
        with pytest.raises(SystemExit) as exit_:
            main(["fit", "--config", str(CONFIGS / "spiral.yaml"), TABLE_DATA, f"--data.source={source}",
                  f"--data.path={path.name}", "--data.target_column=label", "--data.task=classification",
                  *TINY, *QUIET])  # fmt: skip
        assert exit_.value.code == 2
        assert re.search(twice(Path(path.name), "x"), capsys.readouterr().err)
    # the rows to predict: the spiral's columns, "x" twice
    new = fit.datamodule.table.features.head(5)
    new[["x", "x", "y"]].to_csv(workdir / "new.csv", index=False)
    pq.write_table(
        pa.table([pa.array(new[c]) for c in ["x", "x", "y"]], names=["x", "x", "y"]), workdir / "new.parquet"
    )
    for name in ["new.csv", "new.parquet"]:
        with pytest.raises(SystemExit) as exit_:
            main(["predict", "--ckpt_path", checkpoint, f"--data.predict_path={name}", *QUIET])
        assert exit_.value.code == 2
        assert re.search(twice(Path(name), "x"), capsys.readouterr().err)
