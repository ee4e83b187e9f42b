"""What a report reads: run directories (config, model size, metrics, evaluations) and an experiment's
``experiment.json``. Nothing here trains or evaluates."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MoglmError
from ..evaluation.scores import unit

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: evaluations an analysis writes beside the score tables' (read into ``Run.evaluations`` too)
ANALYSIS_FILES = ("out_of_domain", "optimisers")
EVALUATION_LABELS = {"static": "static", "mc_dropout": "MC dropout",
                     "mc_dropout_searched": "MC dropout (searched multiplier)", "dynamic": "dynamic evaluation",
                     "mc_dynamic": "MC dropout + dynamic", "cache": "neural cache",
                     "dynamic_cache": "dynamic + cache", "dynamic_sgd": "dynamic (SGD)",
                     "dynamic_rms": "dynamic (global RMS)"}


@dataclass
class Run:
    """One run directory as a report sees it."""

    path: Path
    name: str
    label: str
    corpus: str
    variant: str = ""
    x: float | None = None
    config: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    evaluations: dict[str, dict[str, Any]] = field(default_factory=dict)
    series: str | None = None  # the line of a sweep figure this run is on (the variant's series)
    seed: int | None = None  # the experiment's seed for this run (several seeds: moglm.report.seeds)

    @property
    def level(self) -> str:
        if self.task == "music":
            return "music"
        static = self.evaluations.get("static", {})
        return static.get("level") or self.config.get("data", {}).get("format", "char")

    @property
    def task(self) -> str:
        if self.config.get("kind") == "music":
            return "music"
        return "reverse_copy" if "length" in self.config or "min_length" in self.config else "language_model"

    def metrics(self) -> list[dict[str, Any]]:
        path = self.path / "metrics.jsonl"
        if not path.is_file():
            return []
        rows = []
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a line cut by a kill
        return rows

    def token_losses(self) -> dict[str, Any] | None:
        path = self.path / "evaluations" / "token_losses.safetensors"
        if not path.is_file():
            return None
        from safetensors.torch import load_file

        return load_file(str(path))


def _json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text())
    except ValueError as e:
        raise MoglmError(f"{path}: not valid JSON ({e})") from None
    return value if isinstance(value, dict) else None


def read_run(path: Path, label: str | None = None, corpus: str | None = None, variant: str = "",
             x: float | None = None) -> Run:
    """A run directory made by ``moglm train``, ``moglm task`` or ``moglm experiment run``."""
    path = Path(path)
    if not (path / "config.toml").is_file():
        raise MoglmError(f"{path}: not a run directory (no config.toml)")
    try:
        config = tomllib.loads((path / "config.toml").read_text())
    except tomllib.TOMLDecodeError as e:
        raise MoglmError(f"{path / 'config.toml'}: {e}") from None
    evaluations: dict[str, dict[str, Any]] = {}
    for name in (*EVALUATION_LABELS, *ANALYSIS_FILES):
        found = _json(path / "evaluations" / f"{name}.json")
        if found is not None:
            evaluations[name] = found
    if "static" not in evaluations:  # a plain `moglm train` / `moglm task` run
        results = _json(path / "results.json")
        if results is not None:
            evaluations["static"] = results
            if "mc_dropout" in results:
                evaluations["mc_dropout"] = results["mc_dropout"] | {"level": results.get("level")}
    if config.get("kind") == "music":  # a plain `moglm music dyneval`'s files, where no experiment wrote its own
        for rule in ("sgd", "rms"):
            found = _json(path / "dyneval" / f"music-{rule}.json")
            if found is not None:
                evaluations.setdefault(f"dynamic_{rule}", found)
    data_path = config.get("data", {}).get("path") if isinstance(config.get("data"), dict) else None
    return Run(path, path.name, label or path.name, corpus or (Path(data_path).stem if data_path else "default"),
               variant, x, config, _json(path / "model.json") or {}, evaluations)


def score(run: Run, evaluation: str, split: str, same_tokens: bool = False,
          key: str | None = None) -> tuple[float, str] | None:
    """(value, file it came from) of ``evaluation`` on ``split``: perplexity for words, bits per token
    otherwise, or the score's ``key`` (``bits_per_byte``); ``same_tokens``: for MC dropout and dynamic
    evaluation, the static score of the same prefix."""
    found = run.evaluations.get(evaluation)
    if found is None:
        return None
    if run.task == "reverse_copy":
        block = found.get("splits", {}).get(split)
        return (block["xent"], "results.json") if block else None
    if run.task == "music":  # log-likelihood per frame (thesis table 4.6)
        block = found.get("splits", {}).get(split)
        if block and "dynamic" in block:
            block = block["static" if same_tokens else "dynamic"]
        files = [f"evaluations/{evaluation}.json", f"dyneval/music-{evaluation.removeprefix('dynamic_')}.json"]
        file = next((f for f in files if (run.path / f).is_file()), "results.json")
        return (float(block["log_likelihood_per_frame"]), file) if block else None
    if same_tokens:
        block = found.get("static", {}).get(split) if evaluation.startswith("mc_dropout") else \
            found.get("splits", {}).get(split, {}).get("static")
    elif evaluation in ("dynamic", "mc_dynamic"):
        block = found.get("splits", {}).get(split, {}).get("dynamic")
    else:
        block = found.get("splits", {}).get(split)
    if not block:
        return None
    key = key or ("perplexity" if unit(run.level) == "perplexity" else "bits_per_token")
    value = block.get(key)
    if value is None and key == "perplexity" and "xent" in block:
        value = math.exp(block["xent"])
    file = f"evaluations/{evaluation}.json" if (run.path / "evaluations" / f"{evaluation}.json").is_file() \
        else "results.json"
    return (float(value), file) if value is not None else None


def read_experiment(folder: Path) -> tuple[dict[str, Any], list[Run]]:
    """An experiment folder's manifest and its runs (those that exist)."""
    manifest = _json(folder / "experiment.json")
    if manifest is None:
        raise MoglmError(f"{folder}: no experiment.json (run `moglm experiment run` first, or pass run directories)")
    out = []
    for row in manifest.get("runs", []):
        path = (folder / row["path"]).resolve()
        if (path / "config.toml").is_file():
            run = read_run(path, row.get("label"), row.get("corpus"), row.get("variant", ""), row.get("x"))
            run.series = row.get("series")
            run.seed = row.get("seed")
            out.append(run)
    return manifest, out
