"""Callbacks for what the Trainer does not ship."""

from src.callbacks.baselines import Baselines
from src.callbacks.dashboard import Dashboard
from src.callbacks.figures import ValidationFigures
from src.callbacks.guard import NonFiniteGuard
from src.callbacks.predictions import PredictionWriter
from src.callbacks.progress import ProgressBar
from src.callbacks.resume import Preemption, RandomState
from src.callbacks.steps import StepValues
from src.callbacks.summary import ModelSummary, RunSummary
from src.callbacks.threads import CpuThreads

__all__ = [
    "Baselines",
    "CpuThreads",
    "Dashboard",
    "ModelSummary",
    "NonFiniteGuard",
    "PredictionWriter",
    "Preemption",
    "ProgressBar",
    "RandomState",
    "RunSummary",
    "StepValues",
    "ValidationFigures",
]
