"""Characters per second of a character language model: training and generation side by side.

    .venv/bin/python -m src.apps.generate.bench                    # 100 training steps, 3 rounds
    .venv/bin/python -m src.apps.generate.bench --rounds 5 --write # and save results/charlm_speed.md

The nets are those ``configs/charlm.yaml`` trains (its ``CharTransformer`` and its window length, read
from the file, so that the numbers follow the config) and a ``CharGRU`` with its defaults, on the
config's data (:class:`src.extras.text.TextDataModule`: the bundled text, its batch size and stride), on
the CPU with ``--threads`` torch threads. Per net and round:

- **training**: :class:`src.extras.text.model.LanguageModel` (loss, accuracy and perplexity updated every
  step) fitted for ``--steps`` optimizer steps by a quiet Trainer (no logger, checkpoints, progress bar
  or model summary; AdamW at the config's learning rate, no scheduler; the shipped gradient clipping).
  The clock runs from ``on_train_start`` to the last step's ``on_train_batch_end``; characters per
  second are the target characters of the batches it covered, ``steps * batch_size * block_size``.
- **generation**: :func:`src.extras.text.model.generate` of ``--new_tokens`` characters after a prompt of
  one window, one sequence, ``sample`` with temperature 0.8 and top-k 40, the context cropped to the
  window: one forward pass of up to ``block_size`` characters per generated character, as
  ``python -m src.apps.generate`` does it.

Each number is the median over ``--rounds`` rounds, after one unmeasured warm-up round.

Then **generation from the command line beside the function**, on a checkpoint of the config's net
trained for ``--steps`` steps through the CLI: ``python -m src.apps.generate`` as a user runs it (its
own process, its text printed as it comes, to /dev/null) with its default thread setting and with
torch's own (``--threads null``: one per core), and :func:`src.extras.text.model.generate` on the model
loaded from the same checkpoint under the same two settings. A command's characters per second are
the extra characters of a long run over a short one divided by its extra seconds, so that starting
Python and loading the checkpoint do not count; both runs sample as above, from the same prompt.
"""

import argparse
import contextlib
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml
from lightning.pytorch.callbacks import Callback
from torch import nn
from typing_extensions import override

from benchmarks import report
from src.extras.text import TextDataModule
from src.extras.text.model import LanguageModel, generate
from src.extras.text.nets import CharGRU, CharTransformer

ROOT = Path(__file__).resolve().parents[3]  # the repository: src/apps/<app>/bench.py
CONFIG = ROOT / "configs" / "charlm.yaml"


@dataclass(frozen=True)
class Setup:
    """What is measured: the config's net, window and batch, and the run's length."""

    net: dict[str, Any] = field(default_factory=dict)  #: CharTransformer's init_args
    block_size: int = 64
    stride: int | None = None
    batch_size: int = 64
    lr: float = 1e-3
    steps: int = 100
    new_tokens: int = 200
    text_path: str | None = None  #: a text file instead of the bundled text (tests)


def from_config(steps: int, new_tokens: int, path: Path = CONFIG) -> Setup:
    """The setup ``configs/charlm.yaml`` trains."""
    config = yaml.safe_load(path.read_text())
    data = config["data"]["init_args"]
    model = config["model"]["init_args"]
    return Setup(
        net=model["net"]["init_args"],
        block_size=data["block_size"],
        stride=data.get("stride"),
        batch_size=data["batch_size"],
        lr=model["optimizer"]["init_args"]["lr"],
        steps=steps,
        new_tokens=new_tokens,
    )


def nets(setup: Setup) -> dict[str, Callable[[int, int], nn.Module]]:
    """The nets side by side: name → the factory the task calls with ``(vocabulary, vocabulary)``."""
    return {
        "CharTransformer (charlm.yaml)": partial(CharTransformer, **setup.net),
        "CharGRU (its defaults)": CharGRU,
    }


class Clock(Callback):
    """Wall seconds from the start of training to the end of step ``steps``."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.start = self.wall = 0.0

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start = time.perf_counter()

    @override
    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.steps:
            self.wall = time.perf_counter() - self.start


@dataclass
class Run:
    """One net's one round."""

    train_chars: int  #: target characters the timed steps trained on
    train_wall: float
    generated: int  #: characters generated
    generate_wall: float
    loss: float  #: the last training step's loss, to check that training happened


def data(setup: Setup) -> TextDataModule:
    return TextDataModule(
        path=setup.text_path, block_size=setup.block_size, stride=setup.stride, batch_size=setup.batch_size
    )


def run(setup: Setup, factory: Callable[[int, int], nn.Module]) -> Run:
    """Train ``setup.steps`` steps, then generate ``setup.new_tokens`` characters."""
    datamodule = data(setup)
    torch.manual_seed(0)
    model = LanguageModel(
        in_features=datamodule.in_features,
        out_features=datamodule.out_features,
        net=factory,
        optimizer=partial(torch.optim.AdamW, lr=setup.lr),
    )
    clock = Clock(setup.steps)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=setup.steps,
        limit_val_batches=0,
        gradient_clip_val=1.0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[clock],
    )
    trainer.fit(model, datamodule=datamodule)
    prompt = datamodule.encode(datamodule.stretch("val")[: setup.block_size])
    start = time.perf_counter()
    ids = generate(model, prompt, setup.new_tokens, "sample", 0.8, 40, None, 0, setup.block_size)
    generate_wall = time.perf_counter() - start
    return Run(
        train_chars=trainer.global_step * setup.batch_size * setup.block_size,
        train_wall=clock.wall,
        generated=len(ids) - len(prompt),
        generate_wall=generate_wall,
        loss=float(trainer.callback_metrics["train/loss"]),
    )


@contextlib.contextmanager
def quiet(threads: int) -> Iterator[None]:
    """A run with ``threads`` torch threads and its output discarded."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [each.level for each in loggers]
    for each in loggers:
        each.setLevel(logging.WARNING)
    with (
        open(os.devnull, "w") as sink,
        contextlib.redirect_stdout(sink),
        contextlib.redirect_stderr(sink),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")  # Lightning's advice (more loader workers) is not what is measured
        try:
            yield
        finally:
            torch.set_num_threads(before)
            for each, level in zip(loggers, levels, strict=True):
                each.setLevel(level)


@dataclass
class Results:
    setup: Setup
    threads: int
    runs: dict[str, list[Run]]  #: per net, one per round

    def train_speed(self, name: str) -> float:
        """Median training characters per second."""
        return statistics.median(r.train_chars / r.train_wall for r in self.runs[name])

    def generate_speed(self, name: str) -> float:
        """Median generated characters per second."""
        return statistics.median(r.generated / r.generate_wall for r in self.runs[name])


def measure(setup: Setup, rounds: int, threads: int = 1, warm_up: bool = True) -> Results:
    """Every net once per round, alternating, after an unmeasured warm-up round."""
    factories = nets(setup)
    runs: dict[str, list[Run]] = {name: [] for name in factories}
    with quiet(threads):
        if warm_up:
            short = replace(setup, steps=5, new_tokens=5)
            for factory in factories.values():
                run(short, factory)
        for _ in range(rounds):
            for name, factory in factories.items():
                runs[name].append(run(setup, factory))
    return Results(setup, threads, runs)


COLUMNS = ("net", "parameters", "train chars/s", "train ms/step", "generate chars/s", "generate ms/char")


def table(results: Results) -> str:
    setup = results.setup
    lines = [
        f"Windows of {setup.block_size} characters, batch {setup.batch_size}, {setup.steps} training steps "
        f"(AdamW, lr {setup.lr}); {setup.new_tokens} characters generated one at a time (sample, "
        f"temperature 0.8, top-k 40, context cropped to {setup.block_size}); median of "
        f"{len(next(iter(results.runs.values())))} round(s), {results.threads} torch thread(s), CPU.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|---|" + "---:|" * (len(COLUMNS) - 1),
    ]
    datamodule = data(setup)
    for name, factory in nets(setup).items():
        size = sum(p.numel() for p in factory(datamodule.in_features, datamodule.out_features).parameters())
        train, gen = results.train_speed(name), results.generate_speed(name)
        chars_per_step = setup.batch_size * setup.block_size
        cells = [name, f"{size:,}", f"{train:,.0f}", f"{1000 * chars_per_step / train:.1f}"]
        lines.append("| " + " | ".join([*cells, f"{gen:,.0f}", f"{1000 / gen:.2f}"]) + " |")
    return "\n".join(lines)


@dataclass
class Generation:
    """Characters per second of one way of generating, per round."""

    path: str  #: "python -m src.apps.generate" or "generate()"
    threads: str  #: the thread setting, as its user writes it
    speeds: list[float]


def trained_checkpoint(setup: Setup, folder: Path) -> Path:
    """configs/charlm.yaml's net fitted ``setup.steps`` steps by the CLI, without samples: its last.ckpt."""
    from src.cli import main

    with contextlib.chdir(folder):
        main([
            "fit", "--config", str(CONFIG), f"--trainer.limit_train_batches={setup.steps}",
            "--trainer.max_epochs=1", "--trainer.limit_val_batches=2", "--trainer.callbacks=[]",
            "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
            *([f"--data.init_args.path={setup.text_path}"] if setup.text_path else []),
            *(f"--model.init_args.net.init_args.{k}={v}" for k, v in setup.net.items()),
            f"--data.init_args.block_size={setup.block_size}",
            f"--data.init_args.batch_size={setup.batch_size}",
        ])  # fmt: skip
    (found,) = folder.rglob("last.ckpt")
    return found


def command_seconds(ckpt: Path, prompt: str, new_tokens: int, threads: str) -> float:
    """Wall seconds of ``python -m src.apps.generate`` generating ``new_tokens`` characters."""
    words = [
        "--ckpt_path", str(ckpt), "--prompt", prompt, "--strategy", "sample", "--temperature", "0.8",
        "--top_k", "40", "--max_new_tokens", str(new_tokens), "--seed", "0", "--accelerator", "cpu",
        "--threads", threads,
    ]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "src.apps.generate", *words],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    return time.perf_counter() - start


def measure_generation(setup: Setup, rounds: int, folder: Path, new_tokens: int) -> list[Generation]:
    """The command and the function generating ``new_tokens`` characters, each with the command's default
    threads (1) and torch's (one per core), alternating, ``rounds`` times; see the module's docstring for
    how a command's speed is read."""
    from src.apps.generate import load

    with quiet(torch.get_num_threads()):
        ckpt = trained_checkpoint(setup, folder)
    model, vocabulary, block_size = load(str(ckpt))
    datamodule = data(setup)
    prompt = datamodule.stretch("val")[: setup.block_size]
    short, long = max(1, new_tokens // 10), new_tokens
    default = torch.get_num_threads()  # torch's own: one per core
    found = [
        Generation("python -m src.apps.generate", "default (1)", []),
        Generation("python -m src.apps.generate", f"--threads null ({default})", []),
        Generation("generate()", "1", []),
        Generation("generate()", f"torch's default ({default})", []),
    ]
    for _ in range(rounds):
        for each, threads in zip(found[:2], ("1", "null"), strict=True):
            extra = command_seconds(ckpt, prompt, long, threads) - command_seconds(
                ckpt, prompt, short, threads
            )
            each.speeds.append((long - short) / extra)
        for each, count in zip(found[2:], (1, default), strict=True):
            torch.set_num_threads(count)
            start = time.perf_counter()
            ids = generate(model, vocabulary.encode(prompt), long, "sample", 0.8, 40, None, 0, block_size)
            each.speeds.append((len(ids) - len(prompt)) / (time.perf_counter() - start))
        torch.set_num_threads(default)
    return found


def generation_table(found: list[Generation], setup: Setup, new_tokens: int) -> str:
    lines = [
        f"{new_tokens} characters sampled after a prompt of {setup.block_size} (temperature 0.8, top-k "
        f"40), by the command in its own process (start-up and loading left out) and by the function; "
        f"median of {len(found[0].speeds)} round(s), CPU.",
        "",
        "| generation | torch threads | chars/s |",
        "|---|---|---:|",
    ]
    lines += [f"| {g.path} | {g.threads} | {statistics.median(g.speeds):,.0f} |" for g in found]
    return "\n".join(lines)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=100, help="training steps per net and round")
    parser.add_argument("--new_tokens", type=int, default=200, help="characters generated per net and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--cli_tokens",
        type=int,
        default=2000,
        help="characters per generation of the command and the function",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the shipped cpu_threads)")
    parser.add_argument(
        "--write", action="store_true", help="also save the table as benchmarks/results/charlm_speed.md"
    )
    return parser.parse_args()


if __name__ == "__main__":
    options = parse_arguments()
    setup = from_config(options.steps, options.new_tokens)
    with tempfile.TemporaryDirectory(prefix="charlm-speed-") as tmp:
        found = measure_generation(setup, options.rounds, Path(tmp), options.cli_tokens)
        generation = generation_table(found, setup, options.cli_tokens)
    text = (
        report.header("Character language model speed")
        + "\n\n"
        + table(measure(setup, options.rounds, options.threads))
        + "\n\n"
        + generation
    )
    print(text)
    if options.write:
        print(f"\nwritten to {report.write('charlm_speed', text)}")
