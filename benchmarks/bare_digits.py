"""The digits experiment as a person writes it from Lightning's docs, with no template: the reference that
:mod:`benchmarks.whole_command` times ``make train``'s command against.

    .venv/bin/python -m benchmarks.bare_digits --max_epochs 1             # one epoch
    .venv/bin/python -m benchmarks.bare_digits --test                     # to early stopping, then test
    .venv/bin/python -m benchmarks.bare_digits --test --max_epochs 35 --no-early_stopping   # 35 epochs

The same work as ``configs/digits.yaml``: scikit-learn's digits, split 70/10/20 (seeded, stratified),
standardized by a scaler fitted on the training rows; an MLP 64-256-128-10 (ReLU, dropout 0.2); AdamW at
1e-3 in batches of 64; Lightning's ``TensorBoardLogger``, one ``ModelCheckpoint`` on ``val/loss`` and
``EarlyStopping`` on ``val/loss`` with the defaults' patience of 10, validation every epoch; a Trainer
with ``deterministic=True`` and ``gradient_clip_val=1.0``, no progress bar, no model summary, and torch's
own thread count (``--threads`` sets another). ``--test`` then tests the best checkpoint, as ``make train``
does.
"""

import argparse

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.functional.classification import multiclass_accuracy
from typing_extensions import override

SEED = 42
#: configs/defaults.yaml's early_stopping.patience and configs/digits.yaml's max_epochs
PATIENCE = 10
MAX_EPOCHS = 60


class DigitsData(L.LightningDataModule):
    def __init__(self, batch_size: int = 64) -> None:
        super().__init__()
        self.batch_size = batch_size

    @override
    def setup(self, stage: str) -> None:
        x, y = load_digits(return_X_y=True)
        x_rest, x_test, y_rest, y_test = train_test_split(x, y, test_size=0.2, random_state=SEED, stratify=y)
        # 0.1 of all rows: 0.125 of the remaining 0.8
        x_train, x_val, y_train, y_val = train_test_split(
            x_rest, y_rest, test_size=0.125, random_state=SEED, stratify=y_rest
        )
        scaler = StandardScaler().fit(x_train)  # fitted on the training rows only

        def dataset(features: np.ndarray, labels: np.ndarray) -> TensorDataset:
            return TensorDataset(
                torch.tensor(scaler.transform(features), dtype=torch.float32), torch.tensor(labels)
            )

        self.train, self.val, self.test = map(dataset, (x_train, x_val, x_test), (y_train, y_val, y_test))

    @override
    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    @override
    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=self.batch_size)

    @override
    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test, batch_size=self.batch_size)


class DigitsClassifier(L.LightningModule):
    def __init__(self, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.lr = lr
        self.net = nn.Sequential(
            nn.Linear(64, 256), nn.ReLU(), nn.Dropout(0.2),
            nn.Linear(256, 128), nn.ReLU(), nn.Dropout(0.2),
            nn.Linear(128, 10),
        )  # fmt: skip

    def _step(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str) -> torch.Tensor:
        x, y = batch
        logits = self.net(x)  # (B, 10)
        loss = F.cross_entropy(logits, y)
        self.log(f"{stage}/loss", loss)
        if stage != "train":
            self.log(f"{stage}/acc", multiclass_accuracy(logits, y, num_classes=10, average="micro"))
        return loss

    @override
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    @override
    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._step(batch, "val")

    @override
    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._step(batch, "test")

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def main(
    max_epochs: int = MAX_EPOCHS,
    test: bool = False,
    save_dir: str = "logs",
    threads: int = 0,
    stop: bool = True,
) -> None:
    if threads:
        torch.set_num_threads(threads)
    L.seed_everything(SEED)
    trainer = L.Trainer(
        max_epochs=max_epochs,
        deterministic=True,
        gradient_clip_val=1.0,
        logger=TensorBoardLogger(save_dir, name="bare_digits"),
        callbacks=[
            ModelCheckpoint(monitor="val/loss"),
            *([EarlyStopping(monitor="val/loss", patience=PATIENCE)] if stop else []),
        ],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model, data = DigitsClassifier(), DigitsData()
    trainer.fit(model, datamodule=data)
    print(f"epochs: {trainer.current_epoch}")  # read by benchmarks.whole_command
    if test:
        trainer.test(model, datamodule=data, ckpt_path="best")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max_epochs", type=int, default=MAX_EPOCHS, help=f"default {MAX_EPOCHS}")
    parser.add_argument("--test", action="store_true", help="test the best checkpoint after fit")
    parser.add_argument("--save_dir", default="logs", help="the logger's folder (default logs)")
    parser.add_argument("--threads", type=int, default=0, help="torch's threads; 0 (default): torch's own")
    parser.add_argument(
        "--early_stopping", action=argparse.BooleanOptionalAction, default=True,
        help="stop on val/loss (default); --no-early_stopping runs --max_epochs epochs exactly",
    )  # fmt: skip
    args = parser.parse_args()
    main(args.max_epochs, args.test, args.save_dir, args.threads, args.early_stopping)
