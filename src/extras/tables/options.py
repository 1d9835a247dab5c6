"""The table DataModule's settings, in three groups the signature names: which columns, how they are
encoded, which rows train, validate and test (``data.columns.drop``, ``data.encoding.max_categories``,
``data.split.val_fraction`` ...)."""

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypeVar

import numpy as np
import pandas as pd

from src.data.loading import TESTED, TRAINED, VALIDATED, check_fractions, split_record
from src.errors import UserInputError

G = TypeVar("G", "Columns", "Encoding", "Split")


def group(value: object, kind: type[G], key: str) -> G:
    """A settings group given as itself, left out (its defaults) or as a mapping, as ``hparams`` and
    checkpoints hold it, so ``TabularDataModule(**datamodule.hparams)`` builds the same DataModule."""
    if value is None:
        return kind()
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {f.name for f in fields(kind)})
        if unknown:
            raise UserInputError(f"{key} has no setting {unknown[0]!r}; see {kind.__name__}'s arguments.")
        return kind(**value)
    if not isinstance(value, kind):
        raise UserInputError(f"{key} takes a {kind.__name__} or a mapping, not {type(value).__name__}.")
    return value


@dataclass
class Columns:
    """Which columns of your file the net reads, and as what.

    Args:
        features: The columns to read as features; all but the target when left out.
        drop: Columns to leave out (IDs, free-text notes, anything known only after the fact).
        categorical: Columns to encode as categories even if they hold numbers (say, codes 1, 2, 3).
        numeric: Columns to read as numbers; a cell that is not one is then an error.
        na_values: Further texts that mean "missing" in your file (empty cells and ``NA``, ``NaN``,
            ``null`` already do), say ``["?", "-"]``.
    """

    features: list[str] | None = None
    drop: list[str] = field(default_factory=list)
    categorical: list[str] = field(default_factory=list)
    numeric: list[str] = field(default_factory=list)
    na_values: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        overlap = set(self.categorical) & set(self.numeric)
        if overlap:
            raise UserInputError(
                f"data.columns.categorical and data.columns.numeric both name {sorted(overlap)}; pick one."
            )


@dataclass
class Encoding:
    """How numbers and categories become the net's inputs, fitted on the training rows only.

    Args:
        impute_strategy: What fills a missing numeric cell: the training ``median`` or ``mean``; left
            out, the median (the streaming DataModule, which never holds every value at once: the mean).
        missing_indicator: Add a 0/1 column per numeric column that had missing cells in training.
        standardize: Scale numeric features to zero mean and unit variance (training statistics).
        scaling: How ``standardize`` scales: ``standard`` by the mean and standard deviation, ``robust``
            by the median and the interquartile range.
        max_categories: One-hot columns per categorical column at most: its ``max_categories - 1`` most
            frequent training values, and one column for the rest and for values never seen in training.
        min_category_frequency: Training values rarer than this share the "rest" column.
        high_cardinality: A categorical column of more than ``max_categories`` distinct training values:
            ``target`` reads each value as its smoothed mean of the training target (per class), one
            column per class (one for regression and two classes), standardized; ``other`` gives one-hot
            columns to its most frequent values and one to the rest (the default: on a table of house
            prices whose zip codes have 68 values, the target means scored worse, benchmarks/tables.py).
    """

    impute_strategy: Literal["median", "mean"] | None = None
    missing_indicator: bool = False
    standardize: bool = True
    scaling: Literal["standard", "robust"] = "standard"
    max_categories: int = 50
    min_category_frequency: int = 1
    high_cardinality: Literal["target", "other"] = "other"


@dataclass
class Split:
    """Which rows train, validate and test.

    Args:
        val_fraction: Share of all rows held out for validation.
        test_fraction: Share of all rows held out for the final test; touched only by ``test``.
        folds: Cross-validation: split the train and validation rows together into this many folds
            (stratified by class for classification, seeded by ``seed``); ``fold`` is then the
            validation split and the other folds the training split. The test split is unchanged.
        fold: Which fold (0 to ``folds - 1``) is the validation split when ``folds`` is set.
        train_on_validation: Refit: train on the training and validation rows together (the
            preprocessing is fitted on both too), for a final model once a first run has chosen the
            epoch count. The validation split is still evaluated, but it is no longer held out, so its
            figures flatter the model and must not pick a checkpoint or stop the run: give
            ``trainer.max_epochs`` and ``early_stopping: null``, keep ``last.ckpt`` (docs/data.md). The
            test split is untouched.
    """

    val_fraction: float = 0.1
    test_fraction: float = 0.2
    folds: int | None = None
    fold: int = 0
    train_on_validation: bool = False

    def __post_init__(self) -> None:
        check_fractions(self.val_fraction, self.test_fraction, "rows", "data.split")
        if self.folds is not None and not (self.folds >= 2 and 0 <= self.fold < self.folds):
            raise UserInputError(
                f"data.split.folds={self.folds} and data.split.fold={self.fold} do not fit: folds must be at "
                "least 2 and fold lie in 0 … folds - 1."
            )


#: rows each split needs per task: R² (torchmetrics' R2Score) is undefined below two
MIN_SPLIT_ROWS = {"regression": 2, "classification": 1}


def check_split_size(stage: str, count: int, total: int, task: str, split: Split) -> None:
    """One split of ``total`` rows must hold the rows its task's metrics need, or stop before training."""
    needed = MIN_SPLIT_ROWS.get(task, 1)
    if count >= needed:
        return
    name = {"train": "training", "val": "validation", "test": "test"}[stage]
    advice = {
        "train": "smaller data.split.val_fraction and test_fraction",
        "val": "fewer data.split.folds" if split.folds is not None else "a larger data.split.val_fraction",
        "test": "a larger data.split.test_fraction",
    }[stage]
    raise UserInputError(
        f"data.split: the {name} split has {count} row{'' if count == 1 else 's'} of {total}; a {task} run "
        f"needs at least {needed} {name} row{'' if needed == 1 else 's'}"
        f"{' (R² needs two)' if task == 'regression' else ''}: use more rows or {advice}."
    )


def split_record_of(table: Any, rows: dict[str, np.ndarray], seed: int, split: Split) -> dict[str, Any]:
    """What a table's split was made from: a hash of each row, its features and target as read
    (``table``, a :class:`src.extras.tables.sources.Table`), which split it went to (``rows``: positions per
    split), and the settings that split the rows (:func:`src.data.loading.split_record`)."""
    # (N,) hashes of the features and of the target, combined: one frame of both would copy the table
    x, y = (pd.util.hash_pandas_object(part, index=False) for part in (table.features, table.target))
    hashed = pd.util.hash_pandas_object(pd.DataFrame({"x": x, "y": y}), index=False)
    splits = np.full(len(hashed), TRAINED, np.uint8)
    if not split.train_on_validation:
        splits[rows["val"]] = VALIDATED
    splits[rows["test"]] = TESTED
    settings = {
        "data.seed": seed,
        "data.split.val_fraction": split.val_fraction,
        "data.split.test_fraction": split.test_fraction,
        "data.split.folds": split.folds,
        "data.split.train_on_validation": split.train_on_validation,
    }
    if split.folds is not None:
        settings["data.split.fold"] = split.fold
    return split_record(hashed.to_numpy(), splits, settings)
