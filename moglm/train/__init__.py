"""Training: config, run directories, checkpoints, the paper's recipe, and the final evaluation."""

from .config import RunConfig, load_config
from .final_evaluation import evaluate_run
from .run_directory import RunDirectory
from .trainer import Trainer, TrainingDiverged, TrainingInterrupted

__all__ = ["RunConfig", "RunDirectory", "Trainer", "TrainingDiverged", "TrainingInterrupted", "evaluate_run",
           "load_config"]
