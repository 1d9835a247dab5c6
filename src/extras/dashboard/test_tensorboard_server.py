"""The real TensorBoard server, on loopback, serving a finished run: what `make tensorboard` opens."""

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from src.cli import main
from tests.conftest import CONFIGS, QUIET, ROOT

HOST = "127.0.0.1"
REQUEST_TIMEOUT_S = 5
STARTUP_POLLS, POLL_INTERVAL_S = 120, 0.5  # at most a minute until the run shows up
STOP_TIMEOUT_S = 15
STATUSES = ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]
# no proxy, whatever the environment says: every request stays on this machine
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def request(port: int, path: str, body: dict | None = None) -> object:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if body is not None else {}
    req = urllib.request.Request(f"http://{HOST}:{port}{path}", data=data, headers=headers)
    with OPENER.open(req, timeout=REQUEST_TIMEOUT_S) as response:
        return json.load(response)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict[str, float]]:
    """A two-epoch digits fit with its test: the logs folder, the run's name and its final metrics."""
    tmp = tmp_path_factory.mktemp("served")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp)
        patch.setattr(sys, "argv", ["src.cli"])
        run = main(
            [
                "fit",
                "--config", str(CONFIGS / "digits.yaml"),
                "--trainer.max_epochs=2",
                "--trainer.limit_train_batches=3",
                "--trainer.log_every_n_steps=2",
                "--test_after_fit=true",
                *QUIET,
            ]
        )  # fmt: skip
    metrics = {tag: value.item() for tag, value in run.trainer.callback_metrics.items()}
    log_dir = tmp / run.trainer.log_dir
    return tmp / "logs", log_dir.relative_to(tmp / "logs").as_posix(), metrics


@pytest.fixture
def server(finished_run: tuple[Path, str, dict[str, float]], tmp_path: Path):
    """`tensorboard --logdir logs --host 127.0.0.1` as the Makefile runs it, on a free port."""
    logs, run_name, _ = finished_run
    port = free_port()
    output = tmp_path / "tensorboard.log"
    with output.open("w") as sink:
        process = subprocess.Popen(
            [
                Path(sys.executable).parent / "tensorboard",
                "--logdir",
                logs,
                "--host",
                HOST,
                "--port",
                str(port),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        for _ in range(STARTUP_POLLS):
            assert process.poll() is None, f"tensorboard exited early:\n{output.read_text()}"
            try:
                if run_name in request(port, "/data/runs"):  # type: ignore[operator]
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not listening yet
            time.sleep(POLL_INTERVAL_S)
        else:
            pytest.fail(f"tensorboard did not list {run_name} in time:\n{output.read_text()}")
        yield port, process
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=STOP_TIMEOUT_S)
                pytest.fail(f"tensorboard (pid {process.pid}) ignored SIGTERM for {STOP_TIMEOUT_S} s")


def test_make_tensorboard_serves_logs_on_loopback_as_launched_here() -> None:
    recipe = (ROOT / "Makefile").read_text().split("\ntensorboard:", 1)[1].split("\n\n", 1)[0]
    assert "tensorboard --logdir logs --host 127.0.0.1 --port $(PORT)" in recipe
    assert "http://127.0.0.1:$(PORT)/" in recipe  # the URL it prints


def session_groups(port: int) -> list[dict]:
    body = {
        "experimentName": "",
        "startIndex": 0,
        "sliceSize": 10,
        "includeMetrics": True,
        "allowedStatuses": STATUSES,
    }
    return request(port, "/data/plugin/hparams/session_groups", body)["sessionGroups"]  # type: ignore[index]


@pytest.mark.slow
def test_server_shows_the_run_its_scalars_layout_and_hparams(server, finished_run) -> None:
    port, process = server
    _, run_name, metrics = finished_run

    # the fit: its folder (config, HParams, the best epoch), and a run per stage; no other run
    runs = request(port, "/data/runs")
    assert sorted(runs) == [run_name, *(f"{run_name}/{stage}" for stage in ("test", "train", "validation"))]
    tags = request(port, "/data/plugin/scalars/tags")
    # train and validation share their tags: one chart each, two colours
    shared = {"metrics/loss", "metrics/acc", "metrics/f1", "speed/epoch_time"}
    assert shared <= set(tags[f"{run_name}/train"]) & set(tags[f"{run_name}/validation"])  # type: ignore[index]
    assert {"optimization/loss", "optimization/lr", "optimization/grad_norm", "optimization/clipped"} <= set(
        tags[f"{run_name}/train"]  # type: ignore[index]
    )
    assert {"metrics/loss", "metrics/acc"} <= set(tags[f"{run_name}/test"])  # type: ignore[index]
    assert {t.split("/")[0] for t in tags[run_name]} == {"summary"}  # type: ignore[index]
    images = request(port, "/data/plugin/images/tags")[run_name]  # type: ignore[index]
    assert {"val/confusion_matrix", "summary/confusion_matrix"} <= set(images)
    layout = request(port, "/data/plugin/custom_scalars/layout")
    charts = {chart["title"]: chart for cat in layout["category"] for chart in cat["chart"]}  # type: ignore[index]
    assert charts["loss"]["multiline"]["tag"] == ["^metrics/loss(_[^/]+)?$"]

    # the HParams table: the few hyperparameters, the best epoch's values first, then the test's
    experiment = request(port, "/data/plugin/hparams/experiment", {"experimentName": ""})
    assert len(experiment["hparamInfos"]) <= 15  # type: ignore[index]
    columns = [(m["name"].get("group", ""), m["name"]["tag"]) for m in experiment["metricInfos"]]  # type: ignore[index]
    assert columns[:4] == [
        ("", "summary/best_loss"),
        ("", "summary/best_acc"),
        ("", "summary/best_f1"),
        ("", "summary/best_epoch"),
    ]
    [group] = [g for g in session_groups(port) if g["name"] == run_name]
    assert [s["name"] for s in group["sessions"]] == [run_name]  # the run folder itself: no sibling run
    assert [s["status"] for s in group["sessions"]] == ["STATUS_SUCCESS"]
    assert group["hparams"]["lr"] == pytest.approx(0.002)
    assert group["hparams"]["epochs"] == 2
    values = {(m["name"].get("group", ""), m["name"]["tag"]): m["value"] for m in group["metricValues"]}
    for name in ("loss", "acc", "f1"):
        assert values[("test", f"metrics/{name}")] == pytest.approx(metrics[f"test/{name}"])
    assert math.isfinite(values[("", "summary/best_loss")])
    assert values[("", "summary/best_epoch")] in (0, 1)

    # stopped by its pid, within a bounded time
    os.kill(process.pid, signal.SIGTERM)
    assert process.wait(timeout=STOP_TIMEOUT_S) is not None
