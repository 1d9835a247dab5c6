"""A resumed fit goes on with the rows its checkpoint's run split, or says in one sentence why not: rows
added, removed or edited since, or another split setting, would move held-out rows into training.
Evaluations of a checkpoint take any data."""

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from src.cli import CLI, main
from src.extras.tables import sources
from tests.conftest import CONFIGS, ONE_PASS, QUIET
from tests.test_run_folders import contents, refused

#: the spiral's net and optimizer on a CSV file of spiral rows, in a named run (--ckpt_path last finds it)
WORDS = [
    "--config", str(CONFIGS / "spiral.yaml"), "--data.source=csv", "--data.path=rows.csv",
    "--data.target_column=arm", "--data.task=classification", *ONE_PASS, "--trainer.limit_val_batches=1",
    "--baselines=null", "--validation_figures=null", "--trainer.logger.init_args.version=r",
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


def assert_refused_then_resplit(
    last: Path,
    fit: Callable[..., CLI],
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    item: str,
    change: str,
) -> str:
    """A resume from ``last`` (one epoch; ``fit`` runs the words of the run) on changed data: refused in one
    sentence naming the ``change`` to the ``item``s, before the fit writes into the run folder; with
    ``--data.resplit_on_resume=true`` it goes on, saying how many changed split, and the option is not
    carried on. The notice's counts, after the change."""
    before = last.read_bytes()
    run = last.parent.parent
    config, events = (run / "config.yaml").stat(), sorted(run.rglob("events.out.tfevents.*"))
    sentence = refused(capsys, lambda: fit("--trainer.max_epochs=2", "--ckpt_path=last"))
    assert sentence == (
        f"error: the checkpoint's run split other {item}s into training, validation and test ({change}), "
        f"and a resumed fit goes on with that split only, so that {item}s it held out are never trained "
        "on; start a new run (leave out --ckpt_path), or pass --data.resplit_on_resume=true to go on with "
        "the new split."
    )
    assert last.read_bytes() == before
    # refused before the fit writes into the run folder: its config.yaml as it was, no new event file
    assert (run / "config.yaml").stat().st_mtime_ns == config.st_mtime_ns
    assert "max_epochs: 1" in (run / "config.yaml").read_text()
    assert sorted(run.rglob("events.out.tfevents.*")) == events
    # told to, it goes on, and says how many items changed split
    with caplog.at_level(logging.INFO):
        resumed = fit("--trainer.max_epochs=2", "--ckpt_path=last", "--data.resplit_on_resume=true")
    assert resumed.trainer.current_epoch == 2
    (said,) = [r.getMessage() for r in caplog.records if "resplit_on_resume" in r.getMessage()]
    moved = said.split(": ", 1)[1]
    assert moved.startswith(f"the fit goes on with a new split ({change}): ")
    assert f" {item}s changed split, " in moved or f" {item} changed split, " in moved
    assert moved.endswith(" of them held out before and trained on now.")
    # the checkpoints of the resplit run record its new split, and the option is not carried on
    assert "resplit_on_resume" not in str(torch.load(last, weights_only=True)["config"])
    assert fit("--trainer.max_epochs=3", "--ckpt_path=last").trainer.current_epoch == 3
    return moved


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
