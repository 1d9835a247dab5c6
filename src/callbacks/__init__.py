"""The callback of ``predict``: its CSV file."""

from src.callbacks.predictions import PredictionWriter

__all__ = ["PredictionWriter"]
