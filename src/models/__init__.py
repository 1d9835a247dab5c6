"""LightningModules: the base task and its classification and regression subclasses."""

from src.models.base import BaseTask
from src.models.classifier import Classifier
from src.models.regressor import Regressor

__all__ = ["BaseTask", "Classifier", "Regressor"]
