"""The markdown report: one table per corpus and figure, every number a link to the file it came from
(its title is the command that made it), the papers' numbers beside ours."""

from __future__ import annotations

import math
import os
from pathlib import Path

from ..atomic import atomic_write_text
from ..errors import MoglmError
from . import plots
from .music import music_gain_lines
from .optimisers import optimisers_lines
from .out_of_domain import out_of_domain_lines
from ..evaluation.scores import unit
from .runs import EVALUATION_LABELS, Run, read_experiment, read_run, score
from ..provenance import portable
from .seeds import score_key, seed_label, spread_lines

#: evaluations that may score a prefix of each split, each beside the static score of the same tokens
PREFIX_EVALUATIONS = ("mc_dropout", "mc_dropout_searched", "dynamic", "mc_dynamic", "cache", "dynamic_cache")


def write_report(paths: list[Path], out: Path | None = None, bundle: bool = False) -> Path:
    """``paths``: one experiment folder (``experiments/<scale>/<name>``) or run directories. Returns the
    report's path (``report.md`` in ``out``). ``bundle``: copy the files it cites beside it
    (:mod:`moglm.report.bundle`)."""
    if len(paths) == 1 and (Path(paths[0]) / "experiment.json").is_file():
        folder = Path(paths[0])
        manifest, runs = read_experiment(folder)
        spec = manifest.get("spec")
        if spec is None:  # the report reads the run directories alone, and the manifest names the experiment
            raise MoglmError(f"{folder}/experiment.json has no spec: rerun `moglm experiment run` to rewrite it")
        command = portable(manifest.get("command", ""))  # no absolute path of the machine that ran it
        out = Path(out or folder)
        title = f"{spec['name']} ({manifest['scale']} scale): {spec['description']}"
        source = spec.get("source", "")
    else:
        runs = [read_run(Path(p)) for p in paths]
        spec = {"tables": [{"title": "Scores", "evaluations": [e for e in EVALUATION_LABELS
                                                                 if any(e in r.evaluations for r in runs)],
                            "splits": ["valid", "test"]}],
                "figures": [{"kind": "learning_curves", "title": "Validation score during training"}]
                + ([{"kind": "surprise", "title": "Loss after a surprising token"}]
                   if sum(r.token_losses() is not None for r in runs) > 1 else []),
                "reference": {}, "corpora": {}}
        manifest, command = {}, "moglm evaluate <run>"
        out = Path(out or "report")
        title, source = "Runs", ""
    if not runs:
        raise MoglmError("no runs to report on yet: run the experiment first")
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# {title}", ""]
    if source:
        lines += [f"Reproduces: {source}.", ""]
    if command:
        lines += [f"Produced by `{command}`; every number links to the file it was read from.", ""]
    if spec.get("reference_note"):
        lines += [spec["reference_note"], ""]
    corpora = manifest.get("corpora") or {k: v.get("label") or k for k, v in spec.get("corpora", {}).items()}
    for table in spec.get("tables", []):
        for corpus in dict.fromkeys(r.corpus for r in runs):
            group = [r for r in runs if r.corpus == corpus]
            lines += table_lines(table, group, corpora.get(corpus, corpus), spec.get("reference", {}).get(corpus, {}),
                                 out, command)
            lines += spread_lines(table, group, corpora.get(corpus, corpus))
            if any(e in PREFIX_EVALUATIONS for e in table["evaluations"]):
                lines += same_tokens_lines(table, group, out, command)
    if not manifest or "out_of_domain" in spec.get("evaluations", []):  # not another experiment's shared runs'
        lines += out_of_domain_lines(runs, out, command)
    if runs[0].task == "music":
        lines += music_gain_lines(runs, spec.get("reference", {}), corpora)
    if runs[0].task == "reverse_copy":
        lines += reverse_copy_lines(runs, out, command)
    for figure in spec.get("figures", []):
        if figure["kind"] == "optimisers":  # one table over every corpus and model, then a figure per corpus
            lines += optimisers_lines(runs, corpora, out, command)
        for corpus in dict.fromkeys(r.corpus for r in runs):
            group = [r for r in runs if r.corpus == corpus]
            made = plots.draw(figure, group, out / f"{figure['kind']}-{corpus}.png", corpora.get(corpus, corpus))
            if made is not None:
                lines += [f"### {figure.get('title') or figure['kind']} ({corpora.get(corpus, corpus)})", "",
                          f"![{figure['kind']}]({made.name})", ""]
                if figure["kind"] == "surprise":
                    lines += surprise_lines(made.with_suffix(".json"))
            if figure["kind"] == "unseen_words":  # its table, with or without a figure
                lines += plots.unseen_words.markdown_lines(out / f"unseen_words-{corpus}.json",
                                                           corpora.get(corpus, corpus))
    lines += ["## Runs", "", "| run | directory | parameters | hidden | config |", "| --- | --- | --- | --- | --- |"]
    for r in runs:
        rel = _rel(r.path, out)
        lines.append(f"| {r.label} | [{r.name}]({rel}) | {r.info.get('num_params', '-'):,} | "
                     f"{r.info.get('hidden_size', '-')} | [config.toml]({rel}/config.toml) |"
                     if isinstance(r.info.get("num_params"), int) else
                     f"| {r.label} | [{r.name}]({rel}) | - | - | [config.toml]({rel}/config.toml) |")
    path = out / "report.md"
    atomic_write_text(path, "\n".join(lines) + "\n")
    if bundle:
        from .bundle import bundle_report

        bundle_report(path, [r.path for r in runs])
    return path


def _rel(path: Path, out: Path) -> str:
    return os.path.relpath(path, out.resolve() if path.is_absolute() else out).replace(os.sep, "/")


def _fmt(value: float | None, level: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.2f}" if level == "word" else f"{value:.3f}"


def _cell(run: Run, evaluation: str, split: str, out: Path, command: str, same_tokens: bool = False,
          key: str | None = None) -> str:
    found = score(run, evaluation, split, same_tokens, key)
    if found is None:
        return "-"
    value, file = found
    return f'[{_fmt(value, "byte" if key else run.level)}]({_rel(run.path, out)}/{file} "{command}")'


def table_lines(table: dict, runs: list[Run], corpus_label: str, reference: dict, out: Path,
                command: str) -> list[str]:
    evaluations, splits = table["evaluations"], table.get("splits", ["valid", "test"])
    key = score_key(table)
    level = "byte" if key else runs[0].level
    has_reference = any(reference.get(r.variant) for r in runs)
    head = ["model"] + [f"{EVALUATION_LABELS[e]} {s}" for e in evaluations for s in splits]
    ordering = table.get("ordering") or []
    if ordering:
        better = " > " if level == "music" else " < "  # best first: log-likelihoods higher, the others lower
        head.append("source's order on test: " + better.join(EVALUATION_LABELS[e] for e in ordering))
    if has_reference:
        head += [f"paper {EVALUATION_LABELS[e]} {'/'.join(splits)}" for e in evaluations]
    lines = [f"### {table['title']}: {corpus_label}, {unit(level)}", "", "| " + " | ".join(head) + " |",
             "|" + " --- |" * len(head)]
    for r in runs:
        cells = [seed_label(r, runs)] + [_cell(r, e, s, out, command, key=key) for e in evaluations for s in splits]
        if ordering:
            cells.append(ordering_cell(r, ordering))
        if has_reference:
            ref = reference.get(r.variant, {})
            cells += [" / ".join(_fmt(v, level) for v in ref.get(e, [None] * len(splits))) for e in evaluations]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def ordering_cell(run: Run, ordering: list[str], split: str = "test") -> str:
    """Whether ``run``'s ``split`` scores keep ``ordering`` (best first; lower is better, higher for a music run's
    log-likelihoods); static is read on the tokens the others scored when they scored a prefix."""
    sign = -1.0 if run.level == "music" else 1.0
    values = []
    for e in ordering:
        found = None
        if e == "static":
            found = next((score(run, other, split, same_tokens=True) for other in ordering
                          if other != "static" and score(run, other, split, same_tokens=True)), None)
        found = found or score(run, e, split)
        if found is None:
            return "-"
        values.append(sign * found[0])
    if all(a < b for a, b in zip(values, values[1:])):
        return "yes"
    broken = next(i for i, (a, b) in enumerate(zip(values, values[1:])) if not a < b)
    return f"no: {EVALUATION_LABELS[ordering[broken]]} {sign * values[broken]:.4g} {'<=' if sign < 0 else '>='} " \
           f"{EVALUATION_LABELS[ordering[broken + 1]]} {sign * values[broken + 1]:.4g}"


def same_tokens_lines(table: dict, runs: list[Run], out: Path, command: str) -> list[str]:
    """When MC dropout, dynamic evaluation or the cache scored a prefix, the static score of the same prefix."""
    others = [e for e in table["evaluations"] if e in PREFIX_EVALUATIONS]
    tokens = {r.evaluations.get(e, {}).get("tokens") or _eval_tokens(r.evaluations.get(e, {}))
              for r in runs for e in others} - {None}
    if not tokens:
        return []
    splits = table.get("splits", ["valid", "test"])
    labels = " / ".join(f"with {EVALUATION_LABELS[e]}" for e in others)
    lines = [f"{', '.join(EVALUATION_LABELS[e] for e in others)} scored the first "
             f"{', '.join(f'{t:,}' for t in sorted(tokens))} tokens of each split; the static scores of those same "
             "tokens:", "", "| model | " + " | ".join(f"static {s} (same tokens, {labels})" for s in splits) + " |",
             "|" + " --- |" * (1 + len(splits))]
    for r in runs:
        cells = [" / ".join(_cell(r, e, s, out, command, True) for e in others) for s in splits]
        lines.append(f"| {seed_label(r, runs)} | " + " | ".join(cells) + " |")
    return lines + [""]


def _eval_tokens(report: dict) -> int | None:
    splits = report.get("splits", {})
    for block in splits.values():
        if isinstance(block, dict) and isinstance(block.get("static"), dict):
            return block["static"].get("tokens")
    return None


def reverse_copy_lines(runs: list[Run], out: Path, command: str) -> list[str]:
    lines = ["### Reverse copy: test cross-entropy and accuracy", "",
             "| length | model | parameters | learning rate | l2 | test cross-entropy (nats/token) | token accuracy | "
             "sequence accuracy |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in sorted(runs, key=lambda r: r.config.get("length", 0)):
        test = r.evaluations.get("static", {}).get("splits", {}).get("test")
        if not test:
            continue
        link = f"{_rel(r.path, out)}/results.json"
        lr, l2 = r.config.get("learning_rate"), r.config.get("l2_penalty")
        lines.append(f"| {r.config.get('length', '-')} | {r.label} | {r.info.get('num_params', '-')} | "
                     f"{'-' if lr is None else f'{lr:.3g}'} | {'-' if l2 is None else f'{l2:.3g}'} | "
                     f"[{test['xent']:.4f}]({link} \"{command}\") | "
                     f"{test['token_accuracy']:.3f} | {test['sequence_accuracy']:.3f} |")
    return lines + [""]


def surprise_lines(path: Path) -> list[str]:
    import json

    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    lines = []
    for mode, result in data.items():
        k = min(5, result["horizon"])
        lines += [f"{mode.capitalize()}: {result['surprising']:,} surprising tokens of {result['tokens']:,} "
                  f"(mean loss over the models >= {result['threshold']:.2f} nats).", "",
                  "| model | average loss | at the surprise | " + " | ".join(f"+{i}" for i in range(1, k + 1)) + " |",
                  "|" + " --- |" * (3 + k)]
        for name, m in result["models"].items():
            lines.append(f"| {name} | {m['average']:.3f} | {m['at_surprise']:.3f} | "
                         + " | ".join(f"{v:.3f}" for v in m["after"][:k]) + " |")
        lines += [""] + _recovery_spread(result["models"], k)
    return lines


def _recovery_spread(models: dict, k: int) -> list[str]:
    """With several seeds a variant: the loss k tokens after a surprise above each model's own average (lower: a
    faster recovery), mean ± std over the seeds, and whether the variants' order at +1 exceeds the spread."""
    from .seeds import mean_std, stands

    excess: dict[str, list[list[float]]] = {}
    for name, m in models.items():
        excess.setdefault(name.rsplit(" (seed ", 1)[0], []).append([a - m["average"] for a in m["after"][:k]])
    if not any(len(v) > 1 for v in excess.values()):
        return []
    summary = {v: [(*mean_std([row[i] for row in rows]), len(rows)) for i in range(k)] for v, rows in excess.items()}
    lines = ["Loss after the surprise above each model's own average (lower: a faster recovery), mean ± std over "
             "seeds:", "", "| model | " + " | ".join(f"+{i}" for i in range(1, k + 1)) + " |", "|" + " --- |" * (1 + k)]
    lines += [f"| {v} (n = {cells[0][2]}) | " + " | ".join(f"{m:.3f} ± {sd:.3f}" for m, sd, _ in cells) + " |"
              for v, cells in summary.items()]
    order = sorted(summary, key=lambda v: summary[v][0][0])
    text = order[0] + "".join((" < " if stands(summary[a][0], summary[b][0]) else " ≈ ") + b
                              for a, b in zip(order, order[1:]))
    return lines + ["", f"Fastest recovery first at +1 (`<` where the gap exceeds the spread): {text}", ""]
