"""The learning-curve plot of a run: training and validation scores against tokens seen, in the unit the
console prints (perplexity for word corpora, bits per character or byte otherwise), with the best
validation score and the step weight averaging started."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from ..evaluation.scores import FORMAT_UNITS, UNITS
from ..figures import new_figure, save_figure

def averaging_start(records: list[dict[str, Any]], averaging_since: int | None = None) -> float | None:
    """The training tokens at which weight averaging started, or ``None`` if it did not.

    ``averaging_since`` (the step, as the training progress records it) or an ``{"kind": "averaging"}``
    record is exact; otherwise it is read from the train records' ``averaging`` flag: averaging started
    after the last record without it (exact when records fall on the evaluation steps, as when
    validation starts it; else at most one logging interval early)."""
    steps = sorted((r["step"], r["tokens"]) for r in records if "step" in r and "tokens" in r
                   and r.get("kind") in ("train", "valid", "averaging"))
    event = next((r for r in records if r.get("kind") == "averaging"), None)
    if event is not None and "tokens" in event:
        return float(event["tokens"])
    if averaging_since is None:
        train = [r for r in records if r.get("kind") == "train"]
        first = next((i for i, r in enumerate(train) if r.get("averaging")), None)
        if first is None:
            return None
        averaging_since = train[first - 1]["step"] if first > 0 else 0
    return _tokens_at(steps, averaging_since)


def _tokens_at(steps: list[tuple[int, int]], step: int) -> float:
    """Training tokens after ``step`` steps, interpolated between the records' (step, tokens)."""
    before = (0, 0)
    for s, t in steps:
        if s >= step:
            return before[1] + (t - before[1]) * (step - before[0]) / max(s - before[0], 1)
        before = (s, t)
    return float(before[1])


def plot_learning_curve(records: list[dict[str, Any]], path: Path, title: str = "", unit: str = "nats",
                        averaging_since: int | None = None) -> Path | None:
    """Draw ``metrics.jsonl`` records to ``path`` (PNG); returns ``None`` when matplotlib is missing.

    ``unit``: what the y axis shows: ``nats`` or ``bits`` per token, ``bpc``, ``bpb``, ``perplexity``, or a
    ``data.format`` (``word``, ``char``, ``ptb_char``, ``byte``) for the unit the console prints for it.
    ``averaging_since``: the step weight averaging started at (see :func:`averaging_start`)."""
    unit = FORMAT_UNITS.get(unit, unit)
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {sorted(UNITS) + sorted(FORMAT_UNITS)}, got {unit!r}")
    label, written, convert = UNITS[unit]
    fig = new_figure((7, 4.2))
    if fig is None:
        return None
    ax = fig.subplots()
    train = [r for r in records if r.get("kind") == "train"]
    valid = [r for r in records if r.get("kind") == "valid"]
    if train:
        ax.plot([r["tokens"] for r in train], [convert(r["xent"]) for r in train], lw=0.8, alpha=0.6, label="train")
    if valid:
        ax.plot([r["tokens"] for r in valid], [convert(r["xent"]) for r in valid], "o-", ms=3, label="valid")
        best = min(valid, key=lambda r: r["xent"])
        score = convert(best["xent"])
        ax.axhline(score, color="grey", lw=0.5, ls=":")
        ax.plot([best["tokens"]], [score], "*", ms=10, color="tab:orange", zorder=3,
                label=f"best valid {written(score)} (step {best['step']:,})")
    start = averaging_start(records, averaging_since)
    if start is not None:
        ax.axvline(start, color="tab:red", lw=0.8, ls="--", label="weight averaging starts")
    if unit == "perplexity":
        from matplotlib.ticker import LogFormatter

        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(LogFormatter())  # 10, 100 and, on a short range, 20, 50: no 6 x 10^0
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
    ax.set_xlabel("training tokens")
    ax.set_ylabel(label)
    ax.set_title("\n".join(textwrap.wrap(title, 80)), fontsize=10)
    ax.grid(alpha=0.3, which="both")
    if train or valid:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)
