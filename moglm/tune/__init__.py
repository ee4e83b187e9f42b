"""Hyperparameter tuning with Optuna: the Mogrifier paper's search spaces, many workers, its plots.

``moglm tune SPACE`` (or :func:`run_study` then :func:`write_report`) runs a study whose trials train
run configs (:mod:`moglm.train`) and score them the paper's way; see docs/guides/tuning.md.
"""

from .report import write_report
from .search_space import SearchSpace, load_space, shipped_spaces, validate_space
from .study import StudyResult, best_trial, run_study

__all__ = ["SearchSpace", "StudyResult", "best_trial", "load_space", "run_study", "shipped_spaces",
           "validate_space", "write_report"]
