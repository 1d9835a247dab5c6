"""How fast the exported graphs run beside the checkpoint.

    .venv/bin/python -m src.apps.export.bench               # 100k rows, median of 5

A short fit on ``configs/penguins.yaml`` makes the checkpoint; 100k raw rows are encoded once, then
the net runs on all of them: the checkpoint in PyTorch (eager), the ``torch.export`` program and the
ONNX graph in onnxruntime, each with 1 and 2 threads, median over ``--rounds`` (a Markdown table on
stdout).
"""

import argparse
import contextlib
import functools
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import onnxruntime
import torch

from benchmarks.penguins import raw_rows, train
from src.apps import export
from src.predict import Predictor


def median_seconds(fn, rounds: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def graphs(checkpoint: Path, folder: Path, rows: int, rounds: int) -> str:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        export.main(["--ckpt_path", str(checkpoint), "--output", str(folder / "model.onnx")])
        export.main(
            [
                "--ckpt_path",
                str(checkpoint),
                "--format",
                "torch-export",
                "--output",
                str(folder / "model.pt2"),
            ]
        )
    predictor = Predictor.from_checkpoint(checkpoint)
    x = predictor.encode(raw_rows(rows))  # (rows, F), encoded once: the graphs start from here
    eager = export.Exportable(
        predictor.model, classification=predictor.preprocessor.labels is not None
    ).eval()
    program = torch.export.load(folder / "model.pt2").module()
    lines = [
        f"The net alone on {rows:,} encoded rows (one call each), median of {rounds}",
        "",
        "| runtime | threads | seconds | rows/s |",
        "|---|---|---|---|",
    ]
    features = x.numpy()

    def torch_eager() -> None:
        with torch.inference_mode():
            eager(x)

    def torch_export() -> None:
        with torch.inference_mode():
            program(x)

    for threads in (1, 2):
        torch.set_num_threads(threads)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        session = onnxruntime.InferenceSession(
            str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"]
        )
        for name, fn in (
            ("PyTorch, the checkpoint (eager)", torch_eager),
            ("torch.export program", torch_export),
            (
                "onnxruntime, the ONNX export",
                functools.partial(session.run, ["logits"], {"features": features}),
            ),
        ):
            seconds = median_seconds(fn, rounds)
            lines.append(f"| {name} | {threads} | {seconds:.3f} | {rows / seconds:,.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sys.argv = sys.argv[:1]  # the CLI inside reads its words from main(), not from these
    folder = Path(tempfile.mkdtemp(prefix="export-bench-"))
    print(graphs(train(folder), folder, args.rows, args.rounds))
