"""Nothing run, as at the core's entry points (tests/test_trust.py): a server asked to serve a checkpoint
that names code or is no checkpoint stops with the core's sentences, before it listens."""

from pathlib import Path

import pytest

import tests.test_trust as trust
from src.apps import serve
from src.extras.tables import conftest as tables
from tests.conftest import Trained

# the table runs these tests take further (the table kind's fixtures)
messy_trained = tables.messy_trained


def serving(path: str) -> None:
    serve.main(["--ckpt_path", path, "--port", "8731"])


@pytest.mark.slow
@pytest.mark.parametrize("where", trust.PLACES)
def test_a_checkpoint_names_no_code_at_any_depth_at_any_entry_point(
    messy_trained: Trained, planted: Path, workdir: Path, capsys, where: str
) -> None:
    trust.assert_names_no_code(serving, messy_trained, planted, workdir, capsys, where)


@pytest.mark.slow
@pytest.mark.parametrize("kind", trust.KINDS)
def test_a_file_that_is_no_checkpoint_gets_the_same_sentence_at_every_entry_point(
    workdir: Path, capsys, kind: str
) -> None:
    trust.assert_refused_as_the_core_refuses(serving, workdir, capsys, kind)
