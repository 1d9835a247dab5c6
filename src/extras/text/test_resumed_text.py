"""A resumed text fit goes on with the text its checkpoint's run split into stretches, or says in one
sentence why not: lines added, removed or edited since, or other fractions, would move held-out text into
training. Evaluations of the checkpoint take any text."""

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from src.cli import CLI, main
from src.data.loading import check_split
from src.errors import UserInputError
from src.extras.text import TextDataModule
from src.extras.text.conftest import tiny
from tests.conftest import BARE, QUIET
from tests.test_resumed_data import assert_refused_then_resplit
from tests.test_run_folders import refused


def lines(count: int, seed: int) -> list[str]:
    """Lines of 29 random letters and spaces: every stretch holds every character, so that the vocabulary
    (and the net's width) stays the same however the text is split."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz "))
    return ["".join(rng.choice(letters, 29)) + "\n" for _ in range(count)]


def write(text: list[str]) -> None:
    Path("text.txt").write_text("".join(text), encoding="utf-8")


#: configs/charlm.yaml with a tiny net on text.txt, two batches an epoch, no callbacks but last.ckpt, in a
#: named run (--ckpt_path last finds it)
WORDS = [
    *tiny(Path("text.txt")), *BARE, "--trainer.callbacks=[]",
    "--last_checkpoint=src.callbacks.LatestCheckpoint", "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=1", "--trainer.logger.init_args.version=r",
]  # fmt: skip


def fit(*words: str) -> CLI:
    return main(["fit", *WORDS, *words, *QUIET])


def resumed(*words: str) -> CLI:
    return fit("--trainer.max_epochs=2", "--ckpt_path=last", *words)


@pytest.fixture
def last(workdir: Path) -> Path:
    """One epoch on 400 lines of 30 characters: its last.ckpt."""
    write(lines(400, 0))
    first = fit("--trainer.max_epochs=1")
    return Path(first.trainer.log_dir) / "checkpoints" / "last.ckpt"


def test_a_resume_on_lines_added_since_is_refused_and_goes_on_only_when_told(
    last: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    write(lines(400, 0) + lines(20, 1))
    # the stretches' ends moved on: some lines changed split
    moved = assert_refused_then_resplit(last, fit, capsys, caplog, "line", "20 lines added")
    assert " 0 lines changed split" not in moved


@pytest.mark.parametrize(
    ("words", "change"),
    [
        (["--data.val_fraction=0.2"], "data.val_fraction=0.2 where it had 0.1"),
        (["--data.test_fraction=0.2"], "data.test_fraction=0.2 where it had 0.1"),
    ],
    ids=["val_fraction", "test_fraction"],
)
def test_a_resume_with_other_fractions_is_refused(
    last: Path, capsys: pytest.CaptureFixture[str], words: list[str], change: str
) -> None:
    sentence = refused(capsys, lambda: resumed(*words))
    assert f"into training, validation and test ({change}), and a resumed fit" in sentence


def test_lines_removed_or_edited_are_named(last: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = lines(400, 0)
    write(text[:100] + text[110:])
    assert "(10 lines removed)" in refused(capsys, resumed)
    write(text[:200] + lines(3, 2) + text[203:])
    assert "(3 lines edited)" in refused(capsys, resumed)
    one = ("b" if text[50][0] == "a" else "a") + text[50][1:]  # one character other: the same length
    write([*text[:50], one, *text[51:]])
    assert "(1 line edited)" in refused(capsys, resumed)


def test_repeated_lines_are_counted_each_in_its_own_stretch(
    workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A line and a blank line, 100 times: 200 lines, of which a test_fraction of 0.1 instead of 0.2
    moves 20 from validation into training and 20 from test into validation."""
    Path("text.txt").write_text("a line\n\n" * 100, encoding="utf-8")
    before, now = (TextDataModule("text.txt", block_size=4, test_fraction=f) for f in (0.2, 0.1))
    with caplog.at_level(logging.INFO):
        check_split(before.split_record, now.split_record, True, "line", "data.resplit_on_resume")
    assert [r.getMessage() for r in caplog.records] == [
        "data.resplit_on_resume: the fit goes on with a new split (data.test_fraction=0.1 where it had "
        "0.2): 40 lines changed split, 20 of them held out before and trained on now."
    ]


def test_a_resume_through_the_trainer_is_refused_too(last: Path) -> None:
    """A fit resumed by ``trainer.fit(ckpt_path=...)``, not through the CLI, is checked on restore."""
    write(lines(400, 0) + lines(5, 1))
    run = main([*WORDS, "--trainer.max_epochs=2", *QUIET], run=False)
    with pytest.raises(UserInputError, match=r"\(5 lines added\), and a resumed fit goes on"):
        run.trainer.fit(run.model, datamodule=run.datamodule, ckpt_path=str(last))


def test_a_checkpoint_that_recorded_no_split_resumes_on_any_text(last: Path) -> None:
    checkpoint = torch.load(last, weights_only=True)
    del checkpoint["TextDataModule"]["split"]  # as a checkpoint of an older version holds it
    torch.save(checkpoint, last)
    write(lines(400, 0) + lines(5, 1))
    assert resumed().trainer.current_epoch == 2


def test_the_same_text_resumes_and_evaluations_take_any_text(last: Path, workdir: Path) -> None:
    """Unchanged text goes on; test and predict from the checkpoint use its vocabulary on whatever text
    they are given: a text that has grown, another text to predict."""
    assert resumed().trainer.current_epoch == 2
    write(lines(400, 0) + lines(40, 1))
    tested = main(["test", f"--ckpt_path={last}", *QUIET])
    assert "test/loss" in tested.trainer.callback_metrics
    Path("other.txt").write_text("".join(lines(20, 3)), encoding="utf-8")
    out = workdir / "predictions.csv"
    main(["predict", f"--ckpt_path={last}", "--data.predict_path=other.txt", f"--output={out}", *QUIET])
    assert len(pd.read_csv(out)) == 600 // 16  # one per window of data.block_size characters
