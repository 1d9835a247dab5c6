"""Where rows come from: scikit-learn's bundled real data, seeded synthetic data, or the user's CSV file.

Every source returns a :class:`Table` of float32 features and a target vector; nothing is downloaded.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from sklearn import datasets

from src.errors import UserInputError

Task = Literal["classification", "regression"]


@dataclass(frozen=True)
class Table:
    """Features ``(N, F)`` float32, target ``(N,)`` (int64 class ids or float32 values), and the task."""

    features: np.ndarray
    target: np.ndarray
    task: Task
    num_classes: int | None = None


def _classification(features: np.ndarray, target: np.ndarray, num_classes: int) -> Table:
    return Table(features.astype(np.float32), target.astype(np.int64), "classification", num_classes)


def _regression(features: np.ndarray, target: np.ndarray) -> Table:
    return Table(features.astype(np.float32), target.astype(np.float32), "regression")


def digits() -> Table:
    """8x8 handwritten digits (1797 rows, 64 pixel features, 10 classes), bundled with scikit-learn."""
    x, y = datasets.load_digits(return_X_y=True)
    return _classification(x, y, 10)


def diabetes() -> Table:
    """Diabetes progression (442 rows, 10 features, one continuous target), bundled with scikit-learn."""
    x, y = datasets.load_diabetes(return_X_y=True)
    return _regression(x, y)


def spiral(num_samples: int, noise: float, seed: int, num_classes: int = 3) -> Table:
    """Interleaved 2-D spiral arms, one per class: not linearly separable, so an MLP has work to do."""
    rng = np.random.default_rng(seed)
    per_class = num_samples // num_classes
    radius = np.tile(np.linspace(0.05, 1.0, per_class), num_classes)
    label = np.repeat(np.arange(num_classes), per_class)
    angle = radius * 4.0 + label * (2 * np.pi / num_classes) + rng.normal(0.0, noise, radius.shape)
    xy = np.stack([radius * np.sin(angle), radius * np.cos(angle)], axis=1)
    return _classification(xy, label, num_classes)


def friedman(num_samples: int, noise: float, seed: int) -> Table:
    """Friedman #1: ``10 sin(pi x0 x1) + 20 (x2 - 0.5)^2 + 10 x3 + 5 x4 + noise`` over 10 uniform inputs."""
    x, y = datasets.make_friedman1(n_samples=num_samples, n_features=10, noise=noise, random_state=seed)
    return _regression(x, y)


def csv(
    path: str | Path,
    target_column: str,
    task: Task,
    feature_columns: list[str] | None = None,
    num_classes: int | None = None,
) -> Table:
    """Read a CSV file whose columns are numeric features and one target column.

    Classification targets must be integer class ids in ``[0, num_classes)``; ``num_classes`` defaults to
    the largest id plus one. Every problem is reported with the file, the column and the first bad row.
    """
    path = Path(path)
    if not path.is_file():
        raise UserInputError(f"CSV file {str(path)!r} does not exist; set data.csv_path to an existing file.")
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise UserInputError(f"CSV file {str(path)!r} could not be parsed ({err}); fix the file.") from err
    if target_column not in frame.columns:
        raise UserInputError(
            f"CSV file {str(path)!r} has no column {target_column!r}; set data.target_column to one of "
            f"{list(frame.columns)}."
        )
    features = feature_columns or [c for c in frame.columns if c != target_column]
    missing = [c for c in features if c not in frame.columns]
    if missing:
        raise UserInputError(f"CSV file {str(path)!r} has no column(s) {missing}; fix data.feature_columns.")
    if not features:
        raise UserInputError(f"CSV file {str(path)!r} has no feature column besides {target_column!r}.")
    if frame.empty:
        raise UserInputError(f"CSV file {str(path)!r} has a header but no rows; add data rows.")
    for column in [*features, target_column]:
        _check_numeric(path, frame[column])
    x = frame[features].to_numpy(np.float32)
    y = frame[target_column].to_numpy(np.float64)
    if task == "regression":
        return _regression(x, y)
    count = num_classes if num_classes is not None else int(y.max()) + 1
    return _classification(x, _check_labels(path, target_column, y, count), count)


def _check_numeric(path: Path, column: pd.Series) -> None:
    # pandas reads a column with any non-number as strings, and empty cells as NaN
    numbers = pd.to_numeric(column, errors="coerce")
    bad = numbers.isna() | ~np.isfinite(numbers.to_numpy(np.float64, na_value=np.nan))
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        value = column.iloc[row]
        what = "an empty cell" if pd.isna(value) else f"the non-numeric value {value!r}"
        # +2: one for the header line, one because files count lines from 1
        raise UserInputError(
            f"CSV file {str(path)!r}, column {column.name!r}, line {row + 2} holds {what}; "
            "every feature and target cell must be a finite number."
        )


def _check_labels(path: Path, column: str, y: np.ndarray, count: int) -> np.ndarray:
    bad = (y != np.round(y)) | (y < 0) | (y >= count)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise UserInputError(
            f"CSV file {str(path)!r}, column {column!r}, line {row + 2} holds the label {y[row]:g}, outside "
            f"the class ids 0..{count - 1}; labels must be integers in [0, num_classes)."
        )
    return y.astype(np.int64)
