"""Each multi-target proof fails on the bug it is there to catch (tests/test_mutations.py's ``mutate``)."""

import pytest

import src.extras.tables.test_multitarget as multitarget
import src.predict
from src.models import Classifier
from tests.test_mutations import mutate


@pytest.mark.filterwarnings(
    "ignore:You are trying to `self.log\\(\\)`:UserWarning"
)  # a step without a Trainer
def test_the_multilabel_loss_test_catches_cross_entropy_in_place_of_bce(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mutate(
        monkeypatch,
        Classifier,
        "loss",
        "return F.binary_cross_entropy_with_logits(output, soft, pos_weight=weight)",
        "return F.cross_entropy(output, soft, weight=weight)",
    )
    with pytest.raises(AssertionError, match="not close"):
        multitarget.test_the_multilabel_loss_is_bce_per_label_smoothed_as_cross_entropy_smooths_two_classes()


@pytest.mark.filterwarnings(
    "ignore:You are trying to `self.log\\(\\)`:UserWarning"
)  # a step without a Trainer
def test_the_multilabel_prediction_test_catches_a_softmax_across_labels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mutate(
        monkeypatch, Classifier, "predictions", "probs = logits.sigmoid()", "probs = logits.softmax(dim=-1)"
    )
    with pytest.raises(AssertionError, match="not close"):
        multitarget.test_multilabel_metrics_and_predictions_threshold_each_label_at_half()


def test_the_per_target_columns_test_catches_every_target_predicted_from_the_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mutate(monkeypatch, src.predict, "per_target", "column = preds[:, k]", "column = preds[:, 0]")
    with pytest.raises(AssertionError):
        multitarget.test_a_prediction_per_target_named_by_its_column()
