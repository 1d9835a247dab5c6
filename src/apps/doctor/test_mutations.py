"""Break the doctor on purpose: the proofs that hold it must fail."""

import pytest

import src.apps.doctor.test_doctor as doctoring
from src.apps.doctor.callback import Doctor
from tests.test_mutations import mutate


def test_the_k_label_test_catches_a_doctor_that_knows_classes_only_by_integer_targets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The doctor as it was: float targets of 0s and 1s not taken for labels, the sigmoid not seen."""
    mutate(
        monkeypatch,
        Doctor,
        "_first_batch",
        "or not torch.is_floating_point(target) or labels",
        "or not torch.is_floating_point(target)",
    )
    with pytest.raises(KeyError, match="probabilities-into-loss"):
        doctoring.test_k_labels_of_a_net_that_ends_in_a_sigmoid_are_probabilities_into_the_loss()
