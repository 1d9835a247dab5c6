"""The DataModule: source → seeded split → scaling fitted on train only → in-memory tensors → loaders."""

from functools import cached_property
from typing import Literal

import lightning as L
import numpy as np
import torch
from lightning.pytorch.accelerators import CUDAAccelerator
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from sklearn.utils.class_weight import compute_class_weight
from torch.utils.data import DataLoader, Dataset

from src.data import sources
from src.errors import UserInputError

Stage = Literal["train", "val", "test"]
_DEFAULT_NOISE = {"spiral": 0.2, "friedman": 1.0}


class TensorBatches(Dataset[tuple[torch.Tensor, ...]]):
    """Tensors held in memory and batched by indexing.

    ``DataLoader`` hands ``__getitems__`` the whole list of a batch's indices, so a batch costs one
    fancy-index per tensor instead of ``batch_size`` calls to ``__getitem__`` plus a collate.
    """

    def __init__(self, *tensors: torch.Tensor) -> None:
        if len({len(t) for t in tensors}) != 1:
            raise ValueError("all tensors need the same first dimension")
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        return tuple(t[index] for t in self.tensors)

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        index = torch.as_tensor(indices)
        return tuple(t[index] for t in self.tensors)


def keep_batch(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The collate function for :class:`TensorBatches`: the batch is already stacked."""
    return batch


class TabularDataModule(L.LightningDataModule):
    """Rows of numeric features with a class id or a value to predict.

    Args:
        source: ``digits`` and ``diabetes`` (real data bundled with scikit-learn), ``spiral`` and
            ``friedman`` (synthetic, any size), or ``csv`` (your file; see the ``csv_*`` arguments).
        csv_path: The CSV file, when ``source`` is ``csv``.
        target_column: The column to predict, when ``source`` is ``csv``.
        task: ``classification`` or ``regression``, when ``source`` is ``csv``.
        feature_columns: The CSV columns to use as features; all but the target when left out.
        num_classes: Class count of a CSV classification file; largest label plus one when left out.
        num_samples: Row count of a synthetic source.
        noise: Noise of a synthetic source (spiral: angle jitter; friedman: target std).
        val_fraction: Share of all rows held out for validation.
        test_fraction: Share of all rows held out for the final test; touched only by ``test``.
        seed: Seeds the split, the synthetic data and the training shuffle.
        standardize: Scale features to zero mean and unit variance, with statistics of the train split.
        batch_size: Rows per batch, per process.
        num_workers: Loader worker processes; 0 loads in the main process (best for in-memory data).
        drop_last: Drop the last, smaller training batch of each epoch.
    """

    def __init__(
        self,
        source: Literal["digits", "diabetes", "spiral", "friedman", "csv"] = "digits",
        csv_path: str | None = None,
        target_column: str | None = None,
        task: Literal["classification", "regression"] | None = None,
        feature_columns: list[str] | None = None,
        num_classes: int | None = None,
        num_samples: int = 3000,
        noise: float | None = None,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        seed: int = 42,
        standardize: bool = True,
        batch_size: int = 64,
        num_workers: int = 0,
        drop_last: bool = False,
    ) -> None:
        super().__init__()
        if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
            raise UserInputError(
                f"data.val_fraction={val_fraction} and data.test_fraction={test_fraction} do not fit: each "
                "must lie in (0, 1) and together they must stay below 1, leaving rows to train on."
            )
        if source == "csv" and (csv_path is None or target_column is None or task is None):
            raise UserInputError("data.source=csv needs data.csv_path, data.target_column and data.task.")
        if batch_size < 1:
            raise UserInputError(f"data.batch_size={batch_size} must be at least 1.")
        self.save_hyperparameters()
        self._splits: dict[Stage, TensorBatches] | None = None

    # -- what the model needs to know, linked into it by the CLI --------------------------------------

    @cached_property
    def table(self) -> sources.Table:
        """The whole source, loaded once (the CLI reads it at instantiation to link the shapes)."""
        hp = self.hparams
        noise = hp.noise if hp.noise is not None else _DEFAULT_NOISE.get(hp.source, 0.0)
        if hp.source == "digits":
            return sources.digits()
        if hp.source == "diabetes":
            return sources.diabetes()
        if hp.source == "spiral":
            return sources.spiral(hp.num_samples, noise, hp.seed)
        if hp.source == "friedman":
            return sources.friedman(hp.num_samples, noise, hp.seed)
        return sources.csv(hp.csv_path, hp.target_column, hp.task, hp.feature_columns, hp.num_classes)

    @property
    def in_features(self) -> int:
        """Feature count. Reading it loads and splits the data, so bad data fails before a run starts."""
        return int(self.split_table().features.shape[1])

    @property
    def out_features(self) -> int:
        """Class count for classification, 1 for regression: the width of the net's head."""
        table = self.split_table()
        return table.num_classes if table.num_classes is not None else 1

    def split_table(self) -> sources.Table:
        """The table, after checking that it splits as configured."""
        self.split_rows  # noqa: B018  (computed and cached here; raises when the rows cannot be split)
        return self.table

    # -- splits ---------------------------------------------------------------------------------------

    @cached_property
    def split_rows(self) -> dict[Stage, np.ndarray]:
        """Disjoint row indices per split, seeded; stratified by class for classification."""
        table, hp = self.table, self.hparams
        rows = np.arange(len(table.target))
        stratify = table.target if table.task == "classification" else None
        try:
            rest, test = train_test_split(
                rows, test_size=hp.test_fraction, random_state=hp.seed, stratify=stratify
            )
            rest_stratify = stratify[rest] if stratify is not None else None
            train, val = train_test_split(
                rest,
                test_size=hp.val_fraction / (1 - hp.test_fraction),
                random_state=hp.seed,
                stratify=rest_stratify,
            )
        except ValueError as err:
            raise UserInputError(
                f"The {len(rows)} rows of source {hp.source!r} cannot be split with "
                f"val_fraction={hp.val_fraction} and test_fraction={hp.test_fraction} ({err}); "
                "use more rows or other fractions."
            ) from err
        return {"train": np.sort(train), "val": np.sort(val), "test": np.sort(test)}

    @cached_property
    def scaler(self) -> StandardScaler | None:
        """Feature scaling fitted on the training rows alone, so val/test statistics never leak in."""
        if not self.hparams.standardize:
            return None
        return StandardScaler().fit(self.table.features[self.split_rows["train"]])

    def train_targets(self) -> np.ndarray:
        return self.table.target[self.split_rows["train"]]

    def class_weights(self) -> torch.Tensor:
        """Balanced class weights (``n / (k * count_c)``) from the training split."""
        if self.table.num_classes is None:
            raise ValueError("class weights exist only for classification data")
        classes = np.arange(self.table.num_classes)
        weights = compute_class_weight("balanced", classes=classes, y=self.train_targets())
        return torch.as_tensor(weights, dtype=torch.float32)

    def target_stats(self) -> tuple[float, float]:
        """Mean and standard deviation of the training targets (regression)."""
        y = self.train_targets().astype(np.float64)
        return float(y.mean()), float(y.std()) or 1.0

    def _tensors(self, stage: Stage) -> TensorBatches:
        rows = self.split_rows[stage]
        x = self.table.features[rows]
        if self.scaler is not None:
            x = self.scaler.transform(x)
        return TensorBatches(
            torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(self.table.target[rows])
        )

    def setup(self, stage: str) -> None:
        if self._splits is None:
            self._splits = {s: self._tensors(s) for s in ("train", "val", "test")}
            # one generator for the whole fit: each epoch draws a new order, the same on every run
            self._shuffle = torch.Generator().manual_seed(self.hparams.seed)

    # -- loaders --------------------------------------------------------------------------------------

    def _loader(self, stage: Stage, train: bool = False) -> DataLoader:
        if self._splits is None:
            raise RuntimeError("call setup() before asking for a dataloader")
        workers = self.hparams.num_workers
        on_cuda = self.trainer is not None and isinstance(self.trainer.accelerator, CUDAAccelerator)
        return DataLoader(
            self._splits[stage],
            batch_size=self.hparams.batch_size,
            shuffle=train,
            generator=self._shuffle if train else None,
            drop_last=train and self.hparams.drop_last,
            collate_fn=keep_batch,
            num_workers=workers,
            persistent_workers=workers > 0,
            pin_memory=on_cuda,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader("test")
