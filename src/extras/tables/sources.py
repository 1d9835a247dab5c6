"""Where rows come from: real tables bundled with installed packages, seeded synthetic data, or your file.

Every source gives a :class:`Table`: the feature columns as they were read (numbers, text, empty cells),
the target column, and the task. Nothing is downloaded. Turning columns into numbers is the job of
:mod:`src.extras.tables.preprocessing`, fitted on the training rows only.
"""

import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from sklearn import datasets

from src.errors import UserInputError, notice
from src.extras.tables.preprocessing import Location, Task, label_values, numeric_values

FileFormat = Literal["csv", "parquet"]
SUFFIXES: dict[str, FileFormat] = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}

#: the data that ships with the installed packages (digits, diabetes, penguins) or is drawn (spiral, friedman)
BUNDLED = ("digits", "diabetes", "spiral", "friedman", "penguins")
#: a synthetic source's noise unless given: spiral's angle jitter, friedman's target std
NOISE = {"spiral": 0.2, "friedman": 1.0}


@dataclass(frozen=True)
class Table:
    """Feature columns as read, the target (rows without one already dropped), the task, and where the
    rows came from (for error messages)."""

    features: pd.DataFrame
    target: pd.Series | pd.DataFrame  #: one target column, or several (a frame, one column each)
    task: Task
    location: Location

    @property
    def target_name(self) -> str | list[str]:
        """The target column's name, or the names of several."""
        if isinstance(self.target, pd.DataFrame):
            return [str(name) for name in self.target.columns]
        return str(self.target.name)


def _bundled(features: pd.DataFrame, target: pd.Series, task: Task, what: str) -> Table:
    return Table(features.reset_index(drop=True), target.reset_index(drop=True), task, Location(what))


def bundled(name: str, num_samples: int, noise: float | None, seed: int) -> Table:
    """One of :data:`BUNDLED`; the synthetic ones of ``num_samples`` rows, drawn with ``seed``, their noise
    by default :data:`NOISE`'s."""
    if name in ("spiral", "friedman"):
        draw = spiral if name == "spiral" else friedman
        return draw(num_samples, NOISE[name] if noise is None else noise, seed)
    return {"digits": digits, "diabetes": diabetes, "penguins": penguins}[name]()


def digits() -> Table:
    """8x8 handwritten digits (1797 rows, 64 pixel features, 10 classes), bundled with scikit-learn."""
    bunch = datasets.load_digits(as_frame=True)
    return _bundled(bunch.data, bunch.target, "classification", "the digits data")


def diabetes() -> Table:
    """Diabetes progression (442 rows, 10 features, one continuous target), bundled with scikit-learn."""
    bunch = datasets.load_diabetes(as_frame=True)
    return _bundled(bunch.data, bunch.target.astype(np.float32), "regression", "the diabetes data")


def spiral(num_samples: int, noise: float, seed: int, num_classes: int = 3) -> Table:
    """Interleaved 2-D spiral arms, one per class: not linearly separable, so an MLP has work to do."""
    rng = np.random.default_rng(seed)
    per_class = num_samples // num_classes
    radius = np.tile(np.linspace(0.05, 1.0, per_class), num_classes)
    label = np.repeat(np.arange(num_classes), per_class)
    angle = radius * 4.0 + label * (2 * np.pi / num_classes) + rng.normal(0.0, noise, radius.shape)
    xy = pd.DataFrame({"x": radius * np.sin(angle), "y": radius * np.cos(angle)}, dtype=np.float32)
    return _bundled(xy, pd.Series(label, name="arm"), "classification", "the spiral data")


def friedman(num_samples: int, noise: float, seed: int) -> Table:
    """Friedman #1: ``10 sin(pi x0 x1) + 20 (x2 - 0.5)^2 + 10 x3 + 5 x4 + noise`` over 10 uniform inputs."""
    x, y = datasets.make_friedman1(n_samples=num_samples, n_features=10, noise=noise, random_state=seed)
    frame = pd.DataFrame(x.astype(np.float32), columns=[f"x{i}" for i in range(10)])
    return _bundled(frame, pd.Series(y.astype(np.float32), name="y"), "regression", "the friedman data")


PENGUINS_DROP = ["studyName", "Sample Number", "Individual ID", "Date Egg", "Comments"]


def penguins_path() -> Path:
    """``penguins-raw.csv`` as the palmerpenguins package ships it: 344 penguins of 3 species, with text
    columns (island, sex, "Yes"/"No"), empty cells, and species named in full."""
    return Path(str(resources.files("palmerpenguins") / "data" / "penguins-raw.csv"))


def penguins() -> Table:
    """A penguin's sex (``MALE``/``FEMALE``; 11 penguins without one are left out) from its species,
    island, measurements and clutch completion: a real, messy table, read exactly as a user's CSV file
    is (its record-keeping columns, such as IDs and dates, are dropped)."""
    path = penguins_path()
    return select(
        read_file(path, "csv"),
        "Sex",
        "classification",
        location=file_location(path, "csv"),
        drop_columns=PENGUINS_DROP,
    )


# -- your file ----------------------------------------------------------------------------------------


def check_predict_path(path: str) -> None:
    """``data.predict_path`` names a file, or one sentence says it does not."""
    if not Path(path).is_file():
        raise UserInputError(
            f"data.predict_path={path!r} does not exist; name the CSV or Parquet file to predict."
        )


def file_format(path: str | Path) -> FileFormat:
    """``csv`` or ``parquet`` from the file's suffix."""
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIXES:
        raise UserInputError(
            f"data file {str(path)!r} has the suffix {suffix!r}; name a .csv or .parquet file, or set "
            "data.source to csv or parquet."
        )
    return SUFFIXES[suffix]


def file_location(path: str | Path, fmt: FileFormat) -> Location:
    # CSV: +2 turns a row index into a line number (the header is line 1); Parquet has no lines
    return Location(
        f"{fmt.upper() if fmt == 'csv' else 'Parquet'} file {str(path)!r}", 2 if fmt == "csv" else None
    )


def read_file(
    path: str | Path, fmt: FileFormat, na_values: Sequence[str] = (), key: str = "data.path"
) -> pd.DataFrame:
    """The whole file as pandas reads it (CSV by pandas, Parquet through pyarrow), rows numbered from 0.

    Column names lose surrounding spaces; a name written twice (surrounding spaces aside) is refused; a
    leading unnamed column that only counts the rows (an index written by ``DataFrame.to_csv``) is left
    out, with a notice.
    """
    path = Path(path)
    what = file_location(path, fmt).what
    if not path.is_file():
        raise UserInputError(f"{what} does not exist; set {key} to an existing file.")
    try:
        if fmt == "csv":
            frame = _read_csv(path, na_values)
        else:
            frame = _read_parquet(path, what)
            if na_values:
                frame = frame.replace(list(na_values), np.nan)
    except UserInputError:
        raise  # a sentence already
    except (pd.errors.ParserError, pd.errors.EmptyDataError, OSError, ValueError) as err:
        problem = str(err).strip().splitlines()[0]
        raise UserInputError(f"{what} could not be read ({problem}); fix the file.") from err
    if frame.empty:
        raise UserInputError(f"{what} has no data rows; add rows.")
    frame.columns = [str(c).strip() for c in frame.columns]
    _refuse_repeated(frame.columns, what)
    first = frame.columns[0]
    if first.startswith("Unnamed: 0") and frame[first].equals(pd.Series(range(len(frame)))):
        notice(f"{what}: the first column {first!r} only counts the rows (a saved index) and is left out.")
        frame = frame.drop(columns=first)
    return frame


def _refuse_repeated(names: Sequence[str], what: str, strip: bool = True) -> None:
    """Refuse a column name written more than once (surrounding spaces aside, unless ``strip`` is off): a
    setting that names it, or a checkpoint's list of columns, could not say which of the columns it means."""
    stripped = pd.Index([name.strip() if strip else name for name in names])
    repeated = stripped[stripped.duplicated()].unique().tolist()
    if repeated:
        raise UserInputError(
            f"{what} has the column name(s) {repeated} more than once; rename them so that each column has "
            "a name of its own."
        )


#: rows whose distinct values are counted first when a feature is checked for being the target renamed
SAME_AS_TARGET_PREFIX = 10_000
#: bytes of decoded columns (counted as 8 per cell) that one read of a Parquet file takes at a time
READ_BLOCK_BYTES = 32 << 20


def _data_columns(file: pq.ParquetFile) -> list[str]:
    """The file's column names as written, less the index columns a pandas frame saved beside them."""
    saved_index = (file.schema_arrow.pandas_metadata or {}).get("index_columns", [])
    return [name for name in file.schema_arrow.names if name not in saved_index]


def _columns_per_read(file: pq.ParquetFile) -> int:
    """How many columns one read takes: about ``READ_BLOCK_BYTES``, counting 8 bytes a cell."""
    return max(1, READ_BLOCK_BYTES // max(8 * file.metadata.num_rows, 1))


def _read_parquet(path: Path, what: str) -> pd.DataFrame:
    """A Parquet file by pyarrow, a block of columns at a time, rows numbered from 0 (a saved index dropped).

    Field names written twice (pyarrow allows them) are refused from the schema, before any data is read.

    Read whole, the file is held twice at the peak (Arrow's decoded table beside pandas' columns, more
    than twice the data in all); read a block of columns at a time, with each block's Arrow memory freed
    and handed back before the next, the peak is the data and one block. The columns stay one block each
    (``copy=False``), so that each can be freed on its own later.
    """
    file = pq.ParquetFile(path)
    # every field as written, a saved index's too: a column named exactly as the index would be left
    # out below with it; then the data columns, their surrounding spaces aside
    _refuse_repeated(file.schema_arrow.names, what, strip=False)
    names = _data_columns(file)
    _refuse_repeated(names, what)
    per_block = _columns_per_read(file)
    columns: dict[str, pd.Series] = {}
    for start in range(0, len(names), per_block):
        asked = names[start : start + per_block]
        block = file.read(columns=asked)
        # only the asked-for columns: a name that is also a path into a struct brings the struct too
        part = block.to_pandas(split_blocks=True, self_destruct=True)[asked]
        del block
        columns.update(part.items())
        del part
        pa.default_memory_pool().release_unused()
    frame = pd.DataFrame(columns, copy=False)
    frame.index = pd.RangeIndex(len(frame))
    return frame


def check_unchanged(path: str | Path, fmt: FileFormat, stat: os.stat_result) -> None:
    """Refuse a data file that changed, or went, since ``stat`` was taken when it was first read: row
    positions found in the first read would index other rows."""
    try:
        now = os.stat(path)
    except OSError:  # removed, or no longer readable
        now = None
    if now is None or (now.st_size, now.st_mtime_ns) != (stat.st_size, stat.st_mtime_ns):
        raise UserInputError(
            f"{file_location(path, fmt).what} changed or went away after the run first read it; start the "
            "run again once the file stays as it is."
        )


class ParquetColumns:
    """The columns of a Parquet file read again, a block at a time, at the positions ``rows``: what
    :meth:`~src.extras.tables.preprocessing.Preprocessor.encode` reads in place of a table held whole.

    Read as :func:`read_file` reads them (names without surrounding spaces, ``na_values`` as missing),
    rows keeping their numbers in the file, so that an error still names the right row. Columns are to be
    asked for once each, in the order of ``names``: each read takes the next block of them.

    Args:
        path: The file, unchanged since it was read whole: its size and modification time are compared
            with ``stat``.
        names: The columns that will be asked for, in order.
        rows: The positions of the rows to return, in this order.
        na_values: Further texts that mean "missing".
        stat: ``os.stat`` of the file when it was read whole.
    """

    def __init__(
        self,
        path: str | Path,
        names: Sequence[str],
        rows: np.ndarray,
        na_values: Sequence[str],
        stat: os.stat_result,
    ) -> None:
        check_unchanged(path, "parquet", stat)
        # the memory of a table let go of just before goes back to the system first: Arrow's allocator
        # keeps what is freed for its own reuse until told, and the encoding is allocated elsewhere
        pa.default_memory_pool().release_unused()
        self.file = pq.ParquetFile(path)
        self.in_file = {name.strip(): name for name in _data_columns(self.file)}
        self.names, self.rows, self.na_values = list(names), rows, list(na_values)
        self.per_block = _columns_per_read(self.file)
        self.block: dict[str, pd.Series] = {}

    def __call__(self, name: str) -> pd.Series:
        if name not in self.block:
            start = self.names.index(name)
            names = self.names[start : start + self.per_block]
            in_file = [self.in_file[n] for n in names]
            read = self.file.read(columns=in_file)
            # only the asked-for columns: a name that is also a path into a struct ("a.b": field b of a
            # struct a) brings the struct too
            part = read.to_pandas(split_blocks=True, self_destruct=True)[in_file]
            del read
            part.columns = names
            if self.na_values:
                part = part.replace(self.na_values, np.nan)
            self.block = dict(part.iloc[self.rows].items())  # a copy: the file's block is freed next
            del part
            pa.default_memory_pool().release_unused()
        return self.block.pop(name)


def _separator(path: Path) -> str:
    """The separator the header line uses most: commas, or semicolons, tabs or bars as spreadsheets in
    many locales write them."""
    with path.open("rb") as file:
        header = file.readline().decode("latin-1")
    return max([",", ";", "\t", "|"], key=header.count)


def _read_csv(path: Path, na_values: Sequence[str]) -> pd.DataFrame:
    """A CSV file by pandas, its columns named as its header writes them.

    pandas renames a repeated ``X`` to ``X.1`` (and a real ``X.1`` cannot be told from it by its name), so
    the header is read again as one row of text and its names put back; a blank header cell keeps the
    name pandas gives it (``Unnamed: 2`` for column 2).
    """
    sep = _separator(path)
    options = {"sep": sep, "skipinitialspace": True}
    # low_memory=False: one type per column, not one per chunk of a large file
    data = {"na_values": list(na_values), "low_memory": False}
    try:
        frame = pd.read_csv(path, **options, **data)
    except UnicodeDecodeError:
        # not UTF-8: Latin-1 reads any byte, as spreadsheets in many locales save text
        notice(f"CSV file {str(path)!r} is not UTF-8; it is read as Latin-1.")
        options["encoding"] = "latin-1"
        frame = pd.read_csv(path, **options, **data)
    if sep == ";":
        # the same spreadsheets write decimal commas: a text column of such numbers only is numbers
        for name in frame.columns:
            column = frame[name]
            if pd.api.types.is_numeric_dtype(column) or pd.api.types.is_bool_dtype(column):
                continue
            text = column.dropna().astype(str).str.strip()
            if len(text) and text.str.fullmatch(r"-?\d+(,\d+)?").all() and text.str.contains(",").any():
                frame[name] = pd.to_numeric(
                    column.astype(str).str.strip().str.replace(",", "."), errors="coerce"
                )
    # the header's cells as text, none taken for missing (a column may be named "NA")
    header = pd.read_csv(path, header=None, nrows=1, dtype=str, na_filter=False, **options).iloc[0]
    frame.columns = [
        written if written.strip() else named for written, named in zip(header, frame.columns, strict=True)
    ]
    return frame


def select(
    frame: pd.DataFrame,
    target_column: str | Sequence[str],
    task: Task,
    location: Location,
    feature_columns: Sequence[str] | None = None,
    drop_columns: Sequence[str] = (),
) -> Table:
    """The feature columns and the target of a file; rows without a target are dropped with a notice.

    ``target_column`` names one column, or several (a list of one is that one column): each classification
    target is then a label of two values, each regression target a value of its own.

    Refuses what would make a run meaningless: a column named twice or not at all, the target among the
    features, a feature that is a copy of the target, or no rows left.
    """
    columns = list(frame.columns)
    names = [target_column] if isinstance(target_column, str) else list(target_column)
    named: str | list[str] = names[0] if len(names) == 1 else names  # as the sentences below say it
    absent = [name for name in names if name not in columns]
    if absent:
        raise UserInputError(
            f"{location.what} has no column {absent[0]!r}; set data.target_column to one of {columns}."
        )
    listed = {"data.columns.features": feature_columns or [], "data.columns.drop": drop_columns}
    for key, given in listed.items():
        unknown = [c for c in given if c not in columns]
        if unknown:
            raise UserInputError(f"{location.what} has no column(s) {unknown}; fix {key}.")
    read = [name for name in names if name in (feature_columns or [])]
    if read:
        raise UserInputError(
            f"data.columns.features lists the target {read[0]!r}: the model would read the answer; remove it."
        )
    features = [c for c in (feature_columns or columns) if c not in names and c not in drop_columns]
    if not features:
        raise UserInputError(f"{location.what} has no feature column besides {named!r}.")

    targets = frame[names]
    missing = targets.isna().any(axis=1).to_numpy()
    if missing.all():
        raise UserInputError(
            f"{location.what}: every cell of the target column {named!r} is empty."
            if len(names) == 1
            else f"{location.what}: every row misses a value in one of the target columns {names}."
        )
    if missing.any():
        lacking = repr(named) if len(names) == 1 else f"value in one of {names}"
        notice(
            f"{location.what}: {int(missing.sum())} of {len(targets)} rows have no {lacking} and are "
            "left out."
        )
        frame, targets = frame[~missing], targets[~missing]
    if task == "regression":
        try:
            numbers = {name: numeric_values(targets[name], location).astype(np.float32) for name in names}
        except UserInputError as err:
            raise UserInputError(f"{err} (Class labels? Set data.task: classification.)") from err
        targets = pd.DataFrame(numbers, index=targets.index)
    elif len(names) == 1:
        _check_classes(targets[names[0]], location)
    else:
        for name in names:
            _check_label(targets[name], location)

    empty = [c for c in features if frame[c].isna().all()]
    if empty:
        notice(f"{location.what}: the column(s) {empty} have no values and are left out.")
        features = [c for c in features if c not in empty]
        if not features:
            raise UserInputError(f"{location.what} has no feature column with values besides {named!r}.")
    for column in features:
        values = frame[column]
        first = values.first_valid_index() if values.dtype == object else None
        if first is not None and isinstance(values[first], dict | list | tuple | np.ndarray):
            raise UserInputError(
                f"{location.what}, column {column!r} holds nested values (lists or records), not numbers or "
                "text; flatten them into columns of their own, or leave it out with data.columns.drop."
            )
    for name in names:
        classes = targets[name].nunique() if task == "classification" else 0
        for column in features:
            if _same_as_target(frame[column], targets[name], task, classes):
                raise UserInputError(
                    f"{location.what}: column {column!r} is a copy of the target {name!r}, so the model "
                    "would read the answer; drop it with data.columns.drop."
                )
    return Table(frame[features], targets[names[0]] if len(names) == 1 else targets, task, location)


def _check_label(target: pd.Series, location: Location) -> None:
    """One of several classification targets is a label of exactly two values (0/1, yes/no, two names)."""
    values = sorted({str(v) for v in label_values(target)})
    if len(values) != 2:
        raise UserInputError(
            f"{location.what}: the target {target.name!r} holds {len(values)} value(s) {values[:5]}; with "
            "several target columns each is a label of two values (0/1, yes/no, true/false, two names), and "
            "a target of more classes is predicted in a run of its own (several at once are not supported)."
        )


def _check_classes(target: pd.Series, location: Location) -> None:
    """A classification target needs two classes or more, and not a different number in every row."""
    classes = target.nunique()
    if classes < 2:
        raise UserInputError(
            f"{location.what}: the target {target.name!r} holds the single value {target.iloc[0]!r}; a "
            "classifier needs at least two classes."
        )
    numbers = pd.api.types.is_numeric_dtype(target) and not pd.api.types.is_bool_dtype(target)
    if numbers and classes > max(100, len(target) // 5):
        raise UserInputError(
            f"{location.what}: the target {target.name!r} holds {classes} different numbers in "
            f"{len(target)} rows, which looks like a quantity, not classes; set data.task: regression."
        )


def _same_as_target(column: pd.Series, target: pd.Series, task: Task, classes: int) -> bool:
    """Whether a feature is the target again: equal values (regression), or its ``classes`` classes
    renamed one to one."""
    if column.isna().any():
        return False
    if task == "regression":
        values = pd.to_numeric(column, errors="coerce").to_numpy(np.float64)
        return bool(np.array_equal(values, target.to_numpy(np.float64)))
    # cheap tests first: a first stretch of rows with more distinct values than there are classes rules
    # the column out without hashing all of it; with one row
    # per class every distinct column would pair up, proving nothing
    if classes == len(target) or column.iloc[:SAME_AS_TARGET_PREFIX].nunique() > classes:
        return False
    if column.nunique() != classes:
        return False
    pairs = pd.DataFrame({"feature": column.to_numpy(), "target": target.to_numpy()}).drop_duplicates()
    return len(pairs) == classes
