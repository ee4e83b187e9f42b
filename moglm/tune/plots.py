"""The study's plots (PNG), each drawn on its own canvas (:mod:`moglm.figures`, no pyplot state):

* ``parallel_coordinate.png``: the trials near the best, as in the Mogrifier paper's figures 5 and 6
  (appendix B: "we restricted the range for each hyperparameter separately to about 15% of its entire
  tuning range"); when fewer than three trials lie that close, the neighbourhood widens (30%, 50%,
  then every completed trial) and the title says how wide it is. One vertical axis per parameter (log
  ranges on a log axis, choices as categories) and one for the objective; a line per trial, coloured by
  its objective (every colour stays visible on white), the best trial drawn on top;
* ``optimization_history.png``: the objective of every completed trial and the best so far;
* ``param_importances.png``: PED-ANOVA importances (Optuna's default evaluator), once five trials completed.
"""

from __future__ import annotations

import math
import textwrap
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from ..figures import new_figure, save_figure
from .search_space import ParamSpec, SearchSpace

NEIGHBOURHOOD = 0.15  # of each parameter's tuning range
WIDER = (0.15, 0.3, 0.5, math.inf)
MIN_NEAR = 3
MIN_FOR_IMPORTANCES = 5
TARGET = "valid xent"
COLOURS = (0.0, 0.8)  # the part of viridis used: its light yellow end would vanish on white


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
    if new_figure() is None:
        return {}
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.value is not None and math.isfinite(t.value)]
    if not done:
        return {}
    best = min(done, key=lambda t: t.value)
    names = [n for n in space.params if n in best.params]
    for width in WIDER:
        near = near_best(done, best, space, width)
        if len(near) >= MIN_NEAR or width == math.inf:
            break
    where = "all completed trials" if width == math.inf else f"within {width:.0%} of each range of the best"
    title = f"{study.study_name}: {len(near)} of {len(done)} completed trials, {where}"
    out = {"parallel coordinates": parallel_coordinates(near, best, names, space, title,
                                                        directory / "parallel_coordinate.png"),
           "optimisation history": history(done, f"{study.study_name}: optimisation history",
                                           directory / "optimization_history.png")}
    if len(done) >= MIN_FOR_IMPORTANCES and len(names) > 1:
        out["parameter importances"] = importances(study, names, len(done), directory / "param_importances.png")
    return out


def _label(name: str) -> str:
    """``model.cell.rank`` as ``model.cell\\nrank``: two short lines under the axis instead of one long one."""
    head, _, tail = name.rpartition(".")
    return f"{head}\n{tail}" if head else name


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _axis(values: list[Any], spec: ParamSpec | None) -> tuple[list[float], list[float], list[str]]:
    """Each value's height in [0, 1] on its axis, and the axis's tick heights and labels: choices evenly
    spaced, log ranges in log space, the range of the values shown (a constant in the middle)."""
    if (spec is not None and spec.choices is not None) or any(isinstance(v, (str, bool)) for v in values):
        categories = (list(spec.choices) if spec is not None and spec.choices is not None
                      else sorted(set(values), key=str))
        step = 1 / max(len(categories) - 1, 1)
        where = {str(c): (i * step if len(categories) > 1 else 0.5) for i, c in enumerate(categories)}
        return [where[str(v)] for v in values], list(where.values()), [_value(c) for c in categories]
    log = spec is not None and spec.log and min(values) > 0
    scaled = [math.log(v) if log else float(v) for v in values]
    low, high = min(scaled), max(scaled)
    if high - low < 1e-12:
        return [0.5] * len(values), [0.5], [_value(values[0])]
    heights = [(s - low) / (high - low) for s in scaled]
    ticks = [0.0, 0.5, 1.0]
    labels = [_value(math.exp(low + t * (high - low)) if log else low + t * (high - low)) for t in ticks]
    if spec is not None and spec.integer:
        labels = [str(round(float(label))) for label in labels]
    return heights, ticks, labels


def parallel_coordinates(trials: list[FrozenTrial], best: FrozenTrial, names: list[str], space: SearchSpace,
                         title: str, path: Path) -> Path:
    """One vertical axis per parameter and one for the objective; a line per trial, coloured by objective."""
    from matplotlib import colormaps
    from matplotlib.colors import Normalize

    trials = sorted(trials, key=lambda t: -t.value)  # the worst first: the best is drawn last, on top
    columns = [_axis([t.params[n] for t in trials], space.params.get(n)) for n in names]
    columns.append(_axis([t.value for t in trials], None))
    labels = [_label(n) for n in names] + [TARGET]
    fig = new_figure((max(7.0, 1.7 * len(labels) + 1.5), 5.0))
    ax = fig.subplots()
    values = [t.value for t in trials]
    norm = Normalize(min(values), max(values) if max(values) > min(values) else min(values) + 1)
    cmap = colormaps["viridis"]
    x = list(range(len(labels)))
    for i, t in enumerate(trials):
        heights = [column[0][i] for column in columns]
        colour = cmap(COLOURS[0] + (COLOURS[1] - COLOURS[0]) * norm(t.value))
        if t.number == best.number:
            ax.plot(x, heights, color="tab:red", lw=2.4, zorder=3, label=f"best: trial {t.number}, {t.value:.4f}")
        else:
            ax.plot(x, heights, color=colour, lw=1.2, alpha=0.85, zorder=2)
    for i, (_, ticks, tick_labels) in enumerate(columns):
        ax.axvline(i, color="black", lw=0.8, zorder=1)
        for height, text in zip(ticks, tick_labels):
            ax.text(i + 0.04, height, text, fontsize=7, va="center", ha="left", zorder=4,
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8})
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_xlim(-0.2, len(labels) - 0.55)
    ax.set_ylim(-0.06, 1.06)
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    ax.set_title("\n".join(textwrap.wrap(title, 90)) + f"\ncolour: {TARGET}, darker is better", fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.14), fontsize=8, frameon=False)
    fig.tight_layout()
    return save_figure(fig, path, dpi=90)


def history(done: list[FrozenTrial], title: str, path: Path) -> Path:
    """The objective of every completed trial against its number, and the best so far."""
    done = sorted(done, key=lambda t: t.number)
    fig = new_figure((8, 4.5))
    ax = fig.subplots()
    ax.plot([t.number for t in done], [t.value for t in done], "o", ms=4, color="tab:blue", label=TARGET)
    best, steps = math.inf, []
    for t in done:
        best = min(best, t.value)
        steps.append(best)
    ax.step([t.number for t in done], steps, where="post", color="tab:red", lw=1.2, label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(TARGET)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path, dpi=90)


def importances(study: optuna.Study, names: list[str], completed: int, path: Path) -> Path:
    """PED-ANOVA importances of the tuned parameters (Optuna's default evaluator; fANOVA needs sklearn)."""
    evaluator = optuna.importance.PedAnovaImportanceEvaluator()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # experimental-feature warnings
        found = optuna.importance.get_param_importances(study, evaluator=evaluator, params=names)
    ranked = sorted(found.items(), key=lambda item: item[1])
    fig = new_figure((8, max(2.5, 0.45 * len(ranked) + 1.5)))
    ax = fig.subplots()
    bars = ax.barh([name for name, _ in ranked], [value for _, value in ranked], color="tab:blue")
    ax.bar_label(bars, [f"{value:.2f}" for _, value in ranked], padding=3, fontsize=8)
    ax.set_xlim(0, max([value for _, value in ranked] + [0.0]) * 1.15 or 1)
    ax.set_xlabel(f"importance for {TARGET}")
    ax.tick_params(axis="y", labelsize=8)
    ax.set_title(f"{study.study_name}: parameter importances (PED-ANOVA, {completed} trials)", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path, dpi=90)
