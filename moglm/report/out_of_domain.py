"""The out-of-domain table (Krause thesis 6.3.2, table 6.4): each run's in-domain and out-of-domain test
scores, static and dynamic, read from ``evaluations/out_of_domain.json``, and whether adaptation gains more out
of domain than in domain, as the thesis found."""

from __future__ import annotations

import math
import os
from pathlib import Path

from ..evaluation.scores import unit
from .runs import Run


def _value(block: dict, level: str) -> float:
    return block["perplexity"] if level == "word" else block["bits_per_token"]


def out_of_domain_lines(runs: list[Run], out: Path, command: str) -> list[str]:
    rows = [r for r in runs if "out_of_domain" in r.evaluations]
    if not rows:
        return []
    lines = ["### Out of domain: settings tuned on the training domain's validation text", "",
             "| model | corpus | unit | target | in domain: static -> dynamic (gain) | out of domain: static -> "
             "dynamic (gain) | text changed to fit the vocabulary | larger gain out of domain (thesis) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        e = r.evaluations["out_of_domain"]
        level = e["level"]
        inside, outside = e["in_domain"], e["out_of_domain"]
        changed = e["changed"]
        dropped = f"{changed['dropped_characters']:,} characters dropped" if changed["dropped_characters"] else ""
        unknown = f"{changed['unknown_words']:,} words to <unk>" if changed["unknown_words"] else ""
        link = os.path.relpath(r.path / "evaluations" / "out_of_domain.json", out).replace(os.sep, "/")
        gains = inside["gain"], outside["gain"]
        verdict = "-" if any(math.isnan(g) for g in gains) else ("yes" if gains[1] > gains[0] else "no")
        lines.append(f"| {r.label} | {r.corpus} | {unit(level)} | {e['target']} | "
                     f"[{_value(inside['static'], level):.3f} -> {_value(inside['dynamic'], level):.3f}]({link}) "
                     f"({-gains[0]:+.1%}) | [{_value(outside['static'], level):.3f} -> "
                     f"{_value(outside['dynamic'], level):.3f}]({link}) ({-gains[1]:+.1%}) | "
                     f"{', '.join(x for x in (dropped, unknown) if x) or 'nothing'} of {changed['tokens']:,} tokens | "
                     f"{verdict} |")
    lines += ["", "Gains are perplexity reductions, `1 - exp(xent_dynamic - xent_static)`; every score links to "
              f"the file `{command}` wrote.", ""]
    return lines
