"""One rule for every cell (tables/test_cells.py): the server's request → prediction steps (in process, no
HTTP) answer random rows as :class:`src.predict.Predictor` does, and name the same cells."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import src.extras.tables.test_cells as cells
from src.apps import serve
from src.extras.tables import conftest as tables
from src.extras.tables.preprocessing import CellReport
from src.predict import Predictor
from tests.conftest import Trained

# the table runs these tests read (the table kind's fixtures)
messy_trained = tables.messy_trained
target_trained = tables.target_trained


@pytest.fixture(scope="module", params=["one-hot", "target means"])
def paths(request: pytest.FixtureRequest) -> dict:
    """Built once per way of reading the many-valued columns: the Predictor and the server's API."""
    trained: Trained = request.getfixturevalue(cells.trained_fixture(request.param))
    api = serve.TabularAPI(str(trained.checkpoint), max_rows=100, max_batch_size=4, batch_timeout=0.0)
    api.pre_setup()
    api.setup("cpu")
    return {"predictor": Predictor.from_checkpoint(trained.checkpoint), "api": api}


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(cells.ROW, min_size=1, max_size=6))
def test_every_path_reads_every_cell_alike(paths: dict, rows: list[dict]) -> None:
    report = CellReport()
    expected = paths["predictor"].predict(pd.DataFrame.from_records(rows), report=report)
    want = expected[cells.PROBABILITIES].to_numpy()
    assert np.isfinite(want).all()
    # the server: decode (every check, the encoding), predict, answer
    api = paths["api"]
    answer = api.predict(api.decode_request(serve.PredictRequest(rows=rows)))
    assert isinstance(answer, serve.Answer)
    assert [p["label"] for p in answer.predictions] == expected["prediction"].tolist()
    served = [[p["probabilities"][label] for label in cells.LABELS] for p in answer.predictions]
    np.testing.assert_allclose(served, want, rtol=1.3e-6, atol=1e-5)
    assert answer.notices == report.as_json()


def test_an_array_checkpoint_is_served_as_rows_of_its_feature_columns(trained: Trained) -> None:
    """The core's array DataModule (digits): a request's rows of the 64 pixel columns are answered as
    :class:`Predictor` answers them."""
    api = serve.TabularAPI(str(trained.checkpoint), max_rows=100, max_batch_size=4, batch_timeout=0.0)
    api.pre_setup()
    api.setup("cpu")
    rows = trained.raw_rows("test").head(5)
    expected = Predictor.from_checkpoint(trained.checkpoint).predict(rows)
    answer = api.predict(api.decode_request(serve.PredictRequest(rows=rows.to_dict("records"))))
    assert isinstance(answer, serve.Answer)
    assert [p["label"] for p in answer.predictions] == expected["prediction"].tolist()
