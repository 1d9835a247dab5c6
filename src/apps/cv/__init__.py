"""Cross-validation and repeats: one ordinary run of the CLI per fold or per seed, then mean ± std.

    python -m src.apps.cv --folds 5 --config configs/digits.yaml       # = make cv CONFIG=... FOLDS=5
    python -m src.apps.cv --seeds 3 --config configs/digits.yaml       # = make repeat CONFIG=... SEEDS=3

Cross-validation splits the train and validation rows together into ``--folds`` folds (stratified by
class for classification, seeded by ``data.seed``) and trains one model per fold, with that fold as the
validation split and everything fitted (preprocessing, class weights, target statistics) fitted on the
other folds only; the test split is never touched. It reports the validation metrics per fold.

Repeats run the same config with ``seed_everything`` and ``data.seed`` set to 0, 1, …, ``--seeds - 1``
(so the split, the initial weights and the batch order all change), test each run's best checkpoint as
``make train`` does, and report the test metrics per seed. On small data one seed's test
accuracy moves by a few hundredths: compare two configs by their means and spreads, not by one run.

Every run logs to its own folder, ``logs/<experiment>/<group>/fold<k>`` or ``.../seed<s>``, and the group
folder gets ``summary.yaml`` (every run's metrics, their mean and sample standard deviation) and the
same numbers as TensorBoard scalars (``summary/<metric>`` per run, ``summary/<metric>_mean`` and
``_std``). Any further words are passed to ``python -m src.cli fit``.
"""

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml
from torch.utils.tensorboard import SummaryWriter

from src.cli import CLI, main
from src.files import written

#: metrics of one run, by name (``val/acc``, ``test/loss``, …)
Metrics = dict[str, float]


def fold_words(words: Sequence[str], folds: int, fold: int) -> list[str]:
    """The CLI words of fold ``fold`` of ``folds``: the DataModule selects the fold's rows itself."""
    return [*words, f"--data.split.folds={folds}", f"--data.split.fold={fold}"]


def run_metrics(run: CLI, prefixes: tuple[str, ...] = ("val/",)) -> Metrics:
    """The run's last logged values of the metrics whose names start with one of ``prefixes``."""
    return {
        name: float(value)
        for name, value in sorted(run.trainer.callback_metrics.items())
        if name.startswith(prefixes) and value.numel() == 1
    }


def cross_validate(
    words: Sequence[str],
    folds: int,
    group: str | None = None,
    after_fold: Callable[[int, Metrics], None] | None = None,
) -> list[Metrics]:
    """Fit one model per fold with ``python -m src.cli fit <words>`` and return each fold's val metrics.

    Args:
        words: The words a user would pass to ``fit`` (configs and overrides).
        folds: How many folds; fold ``k``'s run holds out fold ``k`` as its validation split.
        group: The folder, under the experiment's log folder, that holds the runs (``fold<k>`` each);
            a time stamp when left out.
        after_fold: Called with the fold number and its metrics after each fold (a sweep prunes here).
    """
    group = group or time.strftime(f"cv{folds}-%Y%m%d-%H%M%S")
    results = []
    for fold in range(folds):
        run = main(
            ["fit", *fold_words(words, folds, fold), f"--trainer.logger.init_args.version={group}/fold{fold}"]
        )
        results.append(run_metrics(run))
        if after_fold is not None:
            after_fold(fold, results[-1])
    summarize([f"fold{k}" for k in range(folds)], results, _group_folder(run))
    return results


def repeat(words: Sequence[str], seeds: int, group: str | None = None) -> list[Metrics]:
    """Fit and test the same config with seeds 0 … ``seeds - 1``; return each run's test metrics."""
    group = group or time.strftime(f"seeds{seeds}-%Y%m%d-%H%M%S")
    results = []
    for seed in range(seeds):
        run = main(
            [
                "fit",
                *words,
                f"--seed_everything={seed}",
                f"--data.seed={seed}",
                "--test_after_fit=true",
                f"--trainer.logger.init_args.version={group}/seed{seed}",
            ]
        )
        results.append(run_metrics(run, ("test/",)))
    summarize([f"seed{s}" for s in range(seeds)], results, _group_folder(run))
    return results


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarize(names: list[str], results: list[Metrics], folder: Path | None) -> str:
    """Print one line per metric (each run's value, then mean ± std), and log them beside the runs."""
    metrics = [m for m in results[0] if all(m in r for r in results)]
    width = max(map(len, metrics), default=0)
    lines = [f"{'':{width}}  " + "  ".join(f"{n:>8}" for n in names) + "  mean ± std"]
    summary: dict[str, dict[str, float]] = {}
    for metric in metrics:
        values = [r[metric] for r in results]
        mean, std = mean_std(values)
        summary[metric] = {**dict(zip(names, values, strict=True)), "mean": mean, "std": std}
        cells = "  ".join(f"{v:8.4f}" for v in values)
        lines.append(f"{metric:{width}}  {cells}  {mean:.4f} ± {std:.4f}")
    table = "\n".join(lines)
    print(table)
    if folder is not None:
        with written(folder / "summary.yaml") as (partial,):
            partial.write_text(yaml.safe_dump(summary, sort_keys=False))
        with SummaryWriter(str(folder)) as writer:
            for metric, row in summary.items():
                for step, name in enumerate(names):
                    writer.add_scalar(f"summary/{metric}", row[name], step)
                writer.add_scalar(f"summary/{metric}_mean", row["mean"], 0)
                writer.add_scalar(f"summary/{metric}_std", row["std"], 0)
        print(f"Summary written to {folder / 'summary.yaml'}")
    return table


def _group_folder(run: CLI) -> Path | None:
    """The folder that holds a group's runs: the parent of the last run's log folder."""
    log_dir = run.trainer.log_dir
    return Path(log_dir).parent if log_dir is not None else None


def cli_main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m src.apps.cv",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--folds", type=int, help="cross-validate with this many folds")
    mode.add_argument("--seeds", type=int, help="repeat the run with this many seeds")
    options, words = parser.parse_known_args(argv)
    if (options.folds if options.folds is not None else options.seeds) < 1:
        parser.error("--folds and --seeds take a positive count")
    if options.folds is not None:
        cross_validate(words, options.folds)
    else:
        repeat(words, options.seeds)
