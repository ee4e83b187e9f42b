"""The study's plots (PNG, Optuna's matplotlib visualisations):

* ``parallel_coordinate.png``: the trials near the best, as in the Mogrifier paper's figures 5 and 6
  (appendix B: "we restricted the range for each hyperparameter separately to about 15% of its entire
  tuning range"); when fewer than three trials lie that close, the neighbourhood widens (30%, 50%,
  then every completed trial) and the title says how wide it is;
* ``optimization_history.png``: the objective of every completed trial and the best so far;
* ``param_importances.png``: PED-ANOVA importances (Optuna's default evaluator), once five trials completed.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from ..figures import pyplot, save_figure
from .search_space import SearchSpace

NEIGHBOURHOOD = 0.15  # of each parameter's tuning range
WIDER = (0.15, 0.3, 0.5, math.inf)
MIN_NEAR = 3
MIN_FOR_IMPORTANCES = 5
TARGET = "valid xent"


def near_best(trials: list[FrozenTrial], best: FrozenTrial, space: SearchSpace, width: float) -> list[FrozenTrial]:
    """Trials whose every tuned parameter lies within ``width`` (a fraction of its tuning range, in log
    space for log ranges) of the best trial's."""
    def close(t: FrozenTrial) -> bool:
        for name, spec in space.params.items():
            if name not in t.params or name not in best.params:
                return False
            if abs(spec.position(t.params[name]) - spec.position(best.params[name])) > width:
                return False
        return True

    return [t for t in trials if close(t)]


def plot_study(study: optuna.Study, space: SearchSpace, directory: Path) -> dict[str, Path]:
    """Write the plots the study has enough trials for; returns them by description."""
    if pyplot() is None:
        return {}
    from optuna.visualization import matplotlib as ovm

    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.value is not None and math.isfinite(t.value)]
    if not done:
        return {}
    out: dict[str, Path] = {}
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "study created in memory" for the subset
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna's matplotlib plots are marked experimental
            _draw(study, space, directory, done, out, ovm)
    finally:
        optuna.logging.set_verbosity(verbosity)
    return out


def _draw(study, space: SearchSpace, directory: Path, done: list[FrozenTrial], out: dict[str, Path], ovm) -> None:
    best = min(done, key=lambda t: t.value)
    names = [n for n in space.params if n in best.params]
    for width in WIDER:
        near = near_best(done, best, space, width)
        if len(near) >= MIN_NEAR or width == math.inf:
            break
    subset = optuna.create_study(direction="minimize")
    subset.add_trials(near)
    ax = ovm.plot_parallel_coordinate(subset, params=names, target_name=TARGET)
    where = "all completed trials" if width == math.inf else f"within {width:.0%} of each range of the best"
    _title(ax, f"{study.study_name}: {len(near)} trials {where}")
    out["parallel coordinates"] = _save(ax, directory / "parallel_coordinate.png", size=(11, 5))
    ax = ovm.plot_optimization_history(study, target_name=TARGET)
    _title(ax, f"{study.study_name}: optimisation history")
    out["optimisation history"] = _save(ax, directory / "optimization_history.png")
    if len(done) >= MIN_FOR_IMPORTANCES and len(names) > 1:
        evaluator = optuna.importance.PedAnovaImportanceEvaluator()  # Optuna's default; fANOVA needs sklearn
        ax = ovm.plot_param_importances(study, evaluator=evaluator, params=names, target_name=TARGET)
        _title(ax, f"{study.study_name}: parameter importances (PED-ANOVA, {len(done)} trials)")
        out["parameter importances"] = _save(ax, directory / "param_importances.png")


def _title(ax, text: str) -> None:
    """Replace Optuna's title (some of its plots put it on the left) with ours."""
    for loc in ("left", "right"):
        ax.set_title("", loc=loc)
    ax.set_title(text, fontsize=9)


def _save(ax, path: Path, size: tuple[float, float] = (8, 5)) -> Path:
    fig = ax.figure
    fig.set_size_inches(*size)
    fig.tight_layout()
    return save_figure(fig, path, dpi=90)
