"""Break the validation figures on purpose: the proofs that hold them must fail."""

from pathlib import Path

import pytest

import src.extras.figures.test_figures as figures
from src.extras.figures.callback import ValidationFigures
from tests.helpers import MultiLabelTask
from tests.test_mutations import mutate


def test_the_label_counts_test_catches_k_labels_taken_for_one_class_of_k(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The figures as they were: any (B, K) scores into a KxK confusion matrix, K labels read as K classes."""
    mutate(
        monkeypatch,
        ValidationFigures,
        "on_validation_batch_end",
        "if preds.ndim == 2 and target.ndim == 1:",
        "if preds.ndim == 2:",
    )
    with pytest.raises(AssertionError):  # a 3x3 table of 3 labels, counting 3N entries for N rows
        figures.test_k_labels_get_a_2x2_matrix_each_that_counts_every_validation_row_once(
            tmp_path, MultiLabelTask
        )


def test_the_label_counts_test_catches_probabilities_thresholded_as_logits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Probabilities cut at 0, as if they were logits: every label predicted 1, the counts wrong."""
    mutate(
        monkeypatch,
        ValidationFigures,
        "on_validation_batch_end",
        "update(preds, (target > 0.5).long())",
        "update(preds + 0.5, (target > 0.5).long())",  # read as logits: every label's sigmoid above 0.5
    )
    with pytest.raises(AssertionError, match="not equal"):
        figures.test_k_labels_get_a_2x2_matrix_each_that_counts_every_validation_row_once(
            tmp_path, MultiLabelTask
        )


def test_the_value_panels_test_catches_k_values_counted_as_k_labels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """K values read as K labels whatever the targets hold: 2x2 counts of a regression's outputs."""
    mutate(
        monkeypatch,
        ValidationFigures,
        "on_validation_epoch_end",
        "and bool(self._binary.compute() > 0)",
        "and True",
    )
    with pytest.raises(AssertionError):
        figures.test_k_values_get_a_panel_each_of_every_validation_row(tmp_path)
