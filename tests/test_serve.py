"""Serving: a real server process on 127.0.0.1 answers as ``predict`` does, refuses bad requests with a
4xx and one sentence while it keeps serving, and stops, with its workers, on SIGTERM to its PID."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from src import serve
from src.cli import main
from src.predict import Predictor
from tests.conftest import QUIET, ROOT, Trained

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


@pytest.fixture(scope="module")
def server(messy_trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``python -m src.serve`` as its own process group; killed whole at the end, whatever happened."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    port = free_port()
    words = ["--ckpt_path", str(messy_trained.checkpoint), "--port", str(port), f"--max_rows={MAX_ROWS}"]
    # a batch window long enough that a burst of concurrent requests shares batches
    words += ["--batch_timeout=0.05", "--max_batch_size=8"]
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "src.serve", *words],
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
        yield Server(process, url, log)
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


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
            [rows[0], {**rows[1], "income": "lots"}],
            422,
            "the request, column 'income', row 1 holds 'lots', which is not a number",
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


def test_concurrent_good_and_bad_requests_each_get_their_own_answer(
    server: Server, messy_trained: Trained
) -> None:
    rows = good_rows(messy_trained, n=2)
    bodies = [rows if i % 2 else [{**rows[0], "age": "old"}] for i in range(8)]
    answers: list[tuple[int, dict]] = [(0, {})] * len(bodies)
    start = threading.Barrier(len(bodies))

    def send(i: int) -> None:
        start.wait()
        answers[i] = server.predict(bodies[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    expected = Predictor.from_checkpoint(messy_trained.checkpoint).predict(pd.DataFrame.from_records(rows))
    for body, (status, answer) in zip(bodies, answers, strict=True):
        if body is rows:
            assert status == 200
            assert [p["label"] for p in answer["predictions"]] == expected["prediction"].tolist()
        else:
            assert status == 422
            assert "column 'age', row 0 holds 'old'" in answer["detail"]


def test_a_refused_request_in_a_batch_is_answered_alone(messy_trained: Trained) -> None:
    """What LitServe's batched loop does with one batch, in order; left to itself, LitServe answers every
    request of a batch with the exception one of them raised."""
    api = serve.TabularAPI(str(messy_trained.checkpoint), max_rows=10, max_batch_size=4, batch_timeout=0.0)
    api.pre_setup()
    api.setup("cpu")
    rows = good_rows(messy_trained, n=3)
    requests = [
        rows,
        [{**rows[0], "income": "lots"}],  # refused when encoded: the batch is then encoded request by request
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
    assert "row 0 holds 'lots'" in json.loads(responses[1].body)["detail"]
    assert "has no column(s) ['age']" in json.loads(responses[4].body)["detail"]
    # all readable, with a column that is empty in one request: encoded together, as each alone
    empty_city = [{**row, "city": None} for row in rows[:2]]
    together = api.predict(
        api.batch([api.decode_request(serve.PredictRequest(rows=r)) for r in (rows, empty_city)])
    )
    alone = [api.predict(api.decode_request(serve.PredictRequest(rows=r))) for r in (rows, empty_city)]
    for batched, single in zip(together, alone, strict=True):
        assert [p["label"] for p in batched] == [p["label"] for p in single]
        torch.testing.assert_close(
            [p["probabilities"] for p in batched],
            [p["probabilities"] for p in single],
            rtol=1.3e-6,
            atol=1e-5,
        )
    # without batching (--max_batch_size 1) LitServe hands predict one request at a time
    # (one row alone runs another matrix kernel than four together: equal to float32 rounding)
    single = api.encode_response(api.predict(api.decode_request(serve.PredictRequest(rows=rows[:1]))))
    alone, batched = (json.loads(r.body)["predictions"][0] for r in (single, responses[2]))
    assert alone["label"] == batched["label"]
    torch.testing.assert_close(alone["probabilities"], batched["probabilities"], rtol=1.3e-6, atol=1e-5)


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
    started = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    assert server.process.wait(timeout=30) == 0
    deadline = time.monotonic() + 10
    while group_members(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert group_members(pid) == [], "a worker process outlived the server"
    assert time.monotonic() - started < 40
    assert "Traceback" not in server.log.read_text()


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
    makefile = (ROOT / "Makefile").read_text()
    assert "\nserve: PORT = 8000\n" in makefile  # its own default; tensorboard keeps 6006
    recipe = makefile.split("\nserve: $(STAMP)", 1)[1].split("\n\n", 1)[0]
    assert '$(PY) -m src.serve --ckpt_path "$(CKPT)" --port $(PORT)' in recipe
