"""Training: the training engine, the language-model task, and the final evaluation (a run's config and
directory: :mod:`moglm.runs`)."""

from .engine import Engine, Evaluation, Progress, Settings, StepLoss, TrainingDiverged, TrainingInterrupted
from .final_evaluation import evaluate_run
from .trainer import LanguageModelTask, Trainer, train_and_evaluate

__all__ = ["Engine", "Evaluation", "LanguageModelTask", "Progress", "Settings", "StepLoss", "Trainer",
           "TrainingDiverged", "TrainingInterrupted", "evaluate_run", "train_and_evaluate"]
