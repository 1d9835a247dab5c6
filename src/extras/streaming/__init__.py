"""Tables bigger than memory: a folder of Parquet files (or one file of many row groups), streamed.

    python -m src.cli fit --config configs/digits.yaml \
        --data.class_path=src.extras.streaming.StreamingTableDataModule \
        --data.path=rows/ --data.target_column=label --data.task=classification

What :class:`~src.extras.tables.datamodule.TabularDataModule` does in memory, done a window of row groups at a
time, read by pyarrow (src/extras/streaming/README.md):

- **Split** by a hash of each row's key, the file's name (relative to ``data.path``) and the row's number
  in it, seeded: no pass over the data decides it, a row's split never depends on other rows, and files
  added later leave the rows of the others where they were. Shares are ``val_fraction`` and
  ``test_fraction`` of the rows on average (not exactly, and not stratified by class).
- **Preprocessing** fitted in one pass over the training rows (running counts, means and squared
  deviations per numeric column, counts per category, the class labels) into the same
  :class:`~src.extras.tables.preprocessing.Preprocessor` as the in-memory fit, carried in every
  checkpoint under ``preprocessing``. Missing numbers take the training mean: a median needs the rows
  sorted, which one pass in bounded memory cannot do. Column kinds come from the Parquet types.
- **Training order**: each epoch, the row groups in a seeded order, cut into windows of
  ``shuffle_row_groups`` groups whose training rows are shuffled together; one window is held (and the
  next read on a thread) at a time.
- **Processes**: the epoch's rows, in that order, are cut into one contiguous share per process (sizes
  differing by one row at most), each cut into the same number of batches: every training row is seen
  exactly once per epoch across all processes, and no process waits for a batch another lacks.
- **Verified reads**: pages are checked against the checksums their writer stored, if any, and each row
  group's values against the range and empty-cell count its footer records; files that store a column
  with types that do not mix, or that lack one, are refused before the run, naming two files.
- **Resume** in mid-epoch: the loader's position (the order's generator before the epoch, the batches
  done) is saved as :class:`~src.data.loading.ResumableDataModule` saves it; the resumed loader
  finds the window of its next batch from the row counts alone, without reading what it skips. A
  resumed fit goes on only with the rows its run split: each checkpoint records a hash of what each row
  group's footer says of it (:func:`footer_digest`) and its rows in each split, compared without a
  pass over the rows.
"""

import hashlib
import itertools
import logging
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from lightning.pytorch.utilities import AttributeDict, rank_zero_info
from torch.utils.data import DataLoader, IterableDataset
from typing_extensions import override

from src.checkpoints import load_checkpoint
from src.data.loading import (
    TESTED,
    TRAINED,
    VALIDATED,
    ResumableDataModule,
    ResumableLoader,
    Stage,
    TensorBatches,
    check_fractions,
    check_split,
    keep_batch,
    split_record,
)
from src.errors import UserInputError
from src.extras.tables import sources
from src.extras.tables.datamodule import (
    Columns,
    Encoding,
    Split,
    group,
    preprocessing_of,
)
from src.extras.tables.preprocessing import (
    CategoricalColumn,
    Label,
    Location,
    NumericColumn,
    Preprocessor,
    Task,
    category_strings,
    label_values,
    numeric_values,
)

log = logging.getLogger(__name__)

SPLITS: tuple[Stage, ...] = ("train", "val", "test")
#: a split's code in :func:`split_codes`' result, as a split record counts them
CODE = {"train": TRAINED, "val": VALIDATED, "test": TESTED}


# -- the files ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowGroup:
    """One row group of one Parquet file: the unit read at once."""

    file: Path
    name: str  #: the file's path relative to ``data.path`` (its own name for one file): what the split hashes
    index: int  #: the row group's number in its file
    first: int  #: the file's row number of the group's first row
    rows: int


def parquet_files(path: str) -> list[Path]:
    """The Parquet files of ``path`` (a file, or a folder searched recursively), in name order."""
    root = Path(path)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise UserInputError(f"data.path={path!r} does not exist; name a Parquet file or a folder of them.")
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in (".parquet", ".pq") and p.is_file())
    if not files:
        raise UserInputError(
            f"the folder data.path={path!r} holds no .parquet file; add some or fix the path."
        )
    return files


def open_parquet(file: Path) -> pq.ParquetFile:
    """The file with its footer read, its pages checked against the checksums its writer stored (if any) as
    they are read; one sentence naming it when it is missing or not Parquet."""
    try:
        return pq.ParquetFile(file, page_checksum_verification=True)
    except (OSError, pa.ArrowException) as err:
        raise UserInputError(
            f"Parquet file {str(file)!r} could not be read ({_problem(err)}); fix or remove the file."
        ) from err


def data_columns(schema: pa.Schema) -> dict[str, str]:
    """``{name without surrounding spaces: name as written}``, less the index a pandas frame saved."""
    saved_index = (schema.pandas_metadata or {}).get("index_columns", [])
    return {name.strip(): name for name in schema.names if name not in saved_index}


def split_codes(group: RowGroup, seed: int, val_fraction: float, test_fraction: float) -> np.ndarray:
    """``(rows,)`` int8: each row's split (0 train, 1 validation, 2 test) from a hash of its key.

    The key is the file's relative name and the row's number in the file, mixed with the seed by pandas'
    stable 64-bit hash; its top 53 bits, read as a share in [0, 1), fall below ``test_fraction`` (test),
    below ``test_fraction + val_fraction`` (validation), or above (train).
    """
    salt = pd.util.hash_array(np.array([f"{seed}/{group.name}"], dtype=object))[0]
    rows = np.arange(group.first, group.first + group.rows, dtype=np.uint64)
    share = (pd.util.hash_array(rows ^ salt) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    codes = np.full(group.rows, CODE["train"], np.int8)
    codes[share < test_fraction + val_fraction] = CODE["val"]
    codes[share < test_fraction] = CODE["test"]
    return codes


def footer_digest(group: RowGroup, metadata: pq.FileMetaData, columns: Sequence[str]) -> int:
    """A 64-bit hash of what a row group's footer records of it: the file's relative name, the group's
    number, first row and row count, and for each of ``columns`` (as written) its bytes, compressed and
    not, and its statistics (range, empty cells, values). No row is read, so an edit that leaves all of
    them as they were (a label changed for another of the same length) goes unseen."""
    chunks = metadata.row_group(group.index)
    recorded: list[Any] = [group.name, group.index, group.first, group.rows]
    for j in range(chunks.num_columns):
        chunk = chunks.column(j)
        if chunk.path_in_schema in columns:
            statistics = chunk.statistics.to_dict() if chunk.statistics is not None else None
            recorded.append(
                (chunk.path_in_schema, chunk.total_compressed_size, chunk.total_uncompressed_size, statistics)
            )
    return int.from_bytes(hashlib.blake2b(repr(recorded).encode(), digest_size=8).digest(), "little")


def column_types(
    schemas: dict[Path, pa.Schema], columns: Sequence[str]
) -> dict[str, tuple[pa.DataType, Path]]:
    """The type each of ``columns`` is read as, and the first file that stores it so.

    Where the files agree, their type; where they differ, the type Arrow promotes theirs to (numbers of
    any width to the widest, an all-empty column to the others' type, dictionary-encoded text to text).
    Any other difference (text in one file, numbers in another) is one sentence naming two files.
    """
    files = list(schemas)
    found: dict[str, dict[pa.DataType, Path]] = {name: {} for name in columns}
    for file, schema in schemas.items():
        written = data_columns(schema)
        for name in columns:
            if name not in written:
                raise UserInputError(
                    f"Parquet file {str(file)!r} has no column {name!r}, which {str(files[0])!r} has; give "
                    "every file the same columns."
                )
            found[name].setdefault(schema.field(written[name]).type, file)
    return {name: _common_type(name, kinds) for name, kinds in found.items()}


def _common_type(name: str, kinds: dict[pa.DataType, Path]) -> tuple[pa.DataType, Path]:
    """One column's type across files (``kinds``: each type stored, and the first file storing it)."""
    if len(kinds) == 1:
        return next(iter(kinds.items()))
    plain = {
        (kind.value_type if pa.types.is_dictionary(kind) else kind): file for kind, file in kinds.items()
    }
    common: pa.DataType | None = None
    for kind, file in plain.items():
        try:
            common = kind if common is None else _promoted(name, common, kind)
        except (pa.ArrowTypeError, pa.ArrowInvalid) as err:
            other = next(k for k in plain if k != kind and not _mix(name, k, kind))
            raise UserInputError(
                f"Parquet files {str(plain[other])!r} and {str(file)!r} store column {name!r} as {other} "
                f"and as {kind}, which do not mix; write the column with one type in every file."
            ) from err
    assert common is not None
    return common, next((f for k, f in plain.items() if k == common and not pa.types.is_null(k)), file)


def _promoted(name: str, a: pa.DataType, b: pa.DataType) -> pa.DataType:
    """The type Arrow reads ``a`` and ``b`` together as; raises when there is none."""
    schemas = [pa.schema([(name, a)]), pa.schema([(name, b)])]
    return pa.unify_schemas(schemas, promote_options="permissive").field(name).type


def _mix(name: str, a: pa.DataType, b: pa.DataType) -> bool:
    try:
        _promoted(name, a, b)
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        return False
    return True


def recorded_statistics(metadata: pq.FileMetaData, index: int) -> dict[str, pq.Statistics | None]:
    """``{column as written: its statistics in row group index}`` from the file's footer (flat columns)."""
    group = metadata.row_group(index)
    return {group.column(j).path_in_schema: group.column(j).statistics for j in range(group.num_columns)}


def value_range(column: pa.ChunkedArray) -> tuple[Any, Any] | None:
    """The smallest and largest value of a column of numbers, text or booleans, NaN and empty cells left
    out; ``None`` for other types or when no value is left. (Numbers through numpy, many times faster than
    Arrow's NaN-aware ``min_max`` kernel.)"""
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    kind = column.type
    if pa.types.is_integer(kind) or (pa.types.is_floating(kind) and not pa.types.is_float16(kind)):
        values = (column.drop_null() if column.null_count else column).to_numpy()
        if not len(values):
            return None
        low, high = np.fmin.reduce(values).item(), np.fmax.reduce(values).item()  # NaN only if all are
        return None if math.isnan(low) else (low, high)
    if not (
        pa.types.is_decimal(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_boolean(kind)
    ):
        return None
    low, high = pc.min_max(column).values()
    return (low.as_py(), high.as_py()) if low.is_valid else None


def _shown(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else repr(value)


def check_against_footer(group: RowGroup, table: pa.Table, metadata: pq.FileMetaData) -> None:
    """Each column of a row group just read against what the footer records of it: its count of empty
    cells and the range of its values. A page damaged after it was written that still decodes (and that
    no page checksum caught: most writers store none) shows as values outside that range or another count
    of empty cells; one sentence naming the file, the row group and the column."""
    statistics = recorded_statistics(metadata, group.index)
    for written in table.column_names:
        recorded, column = statistics.get(written), table.column(written)
        if recorded is None:
            continue
        if recorded.has_null_count and column.null_count != recorded.null_count:
            found = f"{column.null_count} empty cells where its footer records {recorded.null_count}"
        elif recorded.has_min_max and (span := value_range(column)) is not None:
            low, high = span
            if recorded.min <= low and high <= recorded.max:
                continue
            found = (
                f"values from {_shown(low)} to {_shown(high)} where its footer records "
                f"{_shown(recorded.min)} to {_shown(recorded.max)}"
            )
        else:
            continue
        raise UserInputError(
            f"Parquet file {str(group.file)!r}, row group {group.index}, is damaged: column "
            f"{written.strip()!r} holds {found}; write the file again from its source, or remove it."
        )


def _read(
    group: RowGroup,
    columns: Sequence[str],
    types: dict[str, tuple[pa.DataType, Path]],
    file: pq.ParquetFile | None = None,
) -> pa.Table:
    """Columns of one row group (names without surrounding spaces), checked against the footer's record of
    them and cast to the ``types`` the files share; one sentence when they cannot be read."""
    try:
        file = file or open_parquet(group.file)
        written = data_columns(file.schema_arrow)
        table = file.read_row_group(group.index, columns=[written[name] for name in columns])
    except KeyError as err:
        raise UserInputError(
            f"Parquet file {str(group.file)!r} has no column {err.args[0]!r}, which the other files have; "
            "give every file the same columns."
        ) from err
    except (OSError, pa.ArrowException) as err:
        raise UserInputError(
            f"Parquet file {str(group.file)!r}, row group {group.index}, could not be read "
            f"({_problem(err)}); fix or remove the file."
        ) from err
    check_against_footer(group, table, file.metadata)
    table = table.rename_columns(list(columns))
    for i, name in enumerate(columns):
        kind = types[name][0] if name in types else table.schema.field(i).type
        if table.schema.field(i).type != kind:
            try:
                table = table.set_column(i, name, table.column(i).cast(kind))
            except (pa.ArrowTypeError, pa.ArrowInvalid) as err:
                raise UserInputError(
                    f"Parquet file {str(group.file)!r}, row group {group.index}, column {name!r} cannot be "
                    f"read as {kind}, the type the other files give it ({_problem(err)}); write the column "
                    "with one type in every file."
                ) from err
    return table


def _problem(err: Exception) -> str:
    """The first line of an error's message, or its type's name."""
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def columns_of(table: pa.Table) -> Callable[[str], pd.Series]:
    """``column_of(name)``: a column of ``table`` as pandas reads it (what ``read_file`` gives)."""
    return lambda name: table.column(name).to_pandas()


# -- preprocessing fitted in one pass -----------------------------------------------------------------


class RunningMoments:
    """Count, mean and sum of squared deviations per column, merged batch by batch (Chan et al.), NaN
    read as missing. scikit-learn's ``StandardScaler.partial_fit`` does the same merge but turns a
    column's statistics into NaN for good when its first batch has no value, so it is not used here."""

    def __init__(self, width: int) -> None:
        self.count = np.zeros(width)
        self.mean = np.zeros(width)
        self.m2 = np.zeros(width)

    def update(self, values: np.ndarray) -> None:
        """``values``: ``(N, width)`` float64, NaN where missing."""
        seen = ~np.isnan(values)
        count = seen.sum(axis=0).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(count > 0, np.nansum(values, axis=0) / count, 0.0)
        m2 = np.nansum(np.where(seen, values - mean, 0.0) ** 2, axis=0)
        total = self.count + count
        delta = mean - self.mean
        with np.errstate(invalid="ignore", divide="ignore"):
            self.mean = np.where(total > 0, self.mean + delta * np.where(total > 0, count / total, 0), 0.0)
            self.m2 = self.m2 + m2 + np.where(total > 0, delta**2 * self.count * count / total, 0.0)
        self.count = total


def scale_of(var: np.ndarray, mean: np.ndarray, rows: int) -> np.ndarray:
    """The standard deviation, or 1 for a constant column: ``StandardScaler``'s rule (a variance within
    float64 rounding of zero is zero), which it applies inside ``fit`` only."""
    eps = np.finfo(np.float64).eps
    constant = var <= rows * eps * var + (rows * mean * eps) ** 2
    return np.where(constant, 1.0, np.sqrt(var))


def infrequent(counts: dict[str, int], max_categories: int, min_frequency: int) -> set[str]:
    """The categories ``OneHotEncoder(max_categories, min_frequency)`` folds into its "other" column, from
    their counts: rarer than ``min_frequency``, then all but the ``max_categories - 1`` most frequent
    (ties: the later in sorted order kept, as its stable sort does). The encoder fits on rows only."""
    names = sorted(counts)
    count = np.array([counts[n] for n in names])
    rare = count < min_frequency
    if max_categories < len(names) - rare.sum() + 1:
        rare[np.argsort(count, kind="mergesort")[: -(max_categories - 1)]] = True
    return {n for n, r in zip(names, rare, strict=True) if r}


@dataclass
class Kinds:
    """Which columns are read as numbers and which as categories (from the Parquet types)."""

    numeric: list[str]
    categorical: list[str]


def column_kinds(
    types: dict[str, tuple[pa.DataType, Path]],
    features: list[str],
    categorical: Sequence[str],
    numeric: Sequence[str],
) -> Kinds:
    """Numbers (integers, floats, decimals) and columns empty in every file are numeric, booleans, text and
    dictionaries categorical, unless named otherwise. Dates and nested values are refused, as the in-memory
    path refuses them."""
    kinds = Kinds([], [])
    for name in features:
        kind, file = types[name]
        refuse_unreadable(
            name,
            kind,
            file,
            "turn them into numbers or text of their own columns (days since an event, a list's length), or "
            "drop the column with data.columns.drop.",
        )
        is_number = (
            pa.types.is_integer(kind)
            or pa.types.is_floating(kind)
            or pa.types.is_decimal(kind)
            or pa.types.is_null(kind)  # no value anywhere: left out as a number without training values
        )
        if name in categorical or (name not in numeric and not is_number):
            kinds.categorical.append(name)
        else:
            kinds.numeric.append(name)
    return kinds


def refuse_unreadable(name: str, kind: pa.DataType, file: Path, fix: str) -> None:
    """Dates, durations and nested values (lists, records) in a column the run reads: one sentence naming
    the file, the column and ``fix``."""
    if pa.types.is_temporal(kind):
        raise UserInputError(
            f"Parquet file {str(file)!r}, column {name!r}, holds dates or durations ({kind}), not numbers or "
            f"text; {fix}"
        )
    if pa.types.is_nested(kind):
        raise UserInputError(
            f"Parquet file {str(file)!r}, column {name!r}, holds nested values ({kind}: lists or records), "
            f"not numbers or text; {fix}"
        )


class StreamingFit:
    """Fits a :class:`Preprocessor` batch by batch over the training rows.

    Args:
        kinds: The numeric and categorical columns.
        task: ``classification`` or ``regression``.
        target: The target column's name.
        na_values: Texts that mean "missing".
        max_distinct_values: Distinct values counted per categorical column at most; a column with more
            is refused (it reads like an identifier; dropping it is the cure).
        what: Names the data in a sentence.
    """

    def __init__(
        self, kinds: Kinds, task: Task, target: str, na_values: list[str], max_distinct_values: int, what: str
    ) -> None:
        self.kinds, self.task, self.target, self.na_values = kinds, task, target, na_values
        self.max_distinct, self.what = max_distinct_values, what
        self.moments = RunningMoments(len(kinds.numeric))
        self.counts: dict[str, dict[str, int]] = {name: {} for name in kinds.categorical}
        self.complete = dict.fromkeys(kinds.categorical, True)  # no empty cell in the training rows
        self.labels: set[Any] = set()
        self.rows = 0

    def update(self, column_of: Callable[[str], pd.Series], rows: int) -> None:
        """One batch of ``rows`` training rows, each column as ``column_of(name)`` reads it."""
        location = Location(self.what)
        if self.kinds.numeric:
            block = np.empty((rows, len(self.kinds.numeric)))  # (rows, numeric) float64, NaN = missing
            for j, name in enumerate(self.kinds.numeric):
                block[:, j] = numeric_values(column_of(name), location, self.na_values)
            self.moments.update(block)
        for name in self.kinds.categorical:
            cells = column_of(name)
            self.complete[name] &= bool(cells.notna().all())
            counts = self.counts[name]
            texts, found = np.unique(category_strings(cells, self.na_values).astype(str), return_counts=True)
            for text, count in zip(texts.tolist(), found.tolist(), strict=True):
                counts[text] = counts.get(text, 0) + count
            if len(counts) > self.max_distinct:
                raise UserInputError(
                    f"{self.what}: column {name!r} has more than data.max_distinct_values="
                    f"{self.max_distinct} distinct values in the training rows, like an identifier; drop it "
                    "with data.columns.drop, or raise data.max_distinct_values."
                )
        target = column_of(self.target)
        if self.task == "classification":
            self.labels.update(pd.unique(target).tolist())
        else:
            numeric_values(target, location)  # a text among the targets: one sentence
        self.rows += rows

    def result(
        self, max_categories: int, min_frequency: int, standardize: bool, indicator: bool
    ) -> Preprocessor:
        """The fitted preprocessing: what ``fit_preprocessor`` gives with ``impute_strategy: mean``."""
        if max_categories < 2 or min_frequency < 1:
            raise UserInputError(
                f"data.encoding.max_categories={max_categories} must be at least 2 and "
                f"data.encoding.min_category_frequency={min_frequency} at least 1."
            )
        moments, rows = self.moments, self.rows
        # the scaler is fitted on the imputed column: its mean is the observed mean, and each filled cell
        # adds a zero deviation, so its variance is the observed squared deviations over all rows
        scale = scale_of(moments.m2 / max(rows, 1), moments.mean, rows)
        numeric = [
            NumericColumn(
                name=name,
                fill=float(moments.mean[j]),
                mean=float(moments.mean[j]) if standardize else 0.0,
                scale=float(scale[j]) if standardize else 1.0,
                indicator=indicator and moments.count[j] < rows,
            )
            for j, name in enumerate(self.kinds.numeric)
            if moments.count[j] > 0
        ]
        empty = [name for j, name in enumerate(self.kinds.numeric) if moments.count[j] == 0]
        unique = [
            name
            for name, counts in self.counts.items()
            if rows >= 20 and self.complete[name] and len(counts) == rows
        ]
        if empty:
            rank_zero_info(
                f"{self.what}: the column(s) {empty} have no value in the training rows and are left out."
            )
        if unique:
            rank_zero_info(
                f"{self.what}: the column(s) {unique} hold a different text in every training row (names, "
                "IDs) and are left out; turn them into something shared between rows to use them."
            )
        categorical = []
        for name, counts in self.counts.items():
            if name in unique:
                continue
            rare = infrequent(counts, max_categories, min_frequency)
            categorical.append(
                CategoricalColumn(name, [v for v in sorted(counts) if v not in rare], other=bool(rare))
            )
        if not numeric and not categorical:
            raise UserInputError(f"{self.what} has no feature column with values in the training rows.")
        labels: list[Label] | None = None
        if self.task == "classification":
            classes = np.unique(label_values(pd.Series(sorted(self.labels, key=repr))))
            labels = [int(v) if isinstance(v, np.integer) else str(v) for v in classes]
        return Preprocessor(self.task, self.target, numeric, categorical, labels, list(self.na_values))


# -- the rows of one split, streamed ------------------------------------------------------------------


def share_of(total: int, rank: int, world: int) -> tuple[int, int]:
    """``[start, end)``: process ``rank``'s contiguous share of ``total`` rows (sizes differ by 1 at most)."""
    return total * rank // world, total * (rank + 1) // world


def batch_count(total: int, world: int, batch_size: int, drop_last: bool) -> int:
    """Batches per process, the same on every one: the smallest share cut into ``batch_size`` rows (the
    last batch of a larger share takes its extra row)."""
    smallest = total // world
    return smallest // batch_size if drop_last else math.ceil(smallest / batch_size)


class SplitStream(IterableDataset[tuple[torch.Tensor, ...]]):
    """The batches of one split for one process: ``(x, y)`` tensors, ``(B, F)`` float32 and ``(B,)`` class
    ids (int64) or values (float32). ``len()`` is the batch count, the same on every process.

    Args:
        groups: Every row group, in file and group order.
        counts: ``(groups,)`` this split's rows with a target per group.
        read: Reads a window of groups: the split's rows, encoded, in file order or shuffled by the
            generator it is given.
        stage: The split.
        batch_size: Rows per batch.
        shuffle_row_groups: Groups per window (training); each epoch draws the groups' order.
        rank: This process's number.
        world: The process count.
        drop_last: Drop what is left over after the last full batch of the smallest share.
    """

    def __init__(
        self,
        groups: list[RowGroup],
        counts: np.ndarray,
        read: Callable[[list[int], np.random.Generator | None], tuple[torch.Tensor, torch.Tensor]],
        stage: Stage,
        batch_size: int,
        shuffle_row_groups: int,
        rank: int,
        world: int,
        drop_last: bool,
    ) -> None:
        self.groups, self.counts, self.read, self.stage = groups, counts, read, stage
        self.batch_size, self.window = batch_size, shuffle_row_groups if stage == "train" else 1
        self.rank, self.world, self.drop_last = rank, world, drop_last
        self.total = int(counts.sum())
        if self.total < world:
            raise UserInputError(
                f"the {stage} split has {self.total} rows with a target, fewer than the {world} processes; "
                "use more rows or other fractions."
            )
        self.batches = batch_count(self.total, world, batch_size, drop_last)
        #: the epoch's seed, drawn by the loader (training); ``None`` reads the groups in file order
        self.epoch_seed: int | None = None
        #: batches of the epoch to skip (a resumed epoch)
        self.skip = 0

    def __len__(self) -> int:
        return self.batches

    def windows(self) -> list[list[int]]:
        """The epoch's windows of group numbers, in reading order."""
        order = np.arange(len(self.groups))
        if self.epoch_seed is not None:
            order = np.random.default_rng(self.epoch_seed).permutation(len(self.groups))
        return [order[i : i + self.window].tolist() for i in range(0, len(order), self.window)]

    def bounds(self) -> list[tuple[int, int]]:
        """``[start, end)`` of each of this process's batches, in positions of the epoch's rows."""
        start, end = share_of(self.total, self.rank, self.world)
        cuts = [start + b * self.batch_size for b in range(self.batches + 1)]
        if not self.drop_last:
            cuts[-1] = end
        return list(itertools.pairwise(cuts))

    def window_rows(self, number: int, groups: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One window's rows, shuffled together in training (seeded by the epoch and the window)."""
        shuffle = None if self.epoch_seed is None else np.random.default_rng([self.epoch_seed, number])
        return self.read(groups, shuffle)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        bounds = self.bounds()[self.skip :]
        if not bounds:
            return
        windows = self.windows()
        ends = np.cumsum([int(self.counts[w].sum()) for w in windows])
        first, last = bounds[0][0], bounds[-1][1]
        # the windows holding rows [first, last): none before them is read
        wanted = [i for i in range(len(windows)) if ends[i] > first and _start(ends, i) < last]
        pool = ThreadPoolExecutor(max_workers=1)  # the next window is read while this one trains
        try:
            ahead: Future | None = pool.submit(self.window_rows, wanted[0], windows[wanted[0]])
            # the rows from held_at on, as views of the windows they came from: a batch within one window
            # is a view, one across two a copy of its own rows only
            held: list[tuple[torch.Tensor, torch.Tensor]] = []
            held_rows, held_at = 0, first
            batches = iter(bounds)
            _, end = next(batches)
            for k, number in enumerate(wanted):
                assert ahead is not None
                x, y = ahead.result()
                ahead = (
                    pool.submit(self.window_rows, wanted[k + 1], windows[wanted[k + 1]])
                    if k + 1 < len(wanted)
                    else None
                )
                begin = _start(ends, number)
                x, y = x[max(first - begin, 0) :], y[max(first - begin, 0) :]
                held.append((x, y))
                held_rows += len(y)
                while held_at + held_rows >= end:
                    yield _take(held, end - held_at)
                    held_rows, held_at = held_rows - (end - held_at), end
                    step = next(batches, None)
                    if step is None:
                        return
                    _, end = step
        finally:
            pool.shutdown(cancel_futures=True)


def _take(held: list[tuple[torch.Tensor, torch.Tensor]], rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``rows`` rows of ``held``, taken out of it."""
    xs, ys = [], []
    while rows:
        x, y = held[0]
        take = min(rows, len(y))
        xs.append(x[:take])
        ys.append(y[:take])
        if take == len(y):
            held.pop(0)
        else:
            held[0] = (x[take:], y[take:])
        rows -= take
    return (xs[0], ys[0]) if len(xs) == 1 else (torch.cat(xs), torch.cat(ys))


def _start(ends: np.ndarray, i: int) -> int:
    """Where window ``i`` starts among the epoch's rows."""
    return int(ends[i - 1]) if i > 0 else 0


class StreamLoader(ResumableLoader):
    """The training loader of a :class:`SplitStream`: resumable in mid-epoch as :class:`ResumableLoader`
    is (the same state: the generator before the epoch, the batches processed, the batching), but the
    stream skips the batches done by its row counts instead of drawing them.

    Args:
        dataset: The training split's stream.
        generator: Draws each epoch's order.
        pin_memory: Pin the batches (CUDA).
    """

    dataset: SplitStream

    def __init__(self, dataset: SplitStream, generator: torch.Generator, pin_memory: bool) -> None:
        # batch_size None: the stream hands over whole batches; workers none: a thread reads ahead instead
        super().__init__(
            dataset, batch_size=None, collate_fn=keep_batch, generator=generator, pin_memory=pin_memory
        )

    @override
    def batching(self) -> dict[str, Any]:
        stream = self.dataset
        return {
            "batch_size": stream.batch_size,
            "drop_last": stream.drop_last,
            "processes": stream.world,
            "items": stream.total,
        }

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # not a _BaseDataLoaderIter
        self.dataset.skip = self.start_epoch()
        self.dataset.epoch_seed = int(torch.randint(0, 2**62, (), generator=self.generator))
        return DataLoader.__iter__(self)  # not ResumableLoader's: the stream skips by itself


def quiet_length_warning() -> None:
    """Silence Lightning's warning for any IterableDataset with a length: it is about loader workers that
    each yield every row, and a stream here refuses workers, so its length is exact. (Set when a loader is
    built, not at import: a filter set earlier is overridden by whatever a runner sets in between.)"""
    warnings.filterwarnings(
        "ignore", message="Your `IterableDataset` has `__len__` defined", category=UserWarning
    )


# -- the DataModule -----------------------------------------------------------------------------------


def check_streamable(encoding: Encoding, split: Split) -> None:
    """What one pass over the rows cannot do, said in one sentence: a median, robust scaling and target
    means need every value at once, and the hash split has no folds nor refit."""
    unsupported = {
        "data.encoding.impute_strategy": (encoding.impute_strategy or "mean", "mean"),
        "data.encoding.scaling": (encoding.scaling, "standard"),
        "data.encoding.high_cardinality": (encoding.high_cardinality, "other"),
        "data.split.folds": (split.folds, None),
        "data.split.train_on_validation": (split.train_on_validation, False),
    }
    for key, (given, streamable) in unsupported.items():
        if given != streamable:
            raise UserInputError(
                f"{key}={given!r} needs every row at once, which the streaming DataModule never holds; use "
                f"{streamable!r}, or the in-memory src.extras.tables.TabularDataModule."
            )


class StreamingTableDataModule(ResumableDataModule):
    """Rows of Parquet files too many to hold in memory, streamed with the in-memory path's guarantees.

    The module docstring says how rows are split, fitted, shuffled and shared between processes.

    Args:
        path: A Parquet file of many row groups, or a folder of Parquet files (searched recursively,
            read in name order; every file with the same columns).
        target_column: The column to predict; rows without a value are left out.
        task: ``classification`` or ``regression``.
        columns: Which columns the net reads, and as what (:class:`src.extras.tables.Columns`);
            ``categorical`` encodes a column Parquet stores as numbers, ``numeric`` reads one it stores as
            text.
        encoding: How they are encoded (:class:`src.extras.tables.Encoding`), as the in-memory table's but
            for what a single pass cannot fit: a missing number takes the training ``mean`` (a median is not
            streamable), ``standard`` scaling, and categories beyond ``max_categories`` share ``other``.
        split: ``val_fraction`` and ``test_fraction``, the shares of the rows held out on average
            (:class:`src.extras.tables.Split`; its folds and refit are the in-memory table's alone).
        max_distinct_values: Distinct values counted per categorical column while fitting, at most; a
            column with more is refused (an identifier, or free text).
        predict_path: A CSV or Parquet file to predict (``predict``), read whole.
        preprocessing_from: A checkpoint whose fitted preprocessing to use instead of fitting one;
            the CLI sets it to ``--ckpt_path``.
        resplit_on_resume: Let a resumed fit go on with other row groups or split settings than its
            checkpoint's run split them with (rows it held out may then be trained on); left false, such a
            resume is refused.
        seed: Seeds the split and the training order.
        batch_size: Rows per batch, per process.
        shuffle_row_groups: Row groups whose training rows are shuffled together: more mixes better and
            holds more in memory (twice this many groups at once, the next window being read ahead).
        num_workers: 0; the stream reads its next window on a thread of its own.
        drop_last: Drop the rows after the last full batch of the epoch.
    """

    def __init__(
        self,
        path: str,
        target_column: str,
        task: Literal["classification", "regression"],
        columns: Columns | None = None,
        encoding: Encoding | None = None,
        split: Split | None = None,
        max_distinct_values: int = 100_000,
        predict_path: str | None = None,
        preprocessing_from: str | None = None,
        resplit_on_resume: bool = False,
        seed: int = 42,
        batch_size: int = 64,
        shuffle_row_groups: int = 4,
        num_workers: int = 0,
        drop_last: bool = False,
    ) -> None:
        super().__init__(seed, batch_size, num_workers, drop_last)
        self.columns = group(columns, Columns, "data.columns")
        self.encoding = group(encoding, Encoding, "data.encoding")
        self.split = group(split, Split, "data.split")
        check_fractions(self.split.val_fraction, self.split.test_fraction, "rows", "data.split")
        check_streamable(self.encoding, self.split)
        if num_workers != 0:
            raise UserInputError(
                f"data.num_workers={num_workers}: the streaming DataModule reads on a thread of its own; "
                "set data.num_workers to 0."
            )
        if shuffle_row_groups < 1:
            raise UserInputError(f"data.shuffle_row_groups={shuffle_row_groups} must be at least 1.")
        overlap = set(self.columns.categorical) & set(self.columns.numeric)
        if overlap:
            raise UserInputError(
                f"data.columns.categorical and data.columns.numeric both name {sorted(overlap)}; pick one."
            )
        # plain data in checkpoints (weights_only=True reads them): the groups as mappings
        self.save_hyperparameters(ignore=["columns", "encoding", "split"])
        self.hparams.update(
            columns=asdict(self.columns), encoding=asdict(self.encoding), split=asdict(self.split)
        )
        self._datasets: dict[Stage, Any] = {}
        self._resume: dict[str, Any] | None = None

    @property
    def settings(self) -> AttributeDict:
        """The ``__init__`` arguments, as saved by ``save_hyperparameters``."""
        return cast(AttributeDict, self.hparams)

    @property
    def what(self) -> str:
        """The data, as a sentence names it."""
        path = self.settings.path
        return f"Parquet {'file' if Path(path).is_file() else 'folder'} {path!r}"

    # -- the files and the split ----------------------------------------------------------------------

    @cached_property
    def footers(self) -> dict[Path, tuple[pq.FileMetaData, pa.Schema]]:
        """Each file's footer: its row groups and their statistics, and its columns as Arrow reads them."""
        footers = {}
        for file in self.files:
            opened = open_parquet(file)
            footers[file] = (opened.metadata, opened.schema_arrow)
            opened.close()
        return footers

    @property
    def schema(self) -> pa.Schema:
        """The first file's schema: the columns there are to choose from."""
        return self.footers[self.files[0]][1]

    @cached_property
    def types(self) -> dict[str, tuple[pa.DataType, Path]]:
        """The type each column read (the features and the target) is read as in every file, and the first
        file storing it so; files that lack a column or store it otherwise are one sentence
        (:func:`column_types`)."""
        target = self.settings.target_column
        schemas = {file: schema for file, (_, schema) in self.footers.items()}
        types = column_types(schemas, [*self.features, target])
        refuse_unreadable(
            target,
            *types[target],
            "the target must be classes (text or integers) or numbers: convert it, or set "
            "data.target_column to another column.",
        )
        return types

    @cached_property
    def files(self) -> list[Path]:
        return parquet_files(self.settings.path)

    @cached_property
    def features(self) -> list[str]:
        """The feature columns, chosen as ``sources.select`` chooses them."""
        hp, columns = self.settings, list(data_columns(self.schema))
        if hp.target_column not in columns:
            raise UserInputError(
                f"{self.what} has no column {hp.target_column!r}; set data.target_column to one of {columns}."
            )
        for key, names in {
            "data.columns.features": self.columns.features or [],
            "data.columns.drop": self.columns.drop,
        }.items():
            unknown = [c for c in names if c not in columns]
            if unknown:
                raise UserInputError(f"{self.what} has no column(s) {unknown}; fix {key}.")
        if hp.target_column in (self.columns.features or []):
            raise UserInputError(
                f"data.columns.features lists the target {hp.target_column!r}: the model would read the "
                "answer; remove it."
            )
        chosen = [
            c
            for c in (self.columns.features or columns)
            if c != hp.target_column and c not in self.columns.drop
        ]
        if not chosen:
            raise UserInputError(f"{self.what} has no feature column besides {hp.target_column!r}.")
        return chosen

    @cached_property
    def groups(self) -> list[RowGroup]:
        """Every row group of every file, from the files' footers."""
        root = Path(self.settings.path)
        found = []
        for file, (metadata, _) in self.footers.items():
            name = file.name if root.is_file() else file.relative_to(root).as_posix()
            first = 0
            for index in range(metadata.num_row_groups):
                rows = metadata.row_group(index).num_rows
                found.append(RowGroup(file, name, index, first, rows))
                first += rows
        if not any(g.rows for g in found):
            raise UserInputError(f"{self.what} has no data rows; add rows.")
        return found

    def _codes(self, group: RowGroup) -> np.ndarray:
        hp = self.settings
        return split_codes(group, hp.seed, self.split.val_fraction, self.split.test_fraction)

    def _has_target(self, group: RowGroup, file: pq.ParquetFile) -> np.ndarray | None:
        """``(rows,)`` whether each row has a target (not empty, not NaN), or ``None`` when all do (the
        footer's statistics say so without reading the column, when it cannot hold NaN)."""
        target = self.settings.target_column
        written = data_columns(file.schema_arrow).get(target)
        statistics = recorded_statistics(file.metadata, group.index).get(written or target)
        kind = file.schema_arrow.field(written).type if written is not None else pa.null()
        if (
            statistics is not None
            and statistics.has_null_count
            and statistics.null_count == 0
            and not pa.types.is_floating(kind)
        ):
            return None
        values = _read(group, [target], self.types, file).column(0)
        return ~values.is_null(nan_is_null=True).to_numpy(zero_copy_only=False)

    @cached_property
    def counts(self) -> np.ndarray:
        """``(groups, 3)``: rows with a target per row group and split (train, validation, test); one
        sentence for a file without any target (rows to predict, in among those to train on)."""
        counts = np.zeros((len(self.groups), len(SPLITS)), np.int64)
        for path, numbers in itertools.groupby(range(len(self.groups)), key=lambda i: self.groups[i].file):
            file, rows, kept_rows = open_parquet(path), 0, 0
            for i in numbers:
                group = self.groups[i]
                codes = self._codes(group)
                kept = self._has_target(group, file)
                counts[i] = np.bincount(codes if kept is None else codes[kept], minlength=len(SPLITS))
                rows, kept_rows = rows + group.rows, kept_rows + int(counts[i].sum())
            file.close()
            if rows and not kept_rows:
                raise UserInputError(
                    f"Parquet file {str(path)!r} has no value in its column {self.settings.target_column!r} "
                    f"(all {rows} rows empty); fill in the targets, or move the file out of data.path (rows "
                    "to predict go to predict with data.predict_path)."
                )
        dropped = sum(g.rows for g in self.groups) - int(counts.sum())
        if dropped:
            rank_zero_info(
                f"{self.what}: {dropped} rows have no {self.settings.target_column!r} and are left out."
            )
        return counts

    @cached_property
    def split_record(self) -> dict[str, Any]:
        """What the split was made from, saved in every checkpoint for a resumed fit to compare
        (:func:`check_split`) without a pass over the rows: per row group a hash of its footer's record
        (:func:`footer_digest`, of the columns read) and its rows with a target in each split, and the
        settings that split them."""
        hp, split = self.settings, self.split
        read = [*self.features, hp.target_column]
        items = np.zeros(len(self.groups), np.uint64)
        for i, row_group in enumerate(self.groups):
            metadata, schema = self.footers[row_group.file]
            written = data_columns(schema)
            items[i] = footer_digest(row_group, metadata, [written[c] for c in read if c in written])
        settings = {
            "data.seed": hp.seed,
            "data.split.val_fraction": split.val_fraction,
            "data.split.test_fraction": split.test_fraction,
        }
        return split_record(items, self.counts, settings)

    def moved_rows(self, saved: dict[str, Any]) -> tuple[int, int]:
        """Of the rows with a target in the row groups that ``saved`` (a checkpoint's split record) holds
        too: those its settings put in another split than these do, and those of them held out then and
        trained on now (their codes drawn again from the row numbers; a target read where some lack it)."""
        was = saved["settings"]
        found = np.isin(self.split_record["items"].numpy(), saved["items"].numpy())
        changed = into_training = 0
        for number in np.flatnonzero(found):
            group = self.groups[number]
            before = split_codes(
                group, was["data.seed"], was["data.split.val_fraction"], was["data.split.test_fraction"]
            )
            now = self._codes(group)
            if self.counts[number].sum() < group.rows:  # rows without a target are in no split
                with open_parquet(group.file) as file:
                    kept = self._has_target(group, file)
                if kept is not None:
                    before, now = before[kept], now[kept]
            moved = before != now
            changed += int(moved.sum())
            into_training += int((moved & (now == TRAINED)).sum())
        return changed, into_training

    def rows_of(self, number: int, stage: Stage, columns: Sequence[str]) -> pa.Table:
        """The columns of one row group's rows of ``stage`` with a target, in file order."""
        group = self.groups[number]
        keep = self._codes(group) == CODE[stage]
        table = _read(group, columns, self.types)
        target = table.column(self.settings.target_column) if self.settings.target_column in columns else None
        if target is not None and (target.null_count or pa.types.is_floating(target.type)):
            keep &= ~target.is_null(nan_is_null=True).to_numpy(zero_copy_only=False)
        return table.filter(pa.array(keep))

    # -- what is fitted on the training rows ----------------------------------------------------------

    @cached_property
    def kinds(self) -> Kinds:
        unknown = [c for c in [*self.columns.categorical, *self.columns.numeric] if c not in self.features]
        if unknown:
            raise UserInputError(
                f"{self.what} has no feature column(s) {unknown}; fix data.columns.categorical or "
                "data.columns.numeric."
            )
        return column_kinds(self.types, self.features, self.columns.categorical, self.columns.numeric)

    @cached_property
    def preprocessor(self) -> Preprocessor:
        """The fitted preprocessing: ``preprocessing_from``'s checkpoint's, or fitted in one pass."""
        hp = self.settings
        if hp.preprocessing_from is not None:
            return preprocessing_of(load_checkpoint(hp.preprocessing_from), hp.preprocessing_from)
        fit = StreamingFit(
            self.kinds, hp.task, hp.target_column, self.columns.na_values, hp.max_distinct_values, self.what
        )
        columns = [*self.features, hp.target_column]
        for number, count in enumerate(self.counts[:, CODE["train"]]):
            if count:
                table = self.rows_of(number, "train", columns)
                fit.update(columns_of(table), table.num_rows)
        if fit.rows == 0:
            raise UserInputError(f"{self.what} has no training rows; use more rows or other fractions.")
        encoding = self.encoding
        return fit.result(
            encoding.max_categories,
            encoding.min_category_frequency,
            encoding.standardize,
            encoding.missing_indicator,
        )

    @property
    def in_features(self) -> int:
        """Encoded feature count. Reading it fits, so bad data fails before a run starts."""
        return len(self.preprocessor.feature_names)

    @property
    def out_features(self) -> int:
        """Class count for classification, 1 for regression."""
        return self.preprocessor.num_classes or 1

    @property
    def label_names(self) -> list[Label] | None:
        """Class labels as the data writes them, in class-id order; ``None`` for regression."""
        return self.preprocessor.labels

    @property
    def task(self) -> str:
        return self.preprocessor.task

    # -- tensors --------------------------------------------------------------------------------------

    def encode_window(
        self, numbers: list[int], stage: Stage, shuffle: np.random.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of ``stage`` in row groups ``numbers``, encoded: ``(N, F)`` float32 and ``(N,)``; in
        file order, or in an order ``shuffle`` draws (the rows are put in it before they are encoded, so
        the encoding is written once)."""
        preprocessor, target = self.preprocessor, self.settings.target_column
        parts = [self.rows_of(n, stage, [*preprocessor.columns, target]) for n in numbers]
        table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        del parts
        if shuffle is not None:
            table = table.take(pa.array(shuffle.permutation(table.num_rows)))
        location = Location(self.what)
        x = preprocessor.encode(columns_of(table), table.num_rows, location)
        labels = table.column(target).to_pandas()
        if preprocessor.task == "classification":
            y = preprocessor.encode_labels(labels, location)
        else:
            y = numeric_values(labels, location).astype(np.float32)
        return torch.from_numpy(x), torch.from_numpy(y)

    def dataset(self, stage: Stage) -> Any:
        """A split's :class:`SplitStream` for this process, or ``predict_path``'s rows in memory."""
        if stage == "predict":
            path = self.settings.predict_path
            if path is None:
                raise UserInputError(
                    "the streaming DataModule predicts a file: set data.predict_path to a CSV or Parquet "
                    "file."
                )
            if stage not in self._datasets:
                fmt = sources.file_format(path)
                frame = sources.read_file(path, fmt, self.columns.na_values, key="data.predict_path")
                x = self.preprocessor.transform(frame, sources.file_location(path, fmt))
                self._datasets[stage] = TensorBatches(torch.from_numpy(x))
            return self._datasets[stage]
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        return self.stream(stage, rank, world)

    def stream(self, stage: Stage, rank: int, world: int) -> SplitStream:
        """A split's :class:`SplitStream` for process ``rank`` of ``world``."""
        return SplitStream(
            self.groups,
            self.counts[:, CODE[stage]],
            lambda numbers, shuffle: self.encode_window(numbers, stage, shuffle),
            stage,
            self.settings.batch_size,
            self.settings.shuffle_row_groups,
            rank,
            world,
            self.settings.drop_last and stage == "train",
        )

    @override
    def batching(self, processes: int) -> dict[str, Any]:
        return StreamLoader(self.stream("train", 0, processes), self._shuffle, False).batching()

    @override
    def train_dataloader(self) -> DataLoader:
        """The training stream, at its restored position."""
        quiet_length_warning()
        options = self._loader_options()
        loader = StreamLoader(self.dataset("train"), self._shuffle, options["pin_memory"])
        if self._resume is not None:
            loader.load_state_dict(self._resume)
            self._resume = None
        self._train_loader = loader
        return loader

    def _plain_loader(self, stage: Stage) -> DataLoader:
        quiet_length_warning()
        return DataLoader(
            self.dataset(stage),
            batch_size=None,
            collate_fn=keep_batch,
            pin_memory=self._loader_options()["pin_memory"],
        )

    @override
    def val_dataloader(self) -> DataLoader:
        return self._plain_loader("val")

    @override
    def test_dataloader(self) -> DataLoader:
        return self._plain_loader("test")

    @override
    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.dataset("predict"), **self._loader_options())

    # -- checkpoints ----------------------------------------------------------------------------------

    @override
    def state_dict(self) -> dict[str, Any]:
        """The fitted preprocessing, as plain data, what the split was made from, and the training order's
        state."""
        return {
            "preprocessing": self.preprocessor.state_dict(),
            "split": self.split_record,
            **super().state_dict(),
        }

    @override
    def check_resume(self, state_dict: dict[str, Any]) -> None:
        """A resumed fit goes on with its run's split (:func:`check_split`), row group by row group."""
        saved = state_dict.get("split")
        check_split(
            saved, self.split_record, self.settings.resplit_on_resume, "row", "data.resplit_on_resume",
            part="row group", moved=lambda: self.moved_rows(cast(dict, saved)),
        )  # fmt: skip

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A resumed fit goes on with its run's split (:meth:`check_resume`, first); a checkpoint's
        preprocessing wins over one fitted anew."""
        super().load_state_dict(state_dict)
        restored = Preprocessor.from_state(state_dict["preprocessing"])
        if "preprocessor" not in self.__dict__ or restored != self.preprocessor:
            self.__dict__["preprocessor"] = restored
        self._resume = state_dict.get("loader")
