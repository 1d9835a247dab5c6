"""A table's bad input stops early with one sentence that names the file, column, key or value, and exit
status 2 (the core's cases: tests/test_errors.py)."""

from pathlib import Path

from tests.conftest import CONFIGS
from tests.test_errors import fails

TABLES = "--data=src.extras.tables.TabularDataModule"


def csv_args(path: Path | str, target: str = "label", task: str = "classification") -> list[str]:
    # digits.yaml names its bundled source; a file's source is its format, or left to the suffix
    source = {".csv": "csv", ".parquet": "parquet"}.get(Path(path).suffix, "null")
    return [
        "--config",
        str(CONFIGS / "digits.yaml"),
        TABLES,
        f"--data.source={source}",
        f"--data.path={path}",
        f"--data.target_column={target}",
        f"--data.task={task}",
    ]


def test_missing_csv_file(cli, capsys, nothing_written) -> None:
    line = fails(cli, capsys, *csv_args("nowhere/data.csv"))
    assert "'nowhere/data.csv' does not exist" in line
    assert "data.path" in line


def test_missing_target_column(cli, capsys, write_csv, nothing_written) -> None:
    path = write_csv({"a": [1, 2], "b": [3, 4]})
    line = fails(cli, capsys, *csv_args(path, target="label"))
    assert str(path) in line
    assert "no column 'label'" in line
    assert "['a', 'b']" in line


def test_text_in_a_column_named_numeric(cli, capsys, write_csv, nothing_written) -> None:
    path = write_csv({"a": [1, 2, 3] * 5, "b": ["0.5", "oops", "1"] * 5, "label": [0, 1, 0] * 5})
    line = fails(cli, capsys, *csv_args(path), "--data.columns.numeric=[b]")
    assert "column 'b', line 3 holds 'oops', which is not a number" in line
    assert "data.columns.na_values" in line


def test_value_too_large_for_float32(cli, capsys, write_csv, nothing_written) -> None:
    path = write_csv({"a": [1.0, 1e39, 3.0, 4.0] * 5, "label": [0, 1] * 10})
    line = fails(cli, capsys, *csv_args(path))
    assert "column 'a', line 3 holds 1e+39, which is infinite or too large for float32" in line


def test_non_numeric_regression_target(cli, capsys, write_csv, nothing_written) -> None:
    path = write_csv({"a": [1.0, 2.0, 3.0] * 5, "y": ["1.5", "much", "2"] * 5})
    args = csv_args(path, "y", "regression")
    args[1] = str(CONFIGS / "diabetes.yaml")
    line = fails(cli, capsys, *args)
    assert "column 'y', line 3 holds 'much', which is not a number" in line


def test_target_among_the_features(cli, capsys, write_csv, nothing_written) -> None:
    path = write_csv({"a": [1.0, 2.0, 3.0, 4.0] * 5, "label": [0, 1] * 10})
    line = fails(cli, capsys, *csv_args(path), "--data.columns.features=[a, label]")
    assert "data.columns.features lists the target 'label'" in line


def test_a_copy_of_the_target_under_another_name(cli, capsys, write_csv, nothing_written) -> None:
    labels = ["cat", "dog", "cat", "bird"] * 5
    path = write_csv(
        {"a": range(20), "copy": [{"cat": 7, "dog": 3, "bird": 1}[v] for v in labels], "label": labels}
    )
    line = fails(cli, capsys, *csv_args(path))
    assert "column 'copy' is a copy of the target 'label'" in line
    assert "data.columns.drop" in line


def test_every_target_cell_empty(cli, capsys, write_csv, nothing_written) -> None:
    path = write_csv({"a": [1.0, 2.0, 3.0], "label": [None, None, None]})
    assert "every cell of the target column 'label' is empty" in fails(cli, capsys, *csv_args(path))


def test_header_without_rows(cli, capsys, tmp_path: Path, nothing_written) -> None:
    path = tmp_path / "empty.csv"
    path.write_text("a,label\n")
    assert "has no data rows" in fails(cli, capsys, *csv_args(path))


def test_file_that_is_not_a_table(cli, capsys, tmp_path: Path, nothing_written) -> None:
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"not parquet at all")
    line = fails(cli, capsys, *csv_args(path))
    assert f"Parquet file '{path}' could not be read" in line


def test_unknown_file_suffix(cli, capsys, tmp_path: Path, nothing_written) -> None:
    line = fails(cli, capsys, *csv_args(tmp_path / "data.xlsx"))
    assert "has the suffix '.xlsx'; name a .csv or .parquet file" in line


def test_a_path_with_a_bundled_source(cli, capsys, write_csv, nothing_written) -> None:
    path = write_csv({"a": [1.0, 2.0], "label": [0, 1]})
    line = fails(
        cli,
        capsys,
        "--config",
        "digits.yaml",
        TABLES,
        f"--data.path={path}",
    )
    assert f"data.path={str(path)!r} is set, but data.source='digits' reads bundled data" in line


def test_unknown_column_names(cli, capsys, write_csv, nothing_written) -> None:
    path = write_csv({"a": [1.0, 2.0], "label": [0, 1]})
    line = fails(cli, capsys, *csv_args(path), "--data.columns.drop=[b]")
    assert "has no column(s) ['b']; fix data.columns.drop" in line


def test_a_column_both_numeric_and_categorical(cli, capsys, nothing_written) -> None:
    line = fails(
        cli,
        capsys,
        "--config",
        "digits.yaml",
        TABLES,
        "--data.columns.numeric=[a]",
        "--data.columns.categorical=[a, b]",
    )
    assert "both name ['a']" in line


def test_too_few_rows_to_split(cli, capsys, write_csv, nothing_written) -> None:
    path = write_csv({"a": [1.0, 2.0, 3.0, 4.0], "label": [0, 1, 0, 1]})
    line = fails(cli, capsys, *csv_args(path))
    assert f"The 4 rows of CSV file '{path}' cannot be split" in line


def test_a_split_too_small_for_r2_stops_before_training(cli, capsys, write_csv, nothing_written) -> None:
    # 11 rows: 3 test rows, then 0.1 / 0.8 of the other 8 is one validation row, and R² needs two
    path = write_csv({"a": [float(i) for i in range(11)], "label": [0.5 * i for i in range(11)]})
    line = fails(cli, capsys, "--config", "diabetes.yaml", *csv_args(path, task="regression")[2:])
    assert line == (
        "error: data.split: the validation split has 1 row of 11; a regression run needs at least 2 "
        "validation rows (R² needs two): use more rows or a larger data.split.val_fraction."
    )


def test_a_class_too_rare_to_stratify_is_one_sentence(cli, capsys, write_csv, nothing_written) -> None:
    path = write_csv({"a": [float(i) for i in range(12)], "label": [0] * 11 + [1]})
    line = fails(cli, capsys, *csv_args(path))
    assert f"The 12 rows of CSV file '{path}' cannot be split" in line
    assert "only 1 member" in line
    assert ". " not in line  # sklearn's three sentences, joined into ours


def test_csv_needs_its_arguments(cli, capsys, nothing_written) -> None:
    line = fails(
        cli,
        capsys,
        "--config",
        "digits.yaml",
        TABLES,
        "--data.source=csv",
    )
    assert "needs data.path, data.target_column and data.task" in line
