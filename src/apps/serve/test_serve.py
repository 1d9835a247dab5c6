"""Serving: a real server process on 127.0.0.1 answers as ``predict`` does, refuses bad requests with a
4xx and one sentence while it keeps serving, and stops, with its workers, on SIGTERM to its PID."""

import asyncio
import inspect
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path

import litserve.server
import numpy as np
import pandas as pd
import pytest
import torch
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from src.apps import serve
from src.cli import main
from src.extras.tables import conftest as tables
from src.extras.tables.predict import TableReading, table_preprocessor
from src.extras.tables.preprocessing import CellReport
from src.predict import Predictor
from tests.conftest import QUIET, ROOT, Trained

# the table runs these tests take further (the table kind's fixtures)
messy_trained = tables.messy_trained

MAX_ROWS = 50
LABELS = ["high", "low", "mid"]
PROBABILITIES = [f"probability({label})" for label in LABELS]
#: seconds for the server to load and report healthy; two Python processes import torch and Lightning
READY_WITHIN = 120


@dataclass(frozen=True)
class Server:
    process: subprocess.Popen
    url: str
    log: Path

    def post(self, body: bytes, content_type: str | None = "application/json") -> tuple[int, dict]:
        headers = {"Content-Type": content_type} if content_type else {}
        request = urllib.request.Request(f"{self.url}/predict", data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            with err:
                return err.code, json.loads(err.read())

    def predict(self, rows: list[dict]) -> tuple[int, dict]:
        return self.post(json.dumps({"rows": rows}).encode())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def json_rows(frame: pd.DataFrame) -> list[dict]:
    """Rows as a client sends them: numbers, text, booleans, and null for an empty cell."""
    return json.loads(frame.to_json(orient="records"))


#: ``python -m src.apps.serve``, but for LitServe's worker monitor, which polls every 50 ms instead of
#: every 2 s (``LitServer.monitor_internal``): it then wakes during every shutdown, as it does by chance
#: on a busy machine, so that what it says then shows in every run
EAGER_MONITOR = """
import sys
import litserve
init = litserve.LitServer.__init__
def eager(self, *args, **kwargs):
    init(self, *args, **kwargs)
    self.monitor_internal = 0.05
litserve.LitServer.__init__ = eager
from src.apps.serve import main
main(sys.argv[1:])
"""


@contextmanager
def started(words: list[str], log: Path, program: list[str]) -> Iterator[Server]:
    """``program`` (the server's command, before ``words``) as its own process group, once it answers
    ``GET /health``; killed whole at the end, whatever happened."""
    port = free_port()
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, *program, "--port", str(port), *words],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the workers it starts can be found and ended
        )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + READY_WITHIN
        while not healthy(url):
            assert process.poll() is None, f"the server exited early:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"not ready in {READY_WITHIN} s:\n{log.read_text()[-3000:]}"
            time.sleep(0.25)
        yield Server(process, url, log)
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def healthy(url: str) -> bool:
    """Whether ``GET /health`` answers ok: every inference worker loaded and ready."""
    with suppress(OSError), urllib.request.urlopen(f"{url}/health", timeout=2) as health:
        return health.status == 200
    return False


@pytest.fixture(scope="module")
def server(messy_trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``python -m src.apps.serve`` (its monitor eager: :data:`EAGER_MONITOR`)."""
    words = ["--ckpt_path", str(messy_trained.checkpoint), f"--max_rows={MAX_ROWS}"]
    # a batch window long enough that a burst of concurrent requests shares batches
    words += ["--batch_timeout=0.05", "--max_batch_size=8"]
    log = tmp_path_factory.mktemp("server") / "server.log"
    with started(words, log, ["-c", EAGER_MONITOR]) as running:
        yield running


@pytest.mark.slow
def test_served_predictions_equal_predict(
    server: Server, messy_trained: Trained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = messy_trained.raw_rows("val").reset_index(drop=True)
    rows.to_csv(tmp_path / "new.csv", index=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["src.cli"])
    checkpoint = str(messy_trained.checkpoint)
    main(["predict", "--ckpt_path", checkpoint, "--data.predict_path=new.csv", "--output=out.csv", *QUIET])
    expected = pd.read_csv(tmp_path / "out.csv")

    status, body = server.predict(json_rows(rows))
    assert status == 200
    # the cells read otherwise than written, per column, as Predictor counts them (rare cities: "(other)")
    report = CellReport()
    Predictor.from_checkpoint(messy_trained.checkpoint).predict(rows, report=report)
    assert body["notices"] == report.as_json()
    assert body["notices"]["city"]["read_as"] == "(other)"
    predictions = body["predictions"]
    assert len(predictions) == len(expected) == len(rows)
    assert [p["label"] for p in predictions] == expected["prediction"].tolist()
    assert all(list(p["probabilities"]) == LABELS for p in predictions)
    served = np.array([[p["probabilities"][label] for label in LABELS] for p in predictions])
    written = expected[PROBABILITIES].to_numpy()
    # float32 defaults of assert_close (rtol 1.3e-6, atol 1e-5): the server runs all rows in one forward
    # pass, predict in the Trainer's batches
    torch.testing.assert_close(
        torch.tensor(served, dtype=torch.float32), torch.tensor(written, dtype=torch.float32)
    )


def good_rows(trained: Trained, n: int = 3) -> list[dict]:
    return json_rows(trained.raw_rows("test").head(n))


CASES = {
    "not JSON": (b'{"rows": [', "application/json", 400, "the body is not JSON"),
    "a form, not JSON": (b"rows=1", None, 422, "the body is not a JSON object"),
    "not an object": (b"[1, 2]", "application/json", 422, "the body is not a JSON object"),
    "no rows": (b'{"row": []}', "application/json", 422, "'rows' is missing"),
    "rows not a list": (b'{"rows": {"income": 3}}', "application/json", 422, "'rows' is not a list"),
    "a row not an object": (b'{"rows": [3]}', "application/json", 422, "rows[0] is not an object"),
    "a value that is a list": (
        b'{"rows": [{"income": [1, 2]}]}',
        "application/json",
        422,
        "rows[0]['income'] is [1, 2]; a value must be a number, text, true/false or null.",
    ),
    "no rows at all": (b'{"rows": []}', "application/json", 422, "the request holds no rows"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_request_gets_a_4xx_and_the_server_keeps_serving(
    case: str, server: Server, messy_trained: Trained
) -> None:
    body, content_type, status, detail = CASES[case]
    got, answer = server.post(body, content_type)
    assert (got, list(answer)) == (status, ["detail"])
    assert detail in answer["detail"]
    assert_one_sentence(answer["detail"])
    assert server.predict(good_rows(messy_trained))[0] == 200


def assert_one_sentence(detail: str) -> None:
    assert "\n" not in detail
    assert "Traceback" not in detail
    assert detail.endswith(".")


def test_rows_the_model_cannot_read_get_a_4xx_naming_the_problem(
    server: Server, messy_trained: Trained
) -> None:
    rows = good_rows(messy_trained)
    cases = [
        (
            [{k: v for k, v in row.items() if k not in ("region", "age")} for row in rows],
            422,
            "the request has no column(s) ['age', 'region'], which the model was trained on",
        ),
        (
            [rows[0]] * (MAX_ROWS + 1),
            413,
            f"the request holds {MAX_ROWS + 1} rows, more than the {MAX_ROWS} allowed",
        ),
    ]
    for bad, status, detail in cases:
        got, answer = server.predict(bad)
        assert got == status
        assert answer["detail"].startswith(detail)
        assert_one_sentence(answer["detail"])
        assert server.predict(rows)[0] == 200
    assert "Traceback" not in server.log.read_text()


def burst(server: Server, bodies: list[bytes]) -> list[tuple[int, dict]]:
    """Every body posted at once, one thread each, released together so that they share batches."""
    answers: list[tuple[int, dict]] = [(0, {})] * len(bodies)
    start = threading.Barrier(len(bodies))

    def send(i: int) -> None:
        start.wait()
        answers[i] = server.post(bodies[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return answers


def test_concurrent_good_and_bad_requests_each_get_their_own_answer(
    server: Server, messy_trained: Trained
) -> None:
    rows = good_rows(messy_trained, n=2)
    bodies = [rows if i % 2 else [{k: v for k, v in rows[0].items() if k != "age"}] for i in range(8)]
    answers = burst(server, [json.dumps({"rows": body}).encode() for body in bodies])
    expected = Predictor.from_checkpoint(messy_trained.checkpoint).predict(pd.DataFrame.from_records(rows))
    for body, (status, answer) in zip(bodies, answers, strict=True):
        if body is rows:
            assert status == 200
            assert [p["label"] for p in answer["predictions"]] == expected["prediction"].tolist()
        else:
            assert status == 422
            assert "has no column(s) ['age']" in answer["detail"]


def with_cell(row: dict, column: str, token: str) -> bytes:
    """A one-row body whose ``column`` holds ``token`` as written, JSON or not (``1e999``, ``NaN``)."""
    return json.dumps({"rows": [{**row, column: "<token>"}]}).replace('"<token>"', token).encode()


#: 10**400: valid JSON, and beyond any float
OVERFLOWING = "1" + "0" * 400


def bad_requests(row: dict) -> dict[str, tuple[bytes, int, str]]:
    """What one request can hold that the model cannot read, each in an otherwise good ``row``: its
    body, its status and how its sentence starts."""
    return {
        "an overflowing integer": (
            with_cell(row, "income", OVERFLOWING),
            422,
            "rows[0]['income'] is an integer too large for any float",
        ),
        "an overflowing integer as a category": (
            with_cell(row, "region", "-" + OVERFLOWING),
            422,
            "rows[0]['region'] is an integer too large for any float",
        ),
        "a lone surrogate": (
            with_cell(row, "region", r'"\ud800"'),
            422,
            "rows[0]['region'] is text that is not valid Unicode",
        ),
        "a lone surrogate in a number column": (
            with_cell(row, "income", r'"4\udfff"'),
            422,
            "rows[0]['income'] is text that is not valid Unicode",
        ),
        "a lone surrogate in a name": (
            with_cell(row, "\ud800", "1"),
            422,
            "rows[0] has the column name '\\ud800', which is not valid Unicode",
        ),
        "a list in a cell": (
            with_cell(row, "income", "[1, 2]"),
            422,
            "rows[0]['income'] is [1, 2]; a value must be",
        ),
        "an object in a cell": (
            with_cell(row, "city", '{"a": 1}'),
            422,
            "rows[0]['city'] is {\"a\": 1}; a value must be",
        ),
        "a column named twice": (
            with_cell(row, " income ", "3"),
            422,
            "the request names the column 'income' twice, as 'income' and ' income '; send it once.",
        ),
        "a column missing": (
            json.dumps({"rows": [{k: v for k, v in row.items() if k != "age"}]}).encode(),
            422,
            "the request has no column(s) ['age']",
        ),
        "no rows": (b'{"rows": []}', 422, "the request holds no rows"),
    }


#: cells the one cell rule reads as missing, each answered 200 with its column in "notices"
NOTICED = {
    "text for a number": ("income", '"lots"'),
    "1e999": ("income", "1e999"),
    "-Infinity": ("age", "-Infinity"),
}


def good_requests(trained: Trained) -> list[bytes]:
    """Requests of one to three rows, text and infinite numbers where the model reads numbers (read as
    missing, with a notice), one with a category the model never saw (true and 1 read apart), one with
    ``NaN``, which reads as a missing cell."""
    rows = good_rows(trained, n=8)
    bodies = [json.dumps({"rows": rows[i : i + 1 + i % 3]}).encode() for i in range(6)]
    noticed = [with_cell(rows[2 + i], column, token) for i, (column, token) in enumerate(NOTICED.values())]
    return [*bodies, *noticed, with_cell(rows[0], "verified", "1"), with_cell(rows[1], "income", "NaN")]


def test_cells_read_as_missing_are_counted_in_the_response(messy_trained: Trained) -> None:
    """Text, inf and -inf where a number belongs: predicted as the missing cell (null) is, and named in
    the response's notices, column by column."""
    api = ready_api(messy_trained.checkpoint)
    row = good_rows(messy_trained, n=1)[0]
    for column, token in NOTICED.values():
        [(status, answer), (_, missing)] = through_a_batch(
            api, [with_cell(row, column, token), with_cell(row, column, "null")]
        )
        assert status == 200
        assert_same_predictions(answer, missing)
        written = json.loads(token)  # 'lots', inf, -inf
        example = written if isinstance(written, str) else repr(written)
        assert answer["notices"].pop(column) == {"count": 1, "example": example, "read_as": "missing"}
        assert answer["notices"] == missing["notices"]  # the other columns' notices, as with null


def assert_same_predictions(got: dict, alone: dict) -> None:
    """Equal labels; probabilities equal to float32 rounding (a row alone runs another matrix kernel than
    the rows of a batch)."""
    assert [p["label"] for p in got["predictions"]] == [p["label"] for p in alone["predictions"]]
    torch.testing.assert_close(
        [p["probabilities"] for p in got["predictions"]],
        [p["probabilities"] for p in alone["predictions"]],
        rtol=1.3e-6,
        atol=1e-5,
    )


def test_one_bad_request_never_fails_its_batch(server: Server, messy_trained: Trained) -> None:
    """Fault injection through the front door: good requests in a burst with every kind of bad one, twice
    over; each good one is answered as it is alone, each bad one with its own 4xx, and none with a 500."""
    goods = good_requests(messy_trained)
    bads = {
        body: (status, detail)
        for body, status, detail in bad_requests(good_rows(messy_trained, 1)[0]).values()
    }
    alone = {body: server.post(body) for body in goods}
    assert all(status == 200 for status, _ in alone.values())
    nan, null = goods[-1], goods[-1].replace(b"NaN", b"null")
    assert_same_predictions(alone[nan][1], server.post(null)[1])
    # good and bad in turn, so that every batch of 8 holds both
    bodies = [body for i, bad in enumerate(bads) for body in (goods[i % len(goods)], bad)]
    for _ in range(2):
        answers = burst(server, bodies)
        assert sum(status == 500 for status, _ in answers) == 0
        for body, (status, answer) in zip(bodies, answers, strict=True):
            if body in alone:
                assert status == 200
                assert_same_predictions(answer, alone[body][1])
            else:
                assert status == bads[body][0]
                assert answer["detail"].startswith(bads[body][1])
                assert_one_sentence(answer["detail"])
    assert "Traceback" not in server.log.read_text()


def test_a_refused_request_in_a_batch_is_answered_alone(messy_trained: Trained) -> None:
    """What LitServe's batched loop does with one batch, in order; left to itself, LitServe answers every
    request of a batch with the exception one of them raised."""
    api = serve.TabularAPI(str(messy_trained.checkpoint), max_rows=10, max_batch_size=4, batch_timeout=0.0)
    api.pre_setup()
    api.setup("cpu")
    rows = good_rows(messy_trained, n=3)
    requests = [
        rows,
        [{**rows[0], "income": 10**400}],  # refused when decoded, where each request is encoded alone
        rows[:1],
        [],  # refused when decoded
        [{k: v for k, v in row.items() if k != "age"} for row in rows],  # refused when decoded
    ]
    decoded = [api.decode_request(serve.PredictRequest(rows=r)) for r in requests]
    outputs = api.unbatch(api.predict(api.batch(decoded)))
    responses = [api.encode_response(output) for output in outputs]
    assert [r.status_code for r in responses] == [200, 422, 200, 422, 422]
    expected = Predictor.from_checkpoint(messy_trained.checkpoint).predict(pd.DataFrame.from_records(rows))
    for response, n in ((responses[0], 3), (responses[2], 1)):
        predictions = json.loads(response.body)["predictions"]
        assert [p["label"] for p in predictions] == expected["prediction"].tolist()[:n]
        served = [[p["probabilities"][label] for label in LABELS] for p in predictions]
        torch.testing.assert_close(
            torch.tensor(served, dtype=torch.float32),
            torch.tensor(expected[PROBABILITIES].to_numpy()[:n], dtype=torch.float32),
        )
    assert "rows[0]['income'] is an integer too large" in json.loads(responses[1].body)["detail"]
    assert "has no column(s) ['age']" in json.loads(responses[4].body)["detail"]
    # all readable, with a column that is empty in one request: encoded together, as each alone
    empty_city = [{**row, "city": None} for row in rows[:2]]
    together = api.predict(
        api.batch([api.decode_request(serve.PredictRequest(rows=r)) for r in (rows, empty_city)])
    )
    alone = [api.predict(api.decode_request(serve.PredictRequest(rows=r))) for r in (rows, empty_city)]
    for batched, single in zip(together, alone, strict=True):
        assert [p["label"] for p in batched.predictions] == [p["label"] for p in single.predictions]
        assert batched.notices == single.notices
        torch.testing.assert_close(
            [p["probabilities"] for p in batched.predictions],
            [p["probabilities"] for p in single.predictions],
            rtol=1.3e-6,
            atol=1e-5,
        )
    # without batching (--max_batch_size 1) LitServe hands predict one request at a time
    # (one row alone runs another matrix kernel than four together: equal to float32 rounding)
    single = api.encode_response(api.predict(api.decode_request(serve.PredictRequest(rows=rows[:1]))))
    alone, batched = (json.loads(r.body)["predictions"][0] for r in (single, responses[2]))
    assert alone["label"] == batched["label"]
    torch.testing.assert_close(alone["probabilities"], batched["probabilities"], rtol=1.3e-6, atol=1e-5)


def ready_api(checkpoint: Path) -> serve.TabularAPI:
    api = serve.TabularAPI(str(checkpoint), max_rows=10, max_batch_size=8, batch_timeout=0.0)
    api.pre_setup()
    api.setup("cpu")
    return api


def through_a_batch(api: serve.TabularAPI, bodies: list[bytes]) -> list[tuple[int, dict]]:
    """What LitServe's batched loop does with one batch of bodies: each decoded (as FastAPI parses and
    checks it), then batch, predict and unbatch once, then each response encoded."""
    decoded = [api.decode_request(serve.PredictRequest.model_validate(json.loads(body))) for body in bodies]
    responses = [api.encode_response(output) for output in api.unbatch(api.predict(api.batch(decoded)))]
    return [(response.status_code, json.loads(response.body)) for response in responses]


def test_what_one_request_holds_wrong_stays_with_it_in_a_batch(messy_trained: Trained) -> None:
    """Every bad cell that passes FastAPI's check of the body, in one batch with good requests: each bad
    one refused with its sentence, each good one answered as alone (``"verified": 1`` beside ``true``
    too: pandas would read them as one value in one column)."""
    api = ready_api(messy_trained.checkpoint)
    goods = good_requests(messy_trained)
    shapes = ("a list in a cell", "an object in a cell")  # refused by FastAPI before any worker sees them
    bads = [case for name, case in bad_requests(good_rows(messy_trained, 1)[0]).items() if name not in shapes]
    answers = through_a_batch(api, [*goods, *(body for body, _, _ in bads)])
    for body, (status, answer) in zip(goods, answers[: len(goods)], strict=True):
        assert status == 200
        assert_same_predictions(answer, through_a_batch(api, [body])[0][1])
    for (_, status, detail), (got, answer) in zip(bads, answers[len(goods) :], strict=True):
        assert (got, list(answer)) == (status, ["detail"])
        assert answer["detail"].startswith(detail)
        assert_one_sentence(answer["detail"])


def test_faults_past_the_cells_stay_with_their_request(
    messy_trained: Trained, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Fault injection where every cell is readable: a number that leaves float32 once standardized (read
    as missing, with a notice), a model output that is not finite (JSON has no such number), a bug while
    encoding. Each is the answer of its own request; the others of its batch are answered as alone."""
    api = ready_api(messy_trained.checkpoint)
    rows = good_rows(messy_trained, n=3)
    goods = [json.dumps({"rows": rows[:2]}).encode(), json.dumps({"rows": rows[2:]}).encode()]

    def assert_only_refused(body: bytes, status: int, detail: str) -> None:
        answers = through_a_batch(api, [goods[0], body, goods[1]])
        assert answers[1] == (status, {"detail": detail})
        for good, (got, answer) in zip(goods, answers[::2], strict=True):
            assert got == 200
            assert_same_predictions(answer, through_a_batch(api, [good])[0][1])

    preprocessor = table_preprocessor(api.predictor.reading)
    income, *others = preprocessor.numeric
    assert income.name == "income"
    with monkeypatch.context() as patch:  # standardized by 0.01, 1e37 leaves float32
        patch.setattr(
            api.predictor,
            "reading",
            TableReading(replace(preprocessor, numeric=[replace(income, scale=0.01), *others])),
        )
        answers = through_a_batch(api, [goods[0], with_cell(rows[0], "income", "1e37"), goods[1]])
        status, answer = answers[1]
        assert status == 200
        assert answer["notices"]["income"] == {"count": 1, "example": "1e+37", "read_as": "missing"}
        assert_same_predictions(answer, through_a_batch(api, [with_cell(rows[0], "income", "null")])[0][1])
    outputs = api.predictor.outputs

    def not_finite_past_a_million(x: torch.Tensor) -> dict[str, torch.Tensor]:
        found = outputs(x)
        probs = found["probs"].clone()  # (N, K)
        probs[x[:, 0] > 1e5] = torch.nan  # column 0: income standardized, about 1e6 for 1e7
        return {**found, "probs": probs}

    with monkeypatch.context() as patch:
        patch.setattr(api.predictor, "outputs", not_finite_past_a_million)
        body = json.dumps({"rows": [rows[0], {**rows[1], "income": 1e7}]}).encode()
        assert_only_refused(
            body,
            422,
            "the request, row 1: the model's output is not a finite number; its values lie too far from "
            "those the model was trained on.",
        )
    read = api.predictor.read

    def failing_on_boom(
        frame: pd.DataFrame, names: list[str] | None = None, report: CellReport | None = None
    ) -> torch.Tensor:
        if (frame["city"] == "boom").any():
            raise RuntimeError("a bug")
        return read(frame, names, report)

    with monkeypatch.context() as patch, caplog.at_level(logging.ERROR, logger="src.apps.serve"):
        patch.setattr(api.predictor, "read", failing_on_boom)
        assert_only_refused(with_cell(rows[0], "city", '"boom"'), 500, serve.FAILED)
    assert "RuntimeError: a bug" in caplog.text  # the traceback goes to the server's log alone


def test_bad_options_and_checkpoints_are_one_sentence(messy_trained: Trained, tmp_path: Path, capsys) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cases = [
            (["--ckpt_path", str(tmp_path / "gone.ckpt")], "does not exist; pass the path of a .ckpt file."),
            (
                ["--ckpt_path", str(messy_trained.checkpoint), "--port", str(port)],
                f"port {port} on 127.0.0.1 is taken",
            ),
            (
                ["--ckpt_path", str(messy_trained.checkpoint), "--host", "example.org"],
                "--host 'example.org' cannot be",
            ),
            (
                ["--ckpt_path", str(messy_trained.checkpoint), "--max_rows", "0"],
                "--max_rows 0 must be at least 1.",
            ),
            (
                ["--ckpt_path", str(messy_trained.checkpoint), "--log_level", "loud"],
                "--log_level 'loud' is unknown",
            ),
            (
                ["--ckpt_path", str(messy_trained.checkpoint), "--timeout", "0"],
                "--timeout 0.0 must be longer than --batch_timeout 0.002.",
            ),
        ]
        for words, message in cases:
            with pytest.raises(SystemExit) as exit_:
                serve.main(words)
            assert exit_.value.code == 2
            err = capsys.readouterr().err.strip()
            assert err.startswith("error: ")
            assert message in err
            assert "\n" not in err


def group_members(pgid: int) -> list[int]:
    """The processes of a process group, read from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(ProcessLookupError, PermissionError):  # ended meanwhile, or not ours
                if os.getpgid(int(entry.name)) == pgid:
                    members.append(int(entry.name))
    return members


@pytest.mark.skipif(sys.platform != "linux", reason="lists the server's processes from /proc")
def test_sigterm_to_its_pid_stops_the_server_and_its_workers(server: Server) -> None:
    """Last in this file: it ends the module's server."""
    pid = server.process.pid
    # the server, LitServe's manager, its HTTP process and the inference worker
    assert len(group_members(pid)) >= 4
    os.kill(pid, signal.SIGTERM)
    assert server.process.wait(timeout=120) == 0  # bounds a hang only: no duration is asserted
    deadline = time.monotonic() + 120
    while group_members(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert group_members(pid) == [], "a worker process outlived the server"
    log = server.log.read_text()
    assert "Traceback" not in log
    assert "died" not in log  # LitServe's monitor, finding the workers its own shutdown ended


def test_while_stopping_the_monitor_of_litserve_says_nothing_and_before_it_is_heard() -> None:
    """Whether LitServe's monitor wakes during the shutdown depends on the machine's load; what it would
    say then is dropped by thread name, which a canary holds to LitServe's own."""
    quiet = serve.QuietWhileStopping()

    def record(thread: str, message: str) -> logging.LogRecord:
        made = logging.LogRecord("litserve.server", logging.ERROR, __file__, 1, message, None, None)
        made.threadName = thread
        return made

    monitor = record(serve.MONITOR_THREAD, "Monitoring worker crashed")
    assert quiet.filter(monitor)  # a worker that dies while serving is news
    quiet.stopping.set()
    assert not quiet.filter(monitor)
    assert not quiet.filter(record(serve.MONITOR_THREAD, "⚠️ Worker inference-worker died; shutting down"))
    assert quiet.filter(record("MainThread", "Shutting down LitServe..."))
    source = inspect.getsource(litserve.server)
    assert f'threading.Thread(target=monitor, daemon=True, name="{serve.MONITOR_THREAD}")' in source


def test_the_model_goes_where_accelerator_says_and_a_bad_one_is_a_sentence(
    messy_trained: Trained, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    made: list[dict] = []

    class Recorded:
        def __init__(self, api: object, **kwargs: object) -> None:
            made.append(kwargs)
            self.app = FastAPI()

    monkeypatch.setattr(serve.ls, "LitServer", Recorded)
    port = str(free_port())
    serve.build(serve.parse(["--ckpt_path", str(messy_trained.checkpoint), "--port", port]))
    serve.build(
        serve.parse(["--ckpt_path", str(messy_trained.checkpoint), "--port", port, "--accelerator", "cpu"])
    )
    assert [m["accelerator"] for m in made] == ["auto", "cpu"]  # auto: a GPU when there is one
    refusals = [("tpu", "--accelerator 'tpu' is unknown; choose one of auto, cpu, cuda.")]
    if not torch.cuda.is_available():
        refusals.append(
            ("cuda", "--accelerator cuda needs a CUDA GPU, and torch sees none; pass auto or cpu.")
        )
    for accelerator, sentence in refusals:
        with pytest.raises(SystemExit) as exit_:
            serve.main(
                ["--ckpt_path", str(messy_trained.checkpoint), "--port", port, "--accelerator", accelerator]
            )
        assert exit_.value.code == 2
        assert capsys.readouterr().err == f"error: {sentence}\n"
    # the worker's device, as LitServe hands it to setup
    api = serve.TabularAPI(str(messy_trained.checkpoint), max_rows=10, max_batch_size=1, batch_timeout=0.0)
    api.setup("cpu")
    assert api.torch_device == torch.device("cpu")
    assert next(api.predictor.model.parameters()).device == torch.device("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")
def test_on_a_gpu_rows_are_answered_as_on_the_cpu(messy_trained: Trained) -> None:
    rows = good_rows(messy_trained, n=3)
    answers = []
    for device in ("cpu", "cuda:0"):
        api = serve.TabularAPI(
            str(messy_trained.checkpoint), max_rows=10, max_batch_size=1, batch_timeout=0.0
        )
        api.setup(device)
        assert next(api.predictor.model.parameters()).device == torch.device(device)
        answers.append(
            json.loads(
                api.encode_response(api.predict(api.decode_request(serve.PredictRequest(rows=rows)))).body
            )
        )
    assert [p["label"] for p in answers[1]["predictions"]] == [p["label"] for p in answers[0]["predictions"]]
    torch.testing.assert_close(
        torch.tensor([list(p["probabilities"].values()) for p in answers[1]["predictions"]]),
        torch.tensor([list(p["probabilities"].values()) for p in answers[0]["predictions"]]),
        rtol=1e-4,
        atol=1e-5,
    )


def test_a_regression_model_answers_values(regression_checkpoint: tuple[Path, pd.DataFrame]) -> None:
    checkpoint, rows = regression_checkpoint
    api = serve.TabularAPI(str(checkpoint), max_rows=1000, max_batch_size=1, batch_timeout=0.0)
    api.setup("cpu")
    request = serve.PredictRequest(rows=json_rows(rows))
    response = api.encode_response(api.predict(api.decode_request(request)))
    assert response.status_code == 200
    values = [p["value"] for p in json.loads(response.body)["predictions"]]
    expected = Predictor.from_checkpoint(checkpoint).predict(rows)["prediction"]
    torch.testing.assert_close(torch.tensor(values), torch.tensor(expected.to_numpy(), dtype=torch.float32))


def test_make_serve_starts_what_these_tests_start() -> None:
    makefile = Path(__file__).with_name("app.mk").read_text()
    assert "\nserve: PORT = 8000\n" in makefile  # its own default; tensorboard keeps 6006
    recipe = makefile.split("\nserve: $(STAMP)", 1)[1].split("\n\n", 1)[0]
    assert '$(PY) -m src.apps.serve --ckpt_path "$(CKPT)" --port $(PORT)' in recipe


def inference_workers(server_pid: int) -> list[int]:
    """The server's inference workers: its children that multiprocessing spawned (a fresh interpreter
    each, ``spawn_main`` on its command line), read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError):  # ended meanwhile, or not ours
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if parent == server_pid and b"spawn_main" in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return sorted(found)


#: the deadline of a request on the server below (``--timeout``), in seconds
TIMEOUT = 5.0


def answered_correctly_or_503(server: Server, rows: list[dict], expected: pd.DataFrame) -> int:
    """One request: a 200 with ``expected``'s labels and probabilities, or a 503 with one sentence;
    a dropped connection fails (urllib raises). Returns the status."""
    started_at = time.monotonic()
    status, answer = server.predict(rows)
    if status == 503:
        assert list(answer) == ["detail"]
        assert_one_sentence(answer["detail"])
        assert time.monotonic() - started_at < TIMEOUT + 5  # answered at its deadline, not left waiting
        return status
    assert status == 200, answer
    assert [p["label"] for p in answer["predictions"]] == expected["prediction"].tolist()
    served = [[p["probabilities"][label] for label in LABELS] for p in answer["predictions"]]
    torch.testing.assert_close(
        torch.tensor(served, dtype=torch.float32),
        torch.tensor(expected[PROBABILITIES].to_numpy(), dtype=torch.float32),
    )
    return status


def until_recovered(server: Server, workers: int, gone: set[int], ask: Callable[[], int]) -> list[int]:
    """Requests one after another until ``workers`` inference workers, none of them in ``gone``, are
    ready and a request after that was answered 200; bounded by :data:`READY_WITHIN`. Their statuses."""
    statuses = []
    deadline = time.monotonic() + READY_WITHIN
    while True:
        assert server.process.poll() is None, f"the server exited:\n{server.log.read_text()[-3000:]}"
        running = inference_workers(server.process.pid)
        recovered = len(running) == workers and not gone & set(running) and healthy(server.url)
        statuses.append(ask())
        if recovered and statuses[-1] == 200:
            return statuses
        time.sleep(0.05)  # a 503 comes at once while no worker is ready
        assert time.monotonic() < deadline, f"not recovered in {READY_WITHIN} s:\n{server.log.read_text()}"


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="lists the server's processes from /proc")
def test_a_killed_inference_worker_is_replaced_while_the_server_answers(
    messy_trained: Trained, tmp_path: Path
) -> None:
    """SIGKILL to one of two inference workers, then to both while one holds a request: the server stays
    up, starts new workers, and answers every request correctly or with a 503 and one sentence."""
    rows = good_rows(messy_trained, n=3)
    expected = Predictor.from_checkpoint(messy_trained.checkpoint).predict(pd.DataFrame.from_records(rows))
    # a batch window of 2 s: a worker holds a lone request that long, so that killing it loses the request
    words = ["--ckpt_path", str(messy_trained.checkpoint), "--workers=2", f"--timeout={TIMEOUT}"]
    words += ["--batch_timeout=2", "--max_batch_size=8"]
    with started(words, tmp_path / "server.log", ["-m", "src.apps.serve"]) as server:
        first = inference_workers(server.process.pid)
        assert len(first) == 2
        os.kill(first[0], signal.SIGKILL)
        statuses = until_recovered(
            server, 2, {first[0]}, lambda: answered_correctly_or_503(server, rows, expected)
        )
        assert statuses.count(200) >= 1
        # both killed while one holds a request (sent 0.3 s before): none ready until LitServe restarts them
        second = inference_workers(server.process.pid)
        held: list[int] = []
        sender = threading.Thread(
            target=lambda: held.append(answered_correctly_or_503(server, rows, expected))
        )
        sender.start()
        time.sleep(0.3)
        for pid in second:
            os.kill(pid, signal.SIGKILL)
        statuses = until_recovered(
            server, 2, set(second), lambda: answered_correctly_or_503(server, rows, expected)
        )
        sender.join(timeout=60)
        assert held in (
            [200],
            [503],
        )  # 503 when a killed worker held it, 200 when it still waited in the queue
        assert server.process.poll() is None
    log = server.log.read_text()
    assert "Traceback" not in log
    assert "Exception" not in log


def through_unanswered(app: Callable, path: str, ready: bool) -> tuple[int, dict, bool]:
    """One request through :class:`serve.Unanswered` (a deadline of 0.2 s) before ``app``: its status,
    its JSON body, and whether it reached ``app``."""
    reached = []

    async def inner(scope: dict, receive: Callable, send: Callable) -> None:
        reached.append(scope["path"])
        await app(scope, receive, send)

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def receive() -> dict:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    scope = {"type": "http", "method": "POST", "path": path, "headers": [], "query_string": b""}
    asyncio.run(serve.Unanswered(inner, ready=lambda: ready, timeout=0.2)(scope, receive, send))
    start, body = sent
    return start["status"], json.loads(body["body"]), bool(reached)


def test_a_request_that_no_worker_can_answer_gets_a_503_and_one_sentence() -> None:
    """While no inference worker is ready, at once; when the worker that took it died (it never
    answers), at its deadline. Anything else passes through untouched."""

    async def answers(scope: dict, receive: Callable, send: Callable) -> None:
        await JSONResponse({"predictions": []})(scope, receive, send)

    async def never(scope: dict, receive: Callable, send: Callable) -> None:
        await asyncio.Event().wait()

    assert through_unanswered(answers, "/predict", ready=True) == (200, {"predictions": []}, True)
    assert through_unanswered(answers, "/predict", ready=False) == (503, {"detail": serve.NO_WORKER}, False)
    assert through_unanswered(answers, "/health", ready=False) == (200, {"predictions": []}, True)
    status, answer, reached = through_unanswered(never, "/predict", ready=True)
    assert (status, reached) == (503, True)
    assert answer == {"detail": serve.UNANSWERED.format(timeout=0.2)}
    for detail in (serve.NO_WORKER, answer["detail"]):
        assert_one_sentence(detail)


def test_a_k_output_model_answers_each_rows_columns_by_name(
    quantiles_checkpoint: tuple[Path, pd.DataFrame],
) -> None:
    """Three quantiles per row (tests/helpers.py's Quantiles): each answer holds the three by the names
    ``predict``'s file gives them, with their values."""
    checkpoint, rows = quantiles_checkpoint
    api = serve.TabularAPI(str(checkpoint), max_rows=1000, max_batch_size=1, batch_timeout=0.0)
    api.setup("cpu")
    response = api.encode_response(
        api.predict(api.decode_request(serve.PredictRequest(rows=json_rows(rows))))
    )
    assert response.status_code == 200
    predictions = json.loads(response.body)["predictions"]
    columns = ["preds(0)", "preds(1)", "preds(2)"]
    assert [list(p) for p in predictions] == [columns] * len(rows)
    expected = Predictor.from_checkpoint(checkpoint).predict(rows)[columns].to_numpy()
    torch.testing.assert_close(
        torch.tensor([[p[c] for c in columns] for p in predictions]),
        torch.tensor(expected, dtype=torch.float32),
    )


def test_a_checkpoint_of_a_datamodule_without_a_table_is_one_sentence(
    many_labels_checkpoint: Path, capsys
) -> None:
    """A multi-label task trained on tensors of the user's own: no raw rows to read, so nothing to serve."""
    with pytest.raises(SystemExit) as exit_:
        serve.main(["--ckpt_path", str(many_labels_checkpoint)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: checkpoint ")
    assert "names no DataModule that says how to read new inputs" in err
    assert "\n" not in err
