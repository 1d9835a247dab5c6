"""The server answers base64 image files as ``predict`` does, refusing a bad one with a sentence
naming it."""

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
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image, ImageFile

from src.apps import serve
from src.apps.serve.test_serve import READY_WITHIN, free_port
from tests.conftest import ROOT
from tests.test_readme import page_blocks

# -- serve ----------------------------------------------------------------------------------------------

# an image model's checkpoint: these tests need the images extra, and are skipped without it
images = pytest.importorskip("src.extras.images.conftest")
CLASSES, PROBABILITIES = images.CLASSES, images.PROBABILITIES
image_folder, image_checkpoint = images.image_folder, images.image_checkpoint
new_images, predicted_images = images.new_images, images.predicted_images


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def body(images: list[str]) -> bytes:
    return json.dumps({"images": images}).encode()


@pytest.fixture(scope="module")
def api(image_checkpoint: Path) -> serve.ImageAPI:
    ready = serve.ImageAPI(str(image_checkpoint), max_rows=5, max_batch_size=8, batch_timeout=0.0)
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
    api: serve.ImageAPI, predicted_images: pd.DataFrame, new_images: list[Path], tmp_path: Path
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
        assert_answers(answer, predicted_images.iloc[rows])
    for (_, status, start), (got, answer) in zip(bads, [answers[1], *answers[3:-1]], strict=True):
        assert (got, list(answer)) == (status, ["detail"])
        assert answer["detail"].startswith(start), answer["detail"]
        assert answer["detail"].endswith(".")  # one sentence, no traceback, no object's repr
        assert ". " not in answer["detail"]
        assert "\n" not in answer["detail"]
        assert " at 0x" not in answer["detail"]
    # one request alone (--max_batch_size 1: LitServe hands predict one request, not a list)
    alone = api.encode_response(api.predict(api.decode_request(serve.ImageRequest(images=files[:2]))))
    assert_answers(json.loads(alone.body), predicted_images.iloc[:2])


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
def server(image_checkpoint: Path, image_folder: Path) -> Iterator[str]:
    """``python -m src.apps.serve`` on the image checkpoint, in its own process group; killed whole at the
    end, whatever happened. Its URL."""
    log = image_folder / "server.log"
    port = free_port()
    words = ["--ckpt_path", str(image_checkpoint), "--port", str(port), "--max_rows=5"]
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
    server: str, predicted_images: pd.DataFrame, new_images: list[Path]
) -> None:
    files = [b64(p.read_bytes()) for p in new_images[:3]]
    status, answer = post(server, body(files))
    assert status == 200
    assert_answers(answer, predicted_images.iloc[:3])
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
    # the client this folder's README.md prints, as a user saves and runs it
    (client,) = [
        b
        for b in page_blocks(Path(__file__).with_name("README.md"))
        if b.text.startswith("# image_client.py")
    ]
    namespace: dict = {"__name__": "image_client"}
    exec(compile(client.text, "image_client.py", "exec"), namespace)
    answers = namespace["predict"]([str(p) for p in new_images[:5]], f"{server}/predict")  # --max_rows=5
    assert_answers({"predictions": answers}, predicted_images.iloc[:5])


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
    image_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = serve.ImageAPI(
        str(image_checkpoint), max_rows=50, max_batch_size=8, batch_timeout=0.0, max_pixels=10_000
    )
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
    image_checkpoint: Path, new_images: list[Path]
) -> None:
    files = [b64(p.read_bytes()) for p in new_images]
    answers = []
    for device in ("cpu", "cuda:0"):
        api = serve.ImageAPI(str(image_checkpoint), max_rows=50, max_batch_size=8, batch_timeout=0.0)
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
