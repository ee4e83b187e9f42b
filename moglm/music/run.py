"""A trained music run end to end (``moglm music evaluate`` / ``moglm music dyneval``): static log-likelihood per
frame, and dynamic evaluation with SGD or global RMS, its settings searched on validation (thesis 4.8, table 4.6).
Results go to the run directory: ``results.json`` (static) and ``dyneval/music-<rule>.json``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..dynamic_evaluation import Hyperparameters
from ..dynamic_evaluation.statistics import load_or_collect
from ..errors import MoglmError
from .dynamic_evaluation import dynamic_evaluate_songs, first_songs, search_songs, song_gradient_rms, start_for
from .evaluation import evaluate_songs
from .corpus import read_music
from .training import MusicRun

SPLITS = ("train", "valid", "test")


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise MoglmError(f"split must be one of {SPLITS}, got {split!r}")


def evaluate_music_run(run: MusicRun, splits: list[str] | None = None, checkpoint: str = "best",
                       progress: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Static log-likelihood per frame of each split under checkpoint ``checkpoint``."""
    model, cfg = run.load_model(checkpoint)
    corpus = run.read_corpus(cfg)
    out = {}
    for split in splits or cfg.evaluation.splits:
        _check_split(split)
        scores = evaluate_songs(model, corpus[split], cfg.evaluation.batch_size, progress, split)
        out[split] = scores.as_dict()
        log(f"{split}: log-likelihood {scores.log_likelihood:.4f} per frame ({scores.frames:,} frames, "
            f"{scores.songs} songs)")
    return out


def dyneval_music_run(run: MusicRun, rule: str = "rms", splits: tuple[str, ...] = ("test",), search: bool = True,
                      lr: float | None = None, segment_length: int | None = None, checkpoint: str = "best",
                      progress: bool = False, log: Callable[[str], None] = print,
                      search_frames: int | None = None, frames: int | None = None) -> dict[str, Any]:
    """Dynamic evaluation of ``splits`` with ``rule`` (``sgd`` or ``rms``), songs reset one by one. ``search``:
    tune the learning rate and segment length (and eps) on validation first (its first songs of at most
    ``search_frames`` frames, when given), once for every split; ``frames``: score only the first songs of each
    split that hold at most that many frames; ``lr`` /
    ``segment_length`` fix them instead (or start the search there). Writes and returns
    ``dyneval/music-<rule>.json``: ``{"rule", "hyperparameters", "search", "splits": {split: scores}}``."""
    for split in splits:
        _check_split(split)
    model, cfg = run.load_model(checkpoint)
    corpus = run.read_corpus(cfg)
    hp = start_for(rule)
    hp = hp.with_(**{k: v for k, v in (("lr", lr), ("segment_length", segment_length)) if v is not None})
    rms = None
    if rule == "rms":
        names = [n for n, _ in model.named_parameters()]
        pointer = run.checkpoints.pointer(checkpoint) or {}
        which = {"dir": str(pointer.get("dir", pointer.get("path", ""))), "step": pointer.get("step"),
                 "weights": pointer.get("weights", "model")}  # best's averaged weights and last's raw ones differ
        key = hashlib.sha256(json.dumps(which, sort_keys=True, default=str).encode()).hexdigest()[:16]
        path = run.path / "dyneval" / f"music-rms-{key}.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        rms = load_or_collect(path, names, lambda: song_gradient_rms(model, corpus["train"], progress=progress),
                              which, log)
    trials: list[dict] = []
    if search:
        songs = corpus["valid"] if search_frames is None else first_songs(corpus["valid"], search_frames)
        log(f"searching the {rule} settings on validation ({len(songs)} of its {len(corpus['valid'])} songs)")
        hp, trials = search_songs(model, songs, rule, rms, log=log, start=hp)
    out: dict[str, Any] = {"rule": rule, "checkpoint": checkpoint, "hyperparameters": hp.as_dict(),
                           "searched": search, "search": trials, "splits": {}}
    harmful = []
    for split in splits:
        songs = corpus[split] if frames is None else first_songs(corpus[split], frames)
        result = dynamic_evaluate_songs(model, songs, hp, rms, progress=progress, desc=f"dyneval {split}")
        cost = result.as_dict()["cost"]
        log(f"{split}: static {result.static.log_likelihood:.4f}, dynamic ({rule}, {hp.label()}) "
            f"{result.dynamic.log_likelihood:.4f} per frame ({result.gain:+.4f}); {result.rollbacks} rollbacks; "
            f"{cost:.1f}x the static CPU time")
        out["splits"][split] = result.as_dict()
        if result.gain <= 0 or result.rollbacks:
            why = (f"scored worse than static ({result.static.log_likelihood:.4f} -> "
                   f"{result.dynamic.log_likelihood:.4f} per frame)" if result.gain <= 0 else
                   f"rolled back {result.rollbacks} time{'s' * (result.rollbacks > 1)} (diverging updates)")
            harmful.append(f"{split}: {why}")
            log(f"warning: dynamic evaluation {why} on {split} with {hp.label()}")
    out["harmful"] = harmful
    name = f"music-{rule}" + ("-rejected" if harmful else "")
    if harmful:
        log(f"this report goes to dyneval/{name}.json; the run's saved music-{rule} settings are unchanged")
    from ..provenance import write_result

    write_result(run.path / "dyneval" / f"{name}.json", out, cfg.train.seed)
    return out


def music_run(path: str | Path) -> MusicRun:
    """The music run in ``path`` (a one-line error when it is not one)."""
    from .config import is_music_config

    run = MusicRun(path)
    if not is_music_config(run.read_config()):
        raise MoglmError(f"{path}: not a music run (train one with `moglm music train`)")
    return run


def sample_music_run(run: MusicRun, num_frames: int, temperature: float, seed: int | None, checkpoint: str,
                     output: Path | None, log: Callable[[str], None] = print, force: bool = False):
    from .training import sample_paths, write_sample

    sample_paths(run, output, force)  # refused before the model is loaded
    model, cfg = run.load_model(checkpoint)
    written = write_sample(run, model, cfg, seed, output, num_frames, temperature, log, force)
    if written is None:
        raise MoglmError("the sample could not be written (see above)")
    return written
