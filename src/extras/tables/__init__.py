"""Tables: rows of a CSV or Parquet file, or a bundled table, with a class or a value to predict.

Sources (:mod:`.sources`), preprocessing fitted on the training rows (:mod:`.preprocessing`), the settings
groups (:mod:`.options`) and the DataModule (:mod:`.datamodule`); see README.md in this folder.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from src.data.split import Split
    from src.extras.tables.datamodule import TabularDataModule
    from src.extras.tables.options import Columns, Encoding

__all__ = ["Columns", "Encoding", "Split", "TabularDataModule"]


def __getattr__(name: str) -> Any:
    # src.extras.tables.TabularDataModule (as configs name it) is imported on first use, with Lightning;
    # reading a file and applying a checkpoint's preprocessing (.sources, .preprocessing) need neither
    if name in __all__:
        from src.extras.tables import datamodule

        return getattr(datamodule, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
