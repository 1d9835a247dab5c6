"""How a table run reads new rows, for :class:`src.predict.Predictor` (and so the server and export).

```python
from src.predict import Predictor

predictor = Predictor.from_checkpoint("logs/penguins/version_0/checkpoints/last.ckpt")
predictor.predict(pandas.read_csv("new_penguins.csv"))  # a DataFrame: row, prediction, probabilities
```

Raw rows go through the checkpoint's own fitted preprocessing (:mod:`src.extras.tables.preprocessing`),
by the one rule for every cell; the net reads the encoded rows as they are.
"""

from collections.abc import Sequence
from typing import Any

import pandas as pd
import torch
from torch import nn

from src.errors import UserInputError
from src.extras.tables.preprocessing import CellReport, Location, Preprocessor, preprocessing_of


class EncodedRows(nn.Module):
    """``model`` as it reads encoded rows ``(B, F)``: they need no further transform."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class TableReading:
    """A table run's fitted preprocessing as an :class:`src.predict.ItemReading`.

    Args:
        preprocessor: Fitted on the run's training rows, read back from its checkpoint.
    """

    def __init__(self, preprocessor: Preprocessor) -> None:
        self.preprocessor = preprocessor
        #: class labels in class-id order; ``None`` for regression
        self.labels = preprocessor.labels
        self.target_names = preprocessor.target_names

    @classmethod
    def of(cls, checkpoint: dict[str, Any], path: str) -> "TableReading":
        return cls(preprocessing_of(checkpoint, path))

    def stack(
        self, items: Any, names: Sequence[str] | None = None, report: CellReport | None = None
    ) -> torch.Tensor:
        """Raw rows (a DataFrame) → the ``(N, F)`` float32 matrix the net reads: the cells read otherwise
        than written are counted into ``report``, or logged as one warning naming ``names[0]``."""
        where = Location(names[0] if names else "the rows")
        return torch.from_numpy(self.preprocessor.transform(pd.DataFrame(items), where, report=report))

    def graph(self, model: nn.Module) -> EncodedRows:
        return EncodedRows(model)


def table_preprocessor(reading: object) -> Preprocessor:
    """A predictor's reading as a table's fitted preprocessing, or one sentence for another kind's."""
    if not isinstance(reading, TableReading):
        raise UserInputError("this model does not read a table's rows (it reads images); give it images.")
    return reading.preprocessor
