"""The shipped images and text experiments against the very same model and DataModule under a stock Trainer.

    .venv/bin/python -m benchmarks.experiments                         # both, quiet and busy, 3 rounds
    .venv/bin/python -m benchmarks.experiments --rounds 5 --write      # and save results/experiments.md
    .venv/bin/python -m benchmarks.experiments --only images --load quiet
    .venv/bin/python -m benchmarks.experiments --sections              # and each callback section off

What the extras cost on real work: ``shipped`` is the experiment as ``make train CONFIG=...`` builds it
(``src.cli.main(words, run=False)``, every shipped section on, the logger in a temporary folder);
``stock`` is a second build of the same words, whose model and DataModule (same class, settings, seed
and so initial weights) are fitted by ``L.Trainer`` with Lightning's ``TensorBoardLogger``, one
``ModelCheckpoint(monitor="val/loss")`` (a checkpoint every epoch that improves), the same epochs,
batches, clipping, ``deterministic`` and validation, no progress bar or model summary, and the one torch
thread the shipped
``resume.cpu_threads`` sets while a fit runs (so that the ratio is the extras' cost, not a thread count's;
with torch's default of one thread per core the stock fit is several times slower on a busy machine). The
clock covers the ``fit`` call. ``busy`` keeps the other core spinning (one Python process in a loop)
for the whole round; ``quiet`` does not. Each round runs both variants in turn, alternating which goes
first; the ratio is stock's time over shipped's within a round (1.0: the extras cost nothing), and the
table gives its median with the range over rounds. ``--sections`` adds, on a quiet machine, one shipped
fit per callback section with that section switched off (``--<section>=null``, as
:mod:`benchmarks.fit_overhead` does for digits), per round: what each extra costs on real work.
"""

import argparse
import contextlib
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

import src.cli
from benchmarks import report
from benchmarks.fit_overhead import fit_sections, words_without
from benchmarks.train_speed import isolated

ROOT = Path(__file__).resolve().parent.parent
#: each experiment's words beyond its config: a run long enough to see its epochs, short enough to repeat
EXPERIMENTS = {
    "images": ["--config", str(ROOT / "configs" / "images.yaml"), "--trainer.max_epochs=3"],
    "text": [
        "--config", str(ROOT / "configs" / "charlm.yaml"), "--trainer.max_epochs=2",
        "--trainer.limit_train_batches=60", "--trainer.limit_val_batches=20",
    ],
}  # fmt: skip
LOADS = ("quiet", "busy")
#: the torch threads of a shipped fit on the CPU (configs/defaults.yaml's resume.cpu_threads)
SHIPPED_THREADS = 1


def spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def load(kind: str) -> Iterator[None]:
    """``busy``: one process spinning on a core while the block runs."""
    if kind == "quiet":
        yield
        return
    spinner = multiprocessing.get_context("spawn").Process(target=spin, daemon=True)
    spinner.start()
    try:
        yield
    finally:
        spinner.terminate()
        spinner.join()


def build(words: list[str], folder: Path) -> src.cli.CLI:
    return src.cli.main([*words, f"--trainer.logger.init_args.save_dir={folder}"], run=False)


def fit_shipped(words: list[str], folder: Path) -> float:
    cli = build(words, folder)
    start = time.perf_counter()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return time.perf_counter() - start


def fit_stock(words: list[str], folder: Path) -> float:
    cli = build(words, folder)
    built = cli.trainer
    # the shipped Trainer's flags (reproducible runs are the template's default, and a flag the config states
    # is not an extra's cost): the CLI's Trainer set deterministic algorithms for the process
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(SHIPPED_THREADS)
    trainer = L.Trainer(
        accelerator="auto",
        devices=1,
        max_epochs=built.max_epochs,
        limit_train_batches=built.limit_train_batches,
        limit_val_batches=built.limit_val_batches,
        gradient_clip_val=built.gradient_clip_val,
        gradient_clip_algorithm=built.gradient_clip_algorithm,
        logger=TensorBoardLogger(save_dir=folder, name="stock"),
        callbacks=[ModelCheckpoint(monitor="val/loss")],
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=deterministic,
    )
    start = time.perf_counter()
    trainer.fit(cli.model, datamodule=cli.datamodule)
    return time.perf_counter() - start


FITS = {"shipped": fit_shipped, "stock": fit_stock}


@dataclass
class Cell:
    """One experiment under one load: seconds per variant, per round."""

    seconds: dict[str, list[float]]

    def ratios(self) -> list[float]:
        return [s / t for s, t in zip(self.seconds["stock"], self.seconds["shipped"], strict=True)]


def measure(
    experiments: list[str], loads: list[str], rounds: int, threads: int
) -> dict[tuple[str, str], Cell]:
    cells = {(e, kind): Cell({"shipped": [], "stock": []}) for e in experiments for kind in loads}
    for experiment in experiments:
        for kind in loads:
            for index in range(rounds + 1):  # the first round warms the imports and caches up, unmeasured
                order = ["shipped", "stock"] if index % 2 else ["stock", "shipped"]
                with load(kind):
                    for variant in order:
                        with tempfile.TemporaryDirectory() as folder, isolated(threads):
                            seconds = FITS[variant](EXPERIMENTS[experiment], Path(folder))
                        if index:
                            cells[experiment, kind].seconds[variant].append(seconds)
                            print(
                                f"{experiment} {kind} {index}/{rounds}: {variant} {seconds:.2f} s", flush=True
                            )
    return cells


def measure_sections(experiments: list[str], rounds: int, threads: int) -> dict[str, dict[str, list[float]]]:
    """Per experiment, the shipped fit's seconds and each section's switched off, interleaved per round."""
    sections = fit_sections()
    variants = {"shipped": [], **{f"no {s.name}": words_without([s], sections) for s in sections}}
    seconds: dict[str, dict[str, list[float]]] = {e: {v: [] for v in variants} for e in experiments}
    for experiment in experiments:
        for index in range(rounds):
            for variant, words in variants.items():
                with tempfile.TemporaryDirectory() as folder, isolated(threads):
                    took = fit_shipped([*EXPERIMENTS[experiment], *words], Path(folder))
                seconds[experiment][variant].append(took)
                print(f"{experiment} {index + 1}/{rounds}: {variant} {took:.2f} s", flush=True)
    return seconds


def sections_table(seconds: dict[str, dict[str, list[float]]]) -> str:
    experiments = list(seconds)
    lines = [
        "| variant | " + " | ".join(f"{e} (s) | {e}: saved (s)" for e in experiments) + " |",
        "|---|" + "---:|---:|" * len(experiments),
    ]
    for variant in seconds[experiments[0]]:
        cells = []
        for e in experiments:
            took, shipped = statistics.median(seconds[e][variant]), statistics.median(seconds[e]["shipped"])
            cells += [f"{took:.2f}", "" if variant == "shipped" else f"{shipped - took:+.2f}"]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(cells: dict[tuple[str, str], Cell]) -> str:
    lines = [
        "| experiment | load | shipped (s, median) | stock Trainer (s, median) | stock / shipped (range) |",
        "|---|---|---:|---:|---:|",
    ]
    for (experiment, kind), cell in cells.items():
        ratios = cell.ratios()
        lines.append(
            f"| {experiment} | {kind} | {statistics.median(cell.seconds['shipped']):.2f} | "
            f"{statistics.median(cell.seconds['stock']):.2f} | {statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f}) |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per cell (default 3)")
    parser.add_argument("--only", nargs="+", choices=list(EXPERIMENTS), default=list(EXPERIMENTS))
    parser.add_argument("--load", nargs="+", choices=LOADS, default=list(LOADS))
    parser.add_argument("--sections", action="store_true", help="also each callback section off, quiet")
    parser.add_argument("--write", action="store_true", help="also save results/experiments.md")
    args = parser.parse_args()
    # the main process's threads as torch leaves them; the shipped resume.cpu_threads sets its own in fit
    threads = torch.get_num_threads()
    cells = measure(args.only, args.load, args.rounds, threads)
    parts = [report.header("The shipped images and text experiments against a stock Trainer"), table(cells)]
    if args.sections:
        parts.append(sections_table(measure_sections(args.only, args.rounds, threads)))
    text = "\n\n".join(parts)
    print(f"\n{text}")
    if args.write:
        print(f"\nwritten to {report.write('experiments', text)}")


if __name__ == "__main__":
    main()
