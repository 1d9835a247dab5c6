"""Which rows train, validate and test: the ``data.split`` settings, and the seeded split they make."""

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar, cast

import numpy as np
from sklearn.model_selection import KFold, StratifiedKFold, train_test_split

from src.data.loading import check_fractions
from src.errors import UserInputError

G = TypeVar("G")


def group(value: object, kind: type[G], key: str) -> G:
    """A settings group given as itself, left out (its defaults), or as the mapping ``hparams`` hold."""
    if value is None:
        return kind()
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {f.name for f in fields(cast(Any, kind))})  # a dataclass
        if unknown:
            raise UserInputError(f"{key} has no setting {unknown[0]!r}; see {kind.__name__}'s arguments.")
        return kind(**value)
    if not isinstance(value, kind):
        raise UserInputError(f"{key} takes a {kind.__name__} or a mapping, not {type(value).__name__}.")
    return value


@dataclass
class Split:
    """Which rows train, validate and test.

    Args:
        val_fraction: Share of all rows held out for validation.
        test_fraction: Share of all rows held out for the final test; touched only by ``test``.
        folds: Cross-validation: this many folds of the train and validation rows, one validating.
        fold: Which fold (0 to ``folds - 1``) is the validation split when ``folds`` is set.
        train_on_validation: Refit on the training and validation rows together; the validation figures
            then flatter the model, so give ``trainer.max_epochs`` and ``early_stopping: null``.
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


def split_settings(seed: int, split: Split) -> dict[str, Any]:
    """The settings a split record names (:func:`src.data.loading.split_record`)."""
    settings = {
        "data.seed": seed,
        "data.split.val_fraction": split.val_fraction,
        "data.split.test_fraction": split.test_fraction,
        "data.split.folds": split.folds,
        "data.split.train_on_validation": split.train_on_validation,
    }
    if split.folds is not None:
        settings["data.split.fold"] = split.fold
    return settings


def split_rows(
    count: int, stratify: np.ndarray | None, split: Split, seed: int, task: str, what: str
) -> dict[str, np.ndarray]:
    """Disjoint sorted positions of ``count`` rows per split, seeded, stratified by ``stratify`` ``(N,)``."""
    rows = np.arange(count)
    try:
        rest, test = train_test_split(
            rows, test_size=split.test_fraction, random_state=seed, stratify=stratify
        )
        train, val = train_test_split(
            rest,
            test_size=split.val_fraction / (1 - split.test_fraction),
            random_state=seed,
            stratify=stratify[rest] if stratify is not None else None,
        )
    except ValueError as err:
        # scikit-learn's reason can run to three sentences: one clause each here
        why = "; ".join(part[:1].lower() + part[1:] for part in str(err).rstrip(".").split(". "))
        raise UserInputError(
            f"The {count} rows of {what} cannot be split with data.split.val_fraction={split.val_fraction} "
            f"and test_fraction={split.test_fraction} ({why}); use more rows, other fractions, or drop the "
            "rarest classes."
        ) from err
    if split.folds is not None:
        rest = np.sort(rest)
        splitter = (StratifiedKFold if stratify is not None else KFold)(
            n_splits=split.folds, shuffle=True, random_state=seed
        )
        try:
            folds = list(splitter.split(rest, stratify[rest] if stratify is not None else None))
        except ValueError as err:
            raise UserInputError(
                f"The {len(rest)} train and validation rows of {what} cannot be split into "
                f"data.split.folds={split.folds} folds ({err}); use fewer folds or more rows."
            ) from err
        train, val = (rest[positions] for positions in folds[split.fold])
    if split.train_on_validation:
        train = np.concatenate([train, val])
    for stage, chosen in (("train", train), ("val", val), ("test", test)):
        check_split_size(stage, len(chosen), count, task, split)
    return {"train": np.sort(train), "val": np.sort(val), "test": np.sort(test)}
