"""An image checkpoint's exported graphs (uint8 pixels in, normalization inside) compute what the
checkpoint computes on real PNG files; the sidecar alone turns a file into the input."""

import json
from pathlib import Path

import numpy as np
import onnxruntime
import pandas as pd
import pytest
import torch
from PIL import Image

from src.apps import export
from src.predict import Predictor

# an image model's checkpoint: these tests need the images extra, and are skipped without it
images = pytest.importorskip("src.extras.images.conftest")
CLASSES, PROBABILITIES = images.CLASSES, images.PROBABILITIES
image_folder, image_checkpoint = images.image_folder, images.image_checkpoint
new_images, predicted_images = images.new_images, images.predicted_images


@pytest.fixture(scope="module")
def predictor(image_checkpoint: Path) -> Predictor:
    return Predictor.from_checkpoint(image_checkpoint)


# -- export ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(image_folder: Path, image_checkpoint: Path) -> Path:
    """Both formats of the checkpoint, written by the command a user types."""
    out = image_folder / "exported"
    out.mkdir()
    for fmt, name in (("onnx", "model.onnx"), ("torch-export", "model.pt2")):
        export.main(["--ckpt_path", str(image_checkpoint), "--format", fmt, "--output", str(out / name)])
    return out


def run_graph(fmt: str, path: Path, images: torch.Tensor) -> torch.Tensor:
    """The written file run as its users run it, without the project's helpers."""
    if fmt == "onnx":
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return torch.from_numpy(session.run(["logits"], {"images": images.numpy()})[0])
    return torch.export.load(path).module()(images)


@pytest.mark.parametrize(("fmt", "name"), [("onnx", "model.onnx"), ("torch-export", "model.pt2")])
def test_the_exported_graph_equals_the_checkpoint_on_real_png_files(
    fmt: str,
    name: str,
    exported: Path,
    predictor: Predictor,
    predicted_images: pd.DataFrame,
    new_images: list[Path],
) -> None:
    pixels = predictor.read(new_images)  # (12, 8, 8, 1) uint8, as the files hold them
    assert pixels.dtype == torch.uint8
    tolerance = export.TOLERANCES[fmt]  # onnx: rtol = atol = 1e-5; torch-export: 1e-6
    with torch.inference_mode():
        logits = predictor.model(predictor.graph.normalize(pixels))  # the checkpoint's model, outside a graph
        got = run_graph(fmt, exported / name, pixels)
    assert got.shape == logits.shape == (12, 3)
    torch.testing.assert_close(got, logits, rtol=tolerance.rtol, atol=tolerance.atol)
    # therefore what the CLI's predict wrote: the same probabilities and labels
    torch.testing.assert_close(
        got.softmax(-1),
        torch.tensor(predicted_images[PROBABILITIES].to_numpy(), dtype=torch.float32),
        rtol=tolerance.rtol,
        atol=tolerance.atol,
    )
    assert [CLASSES[k] for k in got.argmax(-1)] == predicted_images["prediction"].tolist()
    for rows in (1, 5):  # the batch dimension is dynamic
        assert run_graph(fmt, exported / name, pixels[:rows]).shape == (rows, 3)


def test_the_sidecar_says_layout_mode_size_labels_and_alone_turns_a_file_into_the_input(
    exported: Path, image_checkpoint: Path, predictor: Predictor, new_images: list[Path]
) -> None:
    sidecar = json.loads((exported / "model.onnx.json").read_text())
    assert sidecar["graph"] == {
        "file": "model.onnx",
        "format": "onnx",
        "input": "images",
        "output": "logits",
        "layout": "BHWC",
        "dtype": "uint8",
        "mode": "L",
        "size": [8, 8],
        "shape": ["B", 8, 8, 1],
    }
    state = torch.load(image_checkpoint, weights_only=True)["ImageDataModule"]
    assert sidecar["preprocessing"] == {
        "task": "classification",
        "labels": CLASSES,
        "mode": "L",
        "channels": 1,
        "size": [8, 8],
        "resize": False,
        "mean": state["mean"].tolist(),
        "std": state["std"].tolist(),
    }
    assert sidecar["recipe"] == list(export.IMAGE_RECIPE)
    assert json.loads((exported / "model.pt2.json").read_text())["graph"]["format"] == "torch-export"
    # the recipe with Pillow and numpy alone: convert to mode, (H, W, C) uint8, stacked
    rows = []
    for path in new_images:
        with Image.open(path) as image:
            rows.append(
                np.asarray(image.convert(sidecar["graph"]["mode"])).reshape(sidecar["graph"]["shape"][1:])
            )
    torch.testing.assert_close(torch.from_numpy(np.stack(rows)), predictor.read(new_images), rtol=0, atol=0)


def test_an_export_that_differs_from_the_checkpoint_is_refused_and_writes_nothing(
    image_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    real = export.run_exported
    monkeypatch.setattr(export, "run_exported", lambda fmt, path, x: real(fmt, path, x) + 1e-3)
    with pytest.raises(SystemExit) as exit_:
        export.main(["--ckpt_path", str(image_checkpoint), "--output", str(tmp_path / "model.onnx")])
    assert exit_.value.code == 1
    assert "differs from the checkpoint by up to 0.001" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
