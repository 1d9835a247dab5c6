"""Callbacks for what the Trainer does not ship."""

from src.callbacks.predictions import PredictionWriter

__all__ = ["PredictionWriter"]
