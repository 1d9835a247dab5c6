"""Training speed side by side: the same MLP and data from a bare PyTorch loop up to the shipped template.

    .venv/bin/python -m benchmarks.train_speed                    # 200k rows, 781 steps, 3 rounds
    .venv/bin/python -m benchmarks.train_speed --rounds 5 --write # and save benchmarks/results/train_speed.md
    .venv/bin/python -m benchmarks.train_speed --profile bare template   # where each one's step time goes

The setup: an MLP 64 → 256 → 256 → 10 (:class:`src.nets.MLP`, ReLU, no dropout or periodic embedding) on
``--rows`` seeded synthetic rows (64 standard-normal features, 10 classes from a random linear teacher),
batches of 256, ``AdamW(lr=1e-3)``, gradient norm clipped at 1.0, on the CPU with ``--threads`` torch
threads. Every
variant starts from the same weights and takes the same number of optimizer steps (``--steps``, by
default and at most one epoch of full batches, ``rows // 256``), as one epoch: the Lightning variants are
given ``max_epochs=1`` and ``limit_train_batches=steps``. The variants:

1. ``compute``: pre-shuffled index slicing of the in-memory tensors; zero_grad, forward, loss, backward,
   clip, step.
2. ``tutorial``: the tutorials' ``DataLoader(TensorDataset(x, y), batch_size=256, shuffle=True)``, the
   same step.
3. ``loop``: the project's :func:`examples.loop.fit`, fed the slices of variant 1.
4. ``bare``: a LightningModule holding the same net whose ``training_step`` returns the loss and logs
   nothing; a quiet Trainer (no logger, checkpointing, progress bar or model summary), the same clipping.
   Its batches come from a ``DataLoader`` over a ``TensorDataset`` with a ``BatchSampler`` as sampler and
   ``batch_size=None``: one fancy index per batch, PyTorch's own way to batch in-memory tensors by
   indexing, so that this row measures Lightning, not per-sample collation.
5. ``template``: :class:`src.models.Classifier` (its metrics and logging) with the same quiet Trainer,
   fed by :class:`src.extras.tables.TabularDataModule`. The DataModule takes no in-memory arrays, so the
   rows are
   written to a Parquet file in a temporary folder (``source: parquet``), with 5 % validation and 5 %
   test rows added on top so that the training split holds the ``--rows`` rows' worth; the file's
   reading, splitting and scaling happen in setup, before the clock starts.
6. ``cli``: the template as ``make train`` builds it: ``src.cli.main(run=False)`` reads
   ``configs/defaults.yaml`` (every shipped callback, the TensorBoard logger in a temporary folder, the
   progress bar, the model summary, ``deterministic: true``, ``log_every_n_steps``) and flags for the
   model, the data file and the run's length, plus ``--trainer.accelerator=cpu`` (what ``auto`` picks
   here).
   The progress bar writes to ``/dev/null``, which is cheaper than a terminal.

What the clock covers: from just before the first batch is drawn (the epoch's shuffle included) to
the end of the last optimizer step. For Lightning, from ``on_train_start`` (after setup, the
configuration of the optimizer and the sanity check; before the epoch's start hooks and its loader) to
the last step's ``on_train_batch_end`` callback hook. Imports, data generation, file writing and
reading, preprocessing, building the model and the Trainer, the CLI's parsing, and the epoch's end
(validation, figures, checkpoints, the logger's flush) are outside it; the "whole fit" column times the
whole ``fit`` call for comparison.

Each round runs every variant once, in the order above, after one unmeasured warm-up round of 50
steps; each variant's steps per second is the median over rounds, and each ratio is the median over
rounds of the two variants' ratio within a round (neighbours in time share the machine's load). Process
CPU time per step is printed beside wall time, and the targets' ratios by CPU time beside those by wall
time: on a machine shared with other work CPU time is the steadier. There, one 2-second run can come
out 10 % slower than the same run just before or after it, so each verdict line also gives the range of
the per-round ratios; a verdict whose range straddles its target wants more ``--rounds``.
"""

import argparse
import contextlib
import cProfile
import io
import logging
import math
import os
import pstats
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any, Literal

import lightning as L
import pandas as pd
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset
from typing_extensions import override

from benchmarks import report
from examples.loop import fit
from src.cli import main
from src.extras.tables import Split, TabularDataModule
from src.models import Classifier
from src.nets import MLP

#: the share of the file's rows the template's DataModule holds out for validation, and for test
HELD_OUT = 0.05
WARM_UP_STEPS = 50


@dataclass(frozen=True)
class Setup:
    """What every variant trains, and on what."""

    rows: int = 200_000
    features: int = 64
    hidden_sizes: tuple[int, ...] = (256, 256)
    classes: int = 10
    batch_size: int = 256
    steps: int | None = None  #: optimizer steps per variant; None: one epoch of full batches
    lr: float = 1e-3
    clip: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.optimizer_steps <= self.rows // self.batch_size:
            raise ValueError(
                f"steps={self.steps}: every variant trains one epoch, of at most rows // batch_size = "
                f"{self.rows // self.batch_size} full batches; give fewer steps or more rows."
            )

    @property
    def optimizer_steps(self) -> int:
        return self.steps if self.steps is not None else self.rows // self.batch_size

    def net(self) -> MLP:
        """The MLP every variant starts from: seeded, so all start with the same weights."""
        torch.manual_seed(self.seed)
        return MLP(self.features, self.classes, hidden_sizes=self.hidden_sizes)


@dataclass
class Data:
    """The in-memory rows (variants 1-4) and the Parquet file that holds them and the held-out rows (5-6)."""

    x: torch.Tensor  # (rows, features) float32
    y: torch.Tensor  # (rows,) int64 class ids
    path: Path
    file_rows: int  # rows + the held-out rows
    folder: Path  # for the CLI's logs and checkpoints


def make_data(setup: Setup, folder: Path) -> Data:
    """Seeded synthetic rows, and a Parquet file of them with enough more rows for validation and test."""
    generator = torch.Generator().manual_seed(setup.seed)
    total = math.ceil(setup.rows / (1 - 2 * HELD_OUT)) + 16  # the training split keeps at least `rows`
    x = torch.randn(total, setup.features, generator=generator)
    teacher = torch.randn(setup.features, setup.classes, generator=generator)
    noise = 2.0 * torch.randn(total, setup.classes, generator=generator)
    y = (x @ teacher + noise).argmax(dim=1)
    frame = pd.DataFrame(x.numpy(), columns=[f"x{i}" for i in range(setup.features)])
    frame["label"] = y.numpy()
    path = folder / "rows.parquet"
    frame.to_parquet(path, index=False)
    return Data(x[: setup.rows].clone(), y[: setup.rows].clone(), path, total, folder)


# -- the clock ------------------------------------------------------------------------------------------


#: set by :func:`profile`: every clock switches it on and off with itself, so it sees what the clock sees
PROFILER: cProfile.Profile | None = None


class Clock:
    """Wall and process CPU seconds (all of the process's threads) from ``start`` to ``finish``."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0
        self._start = (0.0, 0.0)
        self.finished = False

    def start(self) -> None:
        if PROFILER is not None:
            PROFILER.enable()
        self._start = (time.perf_counter(), time.process_time())

    def finish(self) -> None:
        self.wall = time.perf_counter() - self._start[0]
        self.cpu = time.process_time() - self._start[1]
        self.finished = True
        if PROFILER is not None:
            PROFILER.disable()


class TrainingClock(Callback):
    """The clock of the Lightning variants (see the module's docstring), and the last step's loss."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.clock = Clock()
        self.loss: torch.Tensor | None = None

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.clock.start()

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step >= self.steps and not self.clock.finished:
            self.clock.finish()
            # automatic optimization hands on_train_batch_end {"loss": the detached loss}
            self.loss = outputs["loss"] if isinstance(outputs, dict) else outputs


@dataclass
class Run:
    """One variant's one run."""

    steps: int  # optimizer steps taken
    wall: float  # seconds on the clock
    cpu: float  # process CPU seconds on the clock
    whole: float  # seconds of the whole fit call
    loss: float  # the last step's loss (examples.loop.fit: the run's mean), to check that training happened

    def per_step(self, by: Literal["wall", "cpu"] = "wall") -> float:
        """Seconds of wall or process CPU time per optimizer step, on the clock."""
        return (self.wall if by == "wall" else self.cpu) / self.steps


# -- the plain PyTorch variants -------------------------------------------------------------------------


class ShuffledSlices:
    """One epoch of ``count`` full batches: consecutive slices of a fresh permutation of the rows."""

    def __init__(
        self, x: torch.Tensor, y: torch.Tensor, batch_size: int, count: int, generator: torch.Generator
    ) -> None:
        assert count * batch_size <= len(x), "one epoch holds len(x) // batch_size full batches"
        self.x, self.y, self.batch_size, self.count, self.generator = x, y, batch_size, count, generator

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = torch.randperm(len(self.x), generator=self.generator)
        for i in range(self.count):
            rows = order[i * self.batch_size : (i + 1) * self.batch_size]  # (B,) row positions
            yield self.x[rows], self.y[rows]


def plain_loop(net: nn.Module, batches: Iterator[tuple[torch.Tensor, ...]], setup: Setup) -> Run:
    """The step every tutorial writes, for ``setup.optimizer_steps`` batches of ``batches``."""
    optimizer = torch.optim.AdamW(net.parameters(), lr=setup.lr)
    net.train()
    clock = Clock()
    loss = torch.zeros(())
    steps = 0
    clock.start()
    for x, y in islice(batches, setup.optimizer_steps):
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)  # (B, K) logits in, the batch's mean out
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), setup.clip)
        optimizer.step()
        steps += 1
    clock.finish()
    return Run(steps, clock.wall, clock.cpu, clock.wall, loss.item())


def run_compute(setup: Setup, data: Data) -> Run:
    generator = torch.Generator().manual_seed(setup.seed)
    batches = ShuffledSlices(data.x, data.y, setup.batch_size, setup.optimizer_steps, generator)
    return plain_loop(setup.net(), iter(batches), setup)


def run_tutorial(setup: Setup, data: Data) -> Run:
    generator = torch.Generator().manual_seed(setup.seed)
    loader = DataLoader(
        TensorDataset(data.x, data.y), batch_size=setup.batch_size, shuffle=True, generator=generator
    )
    return plain_loop(setup.net(), iter(loader), setup)


def run_loop(setup: Setup, data: Data) -> Run:
    generator = torch.Generator().manual_seed(setup.seed)
    batches = ShuffledSlices(data.x, data.y, setup.batch_size, setup.optimizer_steps, generator)
    net = setup.net()
    clock = Clock()
    clock.start()
    # one "epoch" of exactly the step count; no validation
    result = fit(
        net,
        batches,
        optimizer=partial(torch.optim.AdamW, lr=setup.lr),
        max_epochs=1,
        gradient_clip_val=setup.clip,
    )
    clock.finish()
    return Run(result.steps, clock.wall, clock.cpu, clock.wall, result.history.train_loss[-1])


# -- the Lightning variants -----------------------------------------------------------------------------


class BareModule(L.LightningModule):
    """The net and its loss, nothing else: what Lightning itself costs per step."""

    def __init__(self, net: nn.Module, lr: float) -> None:
        super().__init__()
        self.net = net
        self.lr = lr

    @override
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def quiet_trainer(setup: Setup, clock: TrainingClock) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        limit_train_batches=setup.optimizer_steps,
        gradient_clip_val=setup.clip,
        gradient_clip_algorithm="norm",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[clock],
    )


def lightning_fit(trainer: L.Trainer, clock: TrainingClock, module: L.LightningModule, **data: Any) -> Run:
    start = time.perf_counter()
    trainer.fit(module, **data)
    whole = time.perf_counter() - start
    loss = float(clock.loss) if clock.loss is not None else math.nan
    return Run(trainer.global_step, clock.clock.wall, clock.clock.cpu, whole, loss)


def run_bare(setup: Setup, data: Data) -> Run:
    generator = torch.Generator().manual_seed(setup.seed)
    dataset = TensorDataset(data.x, data.y)
    batches = BatchSampler(RandomSampler(dataset, generator=generator), setup.batch_size, drop_last=False)
    loader = DataLoader(dataset, sampler=batches, batch_size=None)  # dataset[list of indices] per batch
    clock = TrainingClock(setup.optimizer_steps)
    return lightning_fit(
        quiet_trainer(setup, clock), clock, BareModule(setup.net(), setup.lr), train_dataloaders=loader
    )


def template_data(setup: Setup, data: Data) -> TabularDataModule:
    return TabularDataModule(
        source="parquet",
        path=str(data.path),
        target_column="label",
        task="classification",
        batch_size=setup.batch_size,
        split=Split(val_fraction=HELD_OUT, test_fraction=HELD_OUT),
        seed=setup.seed,
    )


def run_template(setup: Setup, data: Data) -> Run:
    datamodule = template_data(setup, data)
    model = Classifier(
        in_features=datamodule.in_features,  # reads, splits and scales the file now, outside the clock
        out_features=datamodule.out_features,
        net=partial(MLP, hidden_sizes=list(setup.hidden_sizes)),
        optimizer=partial(torch.optim.AdamW, lr=setup.lr),
    )
    model.net.load_state_dict(setup.net().state_dict())
    clock = TrainingClock(setup.optimizer_steps)
    return lightning_fit(quiet_trainer(setup, clock), clock, model, datamodule=datamodule)


def cli_words(setup: Setup, data: Data) -> list[str]:
    """The flags that make ``configs/defaults.yaml`` train this benchmark's model on its file."""
    return [
        "--model=src.models.Classifier",
        "--model.init_args.net=src.nets.MLP",
        f"--model.init_args.net.init_args.hidden_sizes=[{', '.join(map(str, setup.hidden_sizes))}]",
        "--model.init_args.optimizer=torch.optim.AdamW",
        f"--model.init_args.optimizer.init_args.lr={setup.lr}",
        "--data=src.extras.tables.TabularDataModule",
        "--data.source=parquet",
        f"--data.path={data.path}",
        "--data.target_column=label",
        "--data.task=classification",
        f"--data.batch_size={setup.batch_size}",
        f"--data.split.val_fraction={HELD_OUT}",
        f"--data.split.test_fraction={HELD_OUT}",
        f"--data.seed={setup.seed}",
        # one epoch of exactly the step count: a max_steps that ends an epoch early would leave the shipped
        # EarlyStopping without the val/loss it checks at the epoch's end, and stop the run with an error
        "--trainer.max_epochs=1",
        f"--trainer.limit_train_batches={setup.optimizer_steps}",
        f"--trainer.gradient_clip_val={setup.clip}",  # the shipped value, said here so that it stays equal
        "--trainer.accelerator=cpu",
        f"--trainer.default_root_dir={data.folder}",
        f"--trainer.logger.init_args.save_dir={data.folder / 'logs'}",
        # `fit` leaves out the prediction writer, which acts in predict only; main(run=False) has none
        "--prediction_writer=null",
    ]


def run_cli(setup: Setup, data: Data) -> Run:
    cli = main(cli_words(setup, data), run=False)
    cli.model.net.load_state_dict(setup.net().state_dict())
    clock = TrainingClock(setup.optimizer_steps)
    # Trainer.callbacks is public and documented, but Lightning assigns it in its callback connector
    # without declaring it on the class, so mypy cannot see it
    cli.trainer.callbacks.append(clock)  # type: ignore[attr-defined]
    return lightning_fit(cli.trainer, clock, cli.model, datamodule=cli.datamodule)


@dataclass(frozen=True)
class Variant:
    title: str
    loader: str
    run: Callable[[Setup, Data], Run]


VARIANTS: dict[str, Variant] = {
    "compute": Variant("1. compute-only loop", "pre-shuffled slices", run_compute),
    "tutorial": Variant("2. tutorials' loop", "DataLoader(TensorDataset), shuffle", run_tutorial),
    "loop": Variant("3. `examples/loop.py` fit", "pre-shuffled slices", run_loop),
    "bare": Variant("4. bare LightningModule, quiet Trainer", "DataLoader, BatchSampler", run_bare),
    "template": Variant(
        "5. `Classifier` + `TabularDataModule`, quiet Trainer", "the DataModule's", run_template
    ),
    "cli": Variant("6. template, shipped defaults (CLI)", "the DataModule's", run_cli),
}


@contextlib.contextmanager
def isolated(threads: int) -> Iterator[None]:
    """A variant's run with this process's global torch settings restored after it, its output discarded.

    ``deterministic: true`` in the shipped defaults switches deterministic algorithms on for the whole
    process; the next variant must not inherit it.
    """
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    # Lightning's notes (model summary, "`Trainer.fit` stopped") go through logging to the real stderr
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
        # Lightning's advice (more loader workers, a shorter logging interval) is not what is measured
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(deterministic)
            torch.set_num_threads(threads)
            for each, level in zip(loggers, levels, strict=True):
                each.setLevel(level)


def run_variant(key: str, setup: Setup, data: Data, threads: int) -> Run:
    with isolated(threads):
        return VARIANTS[key].run(setup, data)


# -- rounds and the table -------------------------------------------------------------------------------


@dataclass
class Results:
    setup: Setup
    threads: int
    runs: dict[str, list[Run]]  # per variant, one per round

    def speed(self, key: str) -> float:
        """Median optimizer steps per second of wall time on the clock."""
        return statistics.median(1 / run.per_step() for run in self.runs[key])

    def ratios(self, key: str, reference: str, by: Literal["wall", "cpu"] = "wall") -> list[float]:
        """Per round, the variant's speed over the reference's speed in the same round, in steps per
        second of wall time, or per second of process CPU time."""
        pairs = zip(self.runs[key], self.runs[reference], strict=True)
        return [ref.per_step(by) / run.per_step(by) for run, ref in pairs]

    def ratio(self, key: str, reference: str, by: Literal["wall", "cpu"] = "wall") -> float:
        """The median of :meth:`ratios`."""
        return statistics.median(self.ratios(key, reference, by))

    @property
    def rounds(self) -> int:
        return len(self.runs["compute"])


def measure(setup: Setup, rounds: int, threads: int = 1, warm_up: bool = True) -> Results:
    """Every variant once per round, alternating, after an unmeasured warm-up round."""
    runs: dict[str, list[Run]] = {key: [] for key in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="train-speed-") as tmp:
        data = make_data(setup, Path(tmp))
        if warm_up:
            short = replace(setup, steps=min(WARM_UP_STEPS, setup.optimizer_steps))
            for key in VARIANTS:
                run_variant(key, short, data, threads)
        for _ in range(rounds):
            for key in VARIANTS:
                runs[key].append(run_variant(key, setup, data, threads))
    return Results(setup, threads, runs)


TARGETS = (
    # (variant, reference, at least, what the issue asks)
    ("cli", "bare", 0.85, "template with shipped defaults ≥ 0.85x the bare LightningModule"),
    ("cli", "tutorial", 1.2, "template with shipped defaults ≥ 1.2x the tutorials' DataLoader loop"),
    ("loop", "compute", 0.95, "`examples/loop.py` ≥ 0.95x the compute-only loop"),
)


COLUMNS = (
    "variant",
    "batches from",
    "steps",
    "steps/s",
    "ms/step",
    "CPU ms/step",
    "x compute-only",
    "x bare LightningModule",
    "whole fit (s)",
)


def table(results: Results) -> str:
    setup = results.setup
    sizes = " → ".join(map(str, (setup.features, *setup.hidden_sizes, setup.classes)))
    lines = [
        f"MLP {sizes}, {setup.rows:,} rows, batch {setup.batch_size}, AdamW(lr={setup.lr}), clip norm "
        f"{setup.clip}, {setup.optimizer_steps} optimizer steps per variant, median of {results.rounds} "
        f"round(s), {results.threads} torch thread(s), CPU. The clock covers training steps only (see "
        '`benchmarks/train_speed.py`); "whole fit" is the whole fit call.',
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|---|---|" + "---:|" * (len(COLUMNS) - 2),
    ]
    for key, variant in VARIANTS.items():
        runs = results.runs[key]
        speed = results.speed(key)
        cpu = statistics.median(run.per_step("cpu") for run in runs)
        whole = statistics.median(run.whole for run in runs)
        cells = [
            variant.title,
            variant.loader,
            str(runs[0].steps),
            f"{speed:,.0f}",
            f"{1000 / speed:.2f}",
            f"{1000 * cpu:.2f}",
            f"{results.ratio(key, 'compute'):.2f}",
            f"{results.ratio(key, 'bare'):.2f}",
            f"{whole:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for key, reference, least, what in TARGETS:
        ratio, by_cpu = results.ratio(key, reference), results.ratio(key, reference, by="cpu")
        rounds = results.ratios(key, reference)
        lines.append(
            f"- {'PASS' if ratio >= least else 'FAIL'}: {what}: {ratio:.2f}x (rounds {min(rounds):.2f} to "
            f"{max(rounds):.2f}; by CPU time {by_cpu:.2f}x)"
        )
    return "\n".join(lines)


def profile(key: str, setup: Setup, threads: int, top: int = 30) -> str:
    """cProfile's view of what a variant's clock covers: the functions with the most time, own and total."""
    global PROFILER
    with tempfile.TemporaryDirectory(prefix="train-speed-") as tmp:
        data = make_data(setup, Path(tmp))
        run_variant(key, setup, data, threads)  # warm: imports and first-call costs stay out
        PROFILER = profiler = cProfile.Profile()
        try:
            run = run_variant(key, setup, data, threads)
        finally:
            PROFILER = None
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    for order in ("tottime", "cumulative"):
        stats.sort_stats(order).print_stats(top)
    text = out.getvalue().replace(str(Path(torch.__file__).parent.parent) + "/", "")
    return f"### cProfile of {VARIANTS[key].title}: {run.steps} steps\n\n```\n{text.strip()}\n```"


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=Setup.rows, help="in-memory rows (default 200000)")
    parser.add_argument(
        "--steps", type=int, default=None, help="optimizer steps per variant (default rows // 256)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads; one keeps a shared machine's noise down"
    )
    parser.add_argument(
        "--write", action="store_true", help="also save the table as benchmarks/results/train_speed.md"
    )
    parser.add_argument(
        "--profile",
        nargs="+",
        choices=list(VARIANTS),
        default=[],
        metavar="VARIANT",
        help=f"instead of the table, profile these variants ({', '.join(VARIANTS)}) with cProfile",
    )
    return parser.parse_args()  # fmt: skip


if __name__ == "__main__":
    options = parse_arguments()
    setup = Setup(rows=options.rows, steps=options.steps)
    if options.profile:
        for key in options.profile:
            print(profile(key, setup, options.threads), end="\n\n")
    else:
        text = (
            report.header("Training speed") + "\n\n" + table(measure(setup, options.rounds, options.threads))
        )
        print(text)
        if options.write:
            print(f"\nwritten to {report.write('train_speed', text)}")
