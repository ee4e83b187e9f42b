"""Orderings with their spread: an experiment that trains each variant with several seeds reports every score
as mean ± standard deviation over the seeds, and calls an ordering of two variants *reproduced* only when the
gap between their means exceeds the spread, ``|mean_a - mean_b| > std_a + std_b`` (their one-standard-
deviation intervals do not touch). With one seed there is no spread, and no ordering is called reproduced."""

from __future__ import annotations

import statistics

from ..evaluation.scores import unit
from .runs import EVALUATION_LABELS, Run, score


def by_variant(runs: list[Run]) -> dict[str, list[Run]]:
    """The runs of each variant, in the experiment's order."""
    out: dict[str, list[Run]] = {}
    for r in runs:
        out.setdefault(r.variant or r.label, []).append(r)
    return out


def several_seeds(runs: list[Run]) -> bool:
    return any(len({r.seed for r in group}) > 1 for group in by_variant(runs).values())


def score_key(table: dict) -> str | None:
    """The field a table's scores are read from: ``bits_per_byte`` for a table in bits per byte (runs of different
    tokenizations), else ``None``, each corpus's own unit."""
    return "bits_per_byte" if table.get("unit") == "bits_per_byte" else None


def seed_label(run: Run, runs: list[Run]) -> str:
    """The run's label in a table or legend: its variant's, and its seed where the variants were trained with
    several (so that the seeds of one variant stay apart)."""
    return f"{run.label} (seed {run.seed})" if run.seed is not None and several_seeds(runs) else run.label


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summary(runs: list[Run], evaluation: str, split: str, key: str | None = None) -> dict[str, tuple[float, float, int]]:
    """``variant -> (mean, std, seeds)`` of the runs' ``evaluation`` on ``split`` (variants without a score left out;
    ``key``: the score's field, default the corpus's unit)."""
    out = {}
    for variant, group in by_variant(runs).items():
        values = [found[0] for r in group if (found := score(r, evaluation, split, key=key)) is not None]
        if values:
            out[variant] = (*mean_std(values), len(values))
    return out


def stands(a: tuple[float, float, int], b: tuple[float, float, int]) -> bool:
    """Whether the ordering of two summaries is reproduced: more than one seed each, and a gap beyond the spread."""
    return a[2] > 1 and b[2] > 1 and abs(a[0] - b[0]) > a[1] + b[1]


def _fmt(value: float, level: str) -> str:
    return f"{value:.2f}" if level == "word" else f"{value:.3f}"


def spread_lines(table: dict, runs: list[Run], corpus_label: str) -> list[str]:
    """Mean ± std per variant for every column of ``table``, then each column's ordering, best first, with each
    adjacent gap against the spread."""
    if not several_seeds(runs):
        return []
    key = score_key(table)
    level = "byte" if key else runs[0].level
    higher_is_better = level == "music"
    labels = {v: group[0].label for v, group in by_variant(runs).items()}
    columns = [(e, s) for e in table["evaluations"] for s in table.get("splits", ["valid", "test"])]
    summaries = {c: summary(runs, *c, key=key) for c in columns}
    lines = [f"Mean ± standard deviation over seeds ({corpus_label}, {unit(level)}; n = seeds scored):", "",
             "| model | " + " | ".join(f"{EVALUATION_LABELS[e]} {s}" for e, s in columns) + " |",
             "|" + " --- |" * (1 + len(columns))]
    for variant, label in labels.items():
        cells = []
        for c in columns:
            m = summaries[c].get(variant)
            cells.append("-" if m is None else f"{_fmt(m[0], level)} ± {_fmt(m[1], level)} (n = {m[2]})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Orderings (best first; `<` where the gap exceeds the spread, `≈` where it does not):", ""]
    for c in columns:
        found = summaries[c]
        if len(found) < 2:
            continue
        order = sorted(found, key=lambda v: found[v][0], reverse=higher_is_better)
        text = labels[order[0]]
        for a, b in zip(order, order[1:]):
            text += (" < " if stands(found[a], found[b]) else " ≈ ") + labels[b]
        lines.append(f"- {EVALUATION_LABELS[c[0]]} {c[1]}: {text}")
    return lines + [""]


def ordering_record(table: dict, runs: list[Run]) -> list[dict]:
    """The orderings of :func:`spread_lines` as data (for tests and docs): one row per column and adjacent pair."""
    out = []
    for e in table["evaluations"]:
        for s in table.get("splits", ["valid", "test"]):
            found = summary(runs, e, s, score_key(table))
            order = sorted(found, key=lambda v: found[v][0], reverse=runs[0].level == "music")
            for a, b in zip(order, order[1:]):
                out.append({"evaluation": e, "split": s, "better": a, "worse": b, "gap": abs(found[a][0] - found[b][0]),
                            "spread": found[a][1] + found[b][1], "stands": stands(found[a], found[b])})
    return out

