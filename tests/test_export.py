"""Export: the ONNX and torch.export graphs compute what the checkpoint computes, and the JSON sidecar
alone (no project code) turns raw rows into the graph's input exactly as the project does."""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import onnxruntime
import pandas as pd
import pytest
import torch

from src.apps import export
from src.predict import Predictor
from tests.conftest import ROOT, Trained

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


def run_graph(fmt: str, path: Path, x: torch.Tensor) -> torch.Tensor:
    """The written file run as its users run it, without the project's helpers."""
    if fmt == "onnx":
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return torch.from_numpy(session.run(["logits"], {"features": x.numpy()})[0])
    return torch.export.load(path).module()(x)


@pytest.mark.parametrize(("fmt", "name"), [("onnx", "model.onnx"), ("torch-export", "model.pt2")])
def test_the_exported_graph_equals_the_checkpoint_on_the_test_split(
    fmt: str, name: str, exported: Path, messy_trained: Trained
) -> None:
    predictor = Predictor.from_checkpoint(messy_trained.checkpoint)
    raw = messy_trained.raw_rows("test")
    x = predictor.encode(raw)  # (N, F) of the test split
    torch.testing.assert_close(x, messy_trained.run.datamodule.dataset("test").tensors[0], rtol=0, atol=0)
    tolerance = export.TOLERANCES[fmt]  # onnx: rtol = atol = 1e-5; torch-export: 1e-6
    with torch.inference_mode():
        logits = predictor.model(x)
        got = run_graph(fmt, exported / name, x)
    assert got.shape == logits.shape == (len(raw), 3)
    torch.testing.assert_close(got, logits, rtol=tolerance.rtol, atol=tolerance.atol)
    # and therefore what predict reports: the same probabilities and labels
    predicted = predictor.predict(raw)
    torch.testing.assert_close(
        got.softmax(-1),
        torch.tensor(predicted[PROBABILITIES].to_numpy(), dtype=torch.float32),
        rtol=tolerance.rtol,
        atol=tolerance.atol,
    )
    assert [LABELS[k] for k in got.argmax(-1)] == predicted["prediction"].tolist()


def test_the_batch_dimension_is_dynamic(exported: Path, messy_trained: Trained) -> None:
    x = messy_trained.run.datamodule.dataset("test").tensors[0]
    for rows in (1, 2, len(x)):
        for fmt, name in (("onnx", "model.onnx"), ("torch-export", "model.pt2")):
            assert run_graph(fmt, exported / name, x[:rows]).shape == (rows, 3)


def test_the_sidecar_is_the_checkpoints_preprocessing(exported: Path, messy_trained: Trained) -> None:
    predictor = Predictor.from_checkpoint(messy_trained.checkpoint)
    sidecar = json.loads((exported / "model.onnx.json").read_text())
    assert sidecar["preprocessing"] == predictor.preprocessor.state_dict()
    assert sidecar["feature_names"] == predictor.preprocessor.feature_names
    assert sidecar["graph"] == {
        "file": "model.onnx",
        "format": "onnx",
        "input": "features",
        "output": "logits",
        "in_features": len(predictor.preprocessor.feature_names),
    }
    assert json.loads((exported / "model.pt2.json").read_text())["graph"]["file"] == "model.pt2"


def readme_example() -> str:
    """The docs' onnxruntime example, the block that reads the sidecar."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "deploy.md").read_text(), re.DOTALL)
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


def test_the_readme_example_encodes_raw_rows_from_the_sidecar_alone(
    exported: Path, messy_trained: Trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    code = readme_example()
    assert not re.search(r"^\s*(from|import)\s+src\b", code, re.MULTILINE)  # no project code
    for name in ("model.onnx", "model.onnx.json"):
        shutil.copy(exported / name, tmp_path / name)
    (tmp_path / "request.json").write_text(json.dumps({"rows": RAW_ROWS}))
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "docs/deploy.md", "exec"), namespace)

    predictor = Predictor.from_checkpoint(messy_trained.checkpoint)
    frame = pd.DataFrame.from_records(RAW_ROWS)
    x = namespace["x"]
    assert x.dtype == np.float32
    # the same matrix, bit for bit: the project computes in float64 and stores float32, and so does the
    # sidecar's recipe
    torch.testing.assert_close(torch.from_numpy(x), predictor.encode(frame), rtol=0, atol=0)
    predicted = predictor.predict(frame)
    tolerance = export.TOLERANCES["onnx"]
    np.testing.assert_allclose(
        namespace["probabilities"],
        predicted[PROBABILITIES].to_numpy(),
        rtol=tolerance.rtol,
        atol=tolerance.atol,
    )
    assert capsys.readouterr().out.strip() == str(predicted["prediction"].tolist())


def test_every_part_of_the_encoding_is_reached_by_those_rows(messy_trained: Trained) -> None:
    """Guards the test above: its rows put a 1 in every "(other)" and "(missing)" column they could."""
    predictor = Predictor.from_checkpoint(messy_trained.checkpoint)
    x = predictor.encode(pd.DataFrame.from_records(RAW_ROWS))
    names = predictor.preprocessor.feature_names
    hit = {name for name, column in zip(names, x.T, strict=True) if column.abs().max() > 0}
    reachable = [name for name in names if name.endswith(("=(other)", " (missing)"))]
    assert reachable
    assert set(reachable) <= hit


def test_the_export_refuses_a_graph_that_differs_from_the_checkpoint(
    messy_trained: Trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The command's own check can fail: a graph whose outputs are off by 1e-3 is not written."""
    real = export.run_exported
    monkeypatch.setattr(export, "run_exported", lambda fmt, path, x: real(fmt, path, x) + 1e-3)
    with pytest.raises(SystemExit) as exit_:
        export.main(["--ckpt_path", str(messy_trained.checkpoint), "--output", str(tmp_path / "model.onnx")])
    assert exit_.value.code == 1
    assert "differs from the checkpoint by up to 0.001" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # neither the graph, nor the sidecar, nor a temporary file


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


@pytest.mark.parametrize(("fmt", "name"), [("onnx", "model.onnx"), ("torch-export", "model.pt2")])
def test_a_regression_graph_returns_values_in_the_targets_units(
    fmt: str, name: str, regression_checkpoint: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    checkpoint, rows = regression_checkpoint
    export.main(["--ckpt_path", str(checkpoint), "--format", fmt, "--output", str(tmp_path / name)])
    assert json.loads((tmp_path / f"{name}.json").read_text())["graph"]["output"] == "values"
    predictor = Predictor.from_checkpoint(checkpoint)
    x = predictor.encode(rows)
    if fmt == "onnx":
        session = onnxruntime.InferenceSession(str(tmp_path / name), providers=["CPUExecutionProvider"])
        got = torch.from_numpy(session.run(["values"], {"features": x.numpy()})[0])
    else:
        got = run_graph(fmt, tmp_path / name, x)
    expected = torch.tensor(predictor.predict(rows)["prediction"].to_numpy(), dtype=torch.float32)
    assert got.shape == (len(rows),)
    tolerance = export.TOLERANCES[fmt]
    torch.testing.assert_close(got, expected, rtol=tolerance.rtol, atol=tolerance.atol)


def test_make_export_runs_the_export_command() -> None:
    recipe = (ROOT / "Makefile").read_text().split("\nexport: $(STAMP)", 1)[1].split("\n\n", 1)[0]
    assert '$(PY) -m src.apps.export --ckpt_path "$(CKPT)" --format $(FORMAT)' in recipe
    assert '$(if $(OUTPUT),--output "$(OUTPUT)")' in recipe
