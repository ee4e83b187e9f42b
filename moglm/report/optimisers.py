"""The optimisers comparison in a report (Krause thesis, section 5.4, eq. 5.10-5.12, tables 5.3-5.7): read
from each run's ``evaluations/optimisers.json`` (:mod:`moglm.experiments.optimisers`).

Three tables, one column per run (corpus and model): each optimiser's validation / test score in the
corpus's unit (perplexity for words, bits per character otherwise), the learning rate (and eps) its
search settled on, and whether each of the thesis's claims holds on the test tokens (lower is better):

* momentum hurts (table 5.3): SGD < SGD + momentum 0.5 < SGD + momentum 0.9;
* RMSprop as deep learning frameworks set it (eps 1e-8) is worse than SGD (table 5.4);
* the hybrid of RMSprop and SGD (eps tuned) is at least as good as SGD (table 5.5);
* global RMS beats RMSprop and the hybrid (table 5.5);
* the amount of training data behind the global statistics matters little (table 5.6): the three
  fractions' cross-entropies spread by less than :data:`TOLERANCE` of the smallest;
* non-local RMSprop beats local RMSprop, the hybrid at the same eps (table 5.7);
* non-local RMSprop is on par with global RMS (table 5.7): within :data:`TOLERANCE`.

The figure: per corpus, each optimiser's test cross-entropy relative to static evaluation, per model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from ..figures import new_figure, save_figure
from .runs import Run

FILE = "evaluations/optimisers.json"
#: "matters little" and "on par": test cross-entropies less than this fraction apart. In the thesis's PTB
#: numbers the three statistics fractions are 0.1% apart and non-local RMSprop and global RMS 0.05%, while
#: the hybrid and global RMS, a gap it calls large, are 0.8% apart (of a cross-entropy near 4 nats)
TOLERANCE = 0.005


def read(run: Run) -> dict[str, Any] | None:
    path = run.path / FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        return None


def _test(rows: dict[str, dict], name: str) -> float | None:
    row = rows.get(name) or {}
    return (row.get("test") or {}).get("xent")


def _chain(*names: str) -> Callable[[dict[str, dict]], tuple[bool | None, str]]:
    """Each row strictly better (lower test cross-entropy) than the next."""

    def check(rows: dict[str, dict]) -> tuple[bool | None, str]:
        values = [_test(rows, n) for n in names]
        if any(v is None for v in values):
            return None, "-"
        for (a, va), (b, vb) in zip(zip(names, values), zip(names[1:], values[1:])):
            if not va < vb:
                return False, f"no: {rows[a]['label']} {va:.4f} >= {rows[b]['label']} {vb:.4f} nats"
        return True, "yes"

    return check


def _at_most(better: str, than: str) -> Callable[[dict[str, dict]], tuple[bool | None, str]]:
    def check(rows: dict[str, dict]) -> tuple[bool | None, str]:
        a, b = _test(rows, better), _test(rows, than)
        if a is None or b is None:
            return None, "-"
        if a <= b:
            return True, "yes"
        return False, f"no: {rows[better]['label']} {a:.4f} > {rows[than]['label']} {b:.4f} nats"

    return check


def _beats_both(name: str, *others: str) -> Callable[[dict[str, dict]], tuple[bool | None, str]]:
    def check(rows: dict[str, dict]) -> tuple[bool | None, str]:
        for other in others:
            ok, text = _chain(name, other)(rows)
            if not ok:
                return ok, text
        return True, "yes"

    return check


def _spread(*names: str) -> Callable[[dict[str, dict]], tuple[bool | None, str]]:
    """The rows' test cross-entropies within :data:`TOLERANCE` of the smallest (rows skipped or missing are
    left out; fewer than two left: no verdict)."""

    def check(rows: dict[str, dict]) -> tuple[bool | None, str]:
        values = [v for v in (_test(rows, n) for n in names) if v is not None]
        if len(values) < 2:
            return None, "-"
        spread = (max(values) - min(values)) / min(values)
        ok = spread < TOLERANCE
        return ok, f"{'yes' if ok else 'no'}: {spread:.2%} apart" + (
            f" ({len(values)} of {len(names)} rows)" if len(values) < len(names) else "")

    return check


CLAIMS: list[tuple[str, Callable[[dict[str, dict]], tuple[bool | None, str]]]] = [
    ("momentum hurts: SGD < momentum 0.5 < momentum 0.9 (table 5.3)", _chain("sgd", "momentum-0.5", "momentum-0.9")),
    ("frameworks' RMSprop (eps 1e-8) is worse than SGD (table 5.4)", _chain("sgd", "rmsprop")),
    ("the hybrid (eps tuned) is at least as good as SGD (table 5.5)", _at_most("hybrid", "sgd")),
    ("global RMS beats RMSprop and the hybrid (table 5.5)", _beats_both("global-rms", "rmsprop", "hybrid")),
    (f"the amount of statistics data matters little: 0.1%, 1%, 10% within {TOLERANCE:.1%} (table 5.6)",
     _spread("global-rms-0.001", "global-rms", "global-rms-0.1")),
    ("non-local RMSprop beats local RMSprop, the hybrid (table 5.7)", _chain("nonlocal-rmsprop", "hybrid")),
    (f"non-local RMSprop is on par with global RMS, within {TOLERANCE:.1%} (table 5.7)",
     _spread("nonlocal-rmsprop", "global-rms")),
    ("each step of table 4.1 helps: global RMS + RMS decay < global RMS + decay < SGD + decay < SGD",
     _chain("global-rms-rmsdecay", "global-rms-decay", "sgd-decay", "sgd")),
]


def _score(row: dict[str, Any], split: str, word: bool) -> str:
    found = row.get(split) or {}
    if "score" not in found:
        return "-"
    return f"{found['score']:.2f}" if word else f"{found['score']:.3f}"


def _settings(row: dict[str, Any]) -> str:
    if row.get("skipped"):
        return "skipped"
    if row.get("lr") is None:
        return "-"
    text = f"lr {row['lr']:.3g}"
    if row.get("name") in ("hybrid", "nonlocal-rmsprop"):
        text += f", eps {row['settings']['eps']:g}"
    rollbacks = sum((row.get("rollbacks") or {}).values())
    return text + (f", {rollbacks} rollbacks" if rollbacks else "")


def optimisers_lines(runs: list[Run], corpora: dict[str, str], out: Path, command: str) -> list[str]:
    """The three tables (module docstring), or nothing when no run has the evaluation yet."""
    found = [(r, read(r)) for r in runs]
    found = [(r, report) for r, report in found if report]
    if not found:
        return []
    order: list[tuple[str, str, str]] = []  # name, label, thesis section
    for _, report in found:
        for row in report["rows"]:
            if row["name"] not in [o[0] for o in order]:
                order.append((row["name"], row["label"], row.get("section", "")))
    columns = [f"{corpora.get(r.corpus, r.corpus)} {r.label} ({'ppl' if report['level'] == 'word' else 'bpc'})"
               for r, report in found]
    by_run = [{row["name"]: row for row in report["rows"]} for _, report in found]
    words = [report["level"] == "word" for _, report in found]
    tokens = sorted({report.get("tokens") for _, report in found if report.get("tokens")})
    lines = ["### Optimisers for dynamic evaluation (Krause thesis 5.4): valid / test", "",
             "Each optimiser's learning rate is tuned on the first "
             + (", ".join(f"{t:,}" for t in tokens) or "all the") + " validation tokens, then scores as many test "
             "tokens; perplexity for word-level corpora, bits per character otherwise.", "",
             "| optimiser | thesis | " + " | ".join(columns) + " |", "|" + " --- |" * (2 + len(columns))]
    for name, label, section in order:
        cells = []
        for (r, _), rows, word in zip(found, by_run, words):
            row = rows.get(name)
            if row is None or row.get("skipped"):
                cells.append("skipped" if row else "-")
                continue
            link = f"{_rel(r.path, out)}/{FILE}"
            cells.append(f'[{_score(row, "valid", word)}]({link} "{command}") / '
                         f'[{_score(row, "test", word)}]({link} "{command}")')
        lines.append(f"| {label} | {section or '-'} | " + " | ".join(cells) + " |")
    lines += ["", "The settings each search settled on:", "", "| optimiser | " + " | ".join(columns) + " |",
              "|" + " --- |" * (1 + len(columns))]
    for name, label, _ in order:
        if name == "static":
            continue
        lines.append(f"| {label} | " + " | ".join(_settings(rows[name]) if name in rows else "-" for rows in by_run)
                     + " |")
    lines += ["", "Does the thesis's ordering reproduce (test scores, lower is better)?", "",
              "| the thesis's claim | " + " | ".join(columns) + " |", "|" + " --- |" * (1 + len(columns))]
    for claim, check in CLAIMS:
        lines.append(f"| {claim} | " + " | ".join(check(rows)[1] for rows in by_run) + " |")
    return lines + [""]


def checks(report: dict[str, Any]) -> dict[str, bool | None]:
    """Each claim of :data:`CLAIMS` on one run's report: True, False, or None (a row is missing)."""
    rows = {row["name"]: row for row in report["rows"]}
    return {claim: check(rows)[0] for claim, check in CLAIMS}


def _rel(path: Path, out: Path) -> str:
    return os.path.relpath(path, out.resolve() if path.is_absolute() else out).replace(os.sep, "/")


def plot(runs: list[Run], path: Path, corpus_label: str) -> Path | None:
    """Test cross-entropy of each optimiser relative to static evaluation (percent), one bar per model."""
    found = [(r, report) for r in runs if (report := read(r))]
    if not found:
        return None
    names: list[tuple[str, str]] = []
    for _, report in found:
        for row in report["rows"]:
            if row["name"] != "static" and row["name"] not in [n for n, _ in names]:
                names.append((row["name"], row["label"]))
    fig = new_figure((8, 0.25 * len(names) * (1 + 0.5 * len(found)) + 1.2))
    if fig is None:
        return None
    ax = fig.subplots()
    height = 0.8 / len(found)
    for k, (r, report) in enumerate(found):
        rows = {row["name"]: row for row in report["rows"]}
        static = report["static"]["test"]["xent"]
        ys, xs = [], []
        for i, (name, _) in enumerate(names):
            xent = _test(rows, name)
            if xent is not None:
                ys.append(i + (k - (len(found) - 1) / 2) * height)
                xs.append(100 * (xent / static - 1))
        ax.barh(ys, xs, height=height, label=r.label)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels([label for _, label in names], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("test cross-entropy relative to static (%), lower is better")
    ax.set_title(f"{corpus_label}: optimisers for dynamic evaluation")
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)
