"""Serve a checkpoint over HTTP with LitServe: raw rows in, labelled predictions out.

    python -m src.apps.serve --ckpt_path CKPT [--port 8000]          # or: make serve CKPT=... [PORT=8000]

``POST /predict`` takes ``{"rows": [{"column": value, ...}, ...]}``: values as they come (numbers,
text, true/false, null or a blank for a missing cell; a key left out of one row is a missing cell
too), and answers ``{"predictions": [{"label": ..., "probabilities": {label: p, ...}}, ...]}`` in the
order of the rows, or ``{"predictions": [{"value": ...}, ...]}`` for regression; a model whose
``predict_step`` returns more (K values, K labels) answers each row's columns of ``predict``'s file by
name, ``{"predictions": [{"preds(0)": ..., "preds(1)": ...}, ...]}``. ``GET /health``
answers ``ok`` once the model is loaded. The server listens on 127.0.0.1 unless ``--host`` says
otherwise; SIGTERM or Ctrl+C stops it and its worker processes.

An inference worker that dies (killed, out of memory) is replaced by LitServe (``restart_workers``)
while the others keep answering. :class:`Unanswered` stands before ``POST /predict`` so that no request
waits for nothing: while no worker is ready it is answered 503 at once, and one that a dying worker took
with it is answered 503 at its deadline (``--timeout``), each with one sentence.

The rows take the path that ``predict`` takes (:class:`src.predict.Predictor`): the checkpoint's own
preprocessing encodes them, the model's ``predict_step`` runs on them, and
:func:`src.predict.prediction_frame` names the classes. The checkpoint is loaded once per worker (and
once before they start, so that a bad one is refused with one sentence).

A bad request gets a 4xx whose body is ``{"detail": "<one sentence>"}``, and the server carries on:
400 for a body that is not JSON, 413 for more than ``--max_rows`` rows, 422 for anything else (no
``rows`` list, a row that is not an object, a value that is a list or an object, text that is not
valid Unicode (a lone surrogate such as ``"\\ud800"``), an integer too large for any float, a column
named twice, a column the model needs that no row has, text or a number too large where the model
reads a number). ``NaN`` reads as a missing cell, as in a CSV file.

Concurrent requests are batched by LitServe (``--max_batch_size``, ``--batch_timeout``). LitServe
answers every request of a batch with the error when one of them raises (Lightning-AI/LitServe#340),
in ``decode_request`` as much as in ``predict``, so each request is encoded on its own in
``decode_request``, where every cell of it is read, and joins the batch as its ``(N_i, F)`` tensor or
as its refusal, a value answered on its own. The batch step only concatenates tensors known to be
finite: one forward pass and one labelling call for all their rows. Encoding each request alone also
keeps its prediction what it is alone (pandas reads a column from its cells, so the cells of another
request could change how it reads them).

**An image checkpoint** (a run of :class:`src.extras.images.ImageDataModule`) is served the same way, with
``{"images": ["<base64 of a PNG or JPEG file>", ...]}``, one image per row, answered in the same shape
``{"predictions": [{"label": ..., "probabilities": {...}}, ...]}``. Each image is read as ``predict``
reads files (:mod:`src.extras.images`' one rule); an entry that is not base64 or not an image, or of
another size where the run did not resize its images, refuses its request with a 422 naming it;
``--max_rows`` bounds the images of one request, and ``--max_pixels`` their pixels (413), read from the
headers before any image is decoded.

The model runs on a GPU when there is one (``--accelerator auto``, LitServe's choice of device per
worker), on the CPU otherwise, with ``--threads`` torch threads.
"""

import argparse
import asyncio
import base64
import binascii
import json
import logging
import os
import signal
import socket
import sys
import threading
from abc import abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

import litserve as ls
import numpy as np
import pandas as pd
import torch
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from litserve.utils import WorkerSetupStatus
from pydantic import BaseModel, StrictBool, StrictFloat, StrictInt, StrictStr
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from src.data.arrays import ArrayReading
from src.errors import UserInputError
from src.extras.tables.predict import TableReading
from src.extras.tables.preprocessing import CellReport, Location
from src.predict import Predictor, prediction_frame

#: one cell of a row as JSON gives it; null is a missing cell
Cell = StrictStr | StrictInt | StrictFloat | StrictBool | None
#: how errors name a request's cells: "the request, column 'age', row 3"
REQUEST = Location("the request")
#: uvicorn's log levels
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
#: LitServe binds only these addresses
HOSTS = ("127.0.0.1", "0.0.0.0", "::")
#: the answer to a request that hit a bug here: that request alone, the traceback in the server's log
FAILED = (
    "the server failed on this request (an error on its side, logged there); the request was not predicted."
)
#: why a text cannot be read, JSON's escape of a lone surrogate being valid JSON but no character
NOT_UNICODE = "not valid Unicode (a lone surrogate such as \\ud800); send text as UTF-8"

#: the devices the server can put its model on; auto: a GPU when there is one, else the CPU
ACCELERATORS = ("auto", "cpu", "cuda")
#: the most pixels (width x height, summed over its images) one request may hold: read from the images'
#: headers before any is decoded, so that a few large files cannot hold a worker for seconds
MAX_PIXELS = 25_000_000
#: the thread in which LitServe watches its inference workers (``LitServer``'s monitoring)
MONITOR_THREAD = "litserve-monitoring"
#: the answer to a request while every inference worker is starting (after the ones before died)
NO_WORKER = "no inference worker is ready (a new one is starting after one stopped); retry in a few seconds."
#: the answer to a request past its deadline, ``{timeout}`` seconds after it came
UNANSWERED = (
    "the request was not answered within {timeout:g} s (--timeout): an inference worker stopped while it "
    "held the request, or the server is overloaded; retry it."
)

log = logging.getLogger(__name__)


class PredictRequest(BaseModel):
    """The body of ``POST /predict``; FastAPI checks its shape before any model code runs."""

    rows: list[dict[str, Cell]]


@dataclass(frozen=True)
class Refused:
    """A request that cannot be predicted: its status code and the sentence that says why."""

    status: int
    detail: str


def refused_response(refusal: Refused) -> JSONResponse:
    return JSONResponse({"detail": refusal.detail}, status_code=refusal.status)


class Unanswered:
    """ASGI middleware before ``POST /predict``: a 503 and one sentence where LitServe would leave the
    request waiting, possibly for ever.

    LitServe replaces a dead inference worker, but a request that worker had taken from the queue is
    lost with it, and LitServe's API process waits for its answer without a deadline; a request sent
    while every worker is still loading waits for one to be ready.

    Args:
        app: The application it stands before.
        ready: Whether an inference worker is ready now.
        timeout: Seconds a request may wait for its answer.
    """

    def __init__(self, app: ASGIApp, ready: Callable[[], bool], timeout: float) -> None:
        self.app = app
        self.ready = ready
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/predict":
            await self.app(scope, receive, send)
            return
        if not self.ready():
            await refused_response(Refused(503, NO_WORKER))(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await asyncio.wait_for(self.app(scope, receive, sending), self.timeout)
        except TimeoutError:
            if not started:  # else the answer is half sent, and the connection just ends
                refusal = Refused(503, UNANSWERED.format(timeout=self.timeout))
                await refused_response(refusal)(scope, receive, send)


def unreadable_cell(rows: list[dict[str, Any]]) -> Refused | None:
    """The first cell that pandas or the preprocessing could not take in, whichever column it is in:
    text that is not valid Unicode (JSON's escape of a lone surrogate, ``"\\ud800"``) or an integer
    beyond float64 (JSON has no limit on digits)."""
    for i, row in enumerate(rows):
        for column, value in row.items():
            if not _unicode(column):
                return Refused(422, f"rows[{i}] has the column name {column!r}, which is {NOT_UNICODE}.")
            if isinstance(value, str) and not _unicode(value):
                return Refused(422, f"rows[{i}][{column!r}] is text that is {NOT_UNICODE}.")
            if isinstance(value, int) and not _float(value):
                return Refused(
                    422,
                    f"rows[{i}][{column!r}] is an integer too large for any float (beyond ±1.8e308); send a "
                    "number within float32's range (about ±3.4e38).",
                )
    return None


def _unicode(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _float(value: int) -> bool:
    try:
        float(value)
    except OverflowError:
        return False
    return True


def doubled_column(names: Iterable[str]) -> Refused | None:
    """A column named twice once the spaces around names are dropped (``"age"`` and ``" age"``), as
    :meth:`src.extras.tables.preprocessing.Preprocessor.transform` drops them."""
    seen: dict[str, str] = {}
    for name in names:
        if (first := seen.setdefault(key := name.strip(), name)) != name:
            return Refused(
                422, f"the request names the column {key!r} twice, as {first!r} and {name!r}; send it once."
            )
    return None


@dataclass(frozen=True)
class Encoded:
    """One request read: its rows as the net's input, and its ``notices`` (tables: the cells read
    otherwise than written, per column; None for images)."""

    x: torch.Tensor  #: (N, F) encoded rows, or (N, H, W, C) uint8 pixels
    notices: dict[str, dict[str, Any]] | None


@dataclass(frozen=True)
class Answer:
    """One request's predictions, in the order of its rows, and its notices."""

    predictions: list[dict[str, Any]]
    notices: dict[str, dict[str, Any]] | None


class ImageRequest(BaseModel):
    """The body of ``POST /predict`` for an image checkpoint: each image file's bytes in base64."""

    images: list[StrictStr]


class BatchedAPI(ls.LitAPI):
    """What every kind of data shares: each request decoded alone into a tensor or its refusal, one
    forward pass for the tensors of a batch, each request answered with its own predictions or refusal.

    A subclass loads its predictor in ``setup`` and decodes its body in ``decode_request`` (whose type
    annotation tells LitServe the body's shape), through :meth:`guarded`.

    Args:
        ckpt_path: The checkpoint to serve.
        max_rows: The most rows one request may hold.
        max_batch_size: The most requests whose rows share one forward pass.
        batch_timeout: Seconds to wait for more requests to fill a batch.
        threads: torch's intra-op threads per inference worker.
    """

    def __init__(
        self, ckpt_path: str, max_rows: int, max_batch_size: int, batch_timeout: float, threads: int = 1
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout)
        self.ckpt_path = ckpt_path
        self.max_rows = max_rows
        self.threads = threads
        self.torch_device = torch.device("cpu")  # setup moves the model to the worker's device

    @abstractmethod
    def served(self) -> torch.nn.Module:
        """What :meth:`outputs` runs, moved to the worker's device by :meth:`on_device`."""

    def on_device(self, device: str) -> None:
        """The model on ``device`` (``cpu``, ``cuda:0``, ...: LitServe's choice for this worker), and
        torch's CPU threads set, as every other command sets them."""
        torch.set_num_threads(self.threads)
        self.torch_device = torch.device(device)
        self.served().to(self.torch_device)

    @abstractmethod
    def outputs(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """The rows of a batch's requests, concatenated, → the model's ``predict_step`` outputs."""

    @property
    @abstractmethod
    def labels(self) -> Sequence[Any] | None:
        """Class names in class-id order, or None for regression."""

    def guarded(self, encode: Callable[[Any], Encoded | Refused], items: Any) -> Encoded | Refused:
        """``encode(items)``, or a 500 for this request alone when it raises.

        Never raises: LitServe would answer every request of the batch with the error.
        """
        try:
            return encode(items)
        except Exception:  # a bug, not the client's: this request alone is answered 500
            log.exception("a request failed in decode_request; it alone was answered 500")
            return Refused(500, FAILED)

    def too_many(self, rows: int, what: str) -> Refused | None:
        """None, or the refusal of a request of more than ``max_rows`` rows."""
        if rows > self.max_rows:
            return Refused(
                413, f"the request holds {rows} {what}, more than the {self.max_rows} allowed; split it."
            )
        return None

    def batch(self, inputs: list[Encoded | Refused]) -> list[Encoded | Refused]:
        # the list as it is: predict concatenates the requests' rows
        return inputs

    def predict(self, x: Encoded | Refused | list[Encoded | Refused], **kwargs: Any) -> Any:
        """Every request of the batch (a list when batching): one :class:`Answer` per request, or its
        refusal."""
        requests = x if isinstance(x, list) else [x]
        encoded = [r for r in requests if isinstance(r, Encoded)]
        answered = iter(self.predict_encoded(encoded) if encoded else [])
        results = [next(answered) if isinstance(r, Encoded) else r for r in requests]
        return results if isinstance(x, list) else results[0]

    def predict_encoded(self, encoded: list[Encoded]) -> list[Answer | Refused]:
        """The rows of all requests through one forward pass and one :func:`prediction_frame`: each
        request's predictions, or a refusal where the model's output for one of its rows is not finite
        (JSON has no such number)."""
        on_device = self.outputs(torch.cat([e.x for e in encoded]).to(self.torch_device))
        outputs = {key: value.cpu() for key, value in on_device.items()}
        finite = torch.stack([torch.isfinite(v.reshape(len(v), -1)).all(1) for v in outputs.values()]).all(0)
        every = self.answers(prediction_frame(outputs, self.labels, range(len(finite))))
        ends = np.cumsum([len(e.x) for e in encoded]).tolist()
        results: list[Answer | Refused] = []
        for start, end, request in zip([0, *ends[:-1]], ends, encoded, strict=True):
            bad = (~finite[start:end]).nonzero()
            if len(bad):
                results.append(
                    Refused(
                        422,
                        f"{REQUEST.what}, row {int(bad[0])}: the model's output is not a finite number; "
                        "its values lie too far from those the model was trained on.",
                    )
                )
            else:
                results.append(Answer(every[start:end], request.notices))
        return results

    def answers(self, frame: pd.DataFrame) -> list[dict[str, Any]]:
        """:func:`prediction_frame`'s lines as the response's predictions: label and probabilities (one class
        of K), or value (one value); any other outputs (K values, K labels' 0/1 choices, more than ``preds``)
        as each line's columns by name, ``{"preds(spam)": 1, "probs(spam)": 0.93, ...}``."""
        labels = self.labels
        columns = list(frame.columns[1:])  # after the line's position
        if columns == ["prediction"]:
            return [{"value": float(v)} for v in frame["prediction"]]
        probability = [f"probability({label})" for label in labels or []]
        if labels is None or columns != ["prediction", *probability]:
            return [
                {name: value.item() if hasattr(value, "item") else value for name, value in line.items()}
                for line in frame[columns].to_dict(orient="records")
            ]
        probabilities = frame[probability].to_numpy()
        return [
            {"label": label, "probabilities": dict(zip(map(str, labels), map(float, p), strict=True))}
            for label, p in zip(frame["prediction"], probabilities, strict=True)
        ]

    def encode_response(self, output: Answer | Refused, **kwargs: Any) -> Response:
        # a Response, not an exception, for a refused request: LitServe would send an exception raised
        # here to every request of the batch
        if isinstance(output, Refused):
            return refused_response(output)
        notices = {} if output.notices is None else {"notices": output.notices}
        return JSONResponse({"predictions": output.predictions, **notices})


class TabularAPI(BatchedAPI):
    """LitServe's four steps for a table checkpoint: load, decode raw rows, predict a batch, encode labels.

    Args:
        ckpt_path: The checkpoint to serve.
        max_rows: The most rows one request may hold.
        max_batch_size: The most requests whose rows share one forward pass.
        batch_timeout: Seconds to wait for more requests to fill a batch.
        threads: torch's intra-op threads per inference worker.
    """

    def setup(self, device: str) -> None:
        # one CPU thread by default, because splitting a forward pass of a few hundred rows across
        # threads costs more than it saves, the more so on cores the HTTP process and other workers share
        self.predictor = Predictor.from_checkpoint(self.ckpt_path)
        self.on_device(device)

    def served(self) -> torch.nn.Module:
        return self.predictor.model

    def decode_request(self, request: PredictRequest, **kwargs: Any) -> Encoded | Refused:
        """The request's rows encoded ``(N, F)`` on their own, or why they cannot be predicted."""
        return self.guarded(self.encode, request.rows)

    def encode(self, rows: list[dict[str, Any]]) -> Encoded | Refused:
        """Every check of one request's cells, then the checkpoint's own encoding of them, with the count
        of cells it read otherwise than written (the one rule of :mod:`src.extras.tables.preprocessing`)."""
        if not rows:
            return Refused(422, 'the request holds no rows; send {"rows": [{"column": value, ...}, ...]}.')
        refusal = self.too_many(len(rows), "rows") or unreadable_cell(rows)
        if refusal is not None:
            return refusal
        frame = pd.DataFrame.from_records(rows)
        refusal = doubled_column(frame.columns)
        if refusal is not None:
            return refusal
        report = CellReport()  # answered in the response, not logged: the client sent the cells
        try:
            x = self.predictor.read(frame, [REQUEST.what], report)  # (N, F) float32, finite by the rule
        except UserInputError as err:
            return Refused(422, str(err))
        return Encoded(x, report.as_json())

    def outputs(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.predictor.outputs(x)

    @property
    def labels(self) -> Sequence[Any] | None:
        return self.predictor.labels


class ImageAPI(BatchedAPI):
    """LitServe's four steps for an image checkpoint: load, decode base64 image files, predict a batch,
    encode labels.

    Args:
        ckpt_path: The checkpoint to serve.
        max_rows: The most images one request may hold.
        max_batch_size: The most requests whose images share one forward pass.
        batch_timeout: Seconds to wait for more requests to fill a batch.
        threads: torch's intra-op threads per inference worker.
        max_pixels: The most pixels (width x height, summed over its images) one request may hold.
    """

    def __init__(
        self,
        ckpt_path: str,
        max_rows: int,
        max_batch_size: int,
        batch_timeout: float,
        threads: int = 1,
        max_pixels: int = MAX_PIXELS,
    ) -> None:
        super().__init__(ckpt_path, max_rows, max_batch_size, batch_timeout, threads)
        self.max_pixels = max_pixels

    def setup(self, device: str) -> None:
        self.predictor = Predictor.from_checkpoint(self.ckpt_path)
        self.on_device(device)

    def served(self) -> torch.nn.Module:
        assert self.predictor.graph is not None  # an image checkpoint's predictor
        return self.predictor.graph  # the net and the statistics it normalizes with

    def decode_request(self, request: ImageRequest, **kwargs: Any) -> Encoded | Refused:
        """The request's images as uint8 ``(N, H, W, C)`` pixels, or why they cannot be predicted."""
        return self.guarded(self.encode, request.images)

    def encode(self, images: list[str]) -> Encoded | Refused:
        """Each entry's base64 decoded, then the file read as ``predict`` reads files; the first entry
        that fails names itself."""
        if not images:
            return Refused(422, f"the request holds no images; {IMAGE_SHAPE}.")
        refusal = self.too_many(len(images), "images")
        if refusal is not None:
            return refusal
        files: list[bytes] = []
        for i, text in enumerate(images):
            try:
                files.append(base64.b64decode(text, validate=True))
            except (binascii.Error, ValueError) as err:  # ValueError: text beyond ASCII
                return Refused(
                    422, f"images[{i}] is not base64 ({err}); send each image file's bytes base64-encoded."
                )
        names = [f"images[{i}]" for i in range(len(files))]
        from src.extras.images import header  # an image checkpoint: the images extra made it

        try:
            # headers only: a request of too many pixels is refused before any of them is decoded
            headers = [
                header(file, name, "send a PNG or JPEG file") for file, name in zip(files, names, strict=True)
            ]
            pixels = sum(h.pixels for h in headers)
            if pixels > self.max_pixels:
                return Refused(
                    413,
                    f"the request's images hold {pixels:,} pixels, more than the {self.max_pixels:,} allowed "
                    "(--max_pixels); send fewer or smaller images.",
                )
            return Encoded(self.predictor.read(files, names), None)
        except UserInputError as err:
            return Refused(422, str(err))

    def outputs(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.predictor.outputs(x)

    @property
    def labels(self) -> Sequence[Any] | None:
        return self.predictor.labels


SHAPE = 'send JSON shaped {"rows": [{"column": value, ...}, ...]} with Content-Type: application/json'


def shape_refusal(error: dict[str, Any]) -> Refused:
    """The first complaint of FastAPI's check of the body, as a status code and one sentence."""
    where = error["loc"][1:]  # ("rows", row, column, <the type tried>) without the leading "body"
    if error["type"] == "json_invalid":
        return Refused(
            400, f"the body is not JSON ({error.get('ctx', {}).get('error', 'unreadable')}); {SHAPE}."
        )
    if len(where) >= 3:
        return Refused(
            422,
            f"rows[{where[1]}][{where[2]!r}] is {json.dumps(error['input'])}; a value must be a number, "
            "text, true/false or null.",
        )
    if len(where) == 2:
        return Refused(422, f"rows[{where[1]}] is not an object of column: value pairs; {SHAPE}.")
    if where:
        return Refused(
            422, f"'rows' is {'missing' if error['type'] == 'missing' else 'not a list'}; {SHAPE}."
        )
    return Refused(422, f"the body is not a JSON object; {SHAPE}.")


async def invalid_body(request: Request, error: Exception) -> JSONResponse:
    """FastAPI's answer to a body that does not fit :class:`PredictRequest`, as one sentence."""
    assert isinstance(error, RequestValidationError)
    return refused_response(shape_refusal(error.errors()[0]))


IMAGE_SHAPE = (
    'send JSON shaped {"images": ["<base64 of a PNG or JPEG file>", ...]} with Content-Type: application/json'
)


def image_shape_refusal(error: dict[str, Any]) -> Refused:
    """The first complaint of FastAPI's check of an image request's body, as a status code and one
    sentence."""
    where = error["loc"][1:]  # ("images", position) without the leading "body"
    if error["type"] == "json_invalid":
        return Refused(
            400, f"the body is not JSON ({error.get('ctx', {}).get('error', 'unreadable')}); {IMAGE_SHAPE}."
        )
    if len(where) >= 2:
        return Refused(422, f"images[{where[1]}] is not text; {IMAGE_SHAPE}.")
    if where:
        return Refused(
            422, f"'images' is {'missing' if error['type'] == 'missing' else 'not a list'}; {IMAGE_SHAPE}."
        )
    return Refused(422, f"the body is not a JSON object; {IMAGE_SHAPE}.")


async def invalid_image_body(request: Request, error: Exception) -> JSONResponse:
    """FastAPI's answer to a body that does not fit :class:`ImageRequest`, as one sentence."""
    assert isinstance(error, RequestValidationError)
    return refused_response(image_shape_refusal(error.errors()[0]))


def parse(args: Sequence[str] | None) -> argparse.Namespace:
    parser = _Parser(prog="python -m src.apps.serve", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ckpt_path", required=True, help="The checkpoint to serve (a .ckpt file).")
    parser.add_argument("--host", default="127.0.0.1", help=f"One of {', '.join(HOSTS)} (default 127.0.0.1).")
    parser.add_argument("--port", type=int, default=8000, help="Port to listen on (default 8000).")
    parser.add_argument("--max_rows", type=int, default=10_000, help="Most rows per request (default 10000).")
    parser.add_argument(
        "--max_batch_size", type=int, default=16, help="Most requests per forward pass (default 16)."
    )
    parser.add_argument(
        "--batch_timeout",
        type=float,
        default=0.002,
        help="Seconds to wait for more requests to fill a batch (default 0.002).",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="Inference worker processes (default 1); one that dies is replaced.",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="Seconds a request may wait for its answer before it is answered 503 (default 30).",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per inference worker (default 1)."
    )
    parser.add_argument(
        "--accelerator",
        default="auto",
        help="Where the model runs: auto (a GPU when there is one, else the CPU), cpu or cuda "
        "(default auto).",
    )
    parser.add_argument(
        "--max_pixels",
        type=int,
        default=MAX_PIXELS,
        help=f"Most pixels (width x height, summed over its images) per image request, read from the "
        f"images' headers before any is decoded (default {MAX_PIXELS}).",
    )
    parser.add_argument("--log_level", default="warning", help="uvicorn's log level (default warning).")
    return parser.parse_args(args)


class _Parser(argparse.ArgumentParser):
    """argparse whose complaints are one sentence and exit status 2, like every other bad input here."""

    def error(self, message: str) -> Any:
        raise UserInputError(f"{message}; see python -m src.apps.serve --help.")


def build(options: argparse.Namespace) -> ls.LitServer:
    """The server, after checking what can be checked before any process starts."""
    if options.host not in HOSTS:
        raise UserInputError(f"--host {options.host!r} cannot be served; choose one of {', '.join(HOSTS)}.")
    if not 1024 <= options.port <= 65535:
        raise UserInputError(f"--port {options.port} must lie between 1024 and 65535.")
    if options.accelerator not in ACCELERATORS:
        raise UserInputError(
            f"--accelerator {options.accelerator!r} is unknown; choose one of {', '.join(ACCELERATORS)}."
        )
    if options.accelerator == "cuda" and not torch.cuda.is_available():
        raise UserInputError("--accelerator cuda needs a CUDA GPU, and torch sees none; pass auto or cpu.")
    for name in ("max_rows", "max_batch_size", "workers", "threads", "max_pixels"):
        if getattr(options, name) < 1:
            raise UserInputError(f"--{name} {getattr(options, name)} must be at least 1.")
    if options.log_level not in LOG_LEVELS:
        raise UserInputError(
            f"--log_level {options.log_level!r} is unknown; choose one of {', '.join(LOG_LEVELS)}."
        )
    if options.batch_timeout < 0:
        raise UserInputError(f"--batch_timeout {options.batch_timeout} must not be negative.")
    if not options.timeout > options.batch_timeout:
        raise UserInputError(
            f"--timeout {options.timeout} must be longer than --batch_timeout {options.batch_timeout}."
        )
    # a missing, broken or foreign checkpoint: one sentence
    reading = Predictor.from_checkpoint(options.ckpt_path).reading
    images = not isinstance(reading, TableReading | ArrayReading)
    family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
    with socket.socket(family) as probe:
        try:
            probe.bind((options.host, options.port))
        except OSError as err:
            raise UserInputError(
                f"port {options.port} on {options.host} is taken ({err.strerror}); pass another with --port."
            ) from err
    batching = (options.ckpt_path, options.max_rows, options.max_batch_size, options.batch_timeout)
    api = (
        ImageAPI(*batching, options.threads, options.max_pixels)
        if images
        else TabularAPI(*batching, options.threads)
    )
    # restart_workers: LitServe's monitor starts a new worker in place of one that died; timeout: a
    # worker drops a request that waited in the queue longer (Unanswered has answered it by then)
    server = ls.LitServer(
        api,
        accelerator=options.accelerator,
        workers_per_device=options.workers,
        restart_workers=True,
        timeout=options.timeout,
    )
    # LitServer.app is the FastAPI application; its shape errors become one sentence and a 4xx
    server.app.add_exception_handler(RequestValidationError, invalid_image_body if images else invalid_body)

    def ready() -> bool:
        # the workers' states, as LitServe's GET /health reads them (set once run() starts the workers)
        return WorkerSetupStatus.READY in server.workers_setup_status.values()

    server.app.add_middleware(Unanswered, ready=ready, timeout=options.timeout)
    return server


class QuietWhileStopping(logging.Filter):
    """Drops what LitServe's worker monitor logs once the server is stopping.

    LitServe's shutdown ends the inference workers while its monitoring thread still polls them every
    few seconds: depending on how busy the machine is, the thread wakes to find them gone and logs an
    error ("Worker ... died; shutting down"), or finds LitServe's process manager already shut down and
    logs its traceback ("Monitoring worker crashed"). Neither is news while the server stops on request.
    Nothing is dropped before :attr:`stopping` is set, nor from any other thread.
    """

    def __init__(self) -> None:
        super().__init__()
        self.stopping = threading.Event()

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.stopping.is_set() and record.threadName == MONITOR_THREAD)


def _stop(
    server_pid: int, server: ls.LitServer, quiet: QuietWhileStopping
) -> Callable[[int, FrameType | None], None]:
    """SIGTERM and SIGINT handler: in the server's own process it acts as Ctrl+C, after which LitServe
    stops its API and inference processes (its monitor quieted first, and told not to replace the
    workers the shutdown ends); a process LitServe forks inherits it and just ends, as by default."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if os.getpid() == server_pid:
            quiet.stopping.set()
            server.restart_workers = False  # the flag LitServer(restart_workers=) sets, read by its monitor
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)

    return handler


def main(args: Sequence[str] | None = None) -> None:
    """Start serving; bad options or checkpoint end with one sentence on stderr and exit status 2."""
    try:
        options = parse(args)
        server = build(options)
    except UserInputError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from err
    quiet = QuietWhileStopping()
    logging.getLogger("litserve.server").addFilter(quiet)
    stop = _stop(os.getpid(), server, quiet)
    signal.signal(signal.SIGTERM, stop)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # else ignored, as a background job's
        signal.signal(signal.SIGINT, stop)
    print(
        f"Serving {options.ckpt_path} at http://{options.host}:{options.port}/predict "
        f"(GET /health answers ok once it is ready; Ctrl+C stops it)",
        flush=True,
    )
    try:
        server.run(
            host=options.host, port=options.port, log_level=options.log_level, generate_client_file=False
        )
    except KeyboardInterrupt:  # stopped while LitServe was starting, before it listens for the signal
        quiet.stopping.set()
