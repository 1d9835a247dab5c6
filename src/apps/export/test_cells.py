"""One rule for every cell (tables/test_cells.py): the exported ONNX graph, run by this app's page's example
(onnxruntime and numpy alone), answers random rows as :class:`src.predict.Predictor` does."""

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import src.extras.tables.test_cells as cells
from src.apps import export
from src.extras.tables import conftest as tables
from src.predict import Predictor
from tests.conftest import Trained

# the table runs these tests read (the table kind's fixtures)
messy_trained = tables.messy_trained
target_trained = tables.target_trained


def docs_example(folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """This app's README's onnxruntime block, run in ``folder``, its names returned (``predict`` among
    them)."""
    page = Path(__file__).with_name("README.md")
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.DOTALL)
    [block] = [b for b in blocks if 'Path("model.onnx.json")' in b]
    (folder / "request.json").write_text('{"rows": []}')
    namespace: dict = {}
    with monkeypatch.context() as patch:
        patch.chdir(folder)
        code = block.replace('print(predict(rows)["label"].tolist())', "")  # no rows to print here
        exec(compile(code, str(page), "exec"), namespace)
    return namespace


@pytest.fixture(scope="module", params=["one-hot", "target means"])
def paths(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Built once per way of reading the many-valued columns: the Predictor, and the exported graph
    through the page's example."""
    trained: Trained = request.getfixturevalue(cells.trained_fixture(request.param))
    folder = tmp_path_factory.mktemp("cells")
    export.export(trained.checkpoint, "onnx", folder / "model.onnx")
    with pytest.MonkeyPatch.context() as patch:
        example = docs_example(folder, patch)
    return {"predictor": Predictor.from_checkpoint(trained.checkpoint), "example": example}


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(cells.ROW, min_size=1, max_size=6))
def test_every_path_reads_every_cell_alike(paths: dict, rows: list[dict]) -> None:
    expected = paths["predictor"].predict(pd.DataFrame.from_records(rows))
    want = expected[cells.PROBABILITIES].to_numpy()
    assert np.isfinite(want).all()
    graph = paths["example"]["predict"](rows)
    assert graph["label"].tolist() == expected["prediction"].tolist()
    np.testing.assert_allclose(graph["probabilities"], want, rtol=1e-5, atol=1e-5)
