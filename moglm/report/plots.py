"""The report's figures, each read from run directories: learning curves, a sweep (score against a
variant's value: the rounds of Mogrifier paper figure 3), cross-entropy against sequence length
(reverse copy, figure 4), recovery after surprise (Krause thesis figure 3.3) and loss by occurrence of
words unseen in training (thesis section 5.3, :mod:`.unseen_words`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..atomic import atomic_write_text
from ..figures import new_figure, save_figure
from ..evaluation.scores import unit
from .runs import Run, score
from .seeds import seed_label
from . import optimisers, unseen_words
from .surprise import analyse

HORIZON = 20


def draw(figure: dict, runs: list[Run], path: Path, corpus_label: str) -> Path | None:
    """The PNG of ``figure`` for ``runs`` (one corpus), or None when there is nothing to draw."""
    drawers = {
        "learning_curves": lambda: learning_curves(runs, path, corpus_label),
        "sweep": lambda: sweep(runs, path, corpus_label, figure.get("evaluation", "static"),
                               figure.get("split", "valid"), figure.get("x_label", "rounds r"),
                               figure.get("log_x", False)),
        "surprise": lambda: surprise(runs, path, corpus_label),
        "unseen_words": lambda: unseen_words.figure(runs, path, corpus_label),
        "optimisers": lambda: optimisers.plot(runs, path, corpus_label),
        "length": lambda: by_length(runs, path),
    }
    if figure["kind"] not in drawers:
        raise ValueError(f"unknown figure kind {figure['kind']!r}")
    return drawers[figure["kind"]]()


def _valid_curve(run: Run) -> tuple[list[float], list[float]]:
    rows = [r for r in run.metrics() if r.get("kind") == "valid"]
    word = run.level == "word"
    xs = [r.get("tokens", r.get("step", 0)) for r in rows]
    if run.level == "music":
        return xs, [-r["xent"] for r in rows]
    ys = [r.get("perplexity", math.exp(r["xent"])) if word else r.get("bits_per_token", r["xent"] / math.log(2))
          for r in rows]
    return xs, ys


def learning_curves(runs: list[Run], path: Path, corpus_label: str) -> Path | None:
    curves = {seed_label(r, runs): _valid_curve(r) for r in runs}
    if not any(xs for xs, _ in curves.values()):
        return None
    fig = new_figure((7, 4.2))
    if fig is None:
        return None
    ax = fig.subplots()
    for name, (xs, ys) in curves.items():
        if xs:
            ax.plot(xs, ys, "o-", ms=3, label=name)
    ax.set_xlabel("training frames" if runs[0].level == "music" else "training tokens")
    ax.set_ylabel(f"validation {unit(runs[0].level)}")
    if runs[0].level == "word":
        ax.set_yscale("log")
    ax.set_title(corpus_label)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def sweep(runs: list[Run], path: Path, corpus_label: str, evaluation: str, split: str, x_label: str = "rounds r",
          log_x: bool = False) -> Path | None:
    """Score against each run's x, one line per series (the variants' ``series``; one line when none)."""
    lines: dict[str | None, list[tuple[float, float]]] = {}
    for r in runs:
        if r.x is not None and (found := score(r, evaluation, split)) is not None:
            lines.setdefault(r.series, []).append((r.x, found[0]))
    if not lines:
        return None
    fig = new_figure((6, 4))
    if fig is None:
        return None
    ax = fig.subplots()
    for series, points in lines.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=series)
    if any(series is not None for series in lines):
        ax.legend()
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(x_label)
    ax.set_ylabel(f"{split} {unit(runs[0].level)}")
    ax.set_title(corpus_label)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def surprise(runs: list[Run], path: Path, corpus_label: str) -> Path | None:
    """Recovery curves, static (solid) and dynamic (dashed), with each model's average (dotted); the
    analysis itself goes to a JSON file beside the PNG."""
    losses = {seed_label(r, runs): r.token_losses() for r in runs}  # every seed: the surprises are all models''
    losses = {k: v for k, v in losses.items() if v is not None}
    if len(losses) < 1:
        return None
    results = {mode: analyse({k: v[mode] for k, v in losses.items()}, 0.1, HORIZON) for mode in ("static", "dynamic")}
    atomic_write_text(path.with_suffix(".json"), json.dumps(results, indent=1))
    fig = new_figure((7.5, 4.5))
    if fig is None:
        return None
    ax = fig.subplots()
    colours = {}
    for mode, style in (("static", "-"), ("dynamic", "--")):
        for name, m in results[mode]["models"].items():
            line, = ax.plot(range(1, HORIZON + 1), m["after"], style, marker="o", ms=2.5,
                            color=colours.get(name), label=f"{name} ({mode})")
            colours[name] = line.get_color()
            ax.axhline(m["average"], color=colours[name], ls=":", lw=0.8)
    ax.set_xlabel("tokens after a surprising token")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # offsets are whole tokens
    ax.set_ylabel("mean loss (nats per token)")
    ax.set_title(f"{corpus_label}: recovery after surprise (dotted: each model's average)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


def length_curves(runs: list[Run]) -> dict[str, tuple[list[int], list[float]]]:
    """Per model (label): the lengths and test cross-entropies of all its runs (one run per length)."""
    points: dict[str, dict[int, float]] = {}  # model -> length -> cross-entropy
    for r in runs:
        by = r.evaluations.get("static", {}).get("splits", {}).get("test", {}).get("by_length") or {}
        points.setdefault(r.label, {}).update({int(n): v["xent"] for n, v in by.items()})
    return {name: (sorted(p), [p[n] for n in sorted(p)]) for name, p in points.items() if p}


def by_length(runs: list[Run], path: Path) -> Path | None:
    """Test cross-entropy against sequence length (reverse copy; Mogrifier paper figure 4)."""
    curves = length_curves(runs)
    if not curves:
        return None
    fig = new_figure((6.5, 4))
    if fig is None:
        return None
    ax = fig.subplots()
    for name, (xs, ys) in curves.items():
        ax.plot(xs, ys, "o-", ms=3, label=name)
    ax.set_xlabel("sequence length")
    ax.set_ylabel("test cross-entropy (nats per token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return save_figure(fig, path)
