"""Wall time of the ``predict`` command on a table's checkpoint: without Lightning, and under the Trainer.

    .venv/bin/python -m benchmarks.predict_cli              # 16 and 100,000 rows, median of 5
    .venv/bin/python -m benchmarks.predict_cli --rounds 3 --rows 16

A short fit on ``configs/penguins.yaml`` makes the checkpoint; the rows to predict are drawn with
replacement from the same raw file (text columns, empty cells). Each round starts a new process, as a
user's command does, so interpreter start-up and imports count. ``python -m src.cli predict --ckpt_path …
--data.predict_path … --output …`` takes the path without Lightning (:mod:`src.fast_predict`); the same
words with ``--trainer.enable_progress_bar=false`` added take the full CLI and the Trainer, as every
``predict`` did before. Both files are compared byte for byte. A Markdown table goes to stdout.
"""

import argparse
import contextlib
import io
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from src.cli import main
from src.data.sources import penguins_path

ROOT = Path(__file__).resolve().parent.parent
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def checkpoint(folder: Path) -> Path:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main(
            [
                "fit", "--config", str(ROOT / "configs" / "penguins.yaml"), "--trainer.max_epochs=2",
                f"--trainer.logger.init_args.save_dir={folder / 'logs'}", *QUIET,
            ]
        )  # fmt: skip
    return next((folder / "logs").rglob("last.ckpt"))


def timed(words: list[str], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "src.cli", *words], cwd=ROOT, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(sizes: list[int], rounds: int) -> str:
    folder = Path(tempfile.mkdtemp(prefix="predict-cli-bench-"))
    ckpt = checkpoint(folder)
    raw = pd.read_csv(penguins_path())
    lines = [
        "| rows | without Lightning (s) | under the Trainer (s) | ratio | same file |",
        "|---:|---:|---:|---:|---|",
    ]
    for size in sizes:
        rows = folder / f"rows{size}.csv"
        raw.sample(size, replace=True, random_state=0).reset_index(drop=True).to_csv(rows, index=False)
        words = ["predict", "--ckpt_path", str(ckpt), "--data.predict_path", str(rows), "--overwrite", "true"]
        fast, full = folder / f"fast{size}.csv", folder / f"full{size}.csv"
        quick = timed([*words, "--output", str(fast)], rounds)
        slow = timed([*words, "--output", str(full), "--trainer.enable_progress_bar=false"], rounds)
        same = fast.read_bytes() == full.read_bytes()
        lines.append(
            f"| {size:,} | {quick:.2f} | {slow:.2f} | {slow / quick:.2f}x | {'yes' if same else 'NO'} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 100_000])
    parser.add_argument("--rounds", type=int, default=5)
    arguments = parser.parse_args()
    print(run(arguments.rows, arguments.rounds))
