"""Images per second through ImageDataModule's training loader, with 0, 1 and 2 worker processes.

    .venv/bin/python -m src.extras.images.bench                      # the bundled digits, 3 rounds
    .venv/bin/python -m src.extras.images.bench --folder my/images --image-size 64
    .venv/bin/python -m src.extras.images.bench --rounds 5 --write   # and save it in benchmarks/results/

Two ways to load, each with 0, 1 and 2 workers (``--workers``): images decoded once and held in memory as
uint8 (``in_memory: true``, the default; a batch is one index of a tensor) and images decoded from their
files for every batch (``in_memory: false``; Pillow in the loader's processes). The clock covers
``--epochs`` whole epochs of the training loader, as a fit draws them (shuffled, batches of
``--batch-size``), after one unclocked epoch that starts the (persistent) workers; decoding into memory,
the split and the statistics happen in setup, before it. What happens to a batch on the device (the
augmentation and normalization of ``on_after_batch_transfer``) is not part of it. Each round runs every
variant once, in turn, with ``--threads`` torch threads in the main process (1, as the shipped
``resume.cpu_threads`` sets while a fit runs; workers always have 1). The table gives the median
images per second over rounds and each variant's ratio to the same way of loading with 0 workers (the
median of the per-round ratios).

On the bundled digits, workers do not pay off: in memory a batch is one index of a tensor, which
worker processes can only slow down (each batch is pickled across to this process), and the tiny PNG
files decode about as fast as a worker's batch crosses over. Workers pay off with ``in_memory: false``
where decoding costs more than the crossing: larger images (try ``--image-size 128``).
"""

import argparse
import statistics
import time
from dataclasses import dataclass

import torch

from benchmarks import report
from src.extras.images import ImageDataModule


@dataclass(frozen=True)
class Setup:
    """What every variant loads."""

    folder: str | None = None  #: None: the bundled digits
    image_size: int | None = None
    batch_size: int = 64
    epochs: int = 5
    workers: tuple[int, ...] = (0, 1, 2)
    threads: int = 1  #: torch threads of the main process while measuring


@dataclass(frozen=True)
class Run:
    images: int
    seconds: float

    @property
    def speed(self) -> float:
        return self.images / self.seconds


def variants(setup: Setup) -> list[tuple[bool, int]]:
    """(in_memory, workers) pairs, in the order they run and are tabled."""
    return [(in_memory, workers) for in_memory in (True, False) for workers in setup.workers]


def measure_one(setup: Setup, in_memory: bool, workers: int) -> Run:
    datamodule = ImageDataModule(
        folder=setup.folder,
        image_size=setup.image_size,
        batch_size=setup.batch_size,
        in_memory=in_memory,
        num_workers=workers,
    )
    datamodule.setup("fit")
    loader = datamodule.train_dataloader()
    for _ in loader:  # unclocked: starts the workers, which persist across epochs
        pass
    images = 0
    start = time.perf_counter()
    for _ in range(setup.epochs):
        for _, y in loader:
            images += len(y)
    seconds = time.perf_counter() - start
    del loader  # its persistent workers end with it
    return Run(images, seconds)


@dataclass
class Results:
    setup: Setup
    runs: dict[tuple[bool, int], list[Run]]  # per variant, one per round

    def speed(self, key: tuple[bool, int]) -> float:
        return statistics.median(run.speed for run in self.runs[key])

    def ratio(self, key: tuple[bool, int]) -> float:
        """Per round, the speed over that of the same way of loading with 0 workers; the median."""
        reference = self.runs[(key[0], 0)] if (key[0], 0) in self.runs else self.runs[key]
        return statistics.median(
            run.speed / ref.speed for run, ref in zip(self.runs[key], reference, strict=True)
        )


def measure(setup: Setup, rounds: int) -> Results:
    """Every variant once per round, in turn (neighbours in time share the machine's load)."""
    runs: dict[tuple[bool, int], list[Run]] = {key: [] for key in variants(setup)}
    threads = torch.get_num_threads()
    torch.set_num_threads(setup.threads)
    try:
        for _ in range(rounds):
            for in_memory, workers in variants(setup):
                runs[(in_memory, workers)].append(measure_one(setup, in_memory, workers))
    finally:
        torch.set_num_threads(threads)
    return Results(setup, runs)


COLUMNS = ("images from", "workers", "images per epoch", "images/s", "x 0 workers")


def table(results: Results) -> str:
    setup = results.setup
    rounds = len(next(iter(results.runs.values())))
    source = setup.folder or "the bundled digits (32x32 grayscale PNG files)"
    lines = [
        f"ImageDataModule's training loader on {source}"
        + (f" resized to {setup.image_size}x{setup.image_size}" if setup.image_size else "")
        + f", batches of {setup.batch_size}, {setup.epochs} epochs per variant after one unclocked, median "
        f"of {rounds} round(s), {setup.threads} torch thread(s) in the main process, CPU.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|---|" + "---:|" * (len(COLUMNS) - 1),
    ]
    for key, runs in results.runs.items():
        in_memory, workers = key
        cells = [
            "memory (decoded once)" if in_memory else "files (decoded per batch)",
            str(workers),
            str(runs[0].images // setup.epochs),
            f"{results.speed(key):,.0f}",
            f"{results.ratio(key):.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--folder", default=None, help="a folder of class folders (default: bundled digits)")
    parser.add_argument("--image-size", type=int, default=None, help="resize to this size (default: none)")
    parser.add_argument("--batch-size", type=int, default=Setup.batch_size)
    parser.add_argument("--epochs", type=int, default=Setup.epochs, help="clocked epochs per variant")
    parser.add_argument("--workers", type=int, nargs="+", default=list(Setup.workers))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=Setup.threads, help="torch threads (default 1)")
    parser.add_argument(
        "--write", action="store_true", help="also save the table as benchmarks/results/image_loader.md"
    )
    return parser.parse_args()


if __name__ == "__main__":
    options = parse_arguments()
    setup = Setup(
        folder=options.folder,
        image_size=options.image_size,
        batch_size=options.batch_size,
        epochs=options.epochs,
        workers=tuple(options.workers),
        threads=options.threads,
    )
    text = report.header("Image loader") + "\n\n" + table(measure(setup, options.rounds))
    print(text)
    if options.write:
        print(f"\nwritten to {report.write('image_loader', text)}")
