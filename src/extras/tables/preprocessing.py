"""Raw table columns → the float matrix the net reads, fitted on the training rows, kept as plain data.

scikit-learn fits everything here (``SimpleImputer``, ``StandardScaler``, ``MissingIndicator`` and
``OneHotEncoder`` inside a ``ColumnTransformer``; ``LabelEncoder`` for class labels). What they learn
is then read out into a :class:`Preprocessor` of strings, numbers and lists, because a checkpoint must
load with ``torch.load(weights_only=True)``: a pickled scikit-learn object would be code, not data.
:meth:`Preprocessor.transform` applies those numbers, the same way for training, validation, test,
``predict`` on a new file, the Python API and the server; ``src/extras/tables/test_preprocessing.py``
proves it equal to the fitted ``ColumnTransformer`` itself, unseen categories and missing cells included.

The encoded matrix ``(N, F)`` holds, in order: each numeric column (missing cells filled with the
training median or mean, then standardized), one 0/1 column per numeric column that had missing cells
in training (when ``missing_indicator`` is on), and a one-hot block per categorical column (its
``max_categories - 1`` most frequent training values, then one column for everything rarer or unseen).

**One rule for every cell**, wherever rows come from (the training file's splits, ``predict`` on a new
file, :class:`src.predict.Predictor`, the server, and the exported ONNX graph, which holds the same rule
in its own operators):

- A cell is *missing* when it is ``None``, ``NaN``, an empty or blank text, or a text listed as missing
  (``data.columns.na_values``, and the texts training found among a numeric column's numbers, say ``"?"``).
  A missing number takes the column's fill (its indicator says so); a missing category is the category
  :data:`MISSING`, learnt like any other.
- In a numeric column, a text that is not a number (``"lots"``), an infinite number, or one beyond
  float32's range (itself, or once standardized) is read as missing too: COUNTED, never fatal.
- In a categorical column, a value without a column of its own (never seen in training, or rarer than
  those kept) is read as the column's ``(other)`` value when it has one, and as no category (all zeros,
  as scikit-learn's ``handle_unknown="ignore"``) when it has none: COUNTED too.

Each :meth:`Preprocessor.transform` counts those cells per column in a :class:`CellReport` and, unless
the caller asked for the report (the server answers it in each response), logs it as ONE warning:
``column: count, e.g. value``. Fitting is stricter than encoding: a column named numeric
(``data.columns.numeric``) whose training cells hold text it was not told about, or a training value
beyond float32, stops the fit with one sentence, since the fitted numbers would depend on it.
"""

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd
from sklearn.compose import ColumnTransformer
from sklearn.impute import MissingIndicator, SimpleImputer
from sklearn.model_selection import KFold, StratifiedKFold
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import (
    LabelEncoder,
    OneHotEncoder,
    RobustScaler,
    StandardScaler,
    TargetEncoder,
)

from src.errors import UserInputError, notice

Task = Literal["classification", "regression"]
Label = int | str
#: what a missing categorical cell becomes: a category of its own, learnt like any other
MISSING = "(missing)"
#: a column counts as numeric when at least this share of its filled cells are numbers; the other
#: cells (say "?" or "n/a") are then read as missing, with a notice naming them
NUMERIC_SHARE = 0.95
FLOAT32_MAX = float(np.finfo(np.float32).max)
STATE_VERSION = 1

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NumericColumn:
    """One numeric input column: how to fill, shift and scale it."""

    name: str
    fill: float  #: the training median (or mean) that replaces a missing cell
    mean: float  #: subtracted after filling (0 without standardizing)
    scale: float  #: divides after subtracting (1 without standardizing, or for a constant column)
    indicator: bool  #: whether a 0/1 "was missing" column follows the numeric block
    missing_tokens: list[str] = field(default_factory=list)  #: texts read as missing (say "?")


@dataclass(frozen=True)
class CategoricalColumn:
    """One categorical input column: the values that get a one-hot column of their own, or, for a column
    of many values, each value's target statistics (``encodings``)."""

    name: str
    categories: list[str]  #: one output column each, in this order (target encoding: one row each)
    other: bool  #: whether a last column collects rarer training values and values never seen
    #: target encoding: per category, its smoothed mean of the training target (one per class, or one
    #: for regression and two classes), standardized; ``None``: one-hot
    encodings: list[list[float]] | None = None
    #: target encoding: what a value without an encoding reads as (the training rows' target mean,
    #: standardized)
    default: list[float] | None = None

    @functools.cached_property
    def index(self) -> pd.Index:
        """``categories`` as the Index one-hot encoding looks values up in, built once, not per call."""
        return pd.Index(self.categories)

    @functools.cached_property
    def lookup(self) -> np.ndarray:
        """``(len(categories) + 1, width)`` float64: each category's encoding, then ``default``."""
        assert self.encodings is not None
        assert self.default is not None
        return np.array([*self.encodings, self.default], dtype=np.float64).reshape(
            len(self.categories) + 1, -1
        )

    @property
    def width(self) -> int:
        """Columns of the encoded matrix this column makes."""
        if self.default is not None:
            return len(self.default)
        return len(self.categories) + int(self.other)


@dataclass(frozen=True)
class Location:
    """Names a cell in an error: ``file 'x.csv', column 'a', line 7`` or ``the rows, column 'a', row 5``."""

    what: str  #: "CSV file 'x.csv'", "the request", ...
    line_offset: int | None = None  #: added to a row's index to give its line in the file (2 for CSV)

    def cell(self, column: str, index: Any) -> str:
        where = f"line {index + self.line_offset}" if self.line_offset is not None else f"row {index}"
        return f"{self.what}, column {column!r}, {where}"


# -- reading cells ------------------------------------------------------------------------------------


@dataclass
class ColumnNotice:
    """The cells of one column that the rule read otherwise than as written."""

    count: int
    example: str  #: the first such cell, as text
    read_as: str  #: "missing", "(other)" or "no category"


@dataclass
class CellReport:
    """Per column, the cells read otherwise than as written (see the module's rule): what one notice, or
    one response's ``notices``, says."""

    columns: dict[str, ColumnNotice] = field(default_factory=dict)

    def add(self, column: str, count: int, example: Any, read_as: str) -> None:
        if not count:
            return
        noticed = self.columns.setdefault(column, ColumnNotice(0, _example(example), read_as))
        noticed.count += count

    def line(self, what: str) -> str:
        """One sentence: ``<what>: 'age': 2 cell(s) read as missing (e.g. 'lots'); ...``."""
        parts = [
            f"{c!r}: {n.count} cell(s) read as {n.read_as} (e.g. {n.example!r})"
            for c, n in self.columns.items()
        ]
        return (
            f"{what}: {'; '.join(parts)} (text that is not a number or a number beyond float32 is read as "
            "missing, a category without a column of its own as (other) or none, and one a column read by "
            "its target means never saw as the training mean; list texts that mean missing in "
            "data.columns.na_values, and train with a larger data.encoding.max_categories to give more "
            "categories a column)."
        )

    def as_json(self) -> dict[str, dict[str, Any]]:
        """``{column: {"count": n, "example": text, "read_as": ...}}``, as the server answers it."""
        return {name: asdict(notice) for name, notice in self.columns.items()}


def _example(value: Any) -> str:
    return repr(float(value)) if isinstance(value, float | np.floating) else str(value)


def cell_text(value: Any) -> str:
    """A cell as the text a categorical column compares: ``""`` when missing, booleans ``True``/``False``,
    a whole number without its decimal part (3.0 is ``"3"``), other numbers as Python writes them, text
    as it is. What the exported graph's categorical inputs take (it strips spaces itself)."""
    if value is None or (isinstance(value, float | np.floating) and np.isnan(value)) or value is pd.NA:
        return ""
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        return str(int(value)) if float(value).is_integer() else repr(float(value))
    return str(value)


def _canonical(value: Any) -> str:
    """One spelling per value: 3, 3.0 and "3" are the same category, and so are True and "True"."""
    return cell_text(value).strip()


def category_strings(column: pd.Series, na_values: Sequence[str] = ()) -> np.ndarray:
    """``(N,)`` object array of canonical strings; missing (or blank) cells, and cells that read as one of
    ``na_values``, become :data:`MISSING`."""
    if pd.api.types.infer_dtype(column, skipna=True).startswith("mixed"):
        # factorize takes False for 0 and True for 1 (equal in Python): a cell would then read as
        # whichever came first in its column; booleans spelled first keep each cell its own reading
        column = column.map(lambda v: str(bool(v)) if isinstance(v, bool | np.bool_) else v)
    codes, uniques = pd.factorize(column, use_na_sentinel=True)
    spelled = np.array([_canonical(v) for v in uniques] + [MISSING], dtype=object)
    spelled[(spelled == "") | np.isin(spelled, list(na_values))] = MISSING
    return spelled[codes]  # code -1 (a missing cell) picks the MISSING appended last


def _parse_numbers(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """``(values, unparsed)``: float64 values (NaN where missing or not a number) and where a filled cell
    was not a number."""
    if pd.api.types.is_bool_dtype(column) or pd.api.types.is_numeric_dtype(column):
        values = column.to_numpy(np.float64, na_value=np.nan)
        return values, np.zeros(len(values), dtype=bool)
    text = column.astype(object)
    filled = ~pd.isna(text).to_numpy()
    stripped = text.map(lambda v: v.strip() if isinstance(v, str) else v)
    filled &= (stripped != "").to_numpy()
    values = pd.to_numeric(stripped, errors="coerce").to_numpy(np.float64, na_value=np.nan)
    return values, filled & np.isnan(values)


def numbers_as_written(column: pd.Series) -> np.ndarray:
    """``(N,)`` float64: each cell's number (a text that reads as one too), NaN for any other cell. What
    the exported graph's numeric inputs take; the graph applies the rest of the rule itself."""
    return _parse_numbers(column)[0]


def read_numbers(column: pd.Series, missing_tokens: Sequence[str] = ()) -> tuple[np.ndarray, np.ndarray]:
    """The rule for a numeric column: ``(values, stray)``, float64 ``(N,)`` with NaN for every cell read as
    missing, and where a filled cell was read as missing although it was neither blank nor one of
    ``missing_tokens`` (a text that is not a number, a number beyond float32's range)."""
    values, stray = _parse_numbers(column)
    if stray.any() and missing_tokens:
        where = np.flatnonzero(stray)
        stray[where[column.iloc[where].astype(str).str.strip().isin(list(missing_tokens)).to_numpy()]] = False
    with np.errstate(invalid="ignore"):
        beyond = np.abs(values) > FLOAT32_MAX  # inf too; NaN compares False
    return np.where(beyond, np.nan, values), stray | beyond  # a new array: values may view the column


def numeric_values(column: pd.Series, location: Location, missing_tokens: Sequence[str] = ()) -> np.ndarray:
    """``(N,)`` float64 of a numeric column, NaN for missing cells and for ``missing_tokens``: how the
    fit reads training cells.

    Any other text, an infinite value or one too large for float32 stops with one sentence naming the
    cell (encoding reads them as missing instead: :func:`read_numbers`).
    """
    values, unparsed = _parse_numbers(column)
    if unparsed.any():
        tokens = column[unparsed].astype(str).str.strip()
        known = tokens.isin(list(missing_tokens)).to_numpy()
        if not known.all():
            first = int(np.flatnonzero(unparsed)[~known][0])
            raise UserInputError(
                f"{location.cell(str(column.name), column.index[first])} holds {column.iloc[first]!r}, "
                "which is not a number; fix the cell, or list the text in data.columns.na_values if it "
                "means missing."
            )
    too_large = np.abs(np.nan_to_num(values, nan=0.0)) > FLOAT32_MAX
    if too_large.any():
        first = int(np.flatnonzero(too_large)[0])
        raise UserInputError(
            f"{location.cell(str(column.name), column.index[first])} holds {float(values[first])!r}, "
            "which is "
            "infinite or too large for float32; fix the cell or rescale the column."
        )
    return values


def infer_kinds(
    frame: pd.DataFrame,
    location: Location,
    categorical: Sequence[str] = (),
    numeric: Sequence[str] = (),
) -> tuple[list[str], list[str], dict[str, list[str]]]:
    """``(numeric columns, categorical columns, missing tokens per numeric column)`` of ``frame``.

    Booleans, text and pandas categoricals are categorical, numbers numeric; a text column whose filled
    cells are at least :data:`NUMERIC_SHARE` numbers is numeric, its other texts read as missing.
    ``categorical`` and ``numeric`` name columns whose kind is not to be guessed. Dates are refused: as
    numbers they would depend on the unit they were stored in.
    """
    unknown = [c for c in [*categorical, *numeric] if c not in frame.columns]
    if unknown:
        raise UserInputError(
            f"{location.what} has no feature column(s) {unknown}; fix data.columns.categorical or "
            "data.columns.numeric."
        )
    numeric_columns, categorical_columns, tokens = [], [], {}
    for name in frame.columns:
        column = frame[name]
        if pd.api.types.is_datetime64_any_dtype(column) or pd.api.types.is_timedelta64_dtype(column):
            raise UserInputError(
                f"{location.what}, column {name!r} holds dates or durations; turn them into numbers that "
                "mean something (days since an event, day of week) or drop the column with data.columns.drop."
            )
        guessed_categorical = pd.api.types.is_bool_dtype(column) or isinstance(
            column.dtype, pd.CategoricalDtype
        )
        if name in categorical or (name not in numeric and guessed_categorical):
            categorical_columns.append(name)
            continue
        if name in numeric:  # named numeric: a text it was not told about is an error, not a guess
            numeric_values(column, location)
            numeric_columns.append(name)
            continue
        values, unparsed = _parse_numbers(column)
        parsed = int((~np.isnan(values)).sum())
        if parsed and parsed >= NUMERIC_SHARE * (parsed + unparsed.sum()):
            found = sorted(set(column[unparsed].astype(str).str.strip()))
            if found:
                notice(
                    f"Column {name!r}: {int(unparsed.sum())} cell(s) holding {found[:5]} are read as missing "
                    "(the rest are numbers); list them in data.columns.na_values to say so, or name the "
                    "column in "
                    "data.columns.categorical."
                )
                tokens[name] = found
            numeric_columns.append(name)
        else:
            categorical_columns.append(name)
    return numeric_columns, categorical_columns, tokens


# -- labels -------------------------------------------------------------------------------------------


def label_values(target: pd.Series) -> np.ndarray:
    """Class labels as they are written: integers stay integers, everything else becomes its text."""
    if pd.api.types.is_numeric_dtype(target) and not pd.api.types.is_bool_dtype(target):
        values = target.to_numpy(np.float64)
        if np.all(values == np.round(values)):
            return values.astype(np.int64)
    return category_strings(target)


#: of a label's two values, the one written so (case aside) is its positive value, however the two sort
POSITIVE = ("1", "true", "yes")


def label_pair(train_target: pd.Series, location: Location) -> list[Label]:
    """One of several targets' two values in the training rows, negative first: the one written 1, true or
    yes (case aside) is positive, else the second in sorted order (``["no", "yes"]``, ``[0, 1]``,
    ``["benign", "malignant"]``)."""
    pair = labels_of(train_target)
    if len(pair) != 2:
        raise UserInputError(
            f"{location.what}: the target {train_target.name!r} holds only {pair} in the training rows, "
            "and a label needs both of its values there; use more rows, or other data.split settings."
        )
    positive = [label for label in pair if str(label).strip().lower() in POSITIVE]
    return [pair[1 - pair.index(positive[0])], positive[0]] if len(positive) == 1 else pair


# -- the fitted preprocessing -------------------------------------------------------------------------


@dataclass(frozen=True)
class Preprocessor:
    """Everything fitted on the training rows, as plain data: what a checkpoint carries.

    Build one with :func:`fit_preprocessor`; save it with :meth:`state_dict`, rebuild it with
    :meth:`from_state`.
    """

    task: Task
    #: the target column's name, or the names of several (ignored in a file to predict)
    target: str | list[str] | None
    numeric: list[NumericColumn]
    categorical: list[CategoricalColumn]
    #: class labels (:data:`Label`), in class-id order (classification); with several targets, each one's
    #: two values, negative first (:func:`label_pair`)
    labels: list[Any] | None = None
    na_values: list[str] = field(default_factory=list)  #: texts that mean "missing" in any column

    @property
    def target_names(self) -> list[str] | None:
        """The target columns when there are several, one output each; ``None`` for one target."""
        return list(self.target) if isinstance(self.target, list) else None

    @property
    def columns(self) -> list[str]:
        """The raw input columns, in the order they are encoded."""
        return [c.name for c in self.numeric] + [c.name for c in self.categorical]

    @property
    def feature_names(self) -> list[str]:
        """One name per column of the encoded matrix."""
        names = [c.name for c in self.numeric]
        names += [f"{c.name} (missing)" for c in self.numeric if c.indicator]
        for column in self.categorical:
            if column.default is not None:
                targets = self.labels if self.labels is not None and column.width > 1 else ["target"]
                names += [f"{column.name} (mean {label})" for label in targets]
                continue
            names += [f"{column.name}={value}" for value in column.categories]
            names += [f"{column.name}=(other)"] if column.other else []
        return names

    @property
    def num_classes(self) -> int | None:
        return len(self.labels) if self.labels is not None else None

    def check_columns(self, frame: pd.DataFrame, location: Location) -> None:
        missing = [c for c in self.columns if c not in frame.columns]
        if missing:
            raise UserInputError(
                f"{location.what} has no column(s) {missing}, which the model was trained on; add them "
                "(empty cells are fine)."
            )

    def transform(
        self,
        frame: pd.DataFrame,
        location: Location,
        rows: np.ndarray | None = None,
        report: CellReport | None = None,
    ) -> np.ndarray:
        """Raw rows → ``(N, F)`` float32. Extra columns are ignored; missing columns are an error.

        Read as the training file was: column names without surrounding spaces, ``na_values`` as missing.
        ``rows``: the positions of the rows to encode, in this order (all rows when left out); one column
        at a time is copied out of ``frame``. Cells read otherwise than written (the module's rule) are
        counted into ``report``; without one, they are logged as one warning.
        """
        frame = frame.rename(columns=lambda name: name.strip() if isinstance(name, str) else name)
        self.check_columns(frame, location)

        def column_of(name: str) -> pd.Series:
            return frame[name] if rows is None else frame[name].iloc[rows]

        return self.encode(column_of, len(frame) if rows is None else len(rows), location, report)

    def encode(
        self,
        column_of: Callable[[str], pd.Series],
        count: int,
        location: Location,
        report: CellReport | None = None,
    ) -> np.ndarray:
        """``(count, F)`` float32 from the raw columns ``column_of(name)`` returns, ``count`` rows each,
        asked for once each in the order of :attr:`columns`: what :meth:`transform` does, from columns
        that need not be held all at once."""
        noticed = CellReport() if report is None else report
        # written column by column into the float32 result: the float64 work is one column at a time,
        # never a float64 copy of the whole table (computed in float64 and rounded once, as before)
        indicated = [column for column in self.numeric if column.indicator]
        widths = [cat.width for cat in self.categorical]
        out = np.empty((count, len(self.numeric) + len(indicated) + sum(widths)), np.float32)
        at = len(self.numeric)
        for j, column in enumerate(self.numeric):
            cells = column_of(column.name)
            values, stray = read_numbers(cells, [*column.missing_tokens, *self.na_values])
            missing = np.isnan(values)
            with np.errstate(over="ignore", invalid="ignore"):  # a tiny scale: beyond float32, read below
                scaled = (np.where(missing, column.fill, values) - column.mean) / column.scale
                beyond = np.abs(scaled) > FLOAT32_MAX
            if beyond.any():  # beyond float32 once standardized: missing, as any number beyond it
                scaled[beyond] = (column.fill - column.mean) / column.scale
                missing, stray = missing | beyond, stray | beyond
            out[:, j] = scaled
            if stray.any():
                noticed.add(
                    column.name, int(stray.sum()), cells.iloc[int(np.flatnonzero(stray)[0])], "missing"
                )
            if column.indicator:
                out[:, at] = missing
                at += 1
        for cat, width in zip(self.categorical, widths, strict=True):
            texts = category_strings(column_of(cat.name), self.na_values)
            if cat.encodings is not None:
                out[:, at : at + width], unmatched = _target_encoded(texts, cat)
                read_as = "the training mean"
            else:
                out[:, at : at + width], unmatched = _one_hot(texts, cat)
                read_as = "(other)" if cat.other else "no category"
            if unmatched.any():
                first = texts[int(np.flatnonzero(unmatched)[0])]
                noticed.add(cat.name, int(unmatched.sum()), first, read_as)
            at += width
        if report is None and noticed.columns:
            log.warning(noticed.line(location.what))
        return out

    def encode_labels(self, target: pd.Series | pd.DataFrame, location: Location) -> np.ndarray:
        """Labels → ``(N,)`` int64 class ids; several targets (a frame) → ``(N, K)`` int64, 1 where a
        row's label is its target's positive value. A label the training rows never had is an error."""
        assert self.labels is not None
        if isinstance(target, pd.DataFrame):
            pairs = zip(target, self.labels, strict=True)  # each target's two values
            return np.stack([_class_ids(target[name], pair, location) for name, pair in pairs], axis=1)
        return _class_ids(target, self.labels, location)

    def state_dict(self) -> dict[str, Any]:
        """Strings, numbers, lists and dicts only: ``torch.load(weights_only=True)`` reads them back. A new
        outer dict each call, around one inner state made once (the fitted preprocessing never changes,
        and every checkpoint carries it): read it, do not change it."""
        return {"version": STATE_VERSION, **self._state}

    @functools.cached_property
    def _state(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "Preprocessor":
        if state.get("version") != STATE_VERSION:
            raise UserInputError(
                f"the checkpoint's preprocessing has version {state.get('version')!r}, this code reads "
                f"version {STATE_VERSION}; use the code the checkpoint was made with."
            )
        return cls(
            task=state["task"],
            target=state["target"],
            numeric=[NumericColumn(**c) for c in state["numeric"]],
            categorical=[CategoricalColumn(**c) for c in state["categorical"]],
            labels=state["labels"],
            na_values=state.get("na_values", []),
        )


def _class_ids(target: pd.Series, labels: list[Label], location: Location) -> np.ndarray:
    """``(N,)`` int64 positions of the target's labels in ``labels``; a label not there is an error."""
    values = label_values(target)
    ids = pd.Index(labels).get_indexer(values)
    if (ids < 0).any():
        first = int(np.flatnonzero(ids < 0)[0])
        raise UserInputError(
            f"{location.cell(str(target.name), target.index[first])} holds the label {values[first]!r}, "
            f"which no training row has (labels: {labels}); give that class more rows."
        )
    return ids.astype(np.int64)


def _target_encoded(values: np.ndarray, column: CategoricalColumn) -> tuple[np.ndarray, np.ndarray]:
    """``(N,)`` canonical strings → ``(N, width)`` encodings (``default`` for a value never seen in
    training), and ``(N,)`` where a value has no encoding of its own."""
    codes = column.index.get_indexer(values)
    unmatched = codes < 0
    return column.lookup[np.where(unmatched, len(column.categories), codes)], unmatched


def _one_hot(values: np.ndarray, column: CategoricalColumn) -> tuple[np.ndarray, np.ndarray]:
    """``(N,)`` canonical strings → ``(N, K)`` one-hot, the last column for rare and unseen values, and
    ``(N,)`` where a value has no column of its own."""
    width = len(column.categories) + int(column.other)
    codes = column.index.get_indexer(values)
    unmatched = codes < 0
    if column.other:
        codes = np.where(codes < 0, width - 1, codes)
    out = np.zeros((len(values), width))
    known = codes >= 0  # without an "other" column an unseen value is all zeros, as in scikit-learn
    out[np.flatnonzero(known), codes[known]] = 1.0
    return out, unmatched


@dataclass(frozen=True)
class Options:
    """How :func:`fit_preprocessor` treats the columns (the DataModule's ``data.*`` arguments)."""

    categorical_columns: Sequence[str] = ()
    numeric_columns: Sequence[str] = ()
    standardize: bool = True
    #: how ``standardize`` centres and scales a number: ``standard``, by the training mean and standard
    #: deviation; ``robust``, by the median and the interquartile range (a few extreme values then move
    #: the others less)
    scaling: Literal["standard", "robust"] = "standard"
    impute_strategy: Literal["median", "mean"] = "median"
    missing_indicator: bool = False
    max_categories: int = 50
    min_category_frequency: int = 1
    na_values: Sequence[str] = ()
    #: a categorical column of more than ``max_categories`` distinct training values: ``target``, each
    #: value's smoothed target mean (per class) in a column each, standardized; ``other``: one-hot columns
    #: for the ``max_categories - 1`` most frequent values and one for the rest
    high_cardinality: Literal["target", "other"] = "other"


def column_transformer(
    numeric: list[str],
    categorical: list[str],
    options: Options,
    target_encoded: Sequence[str] = (),
    target_type: str = "continuous",
) -> ColumnTransformer:
    """The scikit-learn pipeline whose fitted numbers a :class:`Preprocessor` carries: ``target_encoded``
    (among ``categorical``) by a ``TargetEncoder`` of ``target_type`` and a ``StandardScaler``, the other
    categorical columns by a ``OneHotEncoder``."""
    scaler = StandardScaler() if options.scaling == "standard" else RobustScaler()
    scale = scaler if options.standardize else "passthrough"
    encoder = OneHotEncoder(
        handle_unknown="infrequent_if_exist",  # an unseen value lands in the "other" column, if any
        max_categories=options.max_categories,
        min_frequency=options.min_category_frequency,
        sparse_output=False,
    )
    parts: list[tuple[str, Any, list[str]]] = [
        (
            "numeric",
            Pipeline([("impute", SimpleImputer(strategy=options.impute_strategy)), ("scale", scale)]),
            numeric,
        ),
    ]
    if options.missing_indicator:
        parts.append(("missing", MissingIndicator(features="missing-only"), numeric))
    encoded = [c for c in categorical if c not in target_encoded]
    parts.append(("categorical", encoder, encoded))
    if target_encoded:
        # cross-fitted on the training rows (TargetEncoder.fit_transform), so that the scale is fitted
        # on encodings of rows their own target had no part in; transform uses the encodings of all rows
        folds = (KFold if target_type == "continuous" else StratifiedKFold)(5, shuffle=True, random_state=0)
        target = TargetEncoder(target_type=target_type, cv=folds)
        scaled = Pipeline([("encode", target), ("scale", StandardScaler())])
        parts.append(("target", scaled, list(target_encoded)))
    return ColumnTransformer(parts, remainder="drop")


def encoder_input(
    frame: pd.DataFrame,
    numeric: list[str],
    categorical: list[str],
    location: Location,
    tokens: dict[str, list[str]],
) -> pd.DataFrame:
    """The frame as the ``ColumnTransformer`` reads it: numbers as float64 (NaN = missing), categories as
    canonical strings."""
    # the numbers go straight into one (N, numeric) float64 block that the frame wraps without a copy: a
    # frame built from a dict of columns would hold them twice while it consolidates them
    values = np.empty((len(frame), len(numeric)), np.float64)
    for j, name in enumerate(numeric):
        values[:, j] = numeric_values(frame[name], location, tokens.get(name, ()))
    encoded = pd.DataFrame(values, index=frame.index, columns=numeric, copy=False)
    for name in categorical:
        encoded[name] = category_strings(frame[name])
    return encoded


def _informative(
    frame: pd.DataFrame,
    train: np.ndarray | None,
    numeric: list[str],
    categorical: list[str],
    location: Location,
    tokens: dict[str, list[str]],
) -> tuple[list[str], list[str]]:
    """The columns left once those that cannot teach anything are dropped, each with a notice: a numeric
    column without a value in the training rows, a text column whose every training value is unique (a
    name, an ID: a column per value would only memorize rows)."""

    def column(name: str) -> pd.Series:  # one column of the training rows
        return frame[name] if train is None else frame[name].iloc[train]

    count = len(frame) if train is None else len(train)
    empty = [c for c in numeric if np.isnan(numeric_values(column(c), location, tokens.get(c, ()))).all()]
    unique = [
        c for c in categorical
        if count >= 20 and (values := column(c)).notna().all() and values.nunique() == count
    ]  # fmt: skip
    if empty:
        notice(f"{location.what}: the column(s) {empty} have no value in the training rows and are left out.")
    if unique:
        notice(
            f"{location.what}: the column(s) {unique} hold a different text in every training row (names, "
            "IDs) and are left out; turn them into something shared between rows to use them."
        )
    return [c for c in numeric if c not in empty], [c for c in categorical if c not in unique]


#: numbers fitted at once: numeric columns are fitted in blocks of about this many float64 cells (16 MiB),
#: since scikit-learn's imputer and scaler each copy their input; small tables fit in one block
FIT_BLOCK_CELLS = 1 << 21


def fit_preprocessor(
    frame: pd.DataFrame,
    train: np.ndarray | None,
    kinds: tuple[list[str], list[str], dict[str, list[str]]],
    task: Task,
    target: str | list[str] | None,
    train_target: pd.Series | pd.DataFrame | None,
    options: Options,
    location: Location,
) -> Preprocessor:
    """Fit on the training rows alone (the positions ``train`` of ``frame``, all of them when ``None``); the
    result is plain data (numbers, strings, lists).

    scikit-learn fits it: the pipeline of :func:`column_transformer`, one block of numeric columns at a
    time (each column's numbers depend on that column alone, so the result is the whole pipeline's; see
    :func:`fit_column_transformer`), then the categorical columns. Only the block being fitted is copied
    out of ``frame``, never the training rows whole.
    """
    numeric, categorical, tokens = _checked_columns(frame, train, kinds, options, location)
    count = len(frame) if train is None else len(train)
    numeric_columns: list[NumericColumn] = []
    block = max(1, FIT_BLOCK_CELLS // max(count, 1))
    for start in range(0, len(numeric), block):
        names = numeric[start : start + block]
        fitted = column_transformer(names, [], options)
        fitted.fit(encoder_input(_part(frame, names, train), names, [], location, tokens))
        steps = fitted.named_transformers_
        imputer: SimpleImputer = steps["numeric"].named_steps["impute"]
        scaler = steps["numeric"].named_steps["scale"]
        # StandardScaler's mean_ or RobustScaler's center_ (its scale_ is the interquartile range, 1 where
        # that is 0, as StandardScaler's is for a constant column)
        centre = np.zeros(len(names))
        if options.standardize:
            centre = scaler.mean_ if options.scaling == "standard" else scaler.center_
        with_indicator = set(steps["missing"].features_.tolist()) if options.missing_indicator else set()
        for i, name in enumerate(names):
            numeric_columns.append(
                NumericColumn(
                    name=name,
                    fill=float(imputer.statistics_[i]),
                    mean=float(centre[i]),
                    scale=float(scaler.scale_[i]) if options.standardize else 1.0,
                    indicator=i in with_indicator,
                    missing_tokens=tokens.get(name, []),
                )
            )
    labels: list[Any] | None = None  # class labels, or each target's two (Preprocessor.labels)
    if task == "classification" and isinstance(train_target, pd.DataFrame):
        labels = [label_pair(train_target[name], location) for name in train_target]
    elif task == "classification":
        labels = labels_of(train_target)
    categorical_columns: list[CategoricalColumn] = []
    if categorical:
        inputs = encoder_input(_part(frame, categorical, train), [], categorical, location, tokens)
        many = target_encoded(inputs, categorical, options)
        if many and isinstance(train_target, pd.DataFrame):
            raise UserInputError(
                f"data.encoding.high_cardinality: target reads column {many[0]!r} by its means of one "
                f"target, but data.target_column names {len(train_target.columns)}; use other, or one target."
            )
        # one target here (several were refused above where a column is target-encoded)
        fitted = column_transformer([], categorical, options, many, target_type(task, labels))
        fitted.fit(inputs, None if not many else target_values(train_target, task, labels))
        encoder: OneHotEncoder = fitted.named_transformers_["categorical"]
        one_hot = [name for name in categorical if name not in many]
        found = (encoder.categories_, encoder.infrequent_categories_) if one_hot else ([], [])
        by_name = dict(zip(one_hot, zip(*found, strict=True), strict=True))
        for name in [*one_hot, *many]:  # the pipeline's order: one-hot blocks, then target encodings
            if name in many:
                categorical_columns.append(_target_column(fitted, many, name, count, options))
                continue
            values, rare = by_name[name]
            rare_set = set(rare.tolist()) if rare is not None else set()
            distinct = len(values)
            if distinct > max(options.max_categories, count // 2):
                notice(
                    f"Column {name!r} has {distinct} distinct values in {count} training rows, like an "
                    f"identifier or free text: only its {len(values) - len(rare_set)} most frequent values "
                    f"get a column of their own (data.encoding.max_categories={options.max_categories}; "
                    "data.encoding.high_cardinality: target reads every value as its mean of the target "
                    "instead); "
                    "drop it with data.columns.drop if it carries no signal."
                )
            categorical_columns.append(
                CategoricalColumn(
                    name=name,
                    categories=[str(v) for v in values if v not in rare_set],
                    other=bool(rare_set),
                )
            )
    return Preprocessor(task, target, numeric_columns, categorical_columns, labels, list(options.na_values))


def target_encoded(inputs: pd.DataFrame, categorical: list[str], options: Options) -> list[str]:
    """The categorical columns of ``inputs`` (canonical strings of the training rows) read by their target
    statistics: with more than ``max_categories`` distinct values, when ``high_cardinality`` is ``target``."""
    if options.high_cardinality != "target":
        return []
    return [name for name in categorical if inputs[name].nunique() > options.max_categories]


def target_type(task: Task, labels: list[Label] | None) -> str:
    """``TargetEncoder``'s ``target_type``: ``continuous``, ``binary`` (one column) or ``multiclass``."""
    if task == "regression":
        return "continuous"
    return "binary" if labels is not None and len(labels) == 2 else "multiclass"


def target_values(train_target: pd.Series | None, task: Task, labels: list[Label] | None) -> np.ndarray:
    """The training targets as the target encoder reads them: class ids, or float64 values."""
    assert train_target is not None
    if task == "regression":
        return train_target.to_numpy(np.float64)
    assert labels is not None
    return pd.Index(labels).get_indexer(label_values(train_target))


def _target_column(
    fitted: ColumnTransformer, many: list[str], name: str, count: int, options: Options
) -> CategoricalColumn:
    """A target-encoded column as plain data: each value's encoding, standardized as the pipeline does."""
    steps = fitted.named_transformers_["target"].named_steps
    encoder: TargetEncoder = steps["encode"]
    scaler: StandardScaler = steps["scale"]
    i, width = many.index(name), len(np.atleast_1d(encoder.target_mean_))
    if encoder.target_type_ == "binary":
        width = 1
    columns = slice(i * width, (i + 1) * width)
    encodings = np.stack(encoder.encodings_[columns], axis=1)  # (categories, width)
    default = np.broadcast_to(encoder.target_mean_, (width,))
    mean, scale = scaler.mean_[columns], scaler.scale_[columns]
    values = encoder.categories_[i]
    notice(
        f"Column {name!r} has {len(values)} distinct values in {count} training rows, more than "
        f"data.encoding.max_categories={options.max_categories}: each is read as its smoothed mean of the "
        "training "
        "target (data.encoding.high_cardinality: target; other gives one-hot columns to the most frequent "
        "values "
        "instead, and a larger data.encoding.max_categories more of them)."
    )
    return CategoricalColumn(
        name=name,
        categories=[str(v) for v in values],
        other=False,
        encodings=((encodings - mean) / scale).tolist(),
        default=((default - mean) / scale).tolist(),
    )


def fit_column_transformer(
    train: pd.DataFrame,
    kinds: tuple[list[str], list[str], dict[str, list[str]]],
    options: Options,
    location: Location,
    task: Task = "classification",
    train_target: pd.Series | None = None,
) -> ColumnTransformer:
    """The whole scikit-learn pipeline fitted on all columns at once, for tests and inspection: what
    :func:`fit_preprocessor` fits block by block, and what its :class:`Preprocessor` is proven equal to.
    Target-encoded columns (:func:`target_encoded`) need ``task`` and the training rows' ``train_target``."""
    numeric, categorical, tokens = _checked_columns(train, None, kinds, options, location)
    inputs = encoder_input(train, numeric, categorical, location, tokens)
    many = target_encoded(inputs, categorical, options)
    if not many:
        return column_transformer(numeric, categorical, options).fit(inputs)
    labels = labels_of(train_target) if task == "classification" else None
    fitted = column_transformer(numeric, categorical, options, many, target_type(task, labels))
    return fitted.fit(inputs, target_values(train_target, task, labels))


def labels_of(train_target: pd.Series | None) -> list[Label]:
    """The class labels of the training rows' targets, in class-id order (LabelEncoder's)."""
    assert train_target is not None
    classes = LabelEncoder().fit(label_values(train_target)).classes_
    return [int(v) if isinstance(v, np.integer) else str(v) for v in classes]


def _part(frame: pd.DataFrame, names: list[str], rows: np.ndarray | None) -> pd.DataFrame:
    """The columns ``names`` of ``frame`` at the positions ``rows`` (all rows when ``None``)."""
    return frame[names] if rows is None else frame[names].iloc[rows]


def _checked_columns(
    frame: pd.DataFrame,
    train: np.ndarray | None,
    kinds: tuple[list[str], list[str], dict[str, list[str]]],
    options: Options,
    location: Location,
) -> tuple[list[str], list[str], dict[str, list[str]]]:
    """The columns to fit, those that cannot teach anything in the training rows (the positions ``train``
    of ``frame``, all of them when ``None``) left out; bad options refused."""
    numeric, categorical, tokens = kinds
    numeric, categorical = _informative(frame, train, numeric, categorical, location, tokens)
    if not numeric and not categorical:
        raise UserInputError(f"{location.what} has no feature column with values in the training rows.")
    if options.max_categories < 2 or options.min_category_frequency < 1:
        raise UserInputError(
            f"data.encoding.max_categories={options.max_categories} must be at least 2 and "
            f"data.encoding.min_category_frequency={options.min_category_frequency} at least 1."
        )
    return numeric, categorical, tokens


def preprocessing_of(checkpoint: dict[str, Any], path: str) -> Preprocessor:
    """The fitted preprocessing a checkpoint carries (under its DataModule's entry, where Lightning puts
    ``state_dict()``)."""
    for value in checkpoint.values():
        if isinstance(value, dict) and isinstance(value.get("preprocessing"), dict):
            return Preprocessor.from_state(value["preprocessing"])
    raise UserInputError(
        f"checkpoint {path!r} carries no fitted preprocessing (it was not written by a run of this "
        "project's DataModule); train a new one."
    )
