"""The libraries a data scientist would pick instead of the template, fitted with their own defaults.

CatBoost, LightGBM and XGBoost (gradient boosting), and RealMLP and TabM from pytabkit (deep tabular
models, ``--deep``), each on the raw columns of the very rows the template's split gives the net
(:func:`rows_of`): numbers parsed by the template's rule (text that is not a number and empty cells are
NaN), categories as text with each library's own categorical handling (CatBoost's ``cat_features``,
pandas ``category`` columns for LightGBM, XGBoost and pytabkit). Nothing is tuned: each model gets its
library's defaults and one thread (the template's net trains on one), and is scored on the validation and
test rows.

They are not in ``requirements.lock``: ``pip install -e '.[bench]'`` brings them. A library that is not
installed is left out with a line saying so.
"""

import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from sklearn.metrics import accuracy_score, root_mean_squared_error
from sklearn.preprocessing import LabelEncoder

from src.extras.tables.preprocessing import category_strings, infer_kinds, label_values, numeric_values
from src.extras.tables.sources import Table

#: gradient boosting libraries: the bar the template is held to
BOOSTING = ("catboost", "lightgbm", "xgboost")
#: deep tabular models (pytabkit): slower on a CPU, fitted only when asked for
DEEP = ("realmlp", "tabm")
#: the package each model needs
PACKAGE = {"catboost": "catboost", "lightgbm": "lightgbm", "xgboost": "xgboost", "realmlp": "pytabkit",
           "tabm": "pytabkit"}  # fmt: skip
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Rows:
    """One table's split as the libraries read it: raw features per split, targets, categorical names."""

    features: dict[str, pd.DataFrame]
    targets: dict[str, np.ndarray]  #: class ids (0 … K-1) or values
    categorical: list[str]
    task: str


def rows_of(table: Table, split_rows: dict[str, np.ndarray]) -> Rows:
    """The template's table (:attr:`src.extras.tables.TabularDataModule.table`) at its split's positions.

    Numbers by the template's rule (NaN for missing and stray text); categories as canonical text, the
    same kinds the template infers; labels encoded on the training split.
    """
    numeric, categorical, tokens = infer_kinds(table.features, table.location)
    frame = pd.DataFrame(index=table.features.index)
    for name in numeric:
        frame[name] = numeric_values(table.features[name], table.location, tokens.get(name, ()))
    for name in categorical:
        frame[name] = category_strings(table.features[name])
    features = {split: frame.iloc[split_rows[split]].reset_index(drop=True) for split in SPLITS}
    if table.task == "classification":
        labels = label_values(table.target)
        encoder = LabelEncoder().fit(labels[split_rows["train"]])
        targets = {split: encoder.transform(labels[split_rows[split]]) for split in SPLITS}
    else:
        values = table.target.to_numpy(np.float64)
        targets = {split: values[split_rows[split]] for split in SPLITS}
    return Rows(features, targets, categorical, table.task)


def with_categories(rows: Rows) -> dict[str, pd.DataFrame]:
    """The features with each categorical column as a pandas ``category`` of the training split's values
    (a value never seen in training is missing)."""
    out = {split: frame.copy() for split, frame in rows.features.items()}
    for name in rows.categorical:
        levels = sorted(set(rows.features["train"][name]))
        for frame in out.values():
            frame[name] = pd.Categorical(frame[name], categories=levels)
    return out


def catboost(rows: Rows, seed: int) -> tuple[Any, dict[str, pd.DataFrame]]:
    import catboost as cb

    cls = cb.CatBoostClassifier if rows.task == "classification" else cb.CatBoostRegressor
    model = cls(random_seed=seed, thread_count=1, verbose=0, cat_features=rows.categorical,
                allow_writing_files=False)  # fmt: skip
    return model, rows.features


def lightgbm(rows: Rows, seed: int) -> tuple[Any, dict[str, pd.DataFrame]]:
    import lightgbm as lgb

    cls = lgb.LGBMClassifier if rows.task == "classification" else lgb.LGBMRegressor
    return cls(random_state=seed, n_jobs=1, verbose=-1), with_categories(rows)


def xgboost(rows: Rows, seed: int) -> tuple[Any, dict[str, pd.DataFrame]]:
    import xgboost as xgb

    cls = xgb.XGBClassifier if rows.task == "classification" else xgb.XGBRegressor
    return cls(random_state=seed, n_jobs=1, enable_categorical=True), with_categories(rows)


def realmlp(rows: Rows, seed: int) -> tuple[Any, dict[str, pd.DataFrame]]:
    import pytabkit

    cls = pytabkit.RealMLP_TD_Classifier if rows.task == "classification" else pytabkit.RealMLP_TD_Regressor
    return cls(random_state=seed, n_threads=1, device="cpu", verbosity=0), with_categories(rows)


def tabm(rows: Rows, seed: int) -> tuple[Any, dict[str, pd.DataFrame]]:
    import pytabkit

    cls = pytabkit.TabM_D_Classifier if rows.task == "classification" else pytabkit.TabM_D_Regressor
    return cls(random_state=seed, n_threads=1, device="cpu", verbosity=0), with_categories(rows)


BUILDERS: dict[str, Callable[[Rows, int], tuple[Any, dict[str, pd.DataFrame]]]] = {
    "catboost": catboost, "lightgbm": lightgbm, "xgboost": xgboost, "realmlp": realmlp, "tabm": tabm,
}  # fmt: skip


def installed(models: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """``(installed, missing)`` among ``models``, by whether their package can be imported."""
    found = [m for m in models if importlib.util.find_spec(PACKAGE[m]) is not None]
    return found, [m for m in models if m not in found]


def main_metric(task: str, target: np.ndarray, preds: np.ndarray) -> float:
    """Accuracy, or RMSE for regression: the figure the tables benchmark compares."""
    if task == "classification":
        return float(accuracy_score(target, preds))
    return float(root_mean_squared_error(target, preds))


def fit_and_score(name: str, rows: Rows, seed: int) -> dict[str, float]:
    """One library's model fitted on the training rows: its validation and test main metric, and the
    seconds its fit and both predictions took."""
    start = time.perf_counter()
    model, frames = BUILDERS[name](rows, seed)
    model.fit(frames["train"], rows.targets["train"])
    found: dict[str, float] = {}
    for split in ("val", "test"):
        preds = np.asarray(model.predict(frames[split])).reshape(len(frames[split]), -1)[:, 0]
        found[split] = main_metric(rows.task, rows.targets[split], preds)
    found["seconds"] = time.perf_counter() - start
    return found
