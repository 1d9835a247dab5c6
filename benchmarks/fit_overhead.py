"""The whole fit of ``make train``'s digits experiment: shipped, bare, and with each callback section off.

    .venv/bin/python -m benchmarks.fit_overhead                     # 30 epochs, 2 rounds
    .venv/bin/python -m benchmarks.fit_overhead --rounds 3 --write  # and save results/fit_overhead.md
    .venv/bin/python -m benchmarks.fit_overhead --profile           # where one shipped fit's time goes
    .venv/bin/python -m benchmarks.fit_overhead --only "no baselines" "all off"   # bare, shipped, these

On small data a fit is mostly what happens around the training steps: validation, checkpoints, figures,
logging, once per epoch. This measures that whole: the wall-clock time of one ``trainer.fit`` call,
with the sanity check, every epoch's training and validation, the checkpoints, the figures and the
logger's writes, and nothing before it (imports, parsing, reading and scaling the data, building the
model and the Trainer). The variants, all on ``--epochs`` epochs (default 30) with 1 torch thread:

- ``shipped``: ``configs/digits.yaml`` as ``make train`` builds it, in-process through
  ``src.cli.main([...], run=False)`` and ``cli.trainer.fit(cli.model, datamodule=cli.datamodule)``, with
  every shipped callback section that acts in fit (validation and checkpoints every epoch, as shipped).
  Two changes, the same in every CLI variant: the logger writes into a temporary folder (on the disk
  ``tempfile`` picks; checkpoints are flushed to it), and early stopping waits 1000 epochs, so that every
  variant runs all its epochs (the table says how many each ran). The sections that act only in another
  subcommand (the prediction writer) are off, as ``fit`` leaves them out.
- ``bare``: a LightningModule holding a copy of the shipped model's net as built (:class:`src.nets.MLP`,
  the same sizes, dropout and initial weights), cross-entropy, AdamW with the shipped learning rate and
  weight decay (no scheduler), whose ``training_step`` returns the loss and whose ``validation_step`` logs
  ``val/loss`` with ``self.log``; a Trainer with Lightning's own ``TensorBoardLogger`` in a temporary
  folder and one ``ModelCheckpoint(monitor="val/loss")``, no progress bar, no model summary, the shipped
  gradient clipping and ``deterministic`` (a Trainer flag the config states is not an extra's cost),
  Lightning's defaults otherwise. Its data is the shipped CLI's DataModule (``datamodule=cli.datamodule``):
  the same loaders, batches and preprocessing.
- ``hydra``: a LightningModule shaped as lightning-hydra-template's ``MNISTLitModule``, the peer people
  compare a template with: the same net copy and optimizer as ``bare``, torchmetrics accuracy and mean
  losses per stage updated in every step and logged with ``self.log`` per epoch, the best validation
  accuracy tracked with ``MaxMetric``; a Trainer with ``ModelCheckpoint`` (best by ``val/acc`` and
  ``last.ckpt``), ``EarlyStopping`` (patience beyond the run) and Lightning's ``TensorBoardLogger``, no
  progress bar, no model summary; the same data.
- ``no <section>``: ``shipped`` with one of the shipped callback sections (``src.cli.callback_sections()``,
  as the code has them now) set to ``null``. Where Lightning would put its own callback in the section's
  place, that is switched off too: the progress bar's section also sets ``trainer.enable_progress_bar=
  false`` (with ``null`` alone Lightning's own bar stands in, refreshed on every step: that is the row
  ``progress_bar: null alone``), and when every ``ModelCheckpoint`` section is off,
  ``trainer.enable_checkpointing=false`` (else Lightning adds its default checkpoint).
- ``all sections off``: every one of those sections off at once: the task, its logging and the CLI's
  Trainer (config saver, model summary, ``deterministic``, the logger) without a shipped callback.

The progress bars write to ``/dev/null`` (cheaper than a terminal), as does everything else the runs
print. Each round runs every variant once, interleaved (neighbours in time share the machine's load),
after one unmeasured warm-up round of 2-epoch fits (``shipped`` and ``bare``: imports made on first use,
caches). Reported per variant: the best (shortest) of ``--rounds`` fits and their median; the speed
relative to ``bare`` from the best times (``bare / variant``: 1.0 is as fast as bare) with the range of
the per-round ratios; process CPU seconds (every thread, the figures' drawing thread included); and what
switching the section off saves against ``shipped`` (best minus best), in all and per epoch.

``--profile`` instead runs cProfile over one shipped fit (after a warm-up fit) and lists the entries with
the most cumulative time that belong to the template (``src/``), Lightning's callbacks, loggers and
checkpoint saving, TensorBoard's writer, matplotlib and ``torch.save``, with milliseconds per epoch. The
figures are drawn on a background thread that cProfile does not follow; their drawing is profiled on
that thread separately. cProfile's own cost per call inflates what makes many small calls.
"""

import argparse
import copy
import cProfile
import gc
import io
import os
import pstats
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
import yaml
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.callbacks import ProgressBar as LightningProgressBar
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification import MulticlassAccuracy
from typing_extensions import override

import src.cli
from benchmarks import report
from benchmarks.train_speed import isolated
from src.checkpoints import resolve

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "digits.yaml"
THREADS = 1
WARM_UP_EPOCHS = 2
#: patience that outlasts any run here: early stopping stays on, but ends no run early
PATIENCE = 1000


# -- the shipped callback sections, as the code has them --------------------------------------------


@dataclass(frozen=True)
class Section:
    """One shipped callback section: its name and the class it accepts (``None`` where unknown)."""

    name: str
    base: type | None


def fit_sections() -> list[Section]:
    """The shipped callback sections that act in fit, in the defaults' order
    (:func:`src.cli.callback_sections`),
    each with the class its section names; the prediction writer, which acts in predict only, is left out."""
    defaults = yaml.safe_load(src.cli.DEFAULTS.read_text())
    sections = []
    for name in src.cli.callback_sections():
        found = resolve(defaults[name]["class_path"]) if defaults.get(name) else None
        if name not in elsewhere():
            sections.append(Section(name, found if isinstance(found, type) else None))
    return sections


def elsewhere() -> list[str]:
    """The sections that act only in a subcommand other than fit (predict's writer): off in every run."""
    return ["prediction_writer"]


def is_progress_bar(section: Section) -> bool:
    if section.base is not None:
        return issubclass(section.base, LightningProgressBar)
    return section.name == "progress_bar"


def is_checkpoint(section: Section) -> bool:
    if section.base is not None:
        return issubclass(section.base, ModelCheckpoint)
    return section.name.endswith("checkpoint")


def words_without(off: list[Section], sections: list[Section], stand_in: bool = False) -> list[str]:
    """The CLI words that switch the sections ``off`` (beyond the shipped words, see :func:`cli_words`).

    ``stand_in``: leave the callbacks Lightning puts in a switched-off section's place (its own progress
    bar, its default checkpoint); otherwise they are switched off too.
    """
    words = [f"--{section.name}=null" for section in off]
    if stand_in:
        return words
    if any(is_progress_bar(section) for section in off):
        words.append("--trainer.enable_progress_bar=false")
    checkpoints = [section for section in sections if is_checkpoint(section)]
    if checkpoints and all(section in off for section in checkpoints):
        words.append("--trainer.enable_checkpointing=false")
    return words


# -- the variants -----------------------------------------------------------------------------------


@dataclass
class Run:
    """One fit: wall and process CPU seconds of the ``fit`` call, and the epochs it ran."""

    wall: float
    cpu: float
    epochs: int


def cli_words(folder: Path, epochs: int, extra: list[str]) -> list[str]:
    """``make train``'s words, the run's length and a temporary log folder, then ``extra``."""
    waits = has_section("early_stopping") and "--early_stopping=null" not in extra
    return [
        f"--config={CONFIG}",
        f"--trainer.max_epochs={epochs}",
        f"--trainer.logger.init_args.save_dir={folder}",
        *([f"--early_stopping.init_args.patience={PATIENCE}"] if waits else []),
        *(f"--{name}=null" for name in elsewhere()),
        *extra,
    ]


def has_section(name: str) -> bool:
    return any(section.name == name for section in fit_sections())


def timed_fit(trainer: L.Trainer, module: L.LightningModule, **data: Any) -> Run:
    gc.collect()
    start = (time.perf_counter(), time.process_time())
    trainer.fit(module, **data)
    wall, cpu = time.perf_counter() - start[0], time.process_time() - start[1]
    return Run(wall, cpu, trainer.current_epoch)


def run_cli(folder: Path, epochs: int, extra: list[str]) -> Run:
    cli = src.cli.main(cli_words(folder, epochs, extra), run=False)
    return timed_fit(cli.trainer, cli.model, datamodule=cli.datamodule)


class BareModule(L.LightningModule):
    """The net, its loss and ``val/loss``: what Lightning itself needs to checkpoint the best epoch."""

    def __init__(self, net: nn.Module, lr: float, weight_decay: float) -> None:
        super().__init__()
        self.net = net
        self.lr = lr
        self.weight_decay = weight_decay

    @override
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    @override
    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", F.cross_entropy(self.net(x), y))

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)


def run_bare(folder: Path, epochs: int, extra: list[str]) -> Run:
    # the shipped CLI, built only for its net (as initialized), its settings and its DataModule
    cli = src.cli.main(cli_words(folder, epochs, []), run=False)
    shipped = cli.model
    net = copy.deepcopy(shipped.net)
    optimizer = shipped.optimizer(shipped.parameters()) if shipped.optimizer is not None else None
    group = optimizer.param_groups[0] if optimizer is not None else {"lr": 1e-3, "weight_decay": 1e-2}
    module = BareModule(net, float(group["lr"]), float(group["weight_decay"]))
    built = cli.trainer
    # the shipped Trainer's flags: the CLI's Trainer set deterministic algorithms for the process
    deterministic = torch.are_deterministic_algorithms_enabled()
    trainer = L.Trainer(
        accelerator="auto",
        devices=1,
        max_epochs=built.max_epochs,
        gradient_clip_val=built.gradient_clip_val,
        gradient_clip_algorithm=built.gradient_clip_algorithm,
        logger=TensorBoardLogger(save_dir=folder, name="bare"),
        callbacks=[ModelCheckpoint(monitor="val/loss")],
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=deterministic,
    )
    return timed_fit(trainer, module, datamodule=cli.datamodule)


class HydraModule(L.LightningModule):
    """lightning-hydra-template's ``MNISTLitModule``, step for step, on the shipped net."""

    def __init__(self, net: nn.Module, lr: float, weight_decay: float, classes: int) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["net"])
        self.net = net
        self.criterion = nn.CrossEntropyLoss()
        self.train_acc = MulticlassAccuracy(classes, average="micro")
        self.val_acc = MulticlassAccuracy(classes, average="micro")
        self.train_loss, self.val_loss = MeanMetric(), MeanMetric()
        self.val_acc_best = MaxMetric()

    @override
    def on_train_start(self) -> None:
        self.val_loss.reset()
        self.val_acc.reset()
        self.val_acc_best.reset()

    def model_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        x, y = batch
        logits = self.net(x)
        return self.criterion(logits, y), logits.argmax(dim=1), y

    @override
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, preds, targets = self.model_step(batch)
        self.train_loss(loss)
        self.train_acc(preds, targets)
        self.log("train/loss", self.train_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    @override
    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss, preds, targets = self.model_step(batch)
        self.val_loss(loss)
        self.val_acc(preds, targets)
        self.log("val/loss", self.val_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("val/acc", self.val_acc, on_step=False, on_epoch=True, prog_bar=True)

    @override
    def on_validation_epoch_end(self) -> None:
        self.val_acc_best(self.val_acc.compute())
        self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True, prog_bar=True)

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        hparams = self.hparams
        return torch.optim.AdamW(self.parameters(), lr=hparams["lr"], weight_decay=hparams["weight_decay"])


def run_hydra(folder: Path, epochs: int, extra: list[str]) -> Run:
    cli = src.cli.main(cli_words(folder, epochs, []), run=False)
    shipped = cli.model
    optimizer = shipped.optimizer(shipped.parameters()) if shipped.optimizer is not None else None
    group = optimizer.param_groups[0] if optimizer is not None else {"lr": 1e-3, "weight_decay": 1e-2}
    classes = cli.datamodule.out_features
    module = HydraModule(
        copy.deepcopy(shipped.net), float(group["lr"]), float(group["weight_decay"]), classes
    )
    built = cli.trainer
    torch.use_deterministic_algorithms(False)  # the CLI's Trainer set it for the process; hydra leaves it
    trainer = L.Trainer(
        accelerator="auto",
        devices=1,
        max_epochs=built.max_epochs,
        gradient_clip_val=built.gradient_clip_val,
        gradient_clip_algorithm=built.gradient_clip_algorithm,
        logger=TensorBoardLogger(save_dir=folder, name="hydra"),
        callbacks=[
            ModelCheckpoint(monitor="val/acc", mode="max", save_last=True),
            EarlyStopping(monitor="val/acc", mode="max", patience=PATIENCE),
        ],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    return timed_fit(trainer, module, datamodule=cli.datamodule)


@dataclass(frozen=True)
class Variant:
    key: str
    title: str
    run: Callable[[Path, int, list[str]], Run]
    extra: list[str] = field(default_factory=list)


def variants() -> list[Variant]:
    sections = fit_sections()
    found = [
        Variant("bare", "bare LightningModule + Trainer", run_bare),
        Variant("hydra", "lightning-hydra-template-shaped module", run_hydra),
        Variant("shipped", "shipped (every section on)", run_cli),
    ]
    for section in sections:
        found.append(
            Variant(f"no {section.name}", f"no `{section.name}`", run_cli, words_without([section], sections))
        )
        if is_progress_bar(section):
            found.append(
                Variant(
                    f"{section.name}: null alone",
                    f"`{section.name}: null` alone (Lightning's own bar stands in)",
                    run_cli,
                    words_without([section], sections, stand_in=True),
                )
            )
    if has_section("baselines"):
        found.append(
            Variant(
                "baselines in a process",
                "the baselines in a process of their own (`baselines.init_args.fit_in=process`)",
                run_cli,
                ["--baselines.init_args.fit_in=process"],
            )
        )
    found.append(Variant("all off", "all sections off", run_cli, words_without(sections, sections)))
    return found


def run_variant(variant: Variant, root: Path, epochs: int) -> Run:
    """One fit of ``variant`` in a fresh folder under ``root``, removed afterwards (off the clock)."""
    folder = Path(tempfile.mkdtemp(prefix="fit-", dir=root))
    try:
        with isolated(THREADS):
            return variant.run(folder, epochs, variant.extra)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# -- rounds and the table ---------------------------------------------------------------------------


@dataclass
class Results:
    epochs: int
    variants: list[Variant]
    runs: dict[str, list[Run]]  # per variant key, one per round

    def best(self, key: str) -> float:
        return min(run.wall for run in self.runs[key])

    def median(self, key: str) -> float:
        return statistics.median(run.wall for run in self.runs[key])

    def round_ratios(self, key: str, reference: str = "bare") -> list[float]:
        """Per round, the reference's time over the variant's (speed relative to the reference)."""
        pairs = zip(self.runs[key], self.runs[reference], strict=True)
        return [ref.wall / run.wall for run, ref in pairs]

    @property
    def rounds(self) -> int:
        return len(self.runs["bare"])


def measure(rounds: int, epochs: int, progress: bool = True, only: list[str] | None = None) -> Results:
    """Every variant (or those whose key ``only`` names) once per round, interleaved, after an unmeasured
    warm-up round; ``bare`` and ``shipped`` always run."""
    chosen = [v for v in variants() if not only or v.key in {"bare", "hydra", "shipped", *only}]
    runs: dict[str, list[Run]] = {variant.key: [] for variant in chosen}
    with tempfile.TemporaryDirectory(prefix="fit-overhead-") as tmp:
        root = Path(tmp)
        for variant in chosen[:3]:  # bare, hydra and shipped: between them, everything the others use
            run_variant(variant, root, WARM_UP_EPOCHS)
        for number in range(1, rounds + 1):
            for variant in chosen:
                run = run_variant(variant, root, epochs)
                runs[variant.key].append(run)
                if progress:
                    print(
                        f"round {number}/{rounds}: {variant.key:<28} {run.wall:6.2f} s, {run.epochs} epochs",
                        flush=True,
                    )
    return Results(epochs, chosen, runs)


COLUMNS = (
    "variant",
    "epochs run",
    "best (s)",
    "median (s)",
    "best CPU (s)",
    "ms/epoch",
    "x bare (rounds)",
    "saved vs shipped (s)",
    "saved per epoch (ms)",
)


def table(results: Results) -> str:
    epochs, shipped, bare = results.epochs, results.best("shipped"), results.best("bare")
    lines = [
        f"`configs/digits.yaml` (`make train`'s experiment), {epochs} epochs, validation and checkpoints "
        f"every epoch, {THREADS} torch thread, in-process; the whole `trainer.fit` call, best and median of "
        f'{results.rounds} interleaved round(s) after a warm-up. "x bare": bare\'s best time over the '
        "variant's (1.0 = as fast as bare), the per-round ratios in brackets. \"saved\": shipped's best "
        "minus the variant's, the time that section costs.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|---|" + "---:|" * (len(COLUMNS) - 1),
    ]
    for variant in results.variants:
        key = variant.key
        runs = results.runs[key]
        best = results.best(key)
        ratios = results.round_ratios(key)
        saved = shipped - best
        counts = sorted({run.epochs for run in runs})
        cells = [
            variant.title,
            "/".join(map(str, counts)) + ("" if counts == [epochs] else " (!)"),
            f"{best:.2f}",
            f"{results.median(key):.2f}",
            f"{min(run.cpu for run in runs):.2f}",
            f"{1000 * best / epochs:.0f}",
            f"{bare / best:.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
            "" if key == "shipped" else f"{saved:+.2f}",
            "" if key == "shipped" else f"{1000 * saved / epochs:+.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    every = all(run.epochs == epochs for runs in results.runs.values() for run in runs)
    lines.append(
        f"- {'every' if every else 'NOT every'} fit ran {epochs} epochs"
        + ("" if every else ": the rows marked (!) are not comparable")
    )
    lines.append(
        f"- shipped: {shipped:.2f} s, {bare / shipped:.2f}x bare ({shipped - bare:+.2f} s, "
        f"{1000 * (shipped - bare) / epochs:+.0f} ms per epoch over bare)"
    )
    # the comparison with the peers, progress bars off on every side: medians over the rounds
    quiet = next((v.key for v in results.variants if v.key.startswith("no progress")), "shipped")
    ours, hydra = results.median(quiet), results.median("hydra")
    lines.append(
        f"- shipped with the bar off ({quiet!r}), medians: {ours:.2f} s; speed "
        f"{results.median('bare') / ours:.2f}x bare and {hydra / ours:.2f}x the "
        f"lightning-hydra-template-shaped module ({hydra:.2f} s)"
    )
    offs = [v.key for v in results.variants if v.key.startswith("no ")]
    total = sum(shipped - results.best(key) for key in offs)
    if "all off" not in results.runs:
        return "\n".join(lines)
    lines.append(
        f"- the single sections' savings add up to {total:.2f} s; all off at once saves "
        f"{shipped - results.best('all off'):.2f} s (the rest, all off vs bare: "
        f"{results.best('all off') - bare:+.2f} s, is the task, its logging and the CLI's Trainer)"
    )
    return "\n".join(lines)


# -- the profile ------------------------------------------------------------------------------------

#: where the time of callbacks, logging and checkpoints is spent (paths as cProfile names them)
ATTRIBUTED = (
    str(ROOT / "src") + os.sep,
    "lightning/pytorch/callbacks/",
    "lightning/pytorch/loggers/",
    "lightning/fabric/loggers/",
    "lightning/pytorch/trainer/connectors/checkpoint_connector",
    "lightning/pytorch/trainer/connectors/logger_connector/",
    "lightning/pytorch/plugins/io/",
    "lightning/fabric/plugins/io/",
    "lightning/pytorch/core/saving",
    "torch/utils/tensorboard/",
    "tensorboard/",
    "matplotlib/",
    "torch/serialization.py",
    "posix.fsync",
    "method 'flush'",
)


def stats_lines(stats: pstats.Stats, epochs: int, top: int, only: tuple[str, ...] = ATTRIBUTED) -> list[str]:
    """The ``top`` entries by cumulative time whose file or name holds one of ``only``, ms per epoch."""
    entries = stats.stats  # type: ignore[attr-defined]  # pstats keeps its table in this attribute
    site = str(Path(torch.__file__).parent.parent) + os.sep
    rows = []
    for (file, line, name), (_, calls, own, cumulative, _) in entries.items():
        where = f"{file}:{line}({name})" if file != "~" else name
        if any(part in where for part in only):
            where = where.replace(site, "").replace(str(ROOT) + os.sep, "")
            rows.append((cumulative, own, calls, where))
    rows.sort(reverse=True)
    lines = [f"{'ms/epoch':>9} {'total ms':>9} {'own ms':>8} {'calls':>7}  function"]
    for cumulative, own, calls, where in rows[:top]:
        per_epoch, total = 1000 * cumulative / epochs, 1000 * cumulative
        lines.append(f"{per_epoch:9.2f} {total:9.1f} {1000 * own:8.1f} {calls:7d}  {where}")
    return lines


def profile(epochs: int, top: int) -> str:
    """cProfile's view of one shipped fit, after a warm-up fit."""
    with tempfile.TemporaryDirectory(prefix="fit-overhead-") as tmp:
        root = Path(tmp)
        run_variant(Variant("shipped", "shipped", run_cli), root, WARM_UP_EPOCHS)
        folder = Path(tempfile.mkdtemp(prefix="fit-", dir=root))
        profiler, drawing = cProfile.Profile(), cProfile.Profile()
        with isolated(THREADS):
            cli = src.cli.main(cli_words(folder, epochs, []), run=False)
            # the figures are drawn on a thread of their own, which the main profiler does not see
            for callback in cli.trainer.callbacks:  # type: ignore[attr-defined]
                draw = getattr(callback, "_draw", None)
                if callable(draw):
                    callback._draw = _profiled(draw, drawing)
            gc.collect()
            start = time.perf_counter()
            profiler.runcall(cli.trainer.fit, cli.model, datamodule=cli.datamodule)
            wall = time.perf_counter() - start
            ran = cli.trainer.current_epoch
    out = io.StringIO()
    main_stats = pstats.Stats(profiler, stream=out)
    lines = [
        f"### cProfile of one shipped fit: {ran} epochs, {wall:.2f} s under the profiler "
        f"({1000 * wall / ran:.0f} ms per epoch)",
        "",
        "The fit's thread, the entries of callbacks, the task, logging and checkpoints by cumulative time:",
        "",
        "```",
        *stats_lines(main_stats, ran, top),
        "```",
    ]
    if drawing.getstats():
        lines += [
            "",
            "The figures' drawing thread (concurrent with training; it competes for the GIL):",
            "",
            "```",
            *stats_lines(pstats.Stats(drawing, stream=out), ran, 12, only=("",)),
            "```",
        ]
    return "\n".join(lines)


def _profiled(function: Callable[..., Any], profiler: cProfile.Profile) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        return profiler.runcall(function, *args, **kwargs)

    return run


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="fits per variant, interleaved (default 2)")
    parser.add_argument("--epochs", type=int, default=30, help="epochs per fit (default 30)")
    parser.add_argument(
        "--write", action="store_true", help="also save the table as benchmarks/results/fit_overhead.md"
    )
    parser.add_argument(
        "--profile", action="store_true", help="instead of the table, profile one shipped fit with cProfile"
    )
    parser.add_argument("--top", type=int, default=25, help="entries the profile lists (default 25)")
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="VARIANT",
        help='run only these variants beside bare and shipped, by key ("no baselines", "all off")',
    )
    return parser.parse_args()


if __name__ == "__main__":
    options = parse_arguments()
    torch.set_num_threads(THREADS)
    if options.profile:
        print(profile(options.epochs, options.top))
    else:
        results = measure(options.rounds, options.epochs, only=options.only)
        text = report.header("The whole fit on small data: shipped, bare, each callback section off")
        text += "\n\n" + table(results)
        print("\n" + text)
        if options.write:
            print(f"\nwritten to {report.write('fit_overhead', text)}")
