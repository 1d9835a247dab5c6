"""A resumed streaming fit goes on with the rows its checkpoint's run split, or says in one sentence why
not: files added or removed, rows appended or edited, another seed or fraction, each seen in the files'
footers without reading a row. Evaluations of a checkpoint take any files."""

import logging
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from src.cli import CLI, main
from src.errors import UserInputError
from src.extras.streaming import CODE, StreamingTableDataModule, split_codes
from src.extras.streaming.test_streaming import config, frame_of, write_folder
from tests.conftest import QUIET
from tests.test_run_folders import contents, refused

ROWS = Path("rows")


def rows() -> pd.DataFrame:
    """600 rows, every 50th without a label (in no split)."""
    frame = frame_of()
    frame.loc[::50, "label"] = None
    return frame


def fit(*words: str) -> CLI:
    """A run named ``r`` on ``rows/`` (three files, row groups of 60 rows); ``--ckpt_path=last`` finds it."""
    return main([
        "fit", "--config", config(ROWS, shuffle_row_groups=2), "--trainer.limit_val_batches=1",
        "--baselines=null", "--validation_figures=null", "--trainer.logger.init_args.version=r", *words,
        *QUIET,
    ])  # fmt: skip


def resume(*words: str) -> CLI:
    return fit("--trainer.max_epochs=2", "--ckpt_path=last", *words)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding ``rows/`` and one epoch's run on it, fitted once for this module's tests."""
    folder = tmp_path_factory.mktemp("fitted")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setattr(sys, "argv", ["src.cli"])
        write_folder(ROWS, rows())
        fit("--trainer.max_epochs=1")
    return folder


@pytest.fixture
def last(fitted: Path, workdir: Path) -> Path:
    """The run's last.ckpt, in a copy of ``fitted`` that is this test's working folder."""
    shutil.copytree(fitted, workdir, dirs_exist_ok=True)
    (found,) = workdir.glob("logs/*/r/checkpoints/last.ckpt")
    return found


def refused_writing_nothing(capsys: pytest.CaptureFixture[str], last: Path, *words: str) -> str:
    """The one sentence a resume is refused with, checked to leave the run folder as it was: its files,
    config.yaml's time of writing, its event files."""
    run = last.parent.parent
    before, written = contents(run), (run / "config.yaml").stat().st_mtime_ns
    sentence = refused(capsys, lambda: resume(*words))
    assert contents(run) == before
    assert (run / "config.yaml").stat().st_mtime_ns == written
    return sentence


def test_a_resume_on_a_file_added_is_refused_and_goes_on_only_when_told(
    last: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    frame_of(130, seed=1).to_parquet(ROWS / "part-3.parquet", row_group_size=60)
    assert refused_writing_nothing(capsys, last) == (
        "error: the checkpoint's run split other rows into training, validation and test (3 row groups "
        "added), and a resumed fit goes on with that split only, so that rows it held out are never "
        "trained on; start a new run (leave out --ckpt_path), or pass --data.resplit_on_resume=true to go "
        "on with the new split."
    )
    # told to, it goes on; the rows it had keep their split, the new ones are new to every split
    with caplog.at_level(logging.INFO):
        assert resume("--data.resplit_on_resume=true").trainer.current_epoch == 2
    (said,) = [r.getMessage() for r in caplog.records if "resplit_on_resume" in r.getMessage()]
    assert said == (
        "data.resplit_on_resume: the fit goes on with a new split (3 row groups added): 0 rows changed "
        "split, 0 of them held out before and trained on now."
    )
    # its checkpoints record the new split, and the option is not carried on
    assert "resplit_on_resume" not in str(torch.load(last, weights_only=True)["config"])
    assert fit("--trainer.max_epochs=3", "--ckpt_path=last").trainer.current_epoch == 3


def append_rows(part: Path) -> None:
    """Ten rows more at the end of the file: its last row group (20 rows) holds 30."""
    pd.concat([pd.read_parquet(part), frame_of(10, seed=2)]).to_parquet(part, row_group_size=60)


def edit_rows(part: Path) -> None:
    """As many rows, one value in the second row group changed."""
    frame = pd.read_parquet(part)
    frame.loc[70, "a"] = 100.0
    frame.to_parquet(part, row_group_size=60)


@pytest.mark.parametrize(
    ("change", "words", "said"),
    [
        (append_rows, [], "1 row group edited"),
        (edit_rows, [], "1 row group edited"),
        (Path.unlink, [], "4 row groups removed"),
        (None, ["--data.seed=7"], "data.seed=7 where it had 42"),
        (None, ["--data.split.val_fraction=0.2"], "data.split.val_fraction=0.2 where it had 0.1"),
        (None, ["--data.split.test_fraction=0.1"], "data.split.test_fraction=0.1 where it had 0.2"),
    ],
    ids=["rows-appended", "rows-edited", "file-removed", "seed", "val-fraction", "test-fraction"],
)
def test_a_resume_on_other_row_groups_or_split_settings_is_refused_writing_nothing(
    last: Path, capsys: pytest.CaptureFixture[str], change: object, words: list[str], said: str
) -> None:
    if callable(change):
        change(ROWS / "part-1.parquet")
    sentence = refused_writing_nothing(capsys, last, *words)
    assert f"into training, validation and test ({said}), and a resumed fit" in sentence


def test_a_resplit_counts_the_rows_that_changed_split(last: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Drawn again from the row numbers, the rows without a label left out."""
    data = StreamingTableDataModule(str(ROWS), "label", "classification")
    labelled = ~rows()["label"].isna().to_numpy()
    before, after = (
        np.concatenate([split_codes(g, seed, 0.1, 0.2) for g in data.groups])[labelled] for seed in (42, 7)
    )
    moved = before != after
    with caplog.at_level(logging.INFO):
        resume("--data.seed=7", "--data.resplit_on_resume=true")
    (said,) = [r.getMessage() for r in caplog.records if "resplit_on_resume" in r.getMessage()]
    assert said == (
        "data.resplit_on_resume: the fit goes on with a new split (data.seed=7 where it had 42): "
        f"{moved.sum()} rows changed split, {(moved & (after == CODE['train'])).sum()} of them held out "
        "before and trained on now."
    )
    assert 100 < moved.sum() < 400


def test_a_resume_outside_the_cli_is_checked_when_the_datamodule_is_restored(
    last: Path, workdir: Path
) -> None:
    """``trainer.fit(ckpt_path=...)`` in your own code: refused as the state is restored, before a step."""
    (ROWS / "part-2.parquet").unlink()
    run = main(
        ["--config", config(ROWS), "--trainer.logger=false", "--trainer.max_epochs=2", *QUIET],
        run=False,
    )
    with pytest.raises(UserInputError, match=re.escape("(4 row groups removed), and a resumed fit")):
        run.trainer.fit(run.model, datamodule=run.datamodule, ckpt_path=str(last))
    assert run.trainer.global_step == 0


def test_the_same_rows_resume_and_evaluations_take_any_rows(last: Path, workdir: Path) -> None:
    """Unchanged files go on, written again as they were too (copied elsewhere: a new time of change), in
    the middle of an epoch too (test_streaming.py's resume tests); test and predict from the checkpoint
    use its fitted preprocessing on whatever files they are given."""
    write_folder(ROWS, rows())
    assert resume().trainer.current_epoch == 2
    frame_of(130, seed=1).to_parquet(ROWS / "part-3.parquet", row_group_size=60)
    edit_rows(ROWS / "part-1.parquet")
    tested = main(["test", f"--ckpt_path={last}", *QUIET])
    assert "test/loss" in tested.trainer.callback_metrics
    frame_of(30, seed=3).drop(columns="label").to_csv("new.csv", index=False)
    out = workdir / "predictions.csv"
    main(["predict", f"--ckpt_path={last}", "--data.predict_path=new.csv", f"--output={out}", *QUIET])
    assert len(pd.read_csv(out)) == 30
