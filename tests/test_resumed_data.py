"""A resumed fit goes on with the rows its checkpoint's run split, or says in one sentence why not: rows
added, removed or edited since, or another split setting, would move held-out rows into training.
Evaluations of a checkpoint take any data."""

import functools
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from src.cli import CLI, main
from tests.conftest import CONFIGS, CORE_ONLY, ONE_PASS, QUIET
from tests.test_run_folders import refused

#: the spiral's rows drawn in memory, in a named run (--ckpt_path last finds it)
WORDS = [
    "--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=600", *ONE_PASS,
    "--trainer.limit_val_batches=1", *CORE_ONLY, "--trainer.logger.init_args.version=r",
]  # fmt: skip


def fit(*words: str) -> CLI:
    return main(["fit", *WORDS, *words, *QUIET])


@pytest.fixture
def last(workdir: Path) -> Path:
    """One epoch on 600 spiral rows: its last.ckpt."""
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


def test_a_resume_on_other_rows_is_refused_and_goes_on_only_when_told(
    last: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # 3 arms of 233 rows: 99 more, and each arm's radii spaced anew, so every row but its first moves
    more = functools.partial(fit, "--data.num_samples=700")
    assert_refused_then_resplit(last, more, capsys, caplog, "row", "99 rows added; 599 rows edited")


@pytest.mark.parametrize(
    ("words", "change"),
    [
        (["--data.seed=7"], "600 rows edited; data.seed=7 where it had 42"),  # it draws the spiral too
        (["--data.split.val_fraction=0.2"], "data.split.val_fraction=0.2 where it had 0.1"),
    ],
    ids=["seed", "fraction"],
)
def test_a_resume_with_other_split_settings_is_refused(
    last: Path, capsys: pytest.CaptureFixture[str], words: list[str], change: str
) -> None:
    sentence = refused(capsys, lambda: fit("--trainer.max_epochs=2", "--ckpt_path=last", *words))
    assert f"into training, validation and test ({change}), and a resumed fit" in sentence


def test_the_same_rows_resume_and_evaluations_take_any_rows(last: Path, workdir: Path) -> None:
    """Unchanged data goes on; test and predict from the checkpoint use its fitted standardization on
    whatever rows they are given: other rows, new rows to predict."""
    assert fit("--trainer.max_epochs=2", "--ckpt_path=last").trainer.current_epoch == 2
    tested = main(["test", f"--ckpt_path={last}", "--data.num_samples=900", *QUIET])
    assert "test/loss" in tested.trainer.callback_metrics
    pd.DataFrame(np.random.default_rng(2).normal(size=(30, 2)), columns=["x", "y"]).to_csv(
        "new.csv", index=False
    )
    out = workdir / "predictions.csv"
    main(["predict", f"--ckpt_path={last}", "--data.predict_path=new.csv", f"--output={out}", *QUIET])
    assert len(pd.read_csv(out)) == 30
    assert np.isfinite(pd.read_csv(out).select_dtypes("number").to_numpy()).all()
