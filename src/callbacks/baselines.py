"""Two scikit-learn models on the net's own rows, so that every run on a table says what the net is worth."""

import re
import time
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_debug, rank_zero_info
from sklearn.base import BaseEstimator
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
from sklearn.linear_model import LogisticRegression, Ridge
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]  # no py.typed, no stubs
from torchmetrics import MeanAbsoluteError, MeanSquaredError, MetricCollection, R2Score
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score
from typing_extensions import override

from src.data import TabularDataModule
from src.errors import UserInputError

Split = Literal["val", "test"]
#: per task, the metric the verdict compares and whether higher is better
MAIN = {"classification": ("acc", True), "regression": ("rmse", False)}
#: the baselines, by the name their figures carry
MODELS = ("hgb", "linear")
#: a baseline's figure as logged, ``val/acc_hgb`` beside the net's ``val/acc``: in the same TensorBoard
#: group (Time Series groups tags by their first part, and opens the first two groups alphabetically)
TAG = re.compile(rf"(val|test)/(.+)_({'|'.join(MODELS)})")


def tag(split: str, metric: str, model: str) -> str:
    """The name a baseline's figure is logged under: ``tag("val", "acc", "hgb")`` is ``val/acc_hgb``."""
    return f"{split}/{metric}_{model}"


#: gradient boosting's trees at most when ``max_iter`` is left to the classes: a multi-class model grows
#: one tree per class per iteration, so its cost grows with the class count
MAX_TREES = 300
#: the fewest iterations that leaves to a model of many classes
MIN_ITER = 20
#: scikit-learn's own defaults (100 iterations at 0.1, its regressor's too): the schedule of regression
#: and of few classes
SKLEARN = HistGradientBoostingClassifier().get_params()


def boosting_schedule(task: str, classes: int, max_iter: int | None) -> tuple[int, float]:
    """Gradient boosting's ``(max_iter, learning_rate)``.

    A given ``max_iter`` keeps scikit-learn's learning rate. ``None``: scikit-learn's defaults for
    regression and while their trees stay within ``MAX_TREES`` (up to 3 classes); beyond,
    ``MAX_TREES // classes`` iterations (at least ``MIN_ITER``), the learning rate raised in proportion,
    so that the ensemble takes the same total step in fewer, larger ones (10 classes: 30 at 0.33).
    """
    default_iter, default_rate = int(SKLEARN["max_iter"]), float(SKLEARN["learning_rate"])
    if max_iter is not None:
        return max_iter, default_rate
    trees_per_iter = classes if task == "classification" and classes > 2 else 1  # binary: one tree
    iterations = min(default_iter, max(MAX_TREES // trees_per_iter, MIN_ITER))
    return iterations, default_rate * default_iter / iterations


def build_models(task: str, classes: int, max_iter: int | None, seed: int) -> dict[str, BaseEstimator]:
    """The two baselines, unfitted: gradient boosting (its schedule: :func:`boosting_schedule`) and a
    linear model, with their defaults otherwise."""
    iterations, rate = boosting_schedule(task, classes, max_iter)
    if task == "classification":
        return {
            "hgb": HistGradientBoostingClassifier(max_iter=iterations, learning_rate=rate, random_state=seed),
            "linear": LogisticRegression(max_iter=1000),
        }
    hgb = HistGradientBoostingRegressor(max_iter=iterations, learning_rate=rate, random_state=seed)
    return {"hgb": hgb, "linear": Ridge()}


def fitting_rows(
    x: np.ndarray, y: np.ndarray, max_rows: int | None, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """The training rows the baselines fit on: all of them, or ``max_rows`` of them drawn without
    replacement by a generator seeded with ``seed``, in their order."""
    if max_rows is None or len(x) <= max_rows:
        return x, y
    kept = np.sort(np.random.default_rng(seed).choice(len(x), max_rows, replace=False))
    return x[kept], y[kept]


def metrics_of(task: str, classes: int) -> MetricCollection:
    """The metrics the shipped tasks log (src/models/classifier.py, regressor.py), unprefixed."""
    if task == "classification":
        return MetricCollection(
            {
                "acc": MulticlassAccuracy(classes, average="micro"),
                "f1": MulticlassF1Score(classes, average="macro"),
            }
        )
    return MetricCollection(
        {"mae": MeanAbsoluteError(), "rmse": MeanSquaredError(squared=False), "r2": R2Score()}
    )


def score(
    model: Any, x: np.ndarray, y: np.ndarray, task: str, classes: int, loss: dict[str, Any]
) -> dict[str, float]:
    """A fitted model's metrics on ``(x, y)``, and its ``loss`` as the task defines it.

    Classification: cross-entropy of ``predict_proba``, as the net's logits get it (no label smoothing
    or class weights, which change what the net's own val/loss means). Regression: the task's loss
    (``mse`` or ``huber``) on targets standardized by the training mean and std, when it trains on them.
    """
    target = torch.as_tensor(y)
    metrics = metrics_of(task, classes)
    if task == "classification":
        probs = np.zeros((len(x), classes), dtype=np.float64)
        probs[:, model.classes_.astype(int)] = model.predict_proba(x)  # a class absent in training: 0
        log_probs = torch.as_tensor(np.log(np.clip(probs, 1e-15, 1.0)), dtype=torch.float32)  # (N, K)
        values = metrics(log_probs, target)
        values["loss"] = F.cross_entropy(log_probs, target)
    else:
        preds = torch.as_tensor(model.predict(x), dtype=torch.float32)  # (N,) in the target's units
        values = metrics(preds, target)
        mean, std = loss["mean"], loss["std"]
        scaled_preds, scaled = (preds - mean) / std, (target - mean) / std
        if loss["loss_fn"] == "huber":
            values["loss"] = F.huber_loss(scaled_preds, scaled, delta=loss["huber_delta"])
        else:
            values["loss"] = F.mse_loss(scaled_preds, scaled)
    return {name: float(value) for name, value in values.items()}


class Baselines(Callback):
    """Fits HistGradientBoosting and a linear model (logistic or ridge) beside the net on a table.

    At fit start, on the training rows exactly as the net gets them (the same split, the same fitted
    preprocessing: :meth:`TabularDataModule.encoded`), scored with the task's own metrics on the
    validation rows, and on the test rows when the run is tested. Every validation epoch logs
    ``val/<metric>_<model>`` (``val/acc_hgb``: a flat line beside the net's ``val/acc`` in TensorBoard, and
    a value in ``trainer.callback_metrics``); a test logs ``test/<metric>_<model>``. Checkpoints carry the
    figures as plain floats (``checkpoint["baselines"]``). When the fit ends and the net's best
    validation main metric (accuracy, or RMSE for regression) trails the better baseline by more than
    ``margin``, one sentence says so and what to try. Data that is not a :class:`TabularDataModule`:
    nothing is fitted or logged.

    Every process fits the same models (seeded), so under DDP all log the same values without a sync.

    Args:
        max_iter: Boosting iterations at most, at scikit-learn's learning rate; the cost grows with it
            and, for classification, with the class count. ``None``: scikit-learn's 100 for regression
            and up to 3 classes; for more, a budget of 300 trees with the learning rate raised to match
            (:func:`boosting_schedule`), so that 10 classes cost a third of 100 iterations' time.
        margin: The relative shortfall the verdict forgives: within it the net counts as level. 1 %
            is about the seed-to-seed spread of the net on tables of a few thousand rows; on smaller
            validation splits one row weighs more than that, so any worse row is named.
        seed: Seeds gradient boosting (its own validation split when it stops early, on > 10,000 rows).
        max_rows: Fit on at most this many training rows, a seeded sample of them when there are more
            (:func:`fitting_rows`): the baselines are a reference, not a model to ship, and boosting's
            cost grows with the rows (200,000 rows of 64 numbers: 4.3 s, 50,000: 1.2 s on one thread).
            ``None``: every training row. The scores are always on every validation and test row.
        threads: Threads of scikit-learn's OpenMP and BLAS pools while fitting and scoring; ``None``
            leaves their default, one per core. One by default: on the small tables that need a
            baseline most, more threads cost more than they give, and many times more on cores that
            other work shares (benchmarks/results/tables.md).
    """

    def __init__(
        self,
        max_iter: int | None = None,
        margin: float = 0.01,
        seed: int = 0,
        max_rows: int | None = 50_000,
        threads: int | None = 1,
    ) -> None:
        if max_iter is not None and max_iter < 1:
            raise UserInputError(f"baselines.max_iter={max_iter} must be at least 1.")
        if not 0 <= margin < 1:
            raise UserInputError(f"baselines.margin={margin} must lie in [0, 1).")
        if max_rows is not None and max_rows < 1:
            raise UserInputError(f"baselines.max_rows={max_rows} must be at least 1, or null for every row.")
        if threads is not None and threads < 1:
            raise UserInputError(f"baselines.threads={threads} must be at least 1, or null for one per core.")
        self.max_iter, self.margin, self.seed, self.threads = max_iter, margin, seed, threads
        self.max_rows = max_rows
        #: the fitted models by name, once fitted
        self.models: dict[str, BaseEstimator] = {}
        #: ``{"hgb": {"val_acc": 0.9, ...}, "linear": {...}}``: what is logged and saved
        self.scores: dict[str, dict[str, float]] = {}
        #: seconds spent fitting and scoring the baselines in this run
        self.seconds = 0.0
        self._data: TabularDataModule | None = None
        self._loss: dict[str, Any] = {}
        self._net_best: float | None = None

    # -- fitting and scoring --------------------------------------------------------------------------

    def _fit(self, trainer: L.Trainer, pl_module: L.LightningModule) -> bool:
        """Fit the models once; whether there are any (only a table's DataModule has them)."""
        if self.models:
            return True
        # Trainer.datamodule is public and documented, but Lightning assigns it in its data connector
        # without declaring it on the class, so mypy cannot see it
        data = trainer.datamodule  # type: ignore[attr-defined]
        if not isinstance(data, TabularDataModule):
            rank_zero_debug(f"Baselines: {type(data).__name__} is not a table; no baselines.")
            return False
        start = time.perf_counter()
        x, y = fitting_rows(*data.encoded("train"), self.max_rows, self.seed)
        hparams = pl_module.hparams  # the Regressor's loss settings; their defaults for any other module
        standardize = data.task == "regression" and hparams.get("standardize_target", True)
        mean, std = data.target_stats() if standardize else (0.0, 1.0)
        self._loss = {
            "mean": mean,
            "std": std,
            "loss_fn": hparams.get("loss_fn", "mse"),
            "huber_delta": hparams.get("huber_delta", 1.0),
        }
        models = build_models(data.task, data.out_features, self.max_iter, self.seed)
        with threadpool_limits(self.threads):
            for model in models.values():
                model.fit(x, y)
        self.models, self._data = models, data
        self.seconds += time.perf_counter() - start
        return True

    def _score(self, split: Split) -> dict[str, dict[str, float]]:
        """Each model's ``<split>_<metric>`` figures, computed once per split."""
        data = self._data
        assert data is not None
        key = f"{split}_loss"
        if not all(key in self.scores.get(name, {}) for name in self.models):
            start = time.perf_counter()
            x, y = data.encoded(split)
            classes = data.out_features
            with threadpool_limits(self.threads):
                scores = {
                    name: score(m, x, y, data.task, classes, self._loss) for name, m in self.models.items()
                }
            for name, values in scores.items():
                self.scores.setdefault(name, {}).update({f"{split}_{k}": v for k, v in values.items()})
            self.seconds += time.perf_counter() - start
        return {
            name: {k: v for k, v in values.items() if k.startswith(f"{split}_")}
            for name, values in self.scores.items()
        }

    def _log(self, pl_module: L.LightningModule, split: Split) -> None:
        for name, values in self._score(split).items():
            for metric, value in values.items():
                # the same value on every process: the sync averages equal numbers, and keeps Lightning
                # from advising one for an epoch-level value under DDP
                pl_module.log(tag(split, metric.removeprefix(f"{split}_"), name), value, sync_dist=True)

    # -- the hooks ------------------------------------------------------------------------------------

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._net_best = None
        if self._fit(trainer, pl_module):
            self._score("val")

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._fit(trainer, pl_module):
            self._log(pl_module, "val")

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # here, not in on_validation_epoch_end: callbacks' epoch-end hooks run before the module's, so
        # the net's values of this epoch reach callback_metrics only afterwards
        if trainer.sanity_checking or self._data is None:
            return
        metric, higher = MAIN[self._data.task]
        logged = trainer.callback_metrics.get(f"val/{metric}")
        if logged is None:
            return
        value = float(logged)
        if self._net_best is None or (value > self._net_best if higher else value < self._net_best):
            self._net_best = value

    @override
    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._fit(trainer, pl_module):
            self._log(pl_module, "test")

    @override
    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self.scores:
            checkpoint["baselines"] = {name: dict(values) for name, values in self.scores.items()}

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero and (sentence := self.verdict()) is not None:
            rank_zero_info(sentence)

    @property
    def net_best(self) -> float | None:
        """The net's best validation main metric of this fit so far (``None`` before a validation)."""
        return self._net_best

    def verdict(self) -> str | None:
        """One sentence when the net's best validation main metric trails the better baseline by more
        than ``margin``; ``None`` when it is level or ahead, or nothing was compared."""
        if self._data is None or self._net_best is None or not self.scores:
            return None
        metric, higher = MAIN[self._data.task]
        key = f"val_{metric}"
        pick = max if higher else min
        best = pick(self.scores, key=lambda name: self.scores[name][key])
        theirs, ours = self.scores[best][key], self._net_best
        # the shortfall relative to the baseline's figure: 0.80 against 0.81 is 1.2 % behind
        shortfall = (theirs - ours) / abs(theirs) if higher else (ours - theirs) / abs(theirs)
        if not shortfall > self.margin:
            return None
        title = {"hgb": "HistGradientBoosting", "linear": "the linear model"}[best]
        return (
            f"The net's best val/{metric} {ours:.4g} trails {title}'s {theirs:.4g} on the same validation "
            f"rows ({shortfall:.1%} behind): try more rows (a smaller data.val_fraction / test_fraction), a "
            f"longer run (trainer.max_epochs, early_stopping patience), or the {best} model itself."
        )
