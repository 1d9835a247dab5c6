"""How fast the served model answers.

    .venv/bin/python -m src.apps.serve.bench                # 4 clients, 10 s per measurement
    .venv/bin/python -m src.apps.serve.bench --seconds 30 --clients 8

A short fit on ``configs/penguins.yaml`` makes the checkpoint. Then, as a Markdown table on stdout:
``python -m src.apps.serve`` on a free port of 127.0.0.1, with LitServe's batching
(``--max_batch_size 16``, the default), without it (``--max_batch_size 1``), and with two inference
workers (``--workers 2``, each with its own HTTP process). ``--clients`` threads, each with its own
keep-alive connection, post requests of 1 or 64 raw penguin rows (text, empty cells) for ``--seconds``
after a warm-up: requests/s, rows/s, median and 99th-percentile latency. Clients and server share the
machine's cores.
"""

import argparse
import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

from benchmarks.penguins import raw_rows, train

ROOT = Path(__file__).resolve().parents[3]  # the repository: src/apps/<app>/bench.py
#: the server settings measured side by side (src.apps.serve's defaults: max_batch_size 16, 1 worker)
SERVERS = {
    "defaults: batching (max_batch_size 16), 1 worker": [],
    "no batching (max_batch_size 1), 1 worker": ["--max_batch_size=1"],
    "batching, 2 workers": ["--workers=2"],
}


class Served:
    """``python -m src.apps.serve`` in its own process group, ended by SIGTERM (and SIGKILL if it lingers)."""

    def __init__(self, checkpoint: Path, options: list[str]) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        command = [
            sys.executable,
            "-m",
            "src.apps.serve",
            "--ckpt_path",
            str(checkpoint),
            "--port",
            str(self.port),
        ]
        command += options
        self.process = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )

    def __enter__(self) -> "Served":
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("the server exited before it was ready")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as health,
            ):
                if health.status == 200:
                    return self
            time.sleep(0.25)
        raise RuntimeError("the server was not ready within 180 s")

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)


def load(port: int, body: bytes, clients: int, seconds: float) -> dict[str, float]:
    """``clients`` threads posting ``body`` back to back for ``seconds``; latencies in milliseconds."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    start = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def client(i: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        headers = {"Content-Type": "application/json"}
        start.wait()
        while (now := time.perf_counter()) < stop_at[0]:
            connection.request("POST", "/predict", body, headers)
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"the server answered {response.status}")
            latencies[i].append((time.perf_counter() - now) * 1000)
        connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    began = time.perf_counter()
    stop_at[0] = began + seconds
    start.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    every = np.concatenate([np.array(lat) for lat in latencies])
    return {
        "requests/s": len(every) / elapsed,
        "p50": float(np.percentile(every, 50)),
        "p99": float(np.percentile(every, 99)),
    }


def serving(checkpoint: Path, clients: int, seconds: float) -> str:
    lines = [
        f"Serving, {clients} concurrent clients, {seconds:g} s per line, {os.cpu_count()} cores",
        "",
        "| server | rows per request | requests/s | rows/s | p50 latency (ms) | p99 latency (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for name, options in SERVERS.items():
        with Served(checkpoint, options) as server:
            for rows in (1, 64):
                body = json.dumps({"rows": json.loads(raw_rows(rows).to_json(orient="records"))}).encode()
                load(server.port, body, clients, min(2.0, seconds))  # warm-up: connections, first batches
                result = load(server.port, body, clients, seconds)
                lines.append(
                    f"| {name} | {rows} | {result['requests/s']:,.0f} | {result['requests/s'] * rows:,.0f} | "
                    f"{result['p50']:.1f} | {result['p99']:.1f} |"
                )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    checkpoint = train(folder)
    print(serving(checkpoint, args.clients, args.seconds))
