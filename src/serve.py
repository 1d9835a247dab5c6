"""Serve a checkpoint over HTTP with LitServe: raw rows in, labelled predictions out.

    python -m src.serve --ckpt_path CKPT [--port 8000]          # or: make serve CKPT=... [PORT=8000]

``POST /predict`` takes ``{"rows": [{"column": value, ...}, ...]}``: values as they come (numbers,
text, true/false, null or a blank for a missing cell; a key left out of one row is a missing cell
too), and answers ``{"predictions": [{"label": ..., "probabilities": {label: p, ...}}, ...]}`` in the
order of the rows, or ``{"predictions": [{"value": ...}, ...]}`` for regression. ``GET /health``
answers ``ok`` once the model is loaded. The server listens on 127.0.0.1 unless ``--host`` says
otherwise; SIGTERM or Ctrl+C stops it and its worker processes.

The rows take the path that ``predict`` takes (:class:`src.predict.Predictor`): the checkpoint's own
preprocessing encodes them, the model's ``predict_step`` runs on them, and
:func:`src.predict.prediction_frame` names the classes. The checkpoint is loaded once per worker (and
once before they start, so that a bad one is refused with one sentence).

A bad request gets a 4xx whose body is ``{"detail": "<one sentence>"}``, and the server carries on:
400 for a body that is not JSON, 413 for more than ``--max_rows`` rows, 422 for anything else (no
``rows`` list, a row that is not an object, a value that is a list or an object, a column the model
needs that no row has, text where the model reads a number).

Concurrent requests are batched by LitServe (``--max_batch_size``, ``--batch_timeout``): the rows of
up to that many requests are encoded in one call, go through one forward pass and are labelled in one
call, which pays each step's fixed cost once. LitServe answers every request of a batch with the error
when one of them raises (Lightning-AI/LitServe#340), so a refused request is carried through the batch
as a value and answered on its own.
"""

import argparse
import json
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
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
from pydantic import BaseModel, StrictBool, StrictFloat, StrictInt, StrictStr

from src.data.preprocessing import Location
from src.errors import UserInputError
from src.predict import Predictor, prediction_frame

#: one cell of a row as JSON gives it; null is a missing cell
Cell = StrictStr | StrictInt | StrictFloat | StrictBool | None
#: how errors name a request's cells: "the request, column 'age', row 3"
REQUEST = Location("the request")
#: uvicorn's log levels
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
#: LitServe binds only these addresses
HOSTS = ("127.0.0.1", "0.0.0.0", "::")


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


class TabularAPI(ls.LitAPI):
    """LitServe's four steps for a checkpoint: load, decode raw rows, predict a batch, encode labels.

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

    def setup(self, device: str) -> None:
        # the Predictor keeps the model on the CPU, where a small tabular net answers fastest; one
        # thread, because splitting a forward pass of a few hundred rows across threads costs more
        # than it saves, the more so on cores the HTTP process and other workers share
        torch.set_num_threads(self.threads)
        self.predictor = Predictor.from_checkpoint(self.ckpt_path)

    def decode_request(self, request: PredictRequest, **kwargs: Any) -> pd.DataFrame | Refused:
        """The request's raw rows as a frame, or why they cannot be predicted."""
        rows = request.rows
        if not rows:
            return Refused(422, 'the request holds no rows; send {"rows": [{"column": value, ...}, ...]}.')
        if len(rows) > self.max_rows:
            return Refused(
                413, f"the request holds {len(rows)} rows, more than the {self.max_rows} allowed; split it."
            )
        frame = pd.DataFrame.from_records(rows)
        try:
            self.predictor.preprocessor.check_columns(frame, REQUEST)
        except UserInputError as err:
            return Refused(422, str(err))
        return frame

    def batch(self, inputs: list[pd.DataFrame | Refused]) -> list[pd.DataFrame | Refused]:
        # the list as it is: predict encodes the requests' rows together
        return inputs

    def predict(self, x: pd.DataFrame | Refused | list[pd.DataFrame | Refused], **kwargs: Any) -> Any:
        """Every request of the batch (a list when batching) through encode, one forward pass and
        :func:`prediction_frame`, each step once for all their rows: one prediction list per request,
        or its refusal."""
        requests = x if isinstance(x, list) else [x]
        encoded = self.encode([r for r in requests if isinstance(r, pd.DataFrame)])
        readable = [e for e in encoded if isinstance(e, torch.Tensor)]
        answers: list[list[dict[str, Any]]] = []
        if readable:
            outputs = self.predictor.outputs(torch.cat(readable))
            frame = prediction_frame(outputs, self.predictor.preprocessor, range(len(outputs["preds"])))
            every = self.answers(frame)
            ends = np.cumsum([len(e) for e in readable]).tolist()
            answers = [every[start:end] for start, end in zip([0, *ends[:-1]], ends, strict=True)]
        # put the answers and refusals back in the order of the requests
        encoded_in_order, answered = iter(encoded), iter(answers)
        results: list[list[dict[str, Any]] | Refused] = []
        for request in requests:
            outcome = request if isinstance(request, Refused) else next(encoded_in_order)
            results.append(next(answered) if isinstance(outcome, torch.Tensor) else outcome)
        return results if isinstance(x, list) else results[0]

    def encode(self, frames: list[pd.DataFrame]) -> list[torch.Tensor | Refused]:
        """Each request's rows encoded ``(N_i, F)``: all in one call, whose fixed cost dominates a few
        rows, or, when some request holds a cell the model cannot read, one by one, so that only that
        request is refused (and its sentence counts rows from its own first)."""
        if not frames:
            return []
        try:
            together = self.predictor.encode(pd.concat(frames, ignore_index=True), REQUEST.what)
            return list(together.split([len(frame) for frame in frames]))
        except UserInputError:
            return [self.encode_alone(frame) for frame in frames]

    def encode_alone(self, frame: pd.DataFrame) -> torch.Tensor | Refused:
        try:
            return self.predictor.encode(frame, REQUEST.what)
        except UserInputError as err:
            return Refused(422, str(err))

    def answers(self, frame: pd.DataFrame) -> list[dict[str, Any]]:
        """:func:`prediction_frame`'s lines as the response's predictions: label and probabilities, or
        value."""
        labels = self.predictor.preprocessor.labels
        if labels is None:
            return [{"value": float(v)} for v in frame["prediction"]]
        probabilities = frame[[f"probability({label})" for label in labels]].to_numpy()
        return [
            {"label": label, "probabilities": dict(zip(map(str, labels), map(float, p), strict=True))}
            for label, p in zip(frame["prediction"], probabilities, strict=True)
        ]

    def encode_response(self, output: list[dict[str, Any]] | Refused, **kwargs: Any) -> Response:
        # a Response, not an exception, for a refused request: LitServe would send an exception raised
        # here to every request of the batch
        if isinstance(output, Refused):
            return refused_response(output)
        return JSONResponse({"predictions": output})


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


def parse(args: Sequence[str] | None) -> argparse.Namespace:
    parser = _Parser(prog="python -m src.serve", description=(__doc__ or "").splitlines()[0])
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
    parser.add_argument("--workers", type=int, default=1, help="Inference worker processes (default 1).")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per inference worker (default 1)."
    )
    parser.add_argument("--log_level", default="warning", help="uvicorn's log level (default warning).")
    return parser.parse_args(args)


class _Parser(argparse.ArgumentParser):
    """argparse whose complaints are one sentence and exit status 2, like every other bad input here."""

    def error(self, message: str) -> Any:
        raise UserInputError(f"{message}; see python -m src.serve --help.")


def build(options: argparse.Namespace) -> ls.LitServer:
    """The server, after checking what can be checked before any process starts."""
    if options.host not in HOSTS:
        raise UserInputError(f"--host {options.host!r} cannot be served; choose one of {', '.join(HOSTS)}.")
    if not 1024 <= options.port <= 65535:
        raise UserInputError(f"--port {options.port} must lie between 1024 and 65535.")
    for name in ("max_rows", "max_batch_size", "workers", "threads"):
        if getattr(options, name) < 1:
            raise UserInputError(f"--{name} {getattr(options, name)} must be at least 1.")
    if options.log_level not in LOG_LEVELS:
        raise UserInputError(
            f"--log_level {options.log_level!r} is unknown; choose one of {', '.join(LOG_LEVELS)}."
        )
    if options.batch_timeout < 0:
        raise UserInputError(f"--batch_timeout {options.batch_timeout} must not be negative.")
    Predictor.from_checkpoint(options.ckpt_path)  # a missing, broken or foreign checkpoint: one sentence
    family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
    with socket.socket(family) as probe:
        try:
            probe.bind((options.host, options.port))
        except OSError as err:
            raise UserInputError(
                f"port {options.port} on {options.host} is taken ({err.strerror}); pass another with --port."
            ) from err
    api = TabularAPI(
        options.ckpt_path, options.max_rows, options.max_batch_size, options.batch_timeout, options.threads
    )
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=options.workers)
    # LitServer.app is the FastAPI application; its shape errors become one sentence and a 4xx
    server.app.add_exception_handler(RequestValidationError, invalid_body)
    return server


def _stop(server_pid: int) -> Callable[[int, FrameType | None], None]:
    """SIGTERM handler: in the server's own process it acts as Ctrl+C, after which LitServe stops its
    API and inference processes; a process LitServe forks inherits it and just ends, as by default."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if os.getpid() == server_pid:
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
    signal.signal(signal.SIGTERM, _stop(os.getpid()))
    print(
        f"Serving {options.ckpt_path} at http://{options.host}:{options.port}/predict "
        f"(GET /health answers ok once it is ready; Ctrl+C stops it)",
        flush=True,
    )
    server.run(host=options.host, port=options.port, log_level=options.log_level, generate_client_file=False)


if __name__ == "__main__":
    main()
