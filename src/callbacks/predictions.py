"""Write what ``predict`` returns to a CSV file, atomically."""

import os
from pathlib import Path
from typing import Any

import lightning as L
import pandas as pd
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from typing_extensions import override


class PredictionWriter(BasePredictionWriter):
    """Collects the ``predict_step`` dicts of one ``predict`` run into ``predictions.csv``.

    The first column, ``row``, says which row of the data each prediction belongs to.
    A ``(B,)`` tensor becomes one column; a ``(B, K)`` tensor becomes columns ``name_0 .. name_{K-1}``.
    The file is written beside a temporary name and renamed, so a crash never leaves half a file.

    Args:
        output_path: Where to write; ``<log_dir>/predictions.csv`` of the run when left out. Under
            several processes each rank writes ``predictions.rank<N>.csv``.
    """

    def __init__(self, output_path: str | None = None) -> None:
        super().__init__(write_interval="epoch")
        self.output_path = output_path
        self.written: Path | None = None

    def _path(self, trainer: L.Trainer) -> Path:
        path = Path(self.output_path or Path(trainer.log_dir or trainer.default_root_dir) / "predictions.csv")
        if trainer.world_size > 1:
            path = path.with_name(f"{path.stem}.rank{trainer.global_rank}{path.suffix}")
        return path

    @override
    def write_on_epoch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        predictions: Any,
        batch_indices: Any,
    ) -> None:
        batches: list[dict[str, torch.Tensor]] = predictions
        columns: dict[str, Any] = {}
        # batch_indices: per dataloader, per batch, the dataset positions; with the template's
        # DataModule a position maps to the row of the source file (0-based, header not counted)
        positions = [i for batch in (batch_indices[0] if batch_indices else []) for i in batch]
        split_rows = getattr(trainer.datamodule, "split_rows", None)
        if positions:
            columns["row"] = split_rows["test"][positions] if split_rows is not None else positions
        for name in batches[0]:
            tensor = torch.cat([b[name] for b in batches])
            # class ids stay integers; bf16/fp16 outputs become float32, which numpy can hold
            values = (tensor.float() if tensor.is_floating_point() else tensor).cpu().numpy()
            if values.ndim == 1:
                columns[name] = values
            else:
                columns.update({f"{name}_{k}": values[:, k] for k in range(values.shape[1])})
        path = self._path(trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        pd.DataFrame(columns).to_csv(partial, index=False)
        os.replace(partial, path)
        self.written = path
