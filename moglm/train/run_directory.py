"""The run directory: everything a run produces, and everything later commands read.

::

    runs/<name>/
      config.toml          resolved config (with format_version)
      vocab.json           the vocabulary (from the training split)
      model.json           resolved model sizes (hidden size chosen by budget, parameter count)
      metrics.jsonl        one JSON record per line: train / valid / final
      learning_curve.png   the learning curve, redrawn at every evaluation
      results.json         final evaluation (temperature, valid/test scores)
      sample.txt           a sample from the best checkpoint
      checkpoints/         see moglm.train.checkpoint
      tensorboard/         TensorBoard events, when tensorboard is installed
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..data.vocabulary import Vocabulary
from ..errors import MoglmError
from ..model.language_model import LanguageModel
from .build import build_model
from .checkpoint import CheckpointStore, atomic_write_text, load_group, load_state
from .config import RunConfig, read_mapping, validate


def _first_difference(a: Any, b: Any, prefix: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            d = _first_difference(a.get(key), b.get(key), f"{prefix}{key}.")
            if d:
                return d
        return None
    return None if a == b else f"{prefix[:-1]}: {a!r} (saved) vs {b!r} (now)"


class RunDirectory:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.config_path = self.path / "config.toml"
        self.vocab_path = self.path / "vocab.json"
        self.model_info_path = self.path / "model.json"
        self.metrics_path = self.path / "metrics.jsonl"
        self.plot_path = self.path / "learning_curve.png"
        self.results_path = self.path / "results.json"
        self.sample_path = self.path / "sample.txt"
        self.checkpoints = CheckpointStore(self.path / "checkpoints")

    # -- starting or resuming -------------------------------------------------------------------
    def prepare(self, config: RunConfig) -> bool:
        """Create the directory for ``config``; returns whether a run with the same config exists to resume.
        A different saved config is an error (a resumed run must continue exactly)."""
        if self.config_path.is_file():
            saved = read_mapping(self.config_path)
            diff = _first_difference(saved, json.loads(config.model_dump_json(exclude_none=True)))
            if diff:
                raise MoglmError(
                    f"{self.path} holds a run with a different config ({diff}); "
                    "choose another --run-dir, or pass --restart to discard it"
                )
            return self.checkpoints.pointer("last") is not None
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.config_path, config.to_toml())
        return False

    # -- metrics --------------------------------------------------------------------------------
    def append_metrics(self, record: dict[str, Any]) -> None:
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def read_metrics(self) -> list[dict[str, Any]]:
        if not self.metrics_path.is_file():
            return []
        out = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a kill
                continue
        return out

    def truncate_metrics(self, step: int) -> None:
        """Drop records after ``step`` (written after the checkpoint a resumed run restarts from)."""
        kept = [r for r in self.read_metrics() if r.get("step", 0) <= step and r.get("kind") != "final"]
        atomic_write_text(self.metrics_path, "".join(json.dumps(r) + "\n" for r in kept))

    # -- reading a finished (or running) run ------------------------------------------------------
    def load_config(self) -> RunConfig:
        if not self.config_path.is_file():
            raise MoglmError(f"{self.path}: not a run directory (no config.toml)")
        return validate(read_mapping(self.config_path), str(self.config_path))

    def load_vocab(self) -> Vocabulary:
        if not self.vocab_path.is_file():
            raise MoglmError(f"{self.path}: no vocab.json (the run never started training)")
        return Vocabulary.from_json(self.vocab_path.read_text())

    def model_info(self) -> dict[str, Any]:
        if not self.model_info_path.is_file():
            raise MoglmError(f"{self.path}: no model.json (the run never started training)")
        return json.loads(self.model_info_path.read_text())

    def load_model(
        self, which: str = "best", device: torch.device | str = "cpu"
    ) -> tuple[LanguageModel, RunConfig, Vocabulary]:
        """The model of checkpoint ``which`` (``best``: the weights that scored best on validation,
        averaged if averaging was on; ``last``: the latest raw training weights)."""
        config, vocab = self.load_config(), self.load_vocab()
        pointer = self.checkpoints.pointer(which)
        if pointer is None:
            raise MoglmError(f"{self.path}: no {which} checkpoint yet")
        model = build_model(config.model, len(vocab), self.model_info()["hidden_size"])
        weights = load_group(pointer["path"], pointer.get("weights", "model"))
        missing, unexpected = model.load_state_dict(weights, strict=False)
        if missing or unexpected:
            raise MoglmError(f"{pointer['path']}: weights do not fit the model ({(missing or unexpected)[0]})")
        return model.to(device), config, vocab

    def checkpoint_state(self, which: str = "last") -> dict[str, Any] | None:
        pointer = self.checkpoints.pointer(which)
        return None if pointer is None else load_state(pointer["path"])
