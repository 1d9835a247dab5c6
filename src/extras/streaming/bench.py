"""Streaming Parquet rows: peak memory and epoch time by row count, and steps/s beside the in-memory path.

    .venv/bin/python -m src.extras.streaming.bench                              # 1e6, 1e7, 3e7 rows
    .venv/bin/python -m src.extras.streaming.bench --rows 1000000 10000000 --write

Synthetic rows of 64 float32 columns and a class of 10 are written once to a temporary folder as
Parquet files of 1e6 rows (row groups of 65536); each size reads the first of them (a folder of links).
Each size is trained for one epoch in a process of its own (so its peak resident memory, ``VmHWM``, is
its own) with the CLI as a user runs it: ``src.extras.streaming.StreamingTableDataModule``, MLP
64 → 256 → 256 → 10, batches of 256, every shipped callback off (configs/trainer/bare.yaml), no
validation. At the smallest size the in-memory ``TabularDataModule`` trains on the same file too.

- build: the CLI's instantiation, the one pass that fits the preprocessing included (in-memory: the
  reading, split and encoding);
- epoch: from ``on_train_epoch_start`` to ``on_train_epoch_end``;
- peak RSS: the process's peak, imports, fitting and training included.

Checked, as PASS/FAIL lines: peak RSS within 15 % from the smallest to the largest size and under 1 GiB;
epoch time in proportion to the training rows (the ratio within 15 % of the rows' ratio); steps/s of
the stream within 10 % of the in-memory path's.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from benchmarks.child import ROOT, run_python

FILE_ROWS = 1_000_000
GROUP_ROWS = 65_536
FEATURES = 64
RESULT = ROOT / "benchmarks" / "results" / "streaming.md"
CHILD = (
    "import json, sys\n"
    "from src.extras.streaming.bench import measure\n"
    "open(sys.argv[1], 'w').write(json.dumps(measure(sys.argv[2], sys.argv[3])))\n"
)


def write_rows(folder: Path, files: int) -> None:
    """``files`` Parquet files of ``FILE_ROWS`` rows: ``f0..f63`` float32 and ``label`` (10 classes, from
    a linear rule, so the net has something to learn)."""
    folder.mkdir(parents=True, exist_ok=True)
    weights = np.random.default_rng(0).normal(size=(FEATURES, 10)).astype(np.float32)
    for i in range(files):
        path = folder / f"part-{i:04d}.parquet"
        if path.exists():
            continue
        x = np.random.default_rng(i + 1).normal(size=(FILE_ROWS, FEATURES)).astype(np.float32)
        columns = {f"f{j}": x[:, j] for j in range(FEATURES)}
        columns["label"] = (x @ weights).argmax(axis=1).astype(np.int64)
        pq.write_table(pa.table(columns), path, row_group_size=GROUP_ROWS)


class EpochClock(Callback):
    """The training epoch's wall time and steps."""

    def __init__(self) -> None:
        self.seconds, self.steps = 0.0, 0

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start, self.first = time.perf_counter(), trainer.global_step

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.seconds, self.steps = time.perf_counter() - self.start, trainer.global_step - self.first


def peak_rss_mib() -> float:
    """This process's peak resident memory (``VmHWM``), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(kind: str, path: str) -> dict[str, Any]:
    """One epoch of ``kind`` (``streaming`` or ``in-memory``) on ``path``; run in a fresh process."""
    from src.cli import main

    data = (
        ["--data=src.extras.streaming.StreamingTableDataModule", f"--data.path={path}"]
        if kind == "streaming"
        else ["--data=src.extras.tables.TabularDataModule", f"--data.path={path}", "--data.source=parquet"]
    )
    torch.set_num_threads(1)  # as the shipped resume section's cpu_threads sets it
    start = time.perf_counter()
    run = main(
        [
            "--config", str(ROOT / "configs" / "trainer" / "bare.yaml"), *data,
            "--data.target_column=label", "--data.task=classification", "--data.batch_size=256",
            "--model=src.models.Classifier", "--model.net=src.nets.MLP", "--model.net.hidden_sizes=[256,256]",
            "--trainer.max_epochs=1", "--trainer.limit_val_batches=0", "--trainer.logger=false",
            "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
        ],
        run=False,
    )  # fmt: skip
    built = time.perf_counter() - start
    clock = EpochClock()
    run.trainer.callbacks.append(clock)  # type: ignore[attr-defined]
    run.trainer.fit(run.model, datamodule=run.datamodule)
    return {
        "build_s": built,
        "epoch_s": clock.seconds,
        "steps": clock.steps,
        "steps_per_s": clock.steps / clock.seconds,
        "peak_rss_mib": peak_rss_mib(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000, 30_000_000])
    parser.add_argument("--write", action="store_true", help=f"write the table to {RESULT.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    rows = sorted(args.rows)
    with tempfile.TemporaryDirectory(prefix="bench-streaming-") as tmp:
        files = Path(tmp) / "files"
        start = time.perf_counter()
        write_rows(files, rows[-1] // FILE_ROWS)
        print(f"wrote {rows[-1]:,} rows in {time.perf_counter() - start:.0f} s", file=sys.stderr)
        results: list[tuple[str, int, dict[str, Any]]] = []
        for count in rows:
            folder = Path(tmp) / f"rows-{count}"
            folder.mkdir()
            for part in sorted(files.iterdir())[: count // FILE_ROWS]:
                (folder / part.name).symlink_to(part)
            measured, _ = run_python(CHILD, "streaming", str(folder), timeout=3600)
            results.append(("streaming", count, measured))
            print("streaming", count, json.dumps(measured), file=sys.stderr)
        memory, _ = run_python(CHILD, "in-memory", str(files / "part-0000.parquet"), timeout=3600)
        results.append(("in-memory", rows[0], memory))
        print("in-memory", rows[0], json.dumps(memory), file=sys.stderr)
    text = report(results)
    print(text)
    if args.write:
        RESULT.write_text(text)


def report(results: list[tuple[str, int, dict[str, Any]]]) -> str:
    """A Markdown table of the sizes, then the PASS/FAIL lines of the goals."""
    lines = [
        "| path | rows | build (s) | epoch (s) | steps | steps/s | peak RSS (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, count, m in results:
        lines.append(
            f"| {kind} | {count:,} | {m['build_s']:.1f} | {m['epoch_s']:.1f} | {m['steps']} | "
            f"{m['steps_per_s']:.0f} | {m['peak_rss_mib']:.0f} |"
        )
    streamed = [(count, m) for kind, count, m in results if kind == "streaming"]
    (small, first), (large, last) = streamed[0], streamed[-1]
    memory = next(m for kind, _, m in results if kind == "in-memory")
    growth = last["peak_rss_mib"] / first["peak_rss_mib"] - 1
    expected, ratio = last["steps"] / first["steps"], last["epoch_s"] / first["epoch_s"]
    speed = first["steps_per_s"] / memory["steps_per_s"] - 1
    checks = [
        (abs(growth) <= 0.15, f"peak RSS from {small:,} to {large:,} rows: {growth:+.0%} (goal within 15 %)"),
        (
            last["peak_rss_mib"] < 1024,
            f"peak RSS at {large:,} rows: {last['peak_rss_mib']:.0f} MiB (goal < 1 GiB)",
        ),
        (
            abs(ratio / expected - 1) <= 0.15,
            f"epoch time x{ratio:.1f} for x{expected:.1f} the steps (goal within 15 %)",
        ),
        (
            abs(speed) <= 0.10 or speed > 0,
            f"steps/s at {small:,} rows: {speed:+.0%} against in memory (goal within 10 %)",
        ),
    ]
    lines += ["", *(f"{'PASS' if ok else 'FAIL'}: {text}" for ok, text in checks)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
