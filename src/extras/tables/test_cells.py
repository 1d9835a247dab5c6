"""One rule for every cell: random rows (numbers, NaN, None, blanks, missing tokens, unseen categories,
text among numbers, numbers beyond float32) through the five paths give the same predictions.

The paths: the training DataModule's encoding of a file (``preprocessing_from`` the checkpoint), the
``predict`` command (and the DataModule's ``predict_path`` that the Trainer's predict reads),
:class:`src.predict.Predictor`, the server's request → prediction steps (in process, no HTTP), and the
exported ONNX graph run by the export page's example (onnxruntime and numpy alone); the server and the
graph where their apps are still there. Files are CSV, so their rows are the same cells as text.
"""

import math
import re
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
from tests.conftest import QUIET, ROOT, Trained, app, fit_in

#: the table DataModule in place of the array one the shipped array configs name
TABLE_DATA = "--data=src.extras.tables.TabularDataModule"

#: the apps among the paths, where they are still there (each can be deleted)
export, serve = app("export"), app("serve")

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


def docs_example(folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The export app's README's onnxruntime block, run in ``folder``, its names returned (``predict``
    among them)."""
    page = ROOT / "src" / "apps" / "export" / "README.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.DOTALL)
    [block] = [b for b in blocks if 'Path("model.onnx.json")' in b]
    (folder / "request.json").write_text('{"rows": []}')
    namespace: dict = {}
    with monkeypatch.context() as patch:
        patch.chdir(folder)
        code = block.replace('print(predict(rows)["label"].tolist())', "")  # no rows to print here
        exec(compile(code, str(page), "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def target_trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """The messy fit of ``messy_trained`` with its columns of more than 4 values (region, city) read by
    their target means (``data.encoding.high_cardinality: target``)."""
    from src.extras.tables.test_preprocessing import messy_frame

    folder = tmp_path_factory.mktemp("target-trained")
    frame = messy_frame(n=300)
    frame.to_csv(folder / "train.csv", index=False)
    run = fit_in(
        folder, "--config", str(ROOT / "configs" / "digits.yaml"), TABLE_DATA, "--data.source=csv",
        "--data.path=train.csv", "--data.target_column=label", "--data.task=classification",
        "--data.encoding.max_categories=4", "--data.encoding.missing_indicator=true",
        "--model.init_args.net=null",
        "--data.encoding.high_cardinality=target",
    )  # fmt: skip
    assert [c.name for c in run.datamodule.preprocessor.categorical if c.encodings is not None] == [
        "region", "city"
    ]  # fmt: skip
    return Trained(run, frame, Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt")


@pytest.fixture(scope="module", params=["one-hot", "target means"])
def paths(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Everything built once per way of reading the many-valued columns: the Predictor, the server's API,
    the exported graph through the docs' example, and a folder for the files."""
    trained: Trained = request.getfixturevalue(
        "messy_trained" if request.param == "one-hot" else "target_trained"
    )
    messy_trained = trained
    folder = tmp_path_factory.mktemp("cells")
    api, example = None, None
    if serve is not None:
        api = serve.TabularAPI(
            str(messy_trained.checkpoint), max_rows=100, max_batch_size=4, batch_timeout=0.0
        )
        api.pre_setup()
        api.setup("cpu")
    if export is not None:
        export.export(messy_trained.checkpoint, "onnx", folder / "model.onnx")
        with pytest.MonkeyPatch.context() as patch:
            example = docs_example(folder, patch)
    return {
        "predictor": Predictor.from_checkpoint(messy_trained.checkpoint),
        "api": api,
        "example": example,
        "folder": folder,
        "checkpoint": str(messy_trained.checkpoint),
        "padding": messy_trained.raw_rows("train").head(30).assign(label=LABELS * 10),
    }


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

    if serve is not None:  # the server: decode (every check, the encoding), predict, answer
        api = paths["api"]
        answer = api.predict(api.decode_request(serve.PredictRequest(rows=rows)))
        assert isinstance(answer, serve.Answer)
        assert [p["label"] for p in answer.predictions] == expected["prediction"].tolist()
        served = [[p["probabilities"][label] for label in LABELS] for p in answer.predictions]
        np.testing.assert_allclose(served, want, rtol=1.3e-6, atol=1e-5)
        assert answer.notices == report.as_json()

    if export is not None:  # the exported ONNX graph, fed by the export page's example alone
        graph = paths["example"]["predict"](rows)
        assert graph["label"].tolist() == expected["prediction"].tolist()
        np.testing.assert_allclose(graph["probabilities"], want, rtol=1e-5, atol=1e-5)

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
