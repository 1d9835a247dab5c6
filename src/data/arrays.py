"""Arrays in memory: features and targets → a seeded split → standardized on the training rows → loaders.
The first DataModule to edit: swap :func:`load` for your own arrays and keep the rest."""

import math
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
from sklearn import datasets
from sklearn.preprocessing import StandardScaler
from torch import nn
from typing_extensions import override

from src.data.loading import (
    TESTED,
    TRAINED,
    VALIDATED,
    ResumableDataModule,
    Stage,
    TensorBatches,
    check_split,
    split_record,
)
from src.data.split import Split, group, split_rows, split_settings
from src.errors import UserInputError

Source = Literal["digits", "diabetes", "spiral", "friedman"]
Task = Literal["classification", "regression"]


def load(
    source: Source, num_samples: int, noise: float | None, seed: int
) -> tuple[pd.DataFrame, np.ndarray, Task]:
    """Feature columns ``(N, F)``, targets ``(N,)`` and the task of a bundled or synthetic source."""
    if source == "digits":  # 8x8 handwritten digits: 1797 rows, 64 pixels, 10 classes
        x, y = datasets.load_digits(return_X_y=True, as_frame=True)
        return x, y.to_numpy(), "classification"
    if source == "diabetes":  # disease progression of 442 patients from 10 measurements
        x, y = datasets.load_diabetes(return_X_y=True, as_frame=True)
        return x, y.to_numpy(np.float32), "regression"
    if source == "friedman":  # 10 sin(pi x0 x1) + 20 (x2 - 0.5)^2 + 10 x3 + 5 x4 + noise, 10 inputs
        x, y = datasets.make_friedman1(
            num_samples, n_features=10, noise=1.0 if noise is None else noise, random_state=seed
        )
        return pd.DataFrame(x, columns=[f"x{i}" for i in range(10)]), y.astype(np.float32), "regression"
    # three interleaved 2-D spiral arms, one per class: no line separates them
    rng = np.random.default_rng(seed)
    per_class = num_samples // 3
    radius = np.tile(np.linspace(0.05, 1.0, per_class), 3)
    label = np.repeat(np.arange(3), per_class)
    angle = (
        radius * 4.0
        + label * (2 * np.pi / 3)
        + rng.normal(0.0, 0.2 if noise is None else noise, radius.shape)
    )
    return pd.DataFrame({"x": radius * np.sin(angle), "y": radius * np.cos(angle)}), label, "classification"


class Standardized(nn.Module):
    """``model`` behind the training rows' standardization: raw features ``(B, F)`` in, its output out."""

    mean: torch.Tensor  # (F,) buffers: saved with an exported graph, moved with it
    std: torch.Tensor

    def __init__(self, model: nn.Module, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("mean", mean.float().clone())
        self.register_buffer("std", std.float().clone())

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x.float() - self.mean) / self.std

    def forward(self, features: torch.Tensor) -> torch.Tensor:  # (B, F) raw: named as export names it
        return self.model(self.normalize(features))


class ArrayReading:
    """What an array run fitted, read back from its checkpoint to predict new rows."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.columns: list[str] = list(state["columns"])
        self.labels: list[Any] | None = state["labels"]
        self.target_names = None  # one target
        self.mean, self.std = state["mean"], state["std"]

    def stack(self, items: Any, names: Sequence[str] | None = None, report: Any = None) -> torch.Tensor:
        """A DataFrame of the feature columns (others ignored) → raw float32 ``(N, F)``."""
        frame, where = pd.DataFrame(items), names[0] if names else "the rows"
        missing = [c for c in self.columns if c not in frame.columns]
        if missing:
            raise UserInputError(f"{where}: the feature column(s) {missing[:5]} are missing; add them.")
        cells = frame[self.columns].apply(pd.to_numeric, errors="coerce").to_numpy(np.float32, copy=True)
        bad = ~np.isfinite(cells)
        if bad.any():
            row, column = (int(i[0]) for i in np.nonzero(bad))
            raise UserInputError(
                f"{where}: {int(bad.sum())} cell(s) are empty or not a finite number, the first in row "
                f"{row}, column {self.columns[column]!r}; give every feature column a number."
            )
        return torch.from_numpy(cells)

    def graph(self, model: nn.Module) -> Standardized:
        return Standardized(model, self.mean, self.std)


class ArrayDataModule(ResumableDataModule):
    """Bundled (``digits``, ``diabetes``) or synthetic (``spiral``, ``friedman``) arrays.

    Args:
        source: Which arrays :func:`load` gives; ``None``: ``digits`` (a switch to a table inherits none).
        split: Which rows train, validate and test (:class:`src.data.split.Split`).
        batch_size: Rows per batch, per process.
        seed: Seeds the split, the synthetic data and the training shuffle.
        min_batches_per_epoch: Repeat the training rows (reshuffled) up to this many batches an epoch.
        num_workers: Loader worker processes; 0 loads in the main process (best for arrays in memory).
        drop_last: Drop the last, smaller training batch of each epoch.
        predict_path: A CSV file of the feature columns to predict; left out, the validation split.
        resplit_on_resume: Let a resumed fit go on with another split than its checkpoint's.
        num_samples: Row count of a synthetic source.
        noise: Noise of a synthetic source (spiral: angle jitter, 0.2; friedman: target std, 1.0).
    """

    def __init__(
        self,
        source: Source | None = None,
        split: Split | None = None,
        batch_size: int = 64,
        seed: int = 42,
        min_batches_per_epoch: int | None = 16,
        num_workers: int = 0,
        drop_last: bool = False,
        predict_path: str | None = None,
        resplit_on_resume: bool = False,
        num_samples: int = 3000,
        noise: float | None = None,
    ) -> None:
        super().__init__(seed, batch_size, num_workers, drop_last)
        if min_batches_per_epoch is not None and min_batches_per_epoch < 1:
            raise UserInputError(
                f"data.min_batches_per_epoch={min_batches_per_epoch} must be at least 1, or null."
            )
        if predict_path is not None and not Path(predict_path).is_file():
            raise UserInputError(f"data.predict_path={predict_path!r} does not exist; name a CSV file.")
        self.save_hyperparameters()
        source = source or "digits"
        x, y, self.task = load(source, num_samples, noise, seed)
        self.columns = [str(c) for c in x.columns]
        self.x = x.to_numpy(np.float32)  # (N, F)
        #: class labels as the data writes them, in class-id order; ``None`` for regression
        self.label_names: list[Any] | None = None
        if self.task == "classification":
            labels, y = np.unique(y, return_inverse=True)  # y: (N,) class ids
            self.label_names = labels.tolist()
        self.y = y
        self.split = group(split, Split, "data.split")
        stratify = y if self.task == "classification" else None
        self.split_rows = split_rows(len(y), stratify, self.split, seed, self.task, source)
        scaler = StandardScaler().fit(self.x[self.split_rows["train"]])  # fitted on the training rows only
        self.mean, self.std = torch.from_numpy(scaler.mean_).float(), torch.from_numpy(scaler.scale_).float()

    @property
    def in_features(self) -> int:
        return len(self.columns)

    @property
    def out_features(self) -> int:
        """Class count for classification, 1 for regression: the width of the net's head."""
        return len(self.label_names) if self.label_names is not None else 1

    def train_targets(self) -> np.ndarray:
        """The training split's class ids (classification) or values (regression)."""
        return self.y[self.split_rows["train"]]

    def raw_split(self, split: str) -> tuple[pd.DataFrame, np.ndarray]:
        """One split's features as read ``(N, F)`` and targets ``(N,)``: class ids or values."""
        rows = self.split_rows[split]
        return pd.DataFrame(self.x[rows], columns=self.columns, dtype=np.float64), self.y[rows]

    def class_weights(self) -> torch.Tensor:
        """Balanced class weights (``n / (k * count_c)``) from the training split."""
        counts = np.bincount(self.train_targets(), minlength=self.out_features)
        return torch.as_tensor(
            counts.sum() / (self.out_features * np.maximum(counts, 1)), dtype=torch.float32
        )

    @cached_property
    def predict_frame(self) -> pd.DataFrame:
        """The rows to predict: ``predict_path`` as pandas reads it, or the validation split's features."""
        path = self.hparams["predict_path"]
        if path is None:
            return pd.DataFrame(
                self.x[self.split_rows["val"]], index=self.split_rows["val"], columns=self.columns
            )
        return pd.read_csv(path)

    def predict_index(self) -> pd.Index:
        """Which row of its file (0-based, header not counted) each predicted row is, in order."""
        return pd.Index(self.predict_frame.index.to_numpy(), name="row")

    def dataset(self, stage: Stage) -> TensorBatches:
        if stage == "predict":
            where = f"data.predict_path={self.hparams['predict_path']!r}"
            x = ArrayReading(self.state_dict()).stack(self.predict_frame, [where])
        else:
            x = torch.from_numpy(self.x[self.split_rows[stage]])
        x = (x - self.mean) / self.std  # (N, F) standardized
        if stage == "predict":
            return TensorBatches(x)
        rows = self.split_rows[stage]
        y = torch.as_tensor(self.y[rows], dtype=torch.long if self.label_names is not None else torch.float32)
        wanted = self.hparams["min_batches_per_epoch"]
        passes = (
            math.ceil(wanted * self.hparams["batch_size"] / len(rows)) if stage == "train" and wanted else 1
        )
        return TensorBatches(x, y, repeat=passes)

    @classmethod
    def reading_of(cls, checkpoint: dict[str, Any], path: str) -> ArrayReading:
        """How the checkpoint's run reads new rows (:class:`src.predict.Predictor` asks)."""
        state = checkpoint.get(cls.__qualname__)
        if not isinstance(state, dict) or "mean" not in state:
            raise UserInputError(
                f"checkpoint {path!r} carries no fitted {cls.__qualname__} state; train a new one."
            )
        return ArrayReading(state)

    @cached_property
    def split_record(self) -> dict[str, Any]:
        """What the split was made from: a hash of each row's features and target, and its split."""
        hashed = pd.util.hash_pandas_object(pd.DataFrame(self.x).assign(y=self.y), index=False)
        splits = np.full(len(self.y), TRAINED, np.uint8)
        if not self.split.train_on_validation:
            splits[self.split_rows["val"]] = VALIDATED
        splits[self.split_rows["test"]] = TESTED
        return split_record(hashed.to_numpy(), splits, split_settings(self.hparams["seed"], self.split))

    @override
    def state_dict(self) -> dict[str, Any]:
        """Saved in every checkpoint: what was fitted (tensors and plain data), the split, the shuffle."""
        fitted = {"columns": self.columns, "labels": self.label_names, "mean": self.mean, "std": self.std}
        return {**fitted, "split": self.split_record, **super().state_dict()}

    @override
    def check_resume(self, state_dict: dict[str, Any]) -> None:
        check_split(
            state_dict.get("split"), self.split_record, self.hparams["resplit_on_resume"], "row",
            "data.resplit_on_resume",
        )  # fmt: skip

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The checkpoint's standardization wins over one fitted anew."""
        super().load_state_dict(state_dict)
        self.mean, self.std = state_dict["mean"].float(), state_dict["std"].float()
