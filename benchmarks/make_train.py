"""How long ``make train`` takes, split into import, fit and test, and the test accuracy it reaches.

    .venv/bin/python -m benchmarks.make_train              # a short warm-up run, then one measured run
    .venv/bin/python -m benchmarks.make_train --rounds 3 --threads 1 --write

Each run is a fresh process doing what ``make train`` does, ``python -m src.cli fit --config
configs/digits.yaml --test_after_fit true``, as ``src.cli.main([...])``, with two additions: the logger
writes into a temporary folder, and ``--trainer.callbacks+=benchmarks.make_train.FitEnd`` notes when fit
ends. The split, timed inside the process:

- import: ``from src.cli import main`` (torch, Lightning, scikit-learn, pandas, the template); what a run
  imports later (TensorBoard's writer, matplotlib for the figures) counts where it happens;
- fit: from calling ``main`` to the end of fit's ``teardown``: parsing the config, loading and scaling
  the data, building everything, the sanity check, training, validation, figures and checkpoints;
- test: from there to ``main``'s return: loading the best checkpoint, testing, printing the metrics.

The "process" column is the whole process as seen from outside, the interpreter's start and exit
included. A first, one-epoch run is not measured: it fills the OS's file cache and Python's bytecode
cache, as any earlier run on the machine would have. Torch uses its default thread count, as ``make
train`` does, unless ``--threads`` says otherwise. With ``--rounds`` above 1 the median is reported.
"""

import argparse
import statistics
import tempfile
import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from benchmarks import report
from benchmarks.child import run_python

#: the issue's targets: fit + test in under this many seconds, at least this test accuracy
SECONDS = 6.0
ACCURACY = 0.97


class FitEnd(Callback):
    """Notes the time at the end of fit's teardown."""

    at: float | None = None

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self.at = time.perf_counter()


CHILD = """
import time
start = time.perf_counter()
import json, sys
import torch
if int(sys.argv[2]):
    torch.set_num_threads(int(sys.argv[2]))
from src.cli import main
imported = time.perf_counter()
cli = main(sys.argv[3:])
returned = time.perf_counter()
fit_end = next(c.at for c in cli.trainer.callbacks if type(c).__name__ == "FitEnd")
metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items() if k.startswith("test/")}
json.dump({"import": imported - start, "fit": fit_end - imported, "test": returned - fit_end,
           "metrics": metrics, "epochs": cli.trainer.current_epoch, "threads": torch.get_num_threads()},
          open(sys.argv[1], "w"))
"""


def words(log_dir: str) -> list[str]:
    return [
        "fit",
        "--config=configs/digits.yaml",
        "--test_after_fit=true",
        "--trainer.callbacks+=benchmarks.make_train.FitEnd",
        f"--trainer.logger.init_args.save_dir={log_dir}",
    ]


def measure_once(log_dir: str, threads: int, *extra: str) -> dict[str, Any]:
    """One run; ``threads`` 0 leaves torch's default."""
    found, wall = run_python(CHILD, str(threads), *words(log_dir), *extra)
    return {**found, "process": wall}


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        f"`make train` (configs/digits.yaml, --test_after_fit true), {runs[0]['threads']} torch thread(s), "
        f"fresh processes after a one-epoch warm-up run; {len(runs)} measured, median last. Seconds.",
        "",
        "| run | import | fit | test | fit + test | process | epochs | test accuracy |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def row(name: str, values: dict[str, float]) -> str:
        cells = [name] + [f"{values[k]:.2f}" for k in ("import", "fit", "test", "fit+test", "process")]
        cells += [f"{values['epochs']:.0f}", f"{values['accuracy']:.4f}"]
        return "| " + " | ".join(cells) + " |"

    flat = [
        {
            **{k: run[k] for k in ("import", "fit", "test", "process", "epochs")},
            "fit+test": run["fit"] + run["test"],
            "accuracy": run["metrics"].get("test/acc", float("nan")),
        }
        for run in runs
    ]
    for i, values in enumerate(flat, 1):
        lines.append(row(str(i), values))
    median = {key: statistics.median(values[key] for values in flat) for key in flat[0]}
    lines.append(row("**median**", median))
    lines.append("")
    seconds, accuracy = median["fit+test"], median["accuracy"]
    lines.append(
        f"- {'PASS' if seconds < SECONDS else 'FAIL'}: fit + test under {SECONDS:.0f} s ({seconds:.2f} s)"
    )
    lines.append(
        f"- {'PASS' if accuracy >= ACCURACY else 'FAIL'}: test accuracy at least {ACCURACY} ({accuracy:.4f})"
    )
    return "\n".join(lines)


def measure(rounds: int, log_dir: str, threads: int = 0) -> list[dict[str, Any]]:
    measure_once(log_dir, threads, "--trainer.max_epochs=1")  # warm-up
    return [measure_once(log_dir, threads) for _ in range(rounds)]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="measured runs (default 1)")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads; 0 (default) leaves torch's own"
    )
    parser.add_argument("--write", action="store_true", help="also save benchmarks/results/make_train.md")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="make-train-") as tmp:
        runs = measure(options.rounds, tmp, options.threads)
    text = report.header("`make train`: import, fit, test") + "\n\n" + table(runs)
    print(text)
    if options.write:
        print(f"\nwritten to {report.write('make_train', text)}")
