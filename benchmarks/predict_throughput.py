"""How many raw rows per second a checkpoint predicts, from a messy table to labelled probabilities.

    .venv/bin/python -m benchmarks.predict_throughput              # 100k rows, 3 rounds
    .venv/bin/python -m benchmarks.predict_throughput --rows 1000000

A short fit on ``configs/penguins.yaml`` makes the checkpoint. The rows to predict are drawn with
replacement from the same raw file (text columns, empty cells), without the target. Measured side by
side, median over rounds, as a Markdown table on stdout:

- ``encode``: the fitted preprocessing alone (raw DataFrame → float32 matrix);
- ``Predictor.predict``: encode + the net + the labelled output table (the Python API, the server's path);
- ``src.cli predict``: the whole command on a CSV file, read and written, Trainer included.
"""

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from src.cli import main
from src.extras.tables.sources import penguins_path
from src.predict import Predictor

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "penguins.yaml"
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def quietly(words: list[str]) -> None:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main(words)


def timed(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(rows: int, rounds: int) -> str:
    torch.set_num_threads(1)
    folder = Path(tempfile.mkdtemp(prefix="predict-bench-"))
    logs = folder / "logs"
    quietly(
        [
            "fit",
            "--config",
            str(CONFIG),
            "--trainer.max_epochs=2",
            f"--trainer.logger.init_args.save_dir={logs}",
            *QUIET,
        ]
    )
    checkpoint = next(logs.rglob("last.ckpt"))
    frame = pd.read_csv(penguins_path()).drop(columns="Sex").sample(rows, replace=True, random_state=0)
    frame = frame.reset_index(drop=True)
    new = folder / "new.csv"
    frame.to_csv(new, index=False)

    predictor = Predictor.from_checkpoint(checkpoint)
    results = {
        "encode": timed(lambda: predictor.read(frame), rounds),
        "Predictor.predict": timed(lambda: predictor.predict(frame), rounds),
        "src.cli predict (CSV in, CSV out)": timed(
            lambda: quietly(
                [
                    "predict",
                    "--ckpt_path",
                    str(checkpoint),
                    f"--data.predict_path={new}",
                    f"--output={folder / 'out.csv'}",
                    "--data.batch_size=8192",
                    *QUIET,
                ]
            ),
            rounds,
        ),
    }
    lines = [f"{rows} rows, 1 thread, median of {rounds}", "", "| path | seconds | rows/s |", "|---|---|---|"]
    lines += [f"| {name} | {seconds:.3f} | {rows / seconds:,.0f} |" for name, seconds in results.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sys.argv = sys.argv[:1]  # the CLI inside reads its words from main(), not from these
    print(run(args.rows, args.rounds))
