"""Write what ``predict`` returns to a CSV file, atomically, with each class named by its label."""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pandas as pd
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from typing_extensions import override

from src.errors import UserInputError
from src.files import check_output, written
from src.predict import beside_the_run, prediction_frame


class PredictionWriter(BasePredictionWriter):
    """Collects the ``predict_step`` outputs of one ``predict`` run into a CSV file (its columns:
    :func:`src.predict.prediction_frame`; each row named by the DataModule's ``predict_index()``).

    Args:
        output_path: Where to write (``--output``); left out, ``predictions.csv`` in the checkpoint's run
            folder. Each rank of several writes ``<name>.rank<N>.csv``.
        overwrite: Replace a file already at that path (the CLI's ``--overwrite``).
    """

    def __init__(self, output_path: str | None = None, overwrite: bool = False) -> None:
        super().__init__(write_interval="epoch")
        self.output_path = output_path
        self.overwrite = overwrite
        self.written: Path | None = None
        self.rows_written = 0

    def _path(self, trainer: L.Trainer) -> Path:
        if self.output_path is not None:
            path = Path(self.output_path)
        elif trainer.ckpt_path and Path(trainer.ckpt_path).is_file():
            path = beside_the_run(trainer.ckpt_path)
        else:
            path = Path(trainer.log_dir or trainer.default_root_dir) / "predictions.csv"
        if trainer.world_size > 1:
            path = path.with_name(f"{path.stem}.rank{trainer.global_rank}{path.suffix}")
        return path

    def _checked_path(self, trainer: L.Trainer) -> Path:
        datamodule = trainer.datamodule  # type: ignore[attr-defined]  # set by Lightning at run time
        # the run's inputs: the checkpoint and every file or folder the DataModule was given
        given = dict(getattr(datamodule, "hparams", {})).values()
        paths = [v for value in given for v in (value if isinstance(value, list | tuple) else [value])]
        inputs = [trainer.ckpt_path, *(p for p in paths if isinstance(p, str) and Path(p).exists())]
        option = "--output" if self.output_path is not None else "predict's default output"
        return check_output(self._path(trainer), inputs, self.overwrite, option)

    @override
    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._checked_path(trainer)  # a refused path is said before the predicting, not after it

    @override
    def write_on_epoch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, predictions: Any, batch_indices: Any
    ) -> None:
        # a dict of named (B,) or (B, K) tensors per batch; a bare tensor is the predictions alone
        batches = [{"preds": b} if isinstance(b, torch.Tensor) else b for b in predictions]
        if not all(isinstance(b, Mapping) for b in batches):
            kind = type(next(b for b in batches if not isinstance(b, Mapping))).__name__
            raise UserInputError(
                f"{type(pl_module).__name__}.predict_step returned a {kind}; PredictionWriter writes a dict "
                "of (B,) or (B, K) tensors (or one tensor), one column per entry."
            )
        outputs = {name: torch.cat([b[name] for b in batches]) for name in batches[0]}
        # batch_indices: per dataloader, per batch, the dataset positions (under DDP, this rank's share)
        positions = np.array([i for batch in (batch_indices[0] if batch_indices else []) for i in batch])
        datamodule = trainer.datamodule  # type: ignore[attr-defined]  # set by Lightning at run time
        count = len(next(iter(outputs.values())))
        # what each item is: the DataModule's own index of what it predicts, else its position
        index = getattr(datamodule, "predict_index", None)
        every = index() if callable(index) else pd.Index(np.arange(count), name="row")
        rows = every[positions] if len(positions) else every[:count]
        labels, targets = getattr(datamodule, "label_names", None), getattr(datamodule, "target_names", None)
        frame = prediction_frame(outputs, labels, rows, targets)
        path = self._checked_path(trainer)
        with written(path) as (partial,):
            frame.to_csv(partial, index=False)
        self.written = path
        self.rows_written = len(frame)
        print(f"Predictions for {self.rows_written} rows written to {self.written}")
