"""Break the baselines on purpose: the proofs that hold them must fail."""

import logging
from pathlib import Path

import pytest

import src.extras.baselines.models as fitting
import src.extras.baselines.test_baselines as baselines
from src.extras.baselines.callback import Baselines
from tests.test_mutations import mutate


def test_the_k_target_test_catches_each_labels_probability_of_0_taken_for_that_of_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mutate(monkeypatch, fitting, "outputs", "probs[:, seen.index(1)]", "probs[:, seen.index(0)]")
    with pytest.raises(AssertionError):
        baselines.test_k_targets_get_scikit_learns_multi_output_baselines_scored_as_the_task_scores_itself(
            tmp_path, "labels"
        )


def test_the_not_a_table_test_catches_a_run_told_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No baselines, and not a word why: what a run on images or a DataModule of the user's got before."""
    mutate(monkeypatch, Baselines, "_start", "if not self._told:", "if False:")
    with caplog.at_level(logging.INFO), pytest.raises(AssertionError):
        baselines.test_data_that_is_not_a_table_gets_one_line_and_no_baselines(tmp_path, caplog)
