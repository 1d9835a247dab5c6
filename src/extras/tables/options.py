"""The table DataModule's settings, in three groups the signature names: which columns, how they are
encoded, which rows train, validate and test (``data.columns.drop``, ``data.encoding.max_categories``,
``data.split.val_fraction`` ...)."""

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd

from src.data.loading import TESTED, TRAINED, VALIDATED, split_record
from src.data.split import Split, split_settings
from src.errors import UserInputError
from src.extras.tables.preprocessing import label_values


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


def strata(target: pd.Series | pd.DataFrame, split: Split) -> np.ndarray:
    """``(N,)`` what a classification table's split is stratified by: each row's label; with several
    targets, each row's combination of labels when every combination has rows enough for each split (and
    fold) to get one of them, else its first target's label."""
    if isinstance(target, pd.Series):
        return label_values(target)
    labels = [label_values(target[name]) for name in target]
    combination = pd.factorize(pd.MultiIndex.from_arrays(labels))[0]
    smallest = min(split.val_fraction, split.test_fraction)
    needed = max(2, math.ceil(1 / smallest), math.ceil((split.folds or 0) / (1 - split.test_fraction)))
    return combination if np.bincount(combination).min() >= needed else labels[0]


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
    return split_record(hashed.to_numpy(), splits, split_settings(seed, split))
