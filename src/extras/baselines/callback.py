"""Two scikit-learn models on the net's own table rows, fitted beside the training, so that every run on a
table says what the net is worth."""

import re
from collections.abc import Callable
from concurrent.futures import BrokenExecutor, Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, runtime_checkable

import lightning as L
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torchmetrics import MeanAbsoluteError, MeanSquaredError, R2Score
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassF1Score,
    MultilabelAccuracy,
    MultilabelF1Score,
)
from typing_extensions import override

from src.errors import UserInputError
from src.extras import workers
from src.extras.baselines import models as baseline_models
from src.extras.baselines.models import Spec
from src.extras.loggers import last_by_cap

if TYPE_CHECKING:
    from sklearn.base import BaseEstimator

Split = Literal["train", "val", "test"]
#: the baselines, by the name their figures carry
MODELS = ("hgb", "linear")
#: a baseline's figure as logged, ``val/acc_hgb`` beside the net's ``val/acc``: in the same TensorBoard
#: group (Time Series groups tags by their first part, and opens the first two groups alphabetically)
TAG = re.compile(rf"(val|test)/(.+)_({'|'.join(MODELS)})")
#: the figures logged per task, by the names the shipped tasks log theirs under, each built for the class
#: count, and whether higher is better; classification adds ``loss``, the cross-entropy of the probabilities
METRICS: dict[str, dict[str, tuple[Any, bool]]] = {
    "classification": {
        "acc": (lambda k: MulticlassAccuracy(k, average="micro"), True),
        "f1": (lambda k: MulticlassF1Score(k, average="macro"), True),
    },
    "regression": {
        "mae": (lambda k: MeanAbsoluteError(), False),
        "rmse": (lambda k: MeanSquaredError(squared=False), False),
        "r2": (lambda k: R2Score(), True),
    },
}
#: the figures of K targets at once, by the same names: K labels of 0 or 1 (each a positive above a
#: probability of 0.5, averaged over the labels, as torchmetrics' multi-label metrics do by default); K
#: values (over every value, R² of each output averaged); classification adds ``loss``, the binary
#: cross-entropy of the probabilities
MANY_METRICS: dict[str, dict[str, tuple[Any, bool]]] = {
    "classification": {
        "acc": (lambda k: MultilabelAccuracy(k), True),
        "f1": (lambda k: MultilabelF1Score(k), True),
    },
    "regression": METRICS["regression"],
}
#: per task, the figure the verdict compares unless told otherwise
VERDICT_METRIC = {"classification": "acc", "regression": "rmse"}
TITLE = {"hgb": "HistGradientBoosting", "linear": "the linear model"}


T = TypeVar("T")
#: ``fit_in="auto"``'s largest budget for a thread, in trees (a fit of 10 epochs at 10 trees an epoch):
#: boosting's Python holds the interpreter's lock for each tree it grows, which the training waits for;
#: a worker's fresh interpreter outlasts a fit shorter than that
THREAD_TREES = 100
#: the fewest iterations a fit's budget gives boosting (a one-epoch fit's of K classes)
MIN_ITERATIONS = 5


def _submit(fit_in: str, function: Callable[..., T], *args: Any) -> "Future[T]":
    """``function(*args)`` on a thread of its own (``fit_in="thread"``), or on the baselines' worker
    process (:mod:`src.extras.workers`)."""
    if fit_in == "process":
        return workers.submit("baselines", function, *args)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="baselines")
    future = pool.submit(function, *args)
    pool.shutdown(wait=False)  # the thread ends with its one task
    return future


def tag(split: str, metric: str, model: str) -> str:
    """The name a baseline's figure is logged under: ``tag("val", "acc", "hgb")`` is ``val/acc_hgb``."""
    return f"{split}/{metric}_{model}"


@runtime_checkable
class RawSplits(Protocol):
    """What the baselines read from a DataModule (the core's array DataModule and the table kind's offer
    it): the task, the width of the net's head, and each split's rows as read. Any other DataModule gets
    no baselines."""

    @property
    def task(self) -> str:
        """``classification`` or ``regression``."""

    @property
    def out_features(self) -> int:
        """The class count of one target's classification; K for K targets; 1 for one value."""

    def raw_split(self, split: str) -> tuple[pd.DataFrame, np.ndarray]:
        """One split's feature columns as read (numbers as floats, NaN where missing; categories as text)
        and its targets: ``(N,)`` class ids as the net's or values, or ``(N, K)`` (K labels of 0 or 1, or
        K values)."""


def raw_rows(
    data: RawSplits, split: Split, rows: np.ndarray | None = None
) -> tuple[pd.DataFrame, np.ndarray]:
    """One split's rows (:meth:`RawSplits.raw_split`); ``rows``: positions within the split to keep (all
    of them when ``None``)."""
    frame, targets = data.raw_split(split)
    if rows is None:
        return frame, targets
    return frame.iloc[rows].reset_index(drop=True), targets[rows]


def sample(count: int, max_rows: int | None, seed: int) -> np.ndarray | None:
    """The positions of the training rows the baselines fit on: ``None`` for all of them, or ``max_rows``
    of them drawn without replacement by a generator seeded with ``seed``, in their order."""
    if max_rows is None or count <= max_rows:
        return None
    return np.sort(np.random.default_rng(seed).choice(count, max_rows, replace=False))


def score(output: np.ndarray, y: np.ndarray, task: str, classes: int) -> dict[str, float]:
    """A model's figures from its ``output`` on rows whose targets are ``y`` (:data:`METRICS`): ``(N, K)``
    class probabilities or ``(N,)`` values (:func:`src.extras.baselines.models.outputs`). Classification adds
    ``loss``, the cross-entropy of the probabilities as the net's logits get it (no label smoothing or
    class weights, which change what the net's own val/loss means). ``(N, K)`` targets ``y``
    (:data:`MANY_METRICS`): K labels' probabilities of being 1, or K values."""
    # C-ordered copies: a frame's columns and a model's outputs may be column-major or read-only
    target = torch.as_tensor(np.ascontiguousarray(y))
    output = np.ascontiguousarray(output)
    many = target.ndim == 2
    table = MANY_METRICS if many else METRICS
    metrics = {name: build(target.shape[1] if many else classes) for name, (build, _) in table[task].items()}
    values: dict[str, Any] = {}
    if task == "classification" and many:  # (N, K) probabilities that each label is 1
        preds = torch.as_tensor(output, dtype=torch.float32)
        values["loss"] = F.binary_cross_entropy(preds.clamp(1e-7, 1 - 1e-7), target.float())
        target = target.int()
    elif task == "classification":
        preds = torch.as_tensor(np.log(np.clip(output, 1e-15, 1.0)), dtype=torch.float32)  # (N, K)
        values["loss"] = F.cross_entropy(preds, target)
    else:
        preds = torch.as_tensor(output, dtype=torch.float32)  # (N,) in the target's units
        target = target.float()
    for name, metric in metrics.items():
        values[name] = metric(preds, target)
    return {name: float(value) for name, value in values.items()}


class Baselines(Callback):
    """Fits HistGradientBoosting and a linear model (logistic or ridge) beside the net on a table.

    On the very rows of the net's training split, from the raw columns the net reads (each model encodes
    them its own way: :func:`src.extras.baselines.models.build_models`), on a thread or in a process of
    their own started once the data is split, so that the training goes on and never waits for them, but
    at the fit's last validation epoch by its cap (``max_epochs``, ``max_steps``), and when the fit ends.
    Their budget fits the fit's (:meth:`budget`): boosting grows ``trees_per_epoch`` trees per epoch of the
    fit's ``max_epochs``, at a learning rate that fits that many iterations, and stops early on its own
    held-out rows where their classes allow (:func:`src.extras.baselines.models.can_stop_early`);
    ``threads`` leave the training its cores.
    Scored with the task's figures (:data:`METRICS`) on the validation rows, and on the test rows when the
    run is tested. Every validation epoch from the first after they are in logs ``val/<metric>_<model>``
    (``val/acc_hgb``: a flat line beside the net's ``val/acc`` in TensorBoard, and a value in
    ``trainer.callback_metrics``); a fit that ends before (early stopping) writes them to its loggers at
    its last step. A test logs ``test/<metric>_<model>``. Checkpoints carry the figures as plain floats
    (``checkpoint["baselines"]``) once they are in. When the fit ends, one sentence compares the net's
    best validation ``val/<verdict_metric>`` with the better baseline's and says the baselines' budget;
    when the net trails by more than ``margin``, it says what to try.

    What it reads: the DataModule's rows through :class:`RawSplits` (a DataModule without them gets no
    baselines), and the net's logged ``val/<verdict_metric>``; nothing of the LightningModule.

    Every process fits the same models (seeded), so under DDP all log the same values without a sync.

    Args:
        max_iter: Gradient boosting's most iterations (scikit-learn's default, 100, at its learning rate 0.1;
            a model of K > 2 classes, or of K targets, grows K trees per iteration).
        trees_per_epoch: Boosting's trees per epoch of the fit's ``max_epochs``, so that baselines of seconds
            go with a fit of seconds: a model growing one tree an iteration (a value, two classes) gets as
            many iterations (10 per epoch: 10 epochs or more reach ``max_iter``), one of K classes or targets
            a K-th of them; at least :data:`MIN_ITERATIONS`, at most ``max_iter``. ``None``: ``max_iter``,
            whatever the fit's length (also a fit without ``max_epochs``).
        margin: The relative shortfall the verdict forgives: within it the net counts as level. 1 %
            is about the seed-to-seed spread of the net on tables of a few thousand rows; on smaller
            validation splits one row weighs more than that, so any worse row is named.
        seed: Seeds gradient boosting (its own validation split when it stops early, on > 10,000 rows) and
            the sample of ``max_rows``.
        max_rows: Fit on at most this many training rows, a seeded sample of them when there are more
            (:func:`sample`): the baselines are a reference, not a model to ship, and boosting's cost grows
            with the rows. ``None``: every training row. The scores are always on every validation and
            test row.
        threads: Threads of scikit-learn's OpenMP and BLAS pools while fitting and scoring; ``None``
            leaves their default, one per core. One by default: they run beside the training, which keeps
            the other cores.
        fit_in: ``thread``: a thread of the training's process, where scikit-learn is imported already;
            boosting's Python holds the interpreter's lock while it runs, which the training waits for.
            ``process``: a process of their own (:mod:`src.extras.workers`, importing scikit-learn only),
            which never holds the training's lock; its start (a fresh interpreter, about a second) is paid
            beside the fit's first epochs. ``auto``: a thread for a budget of at most
            :data:`THREAD_TREES` trees (a short fit, which a process's start would outlast), else a
            process.
        verdict_metric: The figure the verdict compares, as the net logs it under ``val/``: ``acc`` or
            ``f1`` for classification, ``rmse``, ``mae`` or ``r2`` for regression. ``None``: ``acc``, or
            ``rmse`` for regression.
    """

    def __init__(
        self,
        max_iter: int = 100,
        trees_per_epoch: int | None = 10,
        margin: float = 0.01,
        seed: int = 0,
        max_rows: int | None = 50_000,
        threads: int | None = 1,
        verdict_metric: str | None = None,
        fit_in: Literal["auto", "process", "thread"] = "auto",
    ) -> None:
        if max_iter < 1:
            raise UserInputError(f"baselines.max_iter={max_iter} must be at least 1.")
        if trees_per_epoch is not None and trees_per_epoch < 1:
            raise UserInputError(
                f"baselines.trees_per_epoch={trees_per_epoch} must be at least 1, or null for max_iter."
            )
        if not 0 <= margin < 1:
            raise UserInputError(f"baselines.margin={margin} must lie in [0, 1).")
        if max_rows is not None and max_rows < 1:
            raise UserInputError(f"baselines.max_rows={max_rows} must be at least 1, or null for every row.")
        if threads is not None and threads < 1:
            raise UserInputError(f"baselines.threads={threads} must be at least 1, or null for one per core.")
        known = sorted({name for metrics in METRICS.values() for name in metrics})
        if verdict_metric is not None and verdict_metric not in known:
            raise UserInputError(f"baselines.verdict_metric={verdict_metric!r} is not one of {known}.")
        self.max_iter, self.margin, self.seed, self.threads = max_iter, margin, seed, threads
        self.max_rows, self.verdict_metric = max_rows, verdict_metric
        self.trees_per_epoch = trees_per_epoch
        if fit_in not in ("auto", "process", "thread"):
            raise UserInputError(f"baselines.fit_in={fit_in!r} is not 'auto', 'process' or 'thread'.")
        self.fit_in = fit_in
        #: where this fit's baselines run: ``fit_in``, with ``auto`` decided by the budget
        self.fitted_in = "thread" if fit_in == "auto" else fit_in
        #: the fitted models by name, once fitted
        self.models: dict[str, BaseEstimator] = {}
        #: ``{"hgb": {"val_acc": 0.9, ...}, "linear": {...}}``: what is logged and saved
        self.scores: dict[str, dict[str, float]] = {}
        #: seconds spent fitting the baselines and running them on the evaluated splits (beside the training)
        self.seconds = 0.0
        #: the process id that fitted them (this process's when ``fit_in="thread"``)
        self.fitted_by: int | None = None
        #: boosting's iterations run, the most this fit allowed it (:meth:`budget`) and their learning rate
        self.iterations = 0
        self.budget_iterations = 0
        self.learning_rate = baseline_models.LEARNING_RATE
        self._data: RawSplits | None = None
        self._spec: Spec | None = None
        self._targets: dict[str, np.ndarray] = {}
        self._outputs: dict[str, dict[str, np.ndarray]] = {}
        self._pending: Future[baseline_models.Fitted] | None = None
        self._net_best: float | None = None
        self._logged = False  # whether this fit's validation epochs logged the figures yet
        self._told = False  # whether this run was told that its data offers no table rows

    # -- fitting and scoring, beside the training -----------------------------------------------------

    def _start(self, trainer: L.Trainer) -> None:
        """Start fitting beside the training, once, when the data offers a table's rows."""
        if self._data is not None:
            return
        # Trainer.datamodule is public and documented, but Lightning assigns it in its data connector
        # without declaring it on the class, so mypy cannot see it
        data = trainer.datamodule  # type: ignore[attr-defined]
        if not isinstance(data, RawSplits):
            if not self._told:  # once for the run, however many stages start
                self._told = True
                rank_zero_info(
                    f"Baselines fit on the raw rows of each split (a DataModule with task, out_features and "
                    f"raw_split); {type(data).__name__} offers none, so this run has no baselines."
                )
            return
        self._data = data
        # read here, on the calling thread, which owns the DataModule; the models get the raw columns, and
        # their outputs on every split are scored here against the targets once they are back
        train = raw_rows(data, "train")
        kept = sample(len(train[1]), self.max_rows, self.seed)
        if kept is not None:
            train = train[0].iloc[kept].reset_index(drop=True), train[1][kept]
        categories = train[0].dtypes.map(lambda dtype: not pd.api.types.is_numeric_dtype(dtype))
        classes = data.out_features if data.task == "classification" and train[1].ndim == 1 else 1
        targets = train[1].shape[1] if train[1].ndim == 2 else 0  # K of (N, K) targets
        # trees grown per iteration: one per class beyond two, or one model per target
        trees = max(targets, classes if classes > 2 else 1)
        self.budget_iterations = self.budget(trainer, trees)
        self.learning_rate = baseline_models.learning_rate(self.budget_iterations)
        self._spec = spec = Spec(
            task=data.task,
            numeric=[str(c) for c in train[0].columns[~categories]],
            categorical=[str(c) for c in train[0].columns[categories]],
            classes=classes,
            max_iter=self.budget_iterations,
            seed=self.seed,
            threads=self.threads,
            targets=targets,
            early_stopping=baseline_models.can_stop_early(data.task, train[1]),
            learning_rate=self.learning_rate,
        )
        evaluated = {split: raw_rows(data, split) for split in ("val", "test")}
        evaluated = {split: rows for split, rows in evaluated.items() if len(rows[1])}
        self._targets = {split: y for split, (_, y) in evaluated.items()}
        frames = {split: x for split, (x, _) in evaluated.items()}
        if self.fit_in == "auto":
            small = self.budget_iterations == MIN_ITERATIONS or self.budget_iterations * trees <= THREAD_TREES
            self.fitted_in = "thread" if small else "process"
        self._pending = _submit(self.fitted_in, baseline_models.fit, spec, train, frames)

    def budget(self, trainer: L.Trainer, trees: int = 1) -> int:
        """Boosting's most iterations for this fit, growing ``trees`` trees each: ``trees_per_epoch`` trees
        per epoch of ``max_epochs``, at least :data:`MIN_ITERATIONS` and at most ``max_iter``; ``max_iter``
        for validate and test, whose trainer settings say nothing of a fit."""
        epochs = trainer.max_epochs
        fitting = trainer.state.fn == TrainerFn.FITTING  # validate and test keep pace with no fit: max_iter
        if self.trees_per_epoch is None or epochs is None or epochs < 0 or not fitting:
            return self.max_iter
        iterations = -(-self.trees_per_epoch * max(epochs, 1) // trees)  # rounded up
        return min(self.max_iter, max(iterations, MIN_ITERATIONS))

    def _take(self, fitted: baseline_models.Fitted) -> None:
        """The models of a finished fit, and their validation figures (the test rows' outputs are kept for
        a test: no test figure exists before the run is tested)."""
        self.models, self.seconds, self.fitted_by = fitted.models, fitted.seconds, fitted.pid
        self.iterations = fitted.iterations
        self._outputs = fitted.outputs
        for name, output in fitted.outputs.get("val", {}).items():
            self._score("val", name, output)

    def _score(self, split: str, name: str, output: np.ndarray) -> None:
        assert self._spec is not None
        values = score(output, self._targets[split], self._spec.task, self._spec.classes)
        self.scores.setdefault(name, {}).update({f"{split}_{k}": v for k, v in values.items()})

    def _ready(self, trainer: L.Trainer, wait: bool = True) -> bool:
        """Whether there are figures: the background fit waited for (``wait``), or done already. Under
        DDP every process must log the same values in the same epoch: they agree to log once all are done.
        An error in the fit is raised here, on the calling thread; a worker process that ended before it
        answered (killed for memory, say) costs the baselines of this run, not the run."""
        if self._pending is not None:
            done = wait or self._pending.done()
            if trainer.world_size > 1:
                done = trainer.strategy.reduce_boolean_decision(done, all=True)
            if not done:
                return False
            pending, self._pending = self._pending, None
            try:
                self._take(pending.result())
            except BrokenExecutor as error:
                rank_zero_warn(
                    f"The baselines' worker process ended before it answered ({error}); this run has none."
                )
            all_have = bool(self.models)
            if trainer.world_size > 1:  # all log them, or none does
                all_have = trainer.strategy.reduce_boolean_decision(all_have, all=True)
            if not all_have:
                self.models, self.scores = {}, {}
        return bool(self.models)

    def _log(self, pl_module: L.LightningModule, split: Literal["val", "test"]) -> None:
        for name, values in self.scores.items():
            for key, value in values.items():
                if key.startswith(f"{split}_"):
                    # the same value on every process: the sync averages equal numbers, and keeps
                    # Lightning from advising one for an epoch-level value under DDP
                    pl_module.log(tag(split, key.removeprefix(f"{split}_"), name), value, sync_dist=True)

    # -- the hooks ------------------------------------------------------------------------------------

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":  # once the DataModule has split and fitted its rows, before the net is set up
            self._start(trainer)

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._net_best = None
        self._logged = False
        self._start(trainer)

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start(trainer)  # validate alone: no fit started them

    @override
    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start(trainer)

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # not while sanity checking: its values are thrown away, and the training has not started yet.
        # The training goes on while the models fit; the fit's last epoch by its cap waits for them
        if not trainer.sanity_checking and self._ready(trainer, wait=last_by_cap(trainer)):
            self._log(pl_module, "val")
            self._logged = True

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # here, not in on_validation_epoch_end: callbacks' epoch-end hooks run before the module's, so
        # the net's values of this epoch reach callback_metrics only afterwards
        if trainer.sanity_checking or self._data is None:
            return
        metric, higher = self._verdict_metric()
        logged = trainer.callback_metrics.get(f"val/{metric}")
        if logged is None:
            return
        value = float(logged)
        if self._net_best is None or (value > self._net_best if higher else value < self._net_best):
            self._net_best = value

    @override
    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._ready(trainer):
            return
        assert self._data is not None
        if not any(key.startswith("test_") for values in self.scores.values() for key in values):
            if "test" not in self._outputs:  # no test rows when the fit started
                x, self._targets["test"] = raw_rows(self._data, "test")
                assert self._spec is not None
                self._outputs["test"] = {
                    n: baseline_models.outputs(m, x, self._spec) for n, m in self.models.items()
                }
            for name, output in self._outputs["test"].items():
                self._score("test", name, output)
        self._log(pl_module, "test")

    @override
    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self._pending is None and self.scores:  # figures once they are in; never a wait here
            checkpoint["baselines"] = {name: dict(values) for name, values in self.scores.items()}

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._ready(trainer) and not self._logged:
            # a fit that ended (early stopping, a stop request) before they were in: their figures go to the
            # loggers at the last step, beside the net's curves, and the verdict below still compares them
            values = {tag("val", k[4:], name): v for name, s in self.scores.items() for k, v in s.items()
                      if k.startswith("val_")}  # fmt: skip
            for logger in trainer.loggers:
                logger.log_metrics(values, step=trainer.global_step)
        if trainer.is_global_zero and (sentence := self.verdict()) is not None:
            rank_zero_info(sentence)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # every stage's end (a validate or test alone fits them too): their one fit is in, no process left
        if workers.running("baselines"):
            workers.shutdown("baselines")

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        # the run is over: its background fit, if one runs, is not waited for
        self._pending = None
        if workers.running("baselines"):
            workers.shutdown("baselines", wait=False)

    # -- the verdict ----------------------------------------------------------------------------------

    def _verdict_metric(self) -> tuple[str, bool]:
        assert self._data is not None
        task = self._data.task
        metric = self.verdict_metric or VERDICT_METRIC[task]
        if metric not in METRICS[task]:
            raise UserInputError(
                f"baselines.verdict_metric={metric!r} is not a {task} figure; use one of "
                f"{list(METRICS[task])}."
            )
        return metric, METRICS[task][metric][1]

    @property
    def net_best(self) -> float | None:
        """The net's best validation ``val/<verdict_metric>`` of this fit so far (``None`` before one)."""
        return self._net_best

    def verdict(self) -> str | None:
        """The net's best validation figure against the better baseline's, and the baselines' budget: what
        to try when the net trails by more than ``margin``; ``None`` when nothing was compared."""
        if self._data is None or self._net_best is None or not self.scores:
            return None
        metric, higher = self._verdict_metric()
        key = f"val_{metric}"
        pick = max if higher else min
        best = pick(self.scores, key=lambda name: self.scores[name][key])
        theirs, ours = self.scores[best][key], self._net_best
        # the shortfall relative to the baseline's figure: 0.80 against 0.81 is 1.2 % behind
        shortfall = (theirs - ours) / abs(theirs) if higher else (ours - theirs) / abs(theirs)
        threads = (
            "one per core" if self.threads is None else f"{self.threads} thread{'s' * (self.threads > 1)}"
        )
        budget = (
            f"(Baselines' budget: boosting ran {self.iterations} of at most {self.budget_iterations} "
            f"iterations at learning rate {self.learning_rate:.2g}, on {threads}"
            f"{' in a process of their own' * (self.fitted_in == 'process')}, "
            f"{self.seconds:.1f} s beside the training.)"
        )
        if not shortfall > self.margin:
            where = "level with" if shortfall > -self.margin else "ahead of"
            return f"The net's best val/{metric} {ours:.4g} is {where} {TITLE[best]}'s {theirs:.4g}. {budget}"
        return (
            f"The net's best val/{metric} {ours:.4g} trails {TITLE[best]}'s {theirs:.4g} on the same "
            f"validation rows ({shortfall:.1%} behind): try more rows (a smaller data.split.val_fraction / "
            "test_fraction), a longer run (trainer.max_epochs, early_stopping patience), or the "
            f"{best} model itself. {budget}"
        )
