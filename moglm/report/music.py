"""A music experiment's gain table: how many nats per frame dynamic evaluation (SGD, global RMS) adds to each
model's static log-likelihood on test, beside the gain the thesis reports for the same corpus (table 4.6)."""

from __future__ import annotations

from typing import Any

from .runs import Run, score

RULES = (("dynamic_sgd", "SGD"), ("dynamic_rms", "global RMS"))


def music_gain_lines(runs: list[Run], reference: dict[str, Any], corpora: dict[str, str]) -> list[str]:
    lines = ["### Gain from dynamic evaluation (test, nats per frame)", "",
             "| corpus | model | static | " + " | ".join(f"{label} gain | thesis {label} gain" for _, label in RULES)
             + " | settings (searched on valid) |", "|" + " --- |" * (3 + 2 * len(RULES) + 1)]
    rows = 0
    for run in runs:
        static = score(run, "static", "test")
        if static is None:
            continue
        cells = [corpora.get(run.corpus, run.corpus), run.label, f"{static[0]:.3f}"]
        paper = reference.get(run.corpus, {}).get(run.variant, {})
        settings = []
        for evaluation, _ in RULES:
            dynamic = score(run, evaluation, "test")
            same = score(run, evaluation, "test", same_tokens=True)
            cells.append(f"{dynamic[0] - same[0]:+.3f}" if dynamic and same else "-")
            theirs = [paper.get(evaluation, [None, None])[-1], paper.get("static", [None, None])[-1]]
            cells.append(f"{theirs[0] - theirs[1]:+.2f}" if None not in theirs else "-")
            found = run.evaluations.get(evaluation, {}).get("hyperparameters")
            if found:
                settings.append(", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                          for k, v in found.items()))
        cells.append("; ".join(settings) or "-")
        lines.append("| " + " | ".join(cells) + " |")
        rows += 1
    return lines + [""] if rows else []
