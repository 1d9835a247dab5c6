"""A resumed fit of a table goes on with the rows its checkpoint's run split, or says in one sentence why
not: rows added, removed or edited since, or another split setting, would move held-out rows into training.
Evaluations of a checkpoint take any data."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from src.cli import CLI, main
from src.extras.tables import sources
from tests.conftest import CONFIGS, CORE_ONLY, ONE_PASS, QUIET
from tests.test_resumed_data import assert_refused_then_resplit
from tests.test_run_folders import contents, refused

#: the spiral's net and optimizer on a CSV file of spiral rows, in a named run (--ckpt_path last finds it)
WORDS = [
    "--config", str(CONFIGS / "spiral.yaml"), "--data=src.extras.tables.TabularDataModule",
    "--data.source=csv", "--data.path=rows.csv",
    "--data.target_column=arm", "--data.task=classification", *ONE_PASS, "--trainer.limit_val_batches=1",
    *CORE_ONLY, "--trainer.logger.init_args.version=r",
]  # fmt: skip


def spiral_rows(n: int, seed: int) -> pd.DataFrame:
    table = sources.spiral(n, 0.2, seed)
    return table.features.assign(arm=table.target)


def fit(*words: str) -> CLI:
    return main(["fit", *WORDS, *words, *QUIET])


@pytest.fixture
def last(workdir: Path) -> Path:
    """One epoch on 600 spiral rows: its last.ckpt."""
    spiral_rows(600, 0).to_csv("rows.csv", index=False)
    first = fit("--trainer.max_epochs=1")
    return Path(first.trainer.log_dir) / "checkpoints" / "last.ckpt"


def test_a_resume_on_rows_added_since_is_refused_and_goes_on_only_when_told(
    last: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    pd.concat([spiral_rows(600, 0), spiral_rows(201, 1)]).to_csv("rows.csv", index=False)
    assert_refused_then_resplit(last, fit, capsys, caplog, "row", "201 rows added")


@pytest.mark.parametrize(
    ("words", "change"),
    [
        (["--data.seed=7"], "data.seed=7 where it had 42"),
        (["--data.split.val_fraction=0.2"], "data.split.val_fraction=0.2 where it had 0.1"),
        (["--data.split.folds=3"], "data.split.folds=3 where it had null"),
    ],
    ids=["seed", "fraction", "folds"],
)
def test_a_resume_with_other_split_settings_is_refused(
    last: Path, capsys: pytest.CaptureFixture[str], words: list[str], change: str
) -> None:
    sentence = refused(capsys, lambda: fit("--trainer.max_epochs=2", "--ckpt_path=last", *words))
    assert f"into training, validation and test ({change}), and a resumed fit" in sentence


def test_rows_removed_and_edited_are_named(last: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = spiral_rows(600, 0)
    rows.iloc[:-30].to_csv("rows.csv", index=False)
    assert "(30 rows removed)" in refused(capsys, lambda: fit("--trainer.max_epochs=2", "--ckpt_path=last"))
    edited = rows.copy()
    edited.loc[:39, "x"] += 1.0
    edited.to_csv("rows.csv", index=False)
    assert "(40 rows edited)" in refused(capsys, lambda: fit("--trainer.max_epochs=2", "--ckpt_path=last"))
    rows.iloc[::-1].to_csv("rows.csv", index=False)
    assert "(the same rows in another order)" in refused(
        capsys, lambda: fit("--trainer.max_epochs=2", "--ckpt_path=last")
    )


def test_the_same_rows_resume_and_evaluations_take_any_rows(last: Path, workdir: Path) -> None:
    """Unchanged data goes on; test and predict from the checkpoint use its fitted preprocessing on
    whatever rows they are given: the same file, a file that has grown, new rows to predict."""
    assert fit("--trainer.max_epochs=2", "--ckpt_path=last").trainer.current_epoch == 2
    main(["test", f"--ckpt_path={last}", *QUIET])
    pd.concat([spiral_rows(600, 0), spiral_rows(200, 1)]).to_csv("rows.csv", index=False)
    tested = main(["test", f"--ckpt_path={last}", *QUIET])
    assert "test/loss" in tested.trainer.callback_metrics
    spiral_rows(30, 2).drop(columns="arm").to_csv("new.csv", index=False)
    out = workdir / "predictions.csv"
    main(["predict", f"--ckpt_path={last}", "--data.predict_path=new.csv", f"--output={out}", *QUIET])
    assert len(pd.read_csv(out)) == 30
    assert np.isfinite(pd.read_csv(out).select_dtypes("number").to_numpy()).all()


def test_a_resplit_onto_data_of_other_shapes_is_one_sentence(
    last: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fourth class in the rows the fit goes on with: the net built for them has another output width
    than the checkpoint's, which no resplit can go on from."""
    written = contents(last.parent.parent)
    more = spiral_rows(60, 3).assign(arm=3)
    pd.concat([spiral_rows(600, 0), more]).to_csv("rows.csv", index=False)
    sentence = refused(
        capsys, lambda: fit("--trainer.max_epochs=2", "--ckpt_path=last", "--data.resplit_on_resume=true")
    )
    assert sentence.startswith("error: the checkpoint does not fit the configured model (size mismatch for ")
    assert sentence.endswith(
        "), which is built from the config and the data's shapes (its columns, classes or characters); give "
        "the config and data the checkpoint was trained with, leave --config out to use the one it carries, "
        "or start a new run."
    )
    assert contents(last.parent.parent) == written  # refused before the fit wrote into its folder
