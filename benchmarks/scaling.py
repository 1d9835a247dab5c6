"""How epoch time and peak memory grow with the rows: the template at 1e4, 1e5 and 1e6 training rows.

    .venv/bin/python -m benchmarks.scaling                        # 1e4, 1e5, 1e6 rows, 2 epochs each
    .venv/bin/python -m benchmarks.scaling --rows 10000 100000 --epochs 3 --write

Each size is trained in a process of its own, so that its peak resident memory (``VmHWM``) is its
own: the template with the shipped defaults, built by the CLI exactly as variant 6 of
``benchmarks/train_speed.py`` builds it (MLP 64 → 256 → 256 → 10, batches of 256, a Parquet file of
synthetic rows with 5 % more each for validation and test, so "rows" counts the training rows), for
``--epochs`` epochs with ``--threads`` torch threads. A further process only imports what such a run
uses; its peak is the fixed cost that every run pays before it holds any data.

- epoch: the last epoch's training, from ``on_train_epoch_start`` to ``on_train_epoch_end`` with the
  validation inside it left out (the first epoch also pays for first calls), in wall and process CPU
  time (on a shared machine the steadier: one run of a few seconds can come out 10 % off);
- validation: that epoch's validation, figures and checkpoints included;
- peak RSS: the process's peak, reading the file, preprocessing and training included;
- data: the file's rows as the float32 features and int64 labels they become, ``rows x (64 * 4 + 8)``.

Checked, as PASS/FAIL lines: the epoch time grows in proportion to the rows from 1e5 to 1e6 (the ratio
within 15 % of the rows' ratio), and the peak at 1e6 rows stays within twice the data's bytes plus the
importing process's peak.
"""

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from benchmarks import report
from benchmarks.child import run_python
from benchmarks.train_speed import Setup, cli_words, make_data

ROWS = (10_000, 100_000, 1_000_000)
COLUMNS = (
    "training rows",
    "steps/epoch",
    "epoch (s)",
    "epoch CPU (s)",
    "ms/step",
    "validation (s)",
    "data (MiB)",
    "peak RSS (MiB)",
    "peak - import (MiB)",
    "(peak - import) / data",
)
LINEAR_WITHIN = 0.15


def _now() -> np.ndarray:
    """(wall, process CPU) seconds."""
    return np.array([time.perf_counter(), time.process_time()])


class EpochClock(Callback):
    """Per epoch: wall and CPU seconds of training with its validation left out, and wall seconds of that
    validation."""

    def __init__(self) -> None:
        self.train: list[float] = []
        self.train_cpu: list[float] = []
        self.validation: list[float] = []
        self._epoch_start = self._validation_start = self._validating = np.zeros(2)

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch_start, self._validating = _now(), np.zeros(2)

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._validation_start = _now()

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validating = self._validating + _now() - self._validation_start

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        wall, cpu = _now() - self._epoch_start - self._validating
        self.train.append(float(wall))
        self.train_cpu.append(float(cpu))
        self.validation.append(float(self._validating[0]))


#: the child's own peak resident memory: ``VmHWM``, which belongs to the address space ``exec`` made.
#: Not ``ru_maxrss``: Linux hands a child started by fork (or vfork) and exec its parent's high-water
#: mark, so a child of this benchmark process, which holds the generated rows, would report at least
#: that process's peak (about 1.4 GB at 1e6 rows, whatever the child itself needed)
PEAK = """
import sys

def peak_rss():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource  # not Linux: ru_maxrss, which may hold the parent's (bytes on macOS, KiB elsewhere)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
"""

FIT_BODY = """
import json
import torch
torch.set_num_threads(int(sys.argv[2]))
from src.cli import main
cli = main(sys.argv[3:])
clock = next(c for c in cli.trainer.callbacks if type(c).__name__ == "EpochClock")
json.dump({"train": clock.train, "train_cpu": clock.train_cpu, "validation": clock.validation,
           "steps": cli.trainer.global_step, "train_rows": len(cli.datamodule.dataset("train")),
           "peak_rss": peak_rss()}, open(sys.argv[1], "w"))
"""

IMPORT_ONLY_BODY = """
import json
import matplotlib.pyplot, pyarrow.parquet, torch.utils.tensorboard
import src.callbacks, src.cli, src.data, src.models
json.dump({"peak_rss": peak_rss()}, open(sys.argv[1], "w"))
"""
FIT, IMPORT_ONLY = PEAK + FIT_BODY, PEAK + IMPORT_ONLY_BODY


def measure_size(rows: int, epochs: int, threads: int) -> dict[str, Any]:
    setup = Setup(rows=rows)
    with tempfile.TemporaryDirectory(prefix="scaling-") as tmp:
        data = make_data(setup, Path(tmp))
        words = [
            "fit",
            *cli_words(setup, data),
            f"--trainer.max_epochs={epochs}",  # later flags win over cli_words' one-epoch run
            "--trainer.limit_train_batches=1.0",
            "--trainer.callbacks+=benchmarks.scaling.EpochClock",
        ]
        found, _ = run_python(FIT, str(threads), *words, timeout=3600)
    return {**found, "rows": rows, "data_bytes": data.file_rows * (setup.features * 4 + 8)}


def table(sizes: list[dict[str, Any]], imported: int, epochs: int, threads: int) -> str:
    mib = 2**20
    lines = [
        f"The template with the shipped defaults (CLI), MLP 64 → 256 → 256 → 10, batch 256, {epochs} epochs, "
        f"{threads} torch thread(s); one process per size. Import-only process peak: "
        f"{imported / mib:,.0f} MiB.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---:|" * len(COLUMNS),
    ]
    for size in sizes:
        per_epoch = size["steps"] // epochs
        epoch = size["train"][-1]
        cells = [
            f"{size['train_rows']:,}",
            f"{per_epoch:,}",
            f"{epoch:.2f}",
            f"{size['train_cpu'][-1]:.2f}",
            f"{1000 * epoch / per_epoch:.2f}",
            f"{size['validation'][-1]:.2f}",
            f"{size['data_bytes'] / mib:,.0f}",
            f"{size['peak_rss'] / mib:,.0f}",
            f"{(size['peak_rss'] - imported) / mib:,.0f}",
            f"{(size['peak_rss'] - imported) / size['data_bytes']:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    by_rows = {size["rows"]: size for size in sizes}
    if 100_000 in by_rows and 1_000_000 in by_rows:
        small, large = by_rows[100_000], by_rows[1_000_000]
        grew = large["train"][-1] / small["train"][-1]
        grew_cpu = large["train_cpu"][-1] / small["train_cpu"][-1]
        expected = large["train_rows"] / small["train_rows"]
        linear = abs(grew / expected - 1) <= LINEAR_WITHIN
        lines.append(
            f"- {'PASS' if linear else 'FAIL'}: epoch time grows linearly from 1e5 to 1e6 rows, within "
            f"{LINEAR_WITHIN:.0%} (x{grew:.2f} for x{expected:.2f} the rows; by CPU time x{grew_cpu:.2f})"
        )
    if 1_000_000 in by_rows:
        large = by_rows[1_000_000]
        bound = 2 * large["data_bytes"] + imported
        lines.append(
            f"- {'PASS' if large['peak_rss'] <= bound else 'FAIL'}: peak RSS at 1e6 rows within 2 x the data "
            f"+ the import cost ({large['peak_rss'] / mib:,.0f} MiB against {bound / mib:,.0f} MiB)"
        )
    return "\n".join(lines)


def measure(rows: list[int], epochs: int, threads: int) -> tuple[list[dict[str, Any]], int]:
    imported = int(run_python(IMPORT_ONLY)[0]["peak_rss"])
    return [measure_size(n, epochs, threads) for n in rows], imported


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=list(ROWS), help="training rows per size")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per size; the last one is reported")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads; one keeps a shared machine's noise down"
    )
    parser.add_argument("--write", action="store_true", help="also save benchmarks/results/scaling.md")
    options = parser.parse_args()
    sizes, imported = measure(options.rows, options.epochs, options.threads)
    text = (
        report.header("Epoch time and peak memory by rows")
        + "\n\n"
        + table(sizes, imported, options.epochs, options.threads)
    )
    print(text)
    if options.write:
        print(f"\nwritten to {report.write('scaling', text)}")
