"""Break the export on purpose: the proofs that hold it must fail."""

from pathlib import Path

import pandas as pd
import pytest

import src.apps.export.test_export as exporting
from src.apps.export import Exportable
from tests.test_mutations import mutate


def test_the_k_output_test_catches_a_graph_whose_k_values_are_not_predict_steps(
    quantiles_checkpoint: tuple[Path, pd.DataFrame], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graph that returns the K values in another order: the export's own check against the checkpoint
    refuses it (exit status 1, nothing written), so the proof's export fails."""
    mutate(
        monkeypatch, Exportable, "forward", '(features,), 0)["preds"]', '(features,), 0)["preds"].flip(-1)'
    )
    with pytest.raises(SystemExit) as exit_:
        exporting.test_a_k_output_graph_returns_the_k_values_of_predict_steps_preds(
            "onnx", "model.onnx", quantiles_checkpoint, tmp_path
        )
    assert exit_.value.code == 1
    assert not (tmp_path / "model.onnx").exists()
