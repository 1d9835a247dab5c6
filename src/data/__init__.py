"""Data: the DataModule base every data kind shares, and the in-memory arrays one (digits and friends)."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from src.data.arrays import ArrayDataModule
    from src.data.datamodule import TabularDataModule
    from src.data.loading import TensorBatches
    from src.data.options import Columns, Encoding, Split

__all__ = ["ArrayDataModule", "Columns", "Encoding", "Split", "TabularDataModule", "TensorBatches"]


def __getattr__(name: str) -> Any:
    # src.data.TabularDataModule (as configs name it) is imported on first use, with Lightning; reading a
    # file and applying a checkpoint's preprocessing (src.data.sources, src.data.preprocessing) need neither
    if name in __all__:
        from src.data import arrays, datamodule, loading

        module = {"TensorBatches": loading, "ArrayDataModule": arrays}.get(name, datamodule)
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
