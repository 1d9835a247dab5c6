"""Export: the ONNX graph takes raw columns and predicts what ``Predictor`` predicts from them, the
torch.export program computes what the checkpoint computes from encoded rows, and the docs' example
(onnxruntime and numpy alone) gives ``Predictor``'s answers on rows from pandas, JSON and ``csv``."""

import csv
import json
import re
import shutil
from pathlib import Path

import numpy as np
import onnxruntime
import pandas as pd
import pytest
import torch

import src.extras.tables.test_multitarget as multitarget
import src.extras.tables.test_targets as targets
from src.apps import export
from src.extras.tables import conftest as tables
from src.extras.tables.predict import table_preprocessor
from src.predict import Predictor
from tests.conftest import Trained

# the table runs these tests take further (the table kind's fixtures)
messy_trained = tables.messy_trained

LABELS = ["high", "low", "mid"]
PROBABILITIES = [f"probability({label})" for label in LABELS]


@pytest.fixture(scope="module")
def exported(messy_trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both formats of the shared checkpoint, written by the command a user types."""
    folder = tmp_path_factory.mktemp("exported")
    for fmt, name in (("onnx", "model.onnx"), ("torch-export", "model.pt2")):
        export.main(
            ["--ckpt_path", str(messy_trained.checkpoint), "--format", fmt, "--output", str(folder / name)]
        )
    return folder


def run_raw(path: Path, predictor: Predictor, frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """The raw-column ONNX graph on ``frame``, run in onnxruntime: output name → array."""
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(
        zip(
            names,
            session.run(names, export.graph_inputs(table_preprocessor(predictor.reading), frame)),
            strict=True,
        )
    )


def assert_same_as_predictor(got: dict[str, np.ndarray], predicted: pd.DataFrame) -> None:
    """Labels equal on every row; probabilities within the ONNX tolerance (rtol = atol = 1e-5)."""
    tolerance = export.TOLERANCES["onnx"]
    assert np.asarray(got["label"]).tolist() == predicted["prediction"].tolist()
    np.testing.assert_allclose(
        got["probabilities"], predicted[PROBABILITIES].to_numpy(), rtol=tolerance.rtol, atol=tolerance.atol
    )


@pytest.mark.slow
def test_the_onnx_graph_takes_raw_columns_and_predicts_what_predictor_does(
    exported: Path, messy_trained: Trained
) -> None:
    predictor = Predictor.from_checkpoint(messy_trained.checkpoint)
    raw = messy_trained.raw_rows("test")
    got = run_raw(exported / "model.onnx", predictor, raw)
    assert got["logits"].shape == got["probabilities"].shape == (len(raw), 3)
    assert_same_as_predictor(got, predictor.predict(raw))
    # the encoded matrix inside the graph is the one the net was trained on, bit for bit
    x = predictor.read(raw)
    torch.testing.assert_close(x, messy_trained.run.datamodule.dataset("test").tensors[0], rtol=0, atol=0)
    with torch.inference_mode():
        logits = predictor.model(x).numpy()
    np.testing.assert_allclose(got["logits"], logits, rtol=1e-5, atol=1e-5)


def test_the_torch_export_program_equals_the_checkpoint_on_the_test_split(
    exported: Path, messy_trained: Trained
) -> None:
    predictor = Predictor.from_checkpoint(messy_trained.checkpoint)
    x = predictor.read(messy_trained.raw_rows("test"))  # (N, F) of the test split
    tolerance = export.TOLERANCES["torch-export"]  # 1e-6
    with torch.inference_mode():
        logits = predictor.model(x)
        got = torch.export.load(exported / "model.pt2").module()(x)
    assert got.shape == logits.shape == (len(x), 3)
    torch.testing.assert_close(got, logits, rtol=tolerance.rtol, atol=tolerance.atol)


def test_the_batch_dimension_is_dynamic(exported: Path, messy_trained: Trained) -> None:
    predictor = Predictor.from_checkpoint(messy_trained.checkpoint)
    raw = messy_trained.raw_rows("test")
    x = predictor.read(raw)
    program = torch.export.load(exported / "model.pt2").module()
    for rows in (1, 2, len(x)):
        assert run_raw(exported / "model.onnx", predictor, raw.iloc[:rows])["label"].shape == (rows,)
        assert program(x[:rows]).shape == (rows, 3)


def test_the_sidecar_is_the_checkpoints_preprocessing(exported: Path, messy_trained: Trained) -> None:
    predictor = Predictor.from_checkpoint(messy_trained.checkpoint)
    sidecar = json.loads((exported / "model.onnx.json").read_text())
    assert sidecar["preprocessing"] == table_preprocessor(predictor.reading).state_dict()
    assert sidecar["feature_names"] == table_preprocessor(predictor.reading).feature_names
    prep = table_preprocessor(predictor.reading)
    assert sidecar["graph"] == {
        "file": "model.onnx",
        "format": "onnx",
        "inputs": [{"name": c.name, "dtype": "double"} for c in prep.numeric]
        + [{"name": c.name, "dtype": "string"} for c in prep.categorical],
        "outputs": ["logits", "probabilities", "label"],
    }
    assert {"", "NA", "null", "nan"} <= set(sidecar["csv"]["missing"])
    session = onnxruntime.InferenceSession(str(exported / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == [i["name"] for i in sidecar["graph"]["inputs"]]
    assert json.loads((exported / "model.pt2.json").read_text())["graph"] == {
        "file": "model.pt2",
        "format": "torch-export",
        "input": "features",
        "output": "logits",
        "in_features": len(prep.feature_names),
    }


def readme_example() -> str:
    """The docs' onnxruntime example, the block that reads the sidecar."""
    blocks = re.findall(r"```python\n(.*?)```", Path(__file__).with_name("README.md").read_text(), re.DOTALL)
    [block] = [b for b in blocks if 'Path("model.onnx.json")' in b]
    return block


#: raw rows as a client sends them: numbers, numbers as text, "?" (a missing token the training file
#: had), blanks, nulls, booleans, categories never seen in training
RAW_ROWS = [
    {"income": 61.5, "region": "north", "member": "yes", "age": 33, "verified": True, "city": "city3"},
    {"income": None, "region": "atlantis", "member": " no ", "age": "?", "verified": None, "city": None},
    {"income": "47.25", "region": "", "member": "maybe", "age": " 71 ", "verified": False, "city": "city24"},
    {"income": "", "region": None, "member": "yes", "age": None, "verified": "True", "city": "nowhere"},
    {"income": 50, "region": " south", "member": "no", "age": 18.0, "verified": True, "city": "city27"},
]


def test_the_docs_example_equals_predictor_on_rows_from_pandas_json_and_csv(
    exported: Path, messy_trained: Trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """This folder's README.md block, with onnxruntime and numpy alone, on every row of a table with empty
    cells as pandas reads it (NaN), on JSON rows (None, blanks, "?", unseen categories, text among
    numbers) and on the csv module's rows (texts only): Predictor's labels and probabilities."""
    code = readme_example()
    assert not re.search(r"^\s*(from|import)\s+(src|pandas|torch)\b", code, re.MULTILINE)
    for name in ("model.onnx", "model.onnx.json"):
        shutil.copy(exported / name, tmp_path / name)
    (tmp_path / "request.json").write_text(json.dumps({"rows": RAW_ROWS}))
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "src/apps/export/README.md", "exec"), namespace)
    predictor = Predictor.from_checkpoint(messy_trained.checkpoint)
    json_rows = predictor.predict(pd.DataFrame.from_records(RAW_ROWS))
    assert capsys.readouterr().out.strip() == str(json_rows["prediction"].tolist())
    assert_same_as_predictor(namespace["predict"](RAW_ROWS), json_rows)

    table = messy_trained.frame.drop(columns="label").assign(
        region=lambda f: f["region"].where(f.index % 5 > 0, "atlantis")
    )
    table.to_csv(tmp_path / "new.csv", index=False)
    read = pd.read_csv(tmp_path / "new.csv")
    assert read.isna().any().sum() >= 2  # empty cells in several columns, NaN once read
    expected = predictor.predict(read)
    assert_same_as_predictor(namespace["predict"](read.to_dict("records")), expected)
    missing = set(namespace["spec"]["csv"]["missing"])
    with open(tmp_path / "new.csv", newline="") as file:
        texts = [{k: None if v in missing else v for k, v in row.items()} for row in csv.DictReader(file)]
    assert_same_as_predictor(namespace["predict"](texts), expected)


def test_every_part_of_the_encoding_is_reached_by_those_rows(messy_trained: Trained) -> None:
    """Guards the test above: its rows put a 1 in every "(other)" and "(missing)" column they could."""
    predictor = Predictor.from_checkpoint(messy_trained.checkpoint)
    x = predictor.read(pd.DataFrame.from_records(RAW_ROWS))
    names = table_preprocessor(predictor.reading).feature_names
    hit = {name for name, column in zip(names, x.T, strict=True) if column.abs().max() > 0}
    reachable = [name for name in names if name.endswith(("=(other)", " (missing)"))]
    assert reachable
    assert set(reachable) <= hit


def test_the_export_refuses_a_graph_that_differs_from_the_checkpoint(
    messy_trained: Trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The command's own check can fail: a graph whose outputs are off by 1e-3, or whose preprocessing
    reads a cell otherwise than Predictor, is not written."""
    real = export.run_exported
    monkeypatch.setattr(export, "run_exported", lambda fmt, path, x: real(fmt, path, x) + 1e-3)
    with pytest.raises(SystemExit) as exit_:
        export.main(
            [
                "--ckpt_path",
                str(messy_trained.checkpoint),
                "--output",
                str(tmp_path / "model.pt2"),
                "--format",
                "torch-export",
            ]
        )
    assert exit_.value.code == 1
    assert "differs from the checkpoint by up to 0.001" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # neither the graph, nor the sidecar, nor a temporary file
    # an ONNX graph whose numeric inputs miss the rule "beyond float32 is missing": its check fails
    monkeypatch.setattr(export, "FLOAT32_MAX", float("inf"))
    with pytest.raises(SystemExit) as exit_:
        export.main(["--ckpt_path", str(messy_trained.checkpoint), "--output", str(tmp_path / "model.onnx")])
    assert exit_.value.code == 1
    assert "the exported onnx graph" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (
            ["--ckpt_path", "gone.ckpt"],
            "error: checkpoint 'gone.ckpt' does not exist; pass the path of a .ckpt file.",
        ),
        (
            ["--ckpt_path", "{ckpt}", "--format", "tflite"],
            "error: --format 'tflite' is unknown; choose one of onnx, torch-export.",
        ),
        (
            ["--ckpt_path", "{ckpt}", "--output", "a-file/model.onnx"],
            "error: --output='a-file/model.onnx' cannot be written: '{tmp}/a-file' is a file, not a folder.",
        ),
        (
            ["--ckpt_path", "{ckpt}", "--output", "."],
            "error: --output='.' is a folder; name the file to write inside it.",
        ),
        (  # a folder that does not exist yet: not a file named "new-folder"
            ["--ckpt_path", "{ckpt}", "--output", "new-folder/"],
            "error: --output='new-folder/' is a folder; name the file to write inside it.",
        ),
        (
            ["--format", "onnx"],
            "error: the following arguments are required: --ckpt_path; see python -m src.apps.export --help.",
        ),
    ],
)
def test_bad_input_is_one_sentence_and_exit_status_2(
    words: list[str], message: str, messy_trained: Trained, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("not a folder")
    before = sorted(tmp_path.iterdir())
    words = [w.format(ckpt=messy_trained.checkpoint) for w in words]
    with pytest.raises(SystemExit) as exit_:
        export.main(words)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == message.format(tmp=tmp_path)
    assert sorted(tmp_path.iterdir()) == before


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "name"), [("onnx", "model.onnx"), ("torch-export", "model.pt2")])
def test_a_regression_graph_returns_values_in_the_targets_units(
    fmt: str, name: str, regression_checkpoint: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    """The friedman regression, on the core's arrays: raw features in, values in the target's units out."""
    checkpoint, rows = regression_checkpoint
    export.main(["--ckpt_path", str(checkpoint), "--format", fmt, "--output", str(tmp_path / name)])
    graph = json.loads((tmp_path / f"{name}.json").read_text())["graph"]
    predictor = Predictor.from_checkpoint(checkpoint)
    assert graph["output"] == "values"
    x = predictor.read(rows)  # (N, 10) raw features: the graph standardizes them itself
    if fmt == "onnx":
        (values,) = onnxruntime.InferenceSession(str(tmp_path / name)).run(
            ["values"], {"features": x.numpy()}
        )
        got = torch.from_numpy(values)
    else:
        got = torch.export.load(tmp_path / name).module()(x)
    expected = torch.tensor(predictor.predict(rows)["prediction"].to_numpy(), dtype=torch.float32)
    assert got.shape == (len(rows),)
    tolerance = export.TOLERANCES[fmt]
    torch.testing.assert_close(got, expected, rtol=tolerance.rtol, atol=tolerance.atol)


def test_make_export_runs_the_export_command() -> None:
    targets = Path(__file__).with_name("app.mk").read_text()
    recipe = targets.split("\nexport: $(STAMP)", 1)[1].split("\n\n", 1)[0]
    assert '$(PY) -m src.apps.export --ckpt_path "$(CKPT)" --format $(FORMAT)' in recipe
    assert '$(if $(OUTPUT),--output "$(OUTPUT)")' in recipe


# -- a task of the user's own with K outputs per row -------------------------------------------------------

QUANTILE_COLUMNS = ["preds(0)", "preds(1)", "preds(2)"]


@pytest.mark.parametrize(("fmt", "name"), [("onnx", "model.onnx"), ("torch-export", "model.pt2")])
def test_a_k_output_graph_returns_the_k_values_of_predict_steps_preds(
    fmt: str, name: str, quantiles_checkpoint: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    """Three quantiles per row (tests/helpers.py's Quantiles, on the core's arrays): the graph returns
    ``values`` ``(B, 3)``, each row's three as ``predict`` writes them, and was checked against the
    checkpoint so."""
    checkpoint, rows = quantiles_checkpoint
    export.main(["--ckpt_path", str(checkpoint), "--format", fmt, "--output", str(tmp_path / name)])
    graph = json.loads((tmp_path / f"{name}.json").read_text())["graph"]
    predictor = Predictor.from_checkpoint(checkpoint)
    assert graph["output"] == "values"
    x = predictor.read(rows)  # (N, 10) raw features: the graph standardizes them itself
    if fmt == "onnx":
        (values,) = onnxruntime.InferenceSession(str(tmp_path / name)).run(
            ["values"], {"features": x.numpy()}
        )
        got = torch.from_numpy(values)
    else:
        got = torch.export.load(tmp_path / name).module()(x)
    predicted = predictor.predict(rows)
    assert list(predicted.columns) == ["row", *QUANTILE_COLUMNS]
    expected = torch.tensor(predicted[QUANTILE_COLUMNS].to_numpy(), dtype=torch.float32)
    assert got.shape == (len(rows), 3)
    tolerance = export.TOLERANCES[fmt]
    torch.testing.assert_close(got, expected, rtol=tolerance.rtol, atol=tolerance.atol)
    assert not (expected[:, 0] == expected[:, 2]).all()  # three values, not one three times


def test_a_checkpoint_of_a_datamodule_without_a_table_is_one_sentence(
    many_labels_checkpoint: Path, tmp_path: Path, capsys
) -> None:
    """A multi-label task trained on tensors of its own: no raw columns to take, so nothing to export."""
    with pytest.raises(SystemExit) as exit_:
        export.main(["--ckpt_path", str(many_labels_checkpoint), "--output", str(tmp_path / "model.onnx")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: checkpoint ")
    assert "names no DataModule that says how to read new inputs" in err
    assert "\n" not in err
    assert list(tmp_path.iterdir()) == []


# -- a regression target learnt as log(1 + y) (tables/test_targets.py): the graph answers in its units


@pytest.fixture(scope="module")
def skewed_run(tmp_path_factory: pytest.TempPathFactory):
    return targets.fit_skewed(tmp_path_factory.mktemp("skewed"))


@pytest.mark.slow
def test_every_path_predicts_prices_in_their_own_units(skewed_run, tmp_path: Path) -> None:
    """The exported graph of the raw columns, as the task's own predict_step."""
    run, checkpoint, rows = skewed_run
    assert run.model.target_log.item() == 1.0  # auto: prices are skewed amounts
    x = run.datamodule.dataset("val").tensors[0]
    run.model.eval()
    with torch.no_grad():
        expected = run.model.predict_step((x,), 0)["preds"]
    assert expected.mean() > 1000  # prices, not logs
    export.export(checkpoint, "onnx", tmp_path / "model.onnx")
    graph = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    (values,) = graph.run(["values"], export.graph_inputs(run.datamodule.preprocessor, rows))
    np.testing.assert_allclose(values, expected.numpy(), rtol=1e-5)


# -- a table of several target columns (tables/test_multitarget.py): the raw-column graph answers each


@pytest.mark.slow
@pytest.mark.parametrize(
    ("config", "task", "names", "words"),
    [
        ("spiral.yaml", "classification", multitarget.LABELS, []),
        (
            "friedman.yaml",
            "regression",
            multitarget.VALUES,
            ["--model.init_args.net.init_args.hidden_sizes=[16]"],
        ),
    ],
    ids=["labels", "values"],
)
def test_a_table_of_several_targets_exports_a_graph_that_answers_each(
    config: str, task: str, names: list[str], words: list[str], tmp_path: Path
) -> None:
    run, checkpoint = multitarget.fitted(tmp_path, config, task, names, *words)
    export.main(["--ckpt_path", str(checkpoint), "--output", str(tmp_path / "model.onnx")])
    predictor = Predictor.from_checkpoint(checkpoint)
    rows = run.datamodule.table.features.iloc[run.datamodule.split_rows["val"]].reset_index(drop=True)
    predicted = predictor.predict(rows)
    got = run_raw(tmp_path / "model.onnx", predictor, rows)
    if task == "classification":  # each label's 0/1 choice, as predict_step makes it: probability > 0.5
        chosen = predicted[[f"probability({name})" for name in names]].to_numpy() > 0.5
        expected = chosen.astype(np.float32)
    else:
        expected = predicted[[f"prediction({name})" for name in names]].to_numpy(np.float32)
    assert np.asarray(got["values"]).shape == (len(rows), len(names))
    np.testing.assert_allclose(got["values"], expected, rtol=1e-5, atol=1e-5)


# -- the core's array DataModule: raw float32 features in, its standardization inside the graph ----------


def test_an_array_checkpoint_exports_its_standardization_and_net(trained: Trained, tmp_path: Path) -> None:
    graph = tmp_path / "digits.onnx"
    export.main(["--ckpt_path", str(trained.checkpoint), "--output", str(graph)])
    sidecar = json.loads(graph.with_name("digits.onnx.json").read_text())
    assert sidecar["graph"]["input"] == "features"
    assert sidecar["graph"]["output"] == "logits"
    rows = trained.raw_rows("test").head(32)
    x = rows[sidecar["feature_names"]].to_numpy(np.float32)  # (32, 64) raw pixels, as the file holds them
    (logits,) = onnxruntime.InferenceSession(str(graph)).run(None, {"features": x})
    expected = Predictor.from_checkpoint(trained.checkpoint).predict(rows)
    probabilities = expected[[f"probability({label})" for label in sidecar["labels"]]].to_numpy()
    np.testing.assert_allclose(torch.from_numpy(logits).softmax(-1).numpy(), probabilities, atol=1e-5)
    assert [sidecar["labels"][k] for k in logits.argmax(1)] == expected["prediction"].tolist()
