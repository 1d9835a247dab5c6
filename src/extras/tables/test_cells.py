"""One rule for every cell: random rows (numbers, NaN, None, blanks, missing tokens, unseen categories,
text among numbers, numbers beyond float32) through the core's paths give the same predictions.

The paths: the training DataModule's encoding of a file (``preprocessing_from`` the checkpoint), the
``predict`` command (and the DataModule's ``predict_path`` that the Trainer's predict reads), and
:class:`src.predict.Predictor`. Files are CSV, so their rows are the same cells as text. An app that
predicts holds its own path to :class:`Predictor`'s answers on the same rows (:data:`ROW`) in its folder.
"""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from src.cli import main
from src.extras.tables import TabularDataModule
from src.extras.tables.preprocessing import CellReport
from src.predict import Predictor
from tests.conftest import QUIET, Trained

#: the table DataModule in place of the array one the shipped array configs name
TABLE_DATA = "--data=src.extras.tables.TabularDataModule"

LABELS = ["high", "low", "mid"]
PROBABILITIES = [f"probability({label})" for label in LABELS]
#: stray texts: no pandas missing text among them ("NA", "null"...), which a CSV file would read as missing
STRAY = st.text("abcxyz ,;!", min_size=1, max_size=6).filter(lambda t: t.strip() and t.strip() != "nan")
#: numbers the rule reads as missing (infinite, beyond float32), and large ones it keeps
EXTREME = st.sampled_from([math.inf, -math.inf, 1e39, -1e300, 1e6, -3e5])
MISSING = st.sampled_from([None, math.nan, "", "  ", "?"])  # "?": a missing token training found in age
NUMBER = st.one_of(st.floats(-200, 200, allow_nan=False).map(lambda v: round(v, 3)), st.integers(-5, 120))
NUMERIC = st.one_of(NUMBER, NUMBER.map(lambda v: f" {v} "), MISSING, STRAY, EXTREME)
CATEGORY = st.sampled_from(["north", "south", "east", "west", " north ", "yes", "no", "city3", "city7"])
CATEGORICAL = st.one_of(CATEGORY, MISSING, STRAY, st.booleans(), st.integers(0, 3))
ROW = st.fixed_dictionaries(
    {
        "income": NUMERIC,
        "region": CATEGORICAL,
        "member": CATEGORICAL,
        "age": NUMERIC,
        "verified": CATEGORICAL,
        "city": CATEGORICAL,
    }
)


@pytest.fixture(scope="module", params=["one-hot", "target means"])
def paths(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Everything built once per way of reading the many-valued columns: the Predictor and a folder for
    the files."""
    trained: Trained = request.getfixturevalue(trained_fixture(request.param))
    return {
        "predictor": Predictor.from_checkpoint(trained.checkpoint),
        "folder": tmp_path_factory.mktemp("cells"),
        "checkpoint": str(trained.checkpoint),
        "padding": trained.raw_rows("train").head(30).assign(label=LABELS * 10),
    }


def trained_fixture(way: str) -> str:
    """The shared fit (tests/conftest.py) whose many-valued columns are read ``way``."""
    return "messy_trained" if way == "one-hot" else "target_trained"


def probabilities_of_datamodule(predictor: Predictor, dm: TabularDataModule, stages: list[str]) -> np.ndarray:
    """The rows of a file in their order, as the DataModule encoded them, through the model."""
    x = torch.cat([dm.dataset(stage).tensors[0] for stage in stages])
    order = np.concatenate([dm.split_rows[stage] for stage in stages]) if stages != ["predict"] else None
    probs = predictor.outputs(x)["probs"].numpy()
    if order is None:
        return probs
    back = np.empty_like(probs)
    back[order] = probs
    return back


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(ROW, min_size=1, max_size=6))
def test_every_path_reads_every_cell_alike(paths: dict, rows: list[dict], tmp_path: Path) -> None:
    predictor: Predictor = paths["predictor"]
    report = CellReport()
    expected = predictor.predict(pd.DataFrame.from_records(rows), report=report)
    want = expected[PROBABILITIES].to_numpy()
    assert np.isfinite(want).all()

    # predict's encoding of a file, and training's: the same cells written to CSV and read back
    folder = paths["folder"]
    frame = pd.DataFrame.from_records(rows)
    frame.to_csv(folder / "new.csv", index=False)
    checkpoint = paths["checkpoint"]
    predicting = TabularDataModule(predict_path=str(folder / "new.csv"), preprocessing_from=checkpoint)
    pd.concat([paths["padding"], frame.assign(label="mid")], ignore_index=True).to_csv(
        folder / "train.csv", index=False
    )
    training = TabularDataModule(
        path=str(folder / "train.csv"),
        target_column="label",
        task="classification",
        preprocessing_from=checkpoint,
    )
    for dm, stages in ((predicting, ["predict"]), (training, ["train", "val", "test"])):
        got = probabilities_of_datamodule(predictor, dm, stages)[-len(rows) :]
        np.testing.assert_allclose(got, want, rtol=1.3e-6, atol=1e-5)

    # the predict command itself, on the file
    out = folder / "predictions.csv"
    words = ["--data.predict_path", str(folder / "new.csv"), "--output", str(out), "--overwrite", "true"]
    main(["predict", "--ckpt_path", checkpoint, *words, *QUIET])
    written = pd.read_csv(out)
    assert written["prediction"].tolist() == expected["prediction"].tolist()
    np.testing.assert_allclose(written[PROBABILITIES].to_numpy(), want, rtol=1.3e-6, atol=1e-5)
