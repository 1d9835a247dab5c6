"""What the TensorBoard dashboard costs per training step: the same short fit with and without it.

    .venv/bin/python -m src.extras.dashboard.bench            # digits, 5 epochs, 3 rounds
    .venv/bin/python -m src.extras.dashboard.bench --epochs 10 --rounds 5

Each variant runs the shipped digits config through the real CLI, with the dashboard's callback sections
switched off, as shipped, or with its options on. The clock runs from the start to the end of training, so a
step's time includes its share of validation, figures, checkpoints and logging. Variants alternate
within each round, after one unmeasured warm-up fit; the median over rounds is reported, as a Markdown
table on stdout. Process CPU time is reported beside wall time: on a machine shared with other work it
is the steadier of the two.
"""

import argparse
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import lightning as L
import torch
import yaml
from lightning.pytorch.callbacks import Callback

from src.cli import main

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
#: the callback sections that make the dashboard (the task's own logging stays in every variant)
DASHBOARD = ("dashboard", "validation_figures")


class FitClock(Callback):
    """Wall and process CPU time of training, from the first step's start to the last epoch's end."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0
        self._start = (0.0, 0.0)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = (time.perf_counter(), time.process_time())

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.strategy.root_device.type != "cpu":
            torch.accelerator.synchronize(trainer.strategy.root_device)
        self.wall = time.perf_counter() - self._start[0]
        self.cpu = time.process_time() - self._start[1]


def variants() -> dict[str, dict]:
    """Name → the callback sections a config overrides (the other sections as in defaults.yaml)."""
    return {
        "without dashboard": dict.fromkeys(DASHBOARD),
        "dashboard (shipped defaults)": {},
        "dashboard + histograms every epoch + graph": {
            "dashboard": {"init_args": {"histogram_every_n_epochs": 1, "log_graph": True}}
        },
    }


def fit_once(folder: Path, name: str, sections: dict, epochs: int) -> tuple[FitClock, int, int]:
    """(training's clock, optimizer steps, bytes of TensorBoard event files) of one fit."""
    override = folder / f"{name.replace(' ', '_')}.yaml"
    override.write_text(yaml.safe_dump(sections))
    cli = main(
        [
            "--config", str(CONFIGS / "digits.yaml"),
            "--config", str(override),
            f"--trainer.max_epochs={epochs}",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.logger.init_args.save_dir={folder / 'logs'}",
        ],
        run=False,
    )  # fmt: skip
    clock = FitClock()
    # Trainer.callbacks is public and documented, but Lightning assigns it in its callback connector
    # without declaring it on the class, so mypy cannot see it
    cli.trainer.callbacks.append(clock)  # type: ignore[attr-defined]
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    log_dir = cli.trainer.log_dir
    assert log_dir is not None  # None only without a logger; digits.yaml and defaults.yaml set one
    events = sum(p.stat().st_size for p in Path(log_dir).glob("events.out.tfevents.*"))
    return clock, cli.trainer.global_step, events


def run(epochs: int, rounds: int) -> str:
    wall: dict[str, list[float]] = {name: [] for name in variants()}
    cpu: dict[str, list[float]] = {name: [] for name in variants()}
    steps: dict[str, int] = {}
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        fit_once(Path(tmp), "warm-up", variants()["without dashboard"], 1)  # imports, caches: not measured
        for _ in range(rounds):
            for name, callbacks in variants().items():
                clock, steps[name], sizes[name] = fit_once(Path(tmp), name, callbacks, epochs)
                wall[name].append(clock.wall / steps[name])
                cpu[name].append(clock.cpu / steps[name])
    base_wall, base_cpu = (
        statistics.median(wall["without dashboard"]),
        statistics.median(cpu["without dashboard"]),
    )
    lines = [
        f"digits, {epochs} epochs, median of {rounds} rounds, {torch.get_num_threads()} torch thread(s), "
        f"device {'cuda' if torch.cuda.is_available() else 'cpu'}",
        "",
        "| variant | steps | wall ms/step | wall ratio | CPU ms/step | CPU ratio | event files (KiB) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in variants():
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        cells = [name, steps[name], f"{1000 * w:.1f}", f"{w / base_wall:.3f}", f"{1000 * c:.1f}"]
        cells += [f"{c / base_cpu:.3f}", f"{sizes[name] / 1024:.0f}"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads; one keeps a shared machine's noise down"
    )
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    warnings.simplefilter("ignore")  # Lightning's advice on workers and log intervals is not measured here
    print(run(options.epochs, options.rounds))
