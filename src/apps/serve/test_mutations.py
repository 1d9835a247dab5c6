"""Break the server on purpose: the proofs that hold it must fail."""

from pathlib import Path

import pandas as pd
import pytest

import src.apps.serve.test_serve as serving
from src.apps.serve import BatchedAPI
from tests.test_mutations import mutate


def test_the_k_output_test_catches_an_answer_that_drops_an_output(
    quantiles_checkpoint: tuple[Path, pd.DataFrame], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first of the K values left out of each answer."""
    mutate(
        monkeypatch,
        BatchedAPI,
        "answers",
        "columns = list(frame.columns[1:])",
        "columns = list(frame.columns[2:])",
    )
    with pytest.raises(AssertionError):
        serving.test_a_k_output_model_answers_each_rows_columns_by_name(quantiles_checkpoint)
