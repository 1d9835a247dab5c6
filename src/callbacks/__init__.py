"""The core's callbacks: the latest state of a fit, and ``predict``'s CSV file."""

from src.callbacks.latest import LatestCheckpoint
from src.callbacks.predictions import PredictionWriter

__all__ = ["LatestCheckpoint", "PredictionWriter"]
