"""The DataModule: source → seeded split → preprocessing fitted on train only → tensors → loaders."""

import gc
import math
import os
from dataclasses import asdict
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

import numpy as np
import pandas as pd
import torch
from lightning.pytorch.utilities import AttributeDict
from sklearn.utils.class_weight import compute_class_weight
from typing_extensions import override

from src.checkpoints import load_checkpoint
from src.data.loading import ResumableDataModule, Stage, TensorBatches, check_split
from src.data.split import Split, group, split_rows
from src.errors import UserInputError
from src.extras.tables import sources
from src.extras.tables.options import Columns, Encoding, split_record_of, strata
from src.extras.tables.preprocessing import (
    Options,
    Preprocessor,
    category_strings,
    fit_preprocessor,
    infer_kinds,
    preprocessing_of,
    read_numbers,
)

if TYPE_CHECKING:
    from src.extras.tables.predict import TableReading

Source = Literal["digits", "diabetes", "spiral", "friedman", "penguins", "csv", "parquet"]


class TabularDataModule(ResumableDataModule):
    """Rows of a table with a class or a value to predict: bundled data, synthetic data, or your file.

    Columns come as they are (numbers, text, booleans, empty cells); everything learnt from them is fitted
    on the training split only and saved in every checkpoint, which alone then predicts new rows.

    Args:
        source: ``digits``, ``diabetes``, ``penguins`` (bundled), ``spiral``, ``friedman`` (synthetic),
            ``csv`` or ``parquet`` (your ``path``); left out, ``path``'s format, else ``digits``.
        path: Your CSV or Parquet file.
        target_column: The column to predict (your file), or a list of several: each a label of two
            values for classification (multi-label), each a value for regression (docs/data.md). A list
            of one is that one column.
        task: ``classification`` or ``regression`` (your file).
        columns: Which columns the net reads, and as what (:class:`Columns`: ``data.columns.drop`` ...).
        encoding: How they are encoded (:class:`Encoding`: ``data.encoding.max_categories`` ...).
        split: Which rows train, validate and test (:class:`Split`: ``data.split.val_fraction`` ...).
        batch_size: Rows per batch, per process.
        seed: Seeds the split, the folds, the synthetic data and the training shuffle.
        min_batches_per_epoch: A training epoch of fewer batches repeats the training rows (each as
            often as the others, in a fresh order) until it has this many, since budgets and patience
            count epochs; ``None``: one pass per epoch (docs/data.md).
        num_workers: Loader worker processes; 0 loads in the main process (best for in-memory data).
        drop_last: Drop the last, smaller training batch of each epoch.
        predict_path: A CSV or Parquet file to predict (``predict``): every row, in order; a target
            column in it is ignored. Left out, ``predict`` uses the validation split (never the test split).
        preprocessing_from: A checkpoint whose fitted preprocessing to use instead of fitting one;
            the CLI sets it to ``--ckpt_path``.
        resplit_on_resume: Let a resumed fit go on with other rows or split settings than its
            checkpoint's run split them with (rows it held out may then be trained on); left false, such a
            resume is refused.
        num_samples: Row count of a synthetic source.
        noise: Noise of a synthetic source (spiral: angle jitter; friedman: target std).
    """

    @classmethod
    def reading_of(cls, checkpoint: dict[str, Any], path: str) -> "TableReading":
        """How the checkpoint's run reads new rows (:class:`src.predict.Predictor` asks)."""
        from src.extras.tables.predict import TableReading

        return TableReading.of(checkpoint, path)

    def __init__(
        self,
        source: Source | None = None,
        path: str | None = None,
        target_column: str | list[str] | None = None,
        task: Literal["classification", "regression"] | None = None,
        columns: Columns | None = None,
        encoding: Encoding | None = None,
        split: Split | None = None,
        batch_size: int = 64,
        seed: int = 42,
        min_batches_per_epoch: int | None = 16,
        num_workers: int = 0,
        drop_last: bool = False,
        predict_path: str | None = None,
        preprocessing_from: str | None = None,
        resplit_on_resume: bool = False,
        num_samples: int = 3000,
        noise: float | None = None,
    ) -> None:
        super().__init__(seed, batch_size, num_workers, drop_last)
        if isinstance(target_column, list) and len(target_column) == 1:
            target_column = target_column[0]  # the one column it is: the same run, the same checkpoint
        if isinstance(target_column, list) and len(set(target_column)) < max(len(target_column), 2):
            raise UserInputError(
                f"data.target_column={target_column} must name a column, or several different ones."
            )
        self.columns, self.encoding, self.split = (
            group(columns, Columns, "data.columns"),
            group(encoding, Encoding, "data.encoding"),
            group(split, Split, "data.split"),
        )
        if min_batches_per_epoch is not None and min_batches_per_epoch < 1:
            raise UserInputError(
                f"data.min_batches_per_epoch={min_batches_per_epoch} must be at least 1, or null for one "
                "pass over the training rows per epoch."
            )
        if num_samples < 1:
            raise UserInputError(f"data.num_samples={num_samples} must be at least 1.")
        if source is None:
            source = sources.file_format(path) if path is not None else "digits"
        if source in sources.BUNDLED and path is not None:
            raise UserInputError(
                f"data.path={path!r} is set, but data.source={source!r} reads bundled data; set "
                "data.source to csv or parquet (or leave it out) to read the file."
            )
        if source not in sources.BUNDLED and (path is None or target_column is None or task is None):
            raise UserInputError(f"data.source={source} needs data.path, data.target_column and data.task.")
        if predict_path is not None:
            sources.check_predict_path(predict_path)
        self.source: Source = source
        # plain data in checkpoints (weights_only=True reads them): the groups as mappings; the target as
        # read above (LightningCLI hands save_hyperparameters the arguments as they were typed)
        self.save_hyperparameters(ignore=["columns", "encoding", "split"])
        self.hparams.update(
            columns=asdict(self.columns), encoding=asdict(self.encoding), split=asdict(self.split),
            target_column=target_column,
        )  # fmt: skip
        self._datasets: dict[Stage, TensorBatches] = {}
        self._stat: os.stat_result | None = None  # the data file's, when it was first read

    @property
    def settings(self) -> AttributeDict:
        """The ``__init__`` arguments, as saved by ``save_hyperparameters`` (typed for attribute access)."""
        return cast(AttributeDict, self.hparams)

    # -- the rows -------------------------------------------------------------------------------------

    @cached_property
    def table(self) -> sources.Table:
        """The whole source, loaded once: feature columns as read, and the target. (A Parquet file's
        table is let go of once the tensors are built, see :meth:`_split_datasets`; asked for after
        that, it is read again.)"""
        hp = self.settings
        if self.source in sources.BUNDLED:
            return sources.bundled(self.source, hp.num_samples, hp.noise, hp.seed)
        fmt = cast(sources.FileFormat, self.source)
        location = sources.file_location(hp.path, fmt)
        if self._stat is not None:  # read again (a Parquet table let go of): the splits index this file
            sources.check_unchanged(hp.path, fmt, self._stat)
        else:
            self._stat = os.stat(hp.path) if Path(hp.path).is_file() else None
        frame = sources.read_file(hp.path, fmt, self.columns.na_values)
        return sources.select(
            frame, hp.target_column, hp.task, location, self.columns.features, self.columns.drop
        )

    @cached_property
    def split_rows(self) -> dict[str, np.ndarray]:
        """Disjoint positions into :attr:`table` per split, seeded; stratified by class for classification.

        With ``folds`` set, ``train`` and ``val`` are fold ``fold``'s training and held-out rows of the
        train and validation rows together; ``test`` is the same as without folds.
        """
        table, split = self.table, self.split
        stratify = strata(table.target, split) if table.task == "classification" else None
        return split_rows(
            len(table.target), stratify, split, self.settings.seed, table.task, table.location.what
        )

    @cached_property
    def split_record(self) -> dict[str, Any]:
        """What the split was made from, saved in every checkpoint for a resumed fit to compare
        (:func:`check_split`): :func:`src.extras.tables.options.split_record_of` the table as read."""
        return split_record_of(self.table, self.split_rows, self.settings.seed, self.split)

    # -- what is fitted on the training rows ----------------------------------------------------------

    @cached_property
    def preprocessor(self) -> Preprocessor:
        """The fitted preprocessing: ``preprocessing_from``'s checkpoint's, or fitted on the train split."""
        if self.settings.preprocessing_from is not None:
            return preprocessing_of(
                load_checkpoint(self.settings.preprocessing_from), self.settings.preprocessing_from
            )
        table, train = self.table, self.split_rows["train"]
        return fit_preprocessor(
            table.features,
            train,
            self._kinds(),
            table.task,
            table.target_name,
            table.target.iloc[train],
            self._options(),
            table.location,
        )

    def _kinds(self) -> tuple[list[str], list[str], dict[str, list[str]]]:
        return infer_kinds(
            self.table.features, self.table.location, self.columns.categorical, self.columns.numeric
        )

    def _options(self) -> Options:
        encoding = self.encoding
        return Options(
            categorical_columns=self.columns.categorical,
            numeric_columns=self.columns.numeric,
            na_values=self.columns.na_values,
            standardize=encoding.standardize,
            scaling=encoding.scaling,
            impute_strategy=encoding.impute_strategy or "median",
            missing_indicator=encoding.missing_indicator,
            max_categories=encoding.max_categories,
            min_category_frequency=encoding.min_category_frequency,
            high_cardinality=encoding.high_cardinality,
        )

    @property
    def in_features(self) -> int:
        """Encoded feature count. Reading it loads, splits and fits, so bad data fails before a run starts."""
        return len(self.preprocessor.feature_names)

    @property
    def out_features(self) -> int:
        """Class count for classification, 1 for regression, the target count with several targets: the
        width of the net's head."""
        targets = self.preprocessor.target_names
        return len(targets) if targets is not None else self.preprocessor.num_classes or 1

    @property
    def target_names(self) -> list[str]:
        """The target columns when there are several: linked into the model's ``target_names``, since
        ``out_features`` alone cannot tell 3 labels from 3 classes. One target has no such attribute, so
        the link passes nothing and a module of yours that takes no ``target_names`` saves none."""
        if self.preprocessor.target_names is None:
            raise AttributeError("one target: no target_names to link")
        return self.preprocessor.target_names

    @property
    def label_names(self) -> list[Any] | None:
        """Class labels as the data writes them, in class-id order; with several targets, each one's two
        values, negative first; ``None`` for regression."""
        return self.preprocessor.labels

    def train_targets(self) -> np.ndarray:
        """The training split's class ids (classification) or values (regression); ``(N, K)`` with
        several targets (a label's 0/1, or the values)."""
        if "train" in self._datasets:  # built: the table may have been let go of
            return self._datasets["train"].tensors[1].numpy()
        return self._targets(self.split_rows["train"])

    @property
    def task(self) -> str:
        """``classification`` or ``regression``, as the fitted preprocessing says."""
        return self.preprocessor.task

    def raw_split(self, split: str) -> tuple[pd.DataFrame, np.ndarray]:
        """One split's rows as a model of scikit-learn reads them: the columns the net reads, numbers by
        the preprocessing's rule (NaN for missing cells and stray text), categories as their canonical text
        (missing ones :data:`~src.extras.tables.preprocessing.MISSING`); and the targets, class ids as the
        net's or values: ``(N,)``, or ``(N, K)`` for K target columns (K labels as the net's 0 or 1, or K
        values)."""
        prep, table = self.preprocessor, self.table
        positions = self.split_rows[split]
        columns: dict[str, np.ndarray] = {}
        for column in prep.numeric:
            cells = table.features[column.name].iloc[positions]
            columns[column.name] = read_numbers(cells, [*column.missing_tokens, *prep.na_values])[0]
        for category in prep.categorical:
            cells = table.features[category.name].iloc[positions]
            columns[category.name] = category_strings(cells, prep.na_values)
        # one frame of all the columns: a frame grown a column at a time copies itself at every one
        frame = pd.DataFrame(columns, index=pd.RangeIndex(len(positions)))
        target = table.target.iloc[positions]
        if isinstance(target, pd.DataFrame) and (prep.task != "classification" or prep.labels is None):
            # (N, K) values, or labels already written as 0/1
            kind = np.int64 if prep.task == "classification" else np.float64
            return frame, target.to_numpy(kind, copy=True)
        if prep.task == "classification":  # (N,) class ids, or (N, K) 0/1 of each label's positive value
            return frame, prep.encode_labels(target, table.location)
        return frame, target.to_numpy(np.float64)

    def class_weights(self) -> torch.Tensor:
        """Balanced class weights (``n / (k * count_c)``) from the training split; with several targets,
        each label's BCE ``pos_weight``: its training rows' negatives over its positives."""
        if self.preprocessor.num_classes is None:
            raise ValueError("class weights exist only for classification data")
        if self.preprocessor.target_names is not None:
            labels = self.train_targets()  # (N, K) 0/1
            positives = labels.sum(axis=0)
            negatives = len(labels) - positives
            return torch.as_tensor(negatives / np.maximum(positives, 1), dtype=torch.float32)
        classes = np.arange(self.preprocessor.num_classes)
        weights = compute_class_weight("balanced", classes=classes, y=self.train_targets())
        return torch.as_tensor(weights, dtype=torch.float32)

    # -- tensors --------------------------------------------------------------------------------------

    def _targets(self, rows: np.ndarray) -> np.ndarray:
        target = self.table.target.iloc[rows]
        if self.preprocessor.task == "classification":
            return self.preprocessor.encode_labels(target, self.table.location)
        return target.to_numpy(np.float32, copy=True)

    @cached_property
    def predict_frame(self) -> pd.DataFrame:
        """The rows to predict: ``predict_path`` as read, or the validation split's feature columns."""
        hp = self.settings
        if hp.predict_path is None:
            return self.table.features.iloc[self.split_rows["val"]]
        fmt = sources.file_format(hp.predict_path)
        return sources.read_file(hp.predict_path, fmt, self.columns.na_values, key="data.predict_path")

    def predict_index(self) -> pd.Index:
        """Which row of its file (0-based, header not counted) each predicted row is, in order."""
        return pd.Index(self.predict_frame.index.to_numpy(), name="row")

    def dataset(self, stage: Stage) -> TensorBatches:
        """The tensors of one split (built once): ``(x, y)``, or ``(x,)`` for ``predict``.

        The training, validation and test splits are built together, in one pass over the table's
        columns, as slices of one encoded array.
        """
        if stage not in self._datasets:
            if stage == "predict":
                location = (
                    self.table.location
                    if self.settings.predict_path is None
                    else (
                        sources.file_location(
                            self.settings.predict_path, sources.file_format(self.settings.predict_path)
                        )
                    )
                )
                x = self.preprocessor.transform(self.predict_frame, location)
                self._datasets[stage] = TensorBatches(torch.from_numpy(x))
            else:
                self._datasets.update(self._split_datasets())
        return self._datasets[stage]

    def _split_datasets(self) -> dict[Stage, TensorBatches]:
        """The training, validation and test tensors: the table encoded in the splits' order, each split
        a slice of the one array.

        A Parquet file's table is let go of first and its columns read again a block at a time while they
        are encoded, so that the table and its encoding are never held whole at once (docs/performance.md);
        ``table`` asked for later reads the file again.
        """
        splits: list[Stage] = ["train", "val", "test"]
        rows = [self.split_rows[stage] for stage in splits]
        order = np.concatenate(rows)
        preprocessor = self.preprocessor  # fitted on the table before it is let go of
        self.split_record  # noqa: B018  (recorded from the table too)
        y = torch.from_numpy(self._targets(order))
        if self.source == "parquet":
            assert self._stat is not None, "split_rows has read the file"
            table = self.__dict__.pop("table")
            preprocessor.check_columns(table.features, table.location)  # a checkpoint's may differ
            in_file = table.features.index.to_numpy()[order]  # rows without a target were left out
            location = table.location
            del table
            # views of the table's columns left in reference cycles (say, by an exception caught inside
            # pandas while its columns were checked) would keep them alive until the next collection
            gc.collect()
            columns = sources.ParquetColumns(
                self.settings.path, preprocessor.columns, in_file, self.columns.na_values, self._stat
            )
            x = torch.from_numpy(preprocessor.encode(columns, len(order), location))
        else:
            table = self.table
            x = torch.from_numpy(preprocessor.transform(table.features, table.location, order))
        ends = np.cumsum([len(part) for part in rows])
        return {
            stage: TensorBatches(
                x[end - len(part) : end], y[end - len(part) : end], repeat=self._repeat(stage, len(part))
            )
            for stage, part, end in zip(splits, rows, ends, strict=True)
        }

    def _repeat(self, stage: Stage, rows: int) -> int:
        """How often an epoch passes over the training rows: enough for ``min_batches_per_epoch``."""
        wanted = self.settings.min_batches_per_epoch
        if stage != "train" or wanted is None or rows == 0:
            return 1
        return max(1, math.ceil(wanted * self.settings.batch_size / rows))

    # -- checkpoints ----------------------------------------------------------------------------------

    @override
    def state_dict(self) -> dict[str, Any]:
        """Saved in every checkpoint (Lightning calls it): the fitted preprocessing, as plain data, what
        the split was made from, and the training order's state (:class:`ResumableDataModule`)."""
        return {
            "preprocessing": self.preprocessor.state_dict(),
            "split": self.split_record,
            **super().state_dict(),
        }

    @override
    def check_resume(self, state_dict: dict[str, Any]) -> None:
        """A resumed fit goes on with its run's split (:func:`check_split`)."""
        check_split(
            state_dict.get("split"), self.split_record, self.settings.resplit_on_resume, "row",
            "data.resplit_on_resume",
        )  # fmt: skip

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A resumed fit goes on with its run's split (:meth:`check_resume`, first); a checkpoint's
        preprocessing wins over one fitted anew (say, for an evaluation on a file that changed since)."""
        super().load_state_dict(state_dict)
        restored = Preprocessor.from_state(state_dict["preprocessing"])
        if restored != self.preprocessor:
            self.__dict__["preprocessor"] = restored
            self._datasets.clear()


assert set(sources.BUNDLED) < set(get_args(Source))
