"""Data: sources (bundled, synthetic, CSV) and the DataModule that splits, scales and batches them."""

from src.data.datamodule import TabularDataModule, TensorBatches

__all__ = ["TabularDataModule", "TensorBatches"]
