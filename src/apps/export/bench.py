"""How fast the exported graphs run beside the checkpoint.

    .venv/bin/python -m src.apps.export.bench               # 100k rows, median of 5

A short fit on ``configs/penguins.yaml`` makes the checkpoint; on 100k raw rows, each with 1 and 2
threads, median over ``--rounds`` (a Markdown table on stdout): the checkpoint's net in PyTorch (eager)
and the ``torch.export`` program on the rows encoded once, PyTorch encoding and predicting
(``Predictor``), and the ONNX graph in onnxruntime, which takes the raw columns and encodes them itself.
"""

import argparse
import contextlib
import functools
import io
import tempfile
from pathlib import Path

import onnxruntime
import torch

from benchmarks.penguins import raw_rows, train
from benchmarks.predict_throughput import timed
from src.apps import export
from src.extras.tables.predict import table_preprocessor
from src.predict import Predictor


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
    frame = raw_rows(rows)
    x = predictor.read(frame)  # (rows, F): what the checkpoint's net and the torch.export program take
    preprocessor = table_preprocessor(predictor.reading)
    columns = export.graph_inputs(preprocessor, frame)  # what the ONNX graph takes, once
    eager = export.Exportable(predictor.model, classification=preprocessor.labels is not None).eval()
    program = torch.export.load(folder / "model.pt2").module()
    lines = [
        f"{rows:,} raw rows (one call each), median of {rounds}: the net alone on the encoded rows, and"
        " the ONNX graph, which takes the raw columns and encodes them itself",
        "",
        "| runtime | threads | seconds | rows/s |",
        "|---|---|---|---|",
    ]

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
            ("PyTorch, the checkpoint's net (eager), encoded rows", torch_eager),
            ("torch.export program, encoded rows", torch_export),
            (
                "PyTorch, encoding and net (Predictor.outputs)",
                lambda: predictor.outputs(predictor.read(frame)),
            ),
            ("onnxruntime, the ONNX graph, raw columns", functools.partial(session.run, ["logits"], columns)),
        ):
            fn()  # warm-up
            seconds = timed(fn, rounds)
            lines.append(f"| {name} | {threads} | {seconds:.3f} | {rows / seconds:,.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="export-bench-"))
    print(graphs(train(folder), folder, args.rows, args.rounds))
