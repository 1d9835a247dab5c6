"""Images after training: :class:`Predictor` reads images as ``predict`` does, the exported graphs
(uint8 pixels in, normalization inside) compute what the checkpoint computes on real PNG files, and the
server answers base64 image files as ``predict`` does, refusing a bad one with a sentence naming it."""

import base64
import io
import json
import os
import signal
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import replace
from pathlib import Path

import lightning as L
import numpy as np
import onnxruntime
import pandas as pd
import pytest
import torch
from PIL import Image, ImageFile

from src.apps import export, serve
from src.cli import main
from src.data.images import ImageDataModule, decode
from src.errors import UserInputError
from src.image_predict import ImagePreprocessing
from src.predict import Predictor
from tests.conftest import BARE, CONFIGS, QUIET, ROOT
from tests.test_readme import page_blocks
from tests.test_serve import READY_WITHIN, free_port

CLASSES = ["cat", "dog", "owl"]
PROBABILITIES = [f"probability({name})" for name in CLASSES]


def write_images(folder: Path, classes: list[str], per_class: int, seed: int, size: int = 8) -> list[Path]:
    """Random grayscale PNG files in class folders; class k has bright rows k, k + K, ... (learnable)."""
    rng = np.random.default_rng(seed)
    for k, name in enumerate(classes):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 120, size=(size, size), dtype=np.uint8)
            pixels[k :: len(classes)] += 100
            Image.fromarray(pixels).save(folder / name / f"{i:03d}.png")
    return sorted(folder.rglob("*.png"))


def in_folder(folder: Path, words: list[str]) -> object:
    """``python -m src.cli <words>`` run from ``folder``, as a user would."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setattr(sys, "argv", ["src.cli"])
        return main([*words, *QUIET])


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("deploy-images")


@pytest.fixture(scope="module")
def checkpoint(folder: Path) -> Path:
    """Two epochs of configs/images.yaml's CNN (widths 4, 8) on 90 tiny 8x8 PNG files: its last checkpoint."""
    write_images(folder / "train", CLASSES, per_class=30, seed=0)
    in_folder(folder, [
        "fit", "--config", str(CONFIGS / "images.yaml"), *BARE, "--trainer.callbacks=[]",
        f"--data.init_args.folder={folder / 'train'}", "--data.init_args.batch_size=16",
        "--model.init_args.net.init_args.widths=[4, 8]", "--trainer.max_epochs=2",
        "--last_checkpoint=lightning.pytorch.callbacks.ModelCheckpoint", "--last_checkpoint.filename=last",
    ])  # fmt: skip
    (found,) = folder.rglob("last.ckpt")
    return found


@pytest.fixture(scope="module")
def new_images(folder: Path) -> list[Path]:
    """PNG files the run never saw, of all three classes."""
    return write_images(folder / "new", CLASSES, per_class=4, seed=9)


@pytest.fixture(scope="module")
def predicted(folder: Path, checkpoint: Path, new_images: list[Path]) -> pd.DataFrame:
    """``python -m src.cli predict`` on the new images: its CSV file."""
    out = folder / "predictions.csv"
    in_folder(folder, [
        "predict", "--ckpt_path", str(checkpoint), "--data.predict_path", str(folder / "new"),
        "--output", str(out),
    ])  # fmt: skip
    return pd.read_csv(out)


@pytest.fixture(scope="module")
def predictor(checkpoint: Path) -> Predictor:
    return Predictor.from_checkpoint(checkpoint)


# -- Predictor on images --------------------------------------------------------------------------------


def test_images_are_read_as_the_datamodule_reads_them_to_predict(
    predictor: Predictor, checkpoint: Path, new_images: list[Path]
) -> None:
    data = ImageDataModule(preprocessing_from=str(checkpoint), predict_path=[str(p) for p in new_images])
    expected = data.dataset("predict").tensors[0].permute(0, 2, 3, 1)  # type: ignore[attr-defined]
    assert expected.shape == (12, 8, 8, 1)
    files = predictor.read(new_images)
    as_bytes = predictor.read([p.read_bytes() for p in new_images])
    with Image.open(new_images[0]) as opened:
        as_pil = predictor.read([opened])
    torch.testing.assert_close(files, expected, rtol=0, atol=0)
    torch.testing.assert_close(as_bytes, expected, rtol=0, atol=0)
    torch.testing.assert_close(as_pil, expected[:1], rtol=0, atol=0)
    # and the normalization is the DataModule's, to the bit
    torch.testing.assert_close(
        predictor.graph.normalize(files),
        data.normalize(expected.permute(0, 3, 1, 2).float() / 255),
        rtol=0,
        atol=0,
    )


class Hotter(L.LightningModule):
    """A trained net with a (sharpening) temperature in its predict_step, as a user's module might have."""

    def __init__(self, trained: L.LightningModule) -> None:
        super().__init__()
        self.trained = trained

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.trained(x)

    def predict_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> dict[str, torch.Tensor]:
        probs = torch.softmax(self(batch[0]) / 0.01, dim=-1)
        return {"probs": probs, "preds": probs.argmax(dim=-1)}


def test_images_and_rows_share_one_predictor_which_answers_through_the_models_predict_step(
    predictor: Predictor, new_images: list[Path]
) -> None:
    hotter = Predictor(Hotter(predictor.model), predictor.reading, device="cpu")
    assert type(hotter) is type(predictor) is Predictor
    frame = hotter.predict(new_images)
    with torch.inference_mode():
        logits = hotter.model(hotter.graph.normalize(hotter.read(new_images)))  # type: ignore[union-attr]
    expected = torch.softmax(logits / 0.01, dim=-1)
    torch.testing.assert_close(torch.tensor(frame[PROBABILITIES].to_numpy(), dtype=torch.float32), expected)
    # the edit changed the answer: the shipped predict_step's probabilities are not these
    shipped = predictor.predict(new_images)[PROBABILITIES].to_numpy()
    assert abs(shipped - frame[PROBABILITIES].to_numpy()).max() > 0.05
    with pytest.raises(UserInputError, match="reads images, not a table's rows"):
        _ = predictor.preprocessor


def test_a_run_that_resized_resizes_as_the_datamodule_and_one_that_did_not_refuses(
    predictor: Predictor, new_images: list[Path]
) -> None:
    resized = replace(predictor.preprocessing, mode="RGB", size=(6, 5), resize=True)
    for path in new_images[:3]:
        expected = decode(path, "RGB", (6, 5), resize=True).permute(1, 2, 0)  # (H, W, C)
        torch.testing.assert_close(resized.read(path, "x"), expected, rtol=0, atol=0)
    fixed = replace(predictor.preprocessing, size=(6, 5))
    with pytest.raises(UserInputError) as err:
        fixed.read(new_images[0].read_bytes(), "images[2]")
    assert str(err.value) == (
        "images[2] is 8x8 but the model was trained on 5x6 images without resizing; send images of that size."
    )


def test_predict_equals_the_cli_predict_csv(
    predictor: Predictor, predicted: pd.DataFrame, new_images: list[Path]
) -> None:
    frame = predictor.predict(new_images)
    assert list(frame.columns) == list(predicted.columns) == ["path", "prediction", *PROBABILITIES]
    assert frame["path"].tolist() == predicted["path"].tolist() == [str(p) for p in new_images]
    assert frame["prediction"].tolist() == predicted["prediction"].tolist()
    torch.testing.assert_close(
        torch.tensor(frame[PROBABILITIES].to_numpy(), dtype=torch.float32),
        torch.tensor(predicted[PROBABILITIES].to_numpy(), dtype=torch.float32),
    )
    assert predicted["prediction"].nunique() > 1  # a model that learned something: not one class for all
    # bytes give the same lines, numbered by position
    by_bytes = predictor.predict([p.read_bytes() for p in new_images])
    assert by_bytes["row"].tolist() == list(range(len(new_images)))
    pd.testing.assert_frame_equal(by_bytes.drop(columns="row"), frame.drop(columns="path"))


def test_a_file_that_is_no_image_or_a_checkpoint_without_images_is_one_sentence(
    predictor: Predictor, new_images: list[Path], tmp_path: Path
) -> None:
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    with pytest.raises(
        UserInputError, match=rf"^'{text}' cannot be read as an image \(.*\); replace or remove it\.$"
    ):
        predictor.predict([text])
    with pytest.raises(
        UserInputError, match=r"^image 1 cannot be read as an image \(.*\); send a PNG or JPEG"
    ):
        predictor.predict([new_images[0].read_bytes(), b"nothing"])
    with pytest.raises(UserInputError) as err:
        ImagePreprocessing.of({"state_dict": {}, "TabularDataModule": {"preprocessing": {}}}, "t.ckpt")
    assert str(err.value) == (
        "checkpoint 't.ckpt' carries no fitted image statistics (it was not written by a run of "
        "ImageDataModule); train a new one."
    )


# -- export ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(folder: Path, checkpoint: Path) -> Path:
    """Both formats of the checkpoint, written by the command a user types."""
    out = folder / "exported"
    out.mkdir()
    for fmt, name in (("onnx", "model.onnx"), ("torch-export", "model.pt2")):
        export.main(["--ckpt_path", str(checkpoint), "--format", fmt, "--output", str(out / name)])
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
    predicted: pd.DataFrame,
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
        torch.tensor(predicted[PROBABILITIES].to_numpy(), dtype=torch.float32),
        rtol=tolerance.rtol,
        atol=tolerance.atol,
    )
    assert [CLASSES[k] for k in got.argmax(-1)] == predicted["prediction"].tolist()
    for rows in (1, 5):  # the batch dimension is dynamic
        assert run_graph(fmt, exported / name, pixels[:rows]).shape == (rows, 3)


def test_the_sidecar_says_layout_mode_size_labels_and_alone_turns_a_file_into_the_input(
    exported: Path, checkpoint: Path, predictor: Predictor, new_images: list[Path]
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
    state = torch.load(checkpoint, weights_only=True)["ImageDataModule"]
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
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    real = export.run_exported
    monkeypatch.setattr(export, "run_exported", lambda fmt, path, x: real(fmt, path, x) + 1e-3)
    with pytest.raises(SystemExit) as exit_:
        export.main(["--ckpt_path", str(checkpoint), "--output", str(tmp_path / "model.onnx")])
    assert exit_.value.code == 1
    assert "differs from the checkpoint by up to 0.001" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# -- serve ----------------------------------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def body(images: list[str]) -> bytes:
    return json.dumps({"images": images}).encode()


@pytest.fixture(scope="module")
def api(checkpoint: Path) -> serve.ImageAPI:
    ready = serve.ImageAPI(str(checkpoint), max_rows=5, max_batch_size=8, batch_timeout=0.0)
    ready.pre_setup()
    ready.setup("cpu")
    return ready


def through_a_batch(api: serve.ImageAPI, bodies: list[bytes]) -> list[tuple[int, dict]]:
    """What LitServe's batched loop does with one batch of bodies: each decoded (as FastAPI parses and
    checks it), then batch, predict and unbatch once, then each response encoded."""
    decoded = [api.decode_request(serve.ImageRequest.model_validate(json.loads(b))) for b in bodies]
    responses = [api.encode_response(output) for output in api.unbatch(api.predict(api.batch(decoded)))]
    return [(response.status_code, json.loads(response.body)) for response in responses]


def assert_answers(answer: dict, expected: pd.DataFrame) -> None:
    predictions = answer["predictions"]
    assert [p["label"] for p in predictions] == expected["prediction"].tolist()
    assert all(list(p["probabilities"]) == CLASSES for p in predictions)
    torch.testing.assert_close(
        torch.tensor([[p["probabilities"][c] for c in CLASSES] for p in predictions], dtype=torch.float32),
        torch.tensor(expected[PROBABILITIES].to_numpy(), dtype=torch.float32),
    )


def test_served_images_equal_predict_and_bad_rows_are_refused_alone(
    api: serve.ImageAPI, predicted: pd.DataFrame, new_images: list[Path], tmp_path: Path
) -> None:
    files = [b64(p.read_bytes()) for p in new_images]
    small = tmp_path / "small.png"
    Image.fromarray(np.zeros((4, 6), dtype=np.uint8)).save(small)
    goods = [body(files[:4]), body(files[4:8]), body(files[8:11])]
    bads = [
        (body([files[0], "not base64!"]), 422, "images[1] is not base64 ("),
        (body([files[0], files[1], b64(b"plain text")]), 422, "images[2] cannot be read as an image ("),
        (body([b64(small.read_bytes())]), 422, "images[0] is 6x4 but the model was trained on 8x8 images"),
        (body([]), 422, "the request holds no images; send JSON shaped"),
        (body(files[:6]), 413, "the request holds 6 images, more than the 5 allowed; split it."),
    ]
    answers = through_a_batch(api, [goods[0], bads[0][0], goods[1], *(b for b, _, _ in bads[1:]), goods[2]])
    good_answers = [answers[0], answers[2], answers[-1]]
    for (status, answer), rows in zip(good_answers, (slice(0, 4), slice(4, 8), slice(8, 11)), strict=True):
        assert status == 200
        assert_answers(answer, predicted.iloc[rows])
    for (_, status, start), (got, answer) in zip(bads, [answers[1], *answers[3:-1]], strict=True):
        assert (got, list(answer)) == (status, ["detail"])
        assert answer["detail"].startswith(start), answer["detail"]
        assert answer["detail"].endswith(".")  # one sentence, no traceback, no object's repr
        assert ". " not in answer["detail"]
        assert "\n" not in answer["detail"]
        assert " at 0x" not in answer["detail"]
    # one request alone (--max_batch_size 1: LitServe hands predict one request, not a list)
    alone = api.encode_response(api.predict(api.decode_request(serve.ImageRequest(images=files[:2]))))
    assert_answers(json.loads(alone.body), predicted.iloc[:2])


def test_a_bug_while_decoding_fails_its_request_alone(
    api: serve.ImageAPI, new_images: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    files = [b64(p.read_bytes()) for p in new_images]
    read = api.predictor.read

    def failing_on_one(images: list, names: list) -> torch.Tensor:
        if len(images) == 1:
            raise RuntimeError("a bug")
        return read(images, names)

    monkeypatch.setattr(api.predictor, "read", failing_on_one)
    answers = through_a_batch(api, [body(files[:2]), body(files[:1]), body(files[2:4])])
    assert [status for status, _ in answers] == [200, 500, 200]
    assert answers[1][1] == {"detail": serve.FAILED}


def post(url: str, content: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{url}/predict", data=content, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def server(checkpoint: Path, folder: Path) -> Iterator[str]:
    """``python -m src.apps.serve`` on the image checkpoint, in its own process group; killed whole at the
    end, whatever happened. Its URL."""
    log = folder / "server.log"
    port = free_port()
    words = ["--ckpt_path", str(checkpoint), "--port", str(port), "--max_rows=5"]
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "src.apps.serve", *words],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the workers it starts can be found and ended
        )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + READY_WITHIN
        while True:
            assert process.poll() is None, f"the server exited early:\n{log.read_text()[-3000:]}"
            with suppress(OSError), urllib.request.urlopen(f"{url}/health", timeout=2) as health:
                if health.status == 200:
                    break
            assert time.monotonic() < deadline, f"not ready in {READY_WITHIN} s:\n{log.read_text()[-3000:]}"
            time.sleep(0.25)
        yield url
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


@pytest.mark.slow  # two Python processes import torch and Lightning before the first answer: about 8 s
def test_the_server_answers_images_and_refuses_bad_bodies_with_one_sentence(
    server: str, predicted: pd.DataFrame, new_images: list[Path]
) -> None:
    files = [b64(p.read_bytes()) for p in new_images[:3]]
    status, answer = post(server, body(files))
    assert status == 200
    assert_answers(answer, predicted.iloc[:3])
    cases = [
        (b'{"images": [', 400, "the body is not JSON ("),
        (b"[1]", 422, "the body is not a JSON object; send JSON shaped"),
        (b'{"image": []}', 422, "'images' is missing; send JSON shaped"),
        (b'{"images": "abc"}', 422, "'images' is not a list; send JSON shaped"),
        (b'{"images": ["abc", 3]}', 422, "images[1] is not text; send JSON shaped"),
        (body(["%%%"]), 422, "images[0] is not base64 ("),
        (body(files * 2), 413, "the request holds 6 images, more than the 5 allowed; split it."),
    ]
    for content, status, start in cases:
        got, refused = post(server, content)
        assert (got, list(refused)) == (status, ["detail"]), content
        assert refused["detail"].startswith(start), refused
    assert post(server, body(files[:1]))[0] == 200  # it kept serving
    # the client docs/images.md prints, as a user saves and runs it
    (client,) = [
        b for b in page_blocks(ROOT / "docs" / "images.md") if b.text.startswith("# image_client.py")
    ]
    namespace: dict = {"__name__": "image_client"}
    exec(compile(client.text, "image_client.py", "exec"), namespace)
    answers = namespace["predict"]([str(p) for p in new_images[:5]], f"{server}/predict")  # --max_rows=5
    assert_answers({"predictions": answers}, predicted.iloc[:5])


# -- every file Pillow fails on, and requests too large, get a sentence -----------------------------------


def with_chunk(png: bytes, kind: bytes, data: bytes) -> bytes:
    """A PNG file with one more chunk after its header (IHDR), its CRC right: Pillow reads it as sound up to
    that chunk's content."""
    chunk = struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    end_of_ihdr = 8 + 25  # the signature, then IHDR's length, type, 13 bytes and CRC
    return png[:end_of_ihdr] + chunk + png[end_of_ihdr:]


def test_a_broken_chunk_or_a_bomb_is_a_422_naming_the_image_not_a_500(
    api: serve.ImageAPI, new_images: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    good = new_images[0].read_bytes()
    broken = with_chunk(good, b"gAMA", b"\x00\x01")  # 2 bytes where gAMA holds 4: Pillow's ValueError
    answers = through_a_batch(api, [body([b64(good), b64(broken)]), body([b64(good)])])
    assert answers[0] == (
        422,
        {"detail": "images[1] cannot be read as an image (Truncated gAMA chunk); send a PNG or JPEG file."},
    )
    assert answers[1][0] == 200
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10)  # 8x8 = 64 pixels: more than twice the limit
    ((status, answer),) = through_a_batch(api, [body([b64(good)])])
    assert status == 422
    assert answer["detail"].startswith(
        "images[0] has more pixels than Pillow decodes (Image size (64 pixels)"
    )
    assert answer["detail"].endswith(
        "; shrink it, or raise PIL.Image.MAX_IMAGE_PIXELS if you trust the file."
    )


def test_a_request_of_too_many_pixels_is_refused_from_the_headers_before_decoding(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = serve.ImageAPI(str(checkpoint), max_rows=50, max_batch_size=8, batch_timeout=0.0, max_pixels=10_000)
    api.pre_setup()
    api.setup("cpu")
    large = io.BytesIO()
    Image.fromarray(np.zeros((60, 60), dtype=np.uint8)).save(large, "PNG")  # 3,600 pixels, 100-odd bytes

    def never(self: Image.Image) -> None:
        raise AssertionError("an image was decoded")

    with monkeypatch.context() as patch:
        patch.setattr(ImageFile.ImageFile, "load", never)
        ((status, answer),) = through_a_batch(api, [body([b64(large.getvalue())] * 3)])  # 10,800 pixels
    assert (status, answer) == (
        413,
        {
            "detail": "the request's images hold 10,800 pixels, more than the 10,000 allowed (--max_pixels); "
            "send fewer or smaller images."
        },
    )
    ((status, answer),) = through_a_batch(api, [body([b64(large.getvalue())] * 2)])  # within: read, refused
    assert (status, answer["detail"][:40]) == (422, "images[0] is 60x60 but the model was tra")
    assert serve.MAX_PIXELS == 25_000_000
    assert "(default 25000000)" in " ".join(serve_help().split())


def serve_help() -> str:
    """``python -m src.apps.serve --help`` as printed."""
    done = subprocess.run(
        [sys.executable, "-m", "src.apps.serve", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")
def test_on_a_gpu_the_server_answers_what_it_answers_on_the_cpu(
    checkpoint: Path, new_images: list[Path]
) -> None:
    files = [b64(p.read_bytes()) for p in new_images]
    answers = []
    for device in ("cpu", "cuda:0"):
        api = serve.ImageAPI(str(checkpoint), max_rows=50, max_batch_size=8, batch_timeout=0.0)
        api.pre_setup()
        api.setup(device)
        assert next(api.predictor.model.parameters()).device == torch.device(device)
        answers.append(through_a_batch(api, [body(files)])[0])
    (cpu_status, on_cpu), (gpu_status, on_gpu) = answers
    assert cpu_status == gpu_status == 200
    assert [p["label"] for p in on_gpu["predictions"]] == [p["label"] for p in on_cpu["predictions"]]
    torch.testing.assert_close(
        torch.tensor([list(p["probabilities"].values()) for p in on_gpu["predictions"]]),
        torch.tensor([list(p["probabilities"].values()) for p in on_cpu["predictions"]]),
        rtol=1e-4,
        atol=1e-5,
    )
