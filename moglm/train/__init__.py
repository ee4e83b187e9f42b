"""Training: config, the training engine, the language-model task, and the final evaluation."""

from .config import RunConfig, load_config
from .engine import Engine, Evaluation, Progress, Settings, StepLoss, TrainingDiverged, TrainingInterrupted
from .final_evaluation import evaluate_run
from .language_model_run import LanguageModelRun
from .trainer import LanguageModelTask, Trainer, train_and_evaluate

__all__ = ["Engine", "Evaluation", "LanguageModelRun", "LanguageModelTask", "Progress", "RunConfig", "Settings",
           "StepLoss", "Trainer", "TrainingDiverged", "TrainingInterrupted", "evaluate_run", "load_config",
           "train_and_evaluate"]
