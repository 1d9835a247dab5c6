"""Nothing run, as at the core's entry points (tests/test_trust.py): cross-validation from a checkpoint that
names code or is no checkpoint stops with the core's sentences."""

from pathlib import Path

import pytest

import tests.test_trust as trust
from src.apps import cv
from tests.conftest import QUIET, Trained


def cross_validating(path: str) -> None:
    cv.cli_main(["--folds", "2", *trust.SPIRAL, "--ckpt_path", path, *QUIET])


@pytest.mark.slow
@pytest.mark.parametrize("where", trust.PLACES)
def test_a_checkpoint_names_no_code_at_any_depth_at_any_entry_point(
    trained: Trained, planted: Path, workdir: Path, capsys, caplog, where: str
) -> None:
    if where == "the logger in the settings":  # a fit from a checkpoint: the logger's run name only
        trust.assert_foreign_logger_left_off(
            cross_validating, True, trained, planted, workdir, capsys, caplog
        )
        return
    trust.assert_names_no_code(cross_validating, trained, planted, workdir, capsys, where)


@pytest.mark.slow
@pytest.mark.parametrize("kind", trust.KINDS)
def test_a_file_that_is_no_checkpoint_gets_the_same_sentence_at_every_entry_point(
    workdir: Path, capsys, kind: str
) -> None:
    trust.assert_refused_as_the_core_refuses(cross_validating, workdir, capsys, kind)
