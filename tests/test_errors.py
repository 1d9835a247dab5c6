"""Bad input stops early with one sentence that names the file, column, key or value, and exit status 2."""

from pathlib import Path

import pytest

from tests.conftest import CONFIGS


def fails(cli, capsys, *args: str) -> str:
    """Run the CLI, expect exit status 2, and return the single error line."""
    with pytest.raises(SystemExit) as exit_:
        cli("fit", *args)
    assert exit_.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, lines
    return lines[0]


def csv_args(path: Path | str, target: str = "label", task: str = "classification") -> list[str]:
    return [
        "--config",
        str(CONFIGS / "digits.yaml"),
        "--data.source=csv",
        f"--data.csv_path={path}",
        f"--data.target_column={target}",
        f"--data.task={task}",
    ]


@pytest.fixture
def nothing_written(workdir: Path):
    """Whatever fails must leave no run folder, checkpoint or half-written file behind."""
    yield
    assert [p.name for p in workdir.rglob("*") if p.suffix != ".csv"] == []


def test_missing_csv_file(cli, capsys, nothing_written) -> None:
    line = fails(cli, capsys, *csv_args("nowhere/data.csv"))
    assert "'nowhere/data.csv' does not exist" in line
    assert "data.csv_path" in line


def test_missing_target_column(cli, capsys, write_csv, nothing_written) -> None:
    path = write_csv({"a": [1, 2], "b": [3, 4]})
    line = fails(cli, capsys, *csv_args(path, target="label"))
    assert str(path) in line
    assert "no column 'label'" in line
    assert "['a', 'b']" in line


def test_non_numeric_cell(cli, capsys, write_csv, nothing_written) -> None:
    path = write_csv({"a": [1, 2, 3], "b": ["0.5", "oops", "1"], "label": [0, 1, 0]})
    line = fails(cli, capsys, *csv_args(path))
    assert "column 'b', line 3" in line
    assert "'oops'" in line


def test_empty_cell(cli, capsys, write_csv, nothing_written) -> None:
    path = write_csv({"a": [1.0, None, 3.0], "label": [0, 1, 0]})
    line = fails(cli, capsys, *csv_args(path))
    assert "column 'a', line 3 holds an empty cell" in line


def test_label_outside_the_classes(cli, capsys, write_csv, nothing_written) -> None:
    path = write_csv({"a": [1.0, 2.0, 3.0], "label": [0, -1, 1]})
    line = fails(cli, capsys, *csv_args(path))
    assert "column 'label', line 3 holds the label -1" in line
    path = write_csv({"a": [1.0, 2.0, 3.0], "label": [0, 5, 1]}, name="five.csv")
    line = fails(cli, capsys, *csv_args(path), "--data.num_classes=3")
    assert "label 5, outside the class ids 0..2" in line


def test_fractional_label(cli, capsys, write_csv, nothing_written) -> None:
    path = write_csv({"a": [1.0, 2.0, 3.0], "label": [0, 1.5, 1]})
    assert "the label 1.5" in fails(cli, capsys, *csv_args(path))


def test_header_without_rows(cli, capsys, tmp_path: Path, nothing_written) -> None:
    path = tmp_path / "empty.csv"
    path.write_text("a,label\n")
    assert "has a header but no rows" in fails(cli, capsys, *csv_args(path))


@pytest.mark.parametrize(("val", "test"), [(0.5, 0.5), (0.0, 0.2), (0.1, 1.2), (-0.1, 0.3)])
def test_split_fractions_that_do_not_fit(cli, capsys, val: float, test: float, nothing_written) -> None:
    line = fails(
        cli, capsys, "--config", "digits.yaml", f"--data.val_fraction={val}", f"--data.test_fraction={test}"
    )
    assert f"data.val_fraction={val} and data.test_fraction={test} do not fit" in line


def test_too_few_rows_to_split(cli, capsys, write_csv, nothing_written) -> None:
    path = write_csv({"a": [1.0, 2.0, 3.0, 4.0], "label": [0, 1, 0, 1]})
    line = fails(cli, capsys, *csv_args(path))
    assert "The 4 rows of source 'csv' cannot be split" in line


def test_csv_needs_its_arguments(cli, capsys, nothing_written) -> None:
    line = fails(cli, capsys, "--config", "digits.yaml", "--data.source=csv")
    assert "needs data.csv_path, data.target_column and data.task" in line


def test_model_and_data_task_mismatch(cli, capsys, nothing_written) -> None:
    line = fails(cli, capsys, "--config", "digits.yaml", "--data.source=diabetes")
    assert "model Classifier needs at least 2 classes but the data gives out_features=1" in line
    line = fails(cli, capsys, "--config", "diabetes.yaml", "--data.source=digits")
    assert "model Regressor predicts one value but the data gives out_features=10" in line


def test_unknown_config_key(cli, capsys, nothing_written) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli("fit", "--config", "digits.yaml", "--data.batch_sise=3")
    assert exit_.value.code == 2
    assert "batch_sise" in capsys.readouterr().err


def test_unknown_key_inside_a_config_file(cli, capsys, workdir: Path) -> None:
    (workdir / "typo.yaml").write_text("model:\n  init_args:\n    hiden_sizes: [8]\n")
    with pytest.raises(SystemExit) as exit_:
        cli("fit", "--config", "digits.yaml", "--config", "typo.yaml")
    assert exit_.value.code == 2
    assert "hiden_sizes" in capsys.readouterr().err
