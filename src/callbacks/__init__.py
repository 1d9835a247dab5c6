"""Callbacks for what the Trainer does not ship."""

from src.callbacks.checkpoint import TopKCheckpoint
from src.callbacks.dashboard import Dashboard
from src.callbacks.figures import ValidationFigures
from src.callbacks.guard import NonFiniteGuard
from src.callbacks.predictions import PredictionWriter
from src.callbacks.progress import ProgressBar
from src.callbacks.resume import Preemption, RandomState
from src.callbacks.steps import StepValues
from src.callbacks.threads import CpuThreads

__all__ = [
    "CpuThreads",
    "Dashboard",
    "NonFiniteGuard",
    "PredictionWriter",
    "Preemption",
    "ProgressBar",
    "RandomState",
    "StepValues",
    "TopKCheckpoint",
    "ValidationFigures",
]
