"""The baselines' models on a table's raw columns: gradient boosting and a linear model, built, fitted and
run wherever :class:`src.extras.baselines.callback.Baselines` sends them, by default a process of their own.

No Lightning and no torch here: such a process starts in the time scikit-learn takes to import, and the
training's interpreter never runs the boosting's Python (which would hold its lock while the net trains).
"""

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]  # no py.typed, no stubs

if TYPE_CHECKING:  # the models' modules are imported where they are built: a callback that only sends
    from sklearn.base import BaseEstimator  # their fit to a worker process never imports them

#: gradient boosting reads at most this many categories of a column as categories of their own (its
#: histograms hold 255 bins); the rarer ones share one
MAX_BOOSTED_CATEGORIES = 255
#: boosting's learning rate at scikit-learn's 100 iterations, its default; a smaller budget of iterations
#: takes larger steps (:func:`learning_rate`), at most MAX_LEARNING_RATE
LEARNING_RATE = 0.1
MAX_LEARNING_RATE = 0.3
#: boosting stops early on a tenth of its training rows, held out (stratified by class), when each class
#: (each label's 0 and 1) has at least this many training rows, and a regression at least 10 times it
EARLY_STOPPING_ROWS = 10


@dataclass(frozen=True)
class Spec:
    """What the models are built from: the task, the raw columns the net reads by kind, the class count
    (1 for regression), boosting's most iterations, whether it stops early (:func:`can_stop_early`) and its
    seed, the threads of scikit-learn's pools (``None``: one per core), and ``targets``: K for ``(N, K)``
    targets (K labels of 0 or 1, or K values), 0 for ``(N,)`` ones."""

    task: str
    numeric: list[str]
    categorical: list[str]
    classes: int
    max_iter: int
    seed: int
    threads: int | None
    targets: int = 0
    early_stopping: bool = False
    learning_rate: float = LEARNING_RATE


@dataclass
class Fitted:
    """The fitted models by name; their outputs on each evaluated split (:func:`outputs`), by split then
    model; the seconds fitting and running them took; the process that did it."""

    models: "dict[str, BaseEstimator]"
    outputs: dict[str, dict[str, np.ndarray]]
    seconds: float
    pid: int
    #: boosting's iterations run (the most over K targets' models), up to ``Spec.max_iter``
    iterations: int = 0


def learning_rate(iterations: int) -> float:
    """Boosting's learning rate for a budget of ``iterations``: the steps of scikit-learn's defaults (100
    iterations at 0.1) in as many fewer, larger ones, the shrinkage and iteration count traded as boosting
    trades them; 0.1 from 100 iterations on, at most :data:`MAX_LEARNING_RATE` (33 iterations and fewer),
    beyond which boosting of many classes diverges."""
    return min(max(LEARNING_RATE * 100 / iterations, LEARNING_RATE), MAX_LEARNING_RATE)


def can_stop_early(task: str, y: np.ndarray) -> bool:
    """Whether boosting's own early stopping can hold out a tenth of the training targets ``y`` (``(N,)``
    or ``(N, K)``): for classification a stratified tenth, which needs every class of every target in it
    (:data:`EARLY_STOPPING_ROWS` rows of each)."""
    if task != "classification":
        return len(y) >= 10 * EARLY_STOPPING_ROWS
    columns = y.reshape(len(y), -1).T  # (K, N): each target's classes
    return all(np.unique(column, return_counts=True)[1].min() >= EARLY_STOPPING_ROWS for column in columns)


def build_models(spec: Spec) -> "dict[str, BaseEstimator]":
    """The two baselines, unfitted, each a pipeline from the raw columns (numbers as numbers with NaN for
    missing cells, categories as text).

    ``hgb``: HistGradientBoosting with scikit-learn's defaults but the budget (at most ``max_iter``
    iterations at ``spec.learning_rate``; its early stopping when ``spec.early_stopping``), numbers as they
    are (missing cells its own way), each categorical column as a native categorical feature (its
    :data:`MAX_BOOSTED_CATEGORIES` most frequent values). ``linear``: logistic or ridge regression on
    numbers filled with the median (with a missing indicator) and
    standardized, and every training value of a categorical column one-hot (unseen ones: none).
    K targets at once (``spec.targets``): one boosting model per target (scikit-learn's
    ``MultiOutputClassifier`` / ``MultiOutputRegressor``), one logistic regression per label, and one ridge
    regression of all K values (ridge fits several outputs itself).
    """
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.multioutput import MultiOutputClassifier, MultiOutputRegressor
    from sklearn.pipeline import Pipeline, make_pipeline
    from sklearn.preprocessing import OneHotEncoder, OrdinalEncoder, StandardScaler

    ordinal = OrdinalEncoder(
        handle_unknown="use_encoded_value", unknown_value=np.nan, max_categories=MAX_BOOSTED_CATEGORIES
    )
    trees = ColumnTransformer(
        [("numbers", "passthrough", spec.numeric), ("categories", ordinal, spec.categorical)],
        remainder="drop",
    )
    is_categorical = np.array([False] * len(spec.numeric) + [True] * len(spec.categorical))
    lines = ColumnTransformer(
        [
            ("numbers", make_pipeline(SimpleImputer(strategy="median", add_indicator=True), StandardScaler()),
             spec.numeric),
            ("categories", OneHotEncoder(handle_unknown="ignore"), spec.categorical),
        ],
        remainder="drop",
    )  # fmt: skip
    options = {
        "max_iter": spec.max_iter,
        "learning_rate": spec.learning_rate,
        "early_stopping": spec.early_stopping,
        "random_state": spec.seed,
        "categorical_features": is_categorical,
    }
    hgb: Any
    linear: Any
    if spec.task == "classification":
        hgb, linear = HistGradientBoostingClassifier(**options), LogisticRegression(max_iter=1000)
        if spec.targets:
            hgb, linear = MultiOutputClassifier(hgb), MultiOutputClassifier(linear)
    else:
        hgb, linear = HistGradientBoostingRegressor(**options), Ridge()
        if spec.targets:
            hgb = MultiOutputRegressor(hgb)
    return {"hgb": Pipeline([("columns", trees), ("model", hgb)]), "linear": make_pipeline(lines, linear)}


def outputs(model: Any, x: pd.DataFrame, spec: Spec) -> np.ndarray:
    """A fitted model's ``(N, K)`` class probabilities (a class absent from its training rows: 0), or for K
    labels the ``(N, K)`` probability of each being 1 (one never 1 in the training rows: 0), or its ``(N,)``
    or ``(N, K)`` values in the targets' units."""
    with threadpool_limits(spec.threads):
        if spec.task != "classification":
            return np.asarray(model.predict(x), dtype=np.float64)
        if spec.targets:  # one (N, 2) array per label, its columns the label's classes seen in training
            ones = np.zeros((len(x), spec.targets), dtype=np.float64)
            for k, (probs, classes) in enumerate(zip(model.predict_proba(x), model.classes_, strict=True)):
                seen = list(classes.astype(int))
                ones[:, k] = probs[:, seen.index(1)] if 1 in seen else 0.0
            return ones
        probs = np.zeros((len(x), spec.classes), dtype=np.float64)
        probs[:, model.classes_.astype(int)] = model.predict_proba(x)
        return probs


def fit(spec: Spec, train: tuple[pd.DataFrame, np.ndarray], evaluate: dict[str, pd.DataFrame]) -> Fitted:
    """Both models fitted on ``train`` (raw columns, targets), and their :func:`outputs` on each split of
    ``evaluate``."""
    start = time.perf_counter()
    models = build_models(spec)
    with threadpool_limits(spec.threads):
        for model in models.values():
            model.fit(*train)
    ran = {split: {name: outputs(m, x, spec) for name, m in models.items()} for split, x in evaluate.items()}
    boosted = models["hgb"][-1]  # the pipeline's model: one, or one per target
    iterations = max(m.n_iter_ for m in getattr(boosted, "estimators_", [boosted]))
    return Fitted(models, ran, time.perf_counter() - start, os.getpid(), iterations)
