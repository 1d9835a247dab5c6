"""Data: the DataModule base every data kind shares, and the in-memory arrays one (digits and friends)."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from src.data.arrays import ArrayDataModule
    from src.data.loading import TensorBatches

__all__ = ["ArrayDataModule", "TensorBatches"]


def __getattr__(name: str) -> Any:
    # src.data.ArrayDataModule (as configs name it) is imported on first use, with Lightning and sklearn
    if name in __all__:
        from src.data import arrays, loading

        return getattr(arrays if name == "ArrayDataModule" else loading, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
