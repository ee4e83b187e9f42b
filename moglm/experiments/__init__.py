"""The papers' experiments as shipped, versioned files (:mod:`.spec`), run and resumed by :mod:`.runner`."""

from .spec import Experiment, RunSpec, load_experiment, runs, shipped

__all__ = ["Experiment", "RunSpec", "load_experiment", "runs", "shipped"]
