"""Callbacks for what the Trainer does not ship."""

from src.callbacks.dashboard import Dashboard, TrainLearningRateMonitor
from src.callbacks.figures import ValidationFigures
from src.callbacks.predictions import PredictionWriter

__all__ = ["Dashboard", "PredictionWriter", "TrainLearningRateMonitor", "ValidationFigures"]
