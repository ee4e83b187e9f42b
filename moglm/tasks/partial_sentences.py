"""Partial-sentence training (the student report, section 6.1): train on sentences cut off after ``c``
characters, validate and test on whole sentences, to see how a model trained on curtailed sentences
generalises to full ones (the report cuts PTB character-level sentences at 25, 50 and 75 characters,
whitespace included).

A corpus transform: every line of the training split (a line is a sentence in PTB-style corpora) keeps
its first ``cut`` tokens of the corpus's format (characters for ``char``, Mikolov's symbols for
``ptb_char``, where ``_`` is the space, words for ``word``, bytes for ``byte``); the end of line stays, so
a cut sentence ends where it was cut. Validation and test files are copied unchanged. The transformed
corpus is written into the run directory (``data/``) and trained with
:func:`moglm.train.train_and_evaluate`, the config's ``data.path`` pointing at it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..data.corpus import _read, _split_by_fraction, find_split_files, resolve_path
from ..errors import MoglmError
from ..atomic import atomic_write_bytes
from ..runs.config import DataConfig, RunConfig
from ..runs import RunDirectory
from ..train.trainer import train_and_evaluate


def line_length(line, fmt: str) -> int:
    """Tokens in one line of a corpus of format ``fmt`` (the end of line not counted)."""
    return len(line.split()) if fmt in ("word", "ptb_char") else len(line)


def cut_line(line, cut: int, fmt: str):
    """The first ``cut`` tokens of one line (``str``, or ``bytes`` for the byte format)."""
    if fmt in ("word", "ptb_char"):
        return " ".join(line.split()[:cut])
    return line[:cut]


def cut_text(text, cut: int, fmt: str):
    """Every line of ``text`` cut to ``cut`` tokens; line ends are kept."""
    newline = b"\n" if isinstance(text, bytes) else "\n"
    return newline.join(cut_line(line, cut, fmt) for line in text.split(newline))


def raw_splits(data: DataConfig) -> dict[str, str | bytes]:
    """The text of each split of a corpus config: its train/valid/test files, or one file split by fraction."""
    if data.path is None:
        raise MoglmError("partial-sentence training needs a corpus of sentences, one per line: set data.path")
    binary = data.format == "byte"
    root = resolve_path(data.path)
    if data.files:
        base = root if root.is_dir() else root.parent
        return {s: _read(resolve_path(base / data.files[s]), binary) for s in ("train", "valid", "test")}
    if root.is_dir():
        return {s: _read(p, binary) for s, p in find_split_files(root).items()}
    return _split_by_fraction(_read(root, binary), tuple(data.split_fractions))


def write_partial_corpus(data: DataConfig, cut: int, directory: Path) -> dict[str, Any]:
    """Write ``train.txt`` (cut) and ``valid.txt``, ``test.txt`` (whole) into ``directory``; returns statistics."""
    if cut < 1:
        raise MoglmError(f"--cut must be >= 1, got {cut}")
    splits = raw_splits(data)
    directory.mkdir(parents=True, exist_ok=True)
    out = {"train": cut_text(splits["train"], cut, data.format), "valid": splits["valid"], "test": splits["test"]}
    for split, text in out.items():
        atomic_write_bytes(directory / f"{split}.txt", text if isinstance(text, bytes) else text.encode("utf-8"))
    newline = b"\n" if isinstance(splits["train"], bytes) else "\n"
    lines = splits["train"].split(newline)
    lengths = [line_length(line, data.format) for line in lines]
    return {"cut": cut, "format": data.format, "train_lines": len(lines),
            "train_lines_cut": sum(n > cut for n in lengths), "train_tokens_before": sum(lengths),
            "train_tokens_after": sum(min(n, cut) for n in lengths)}


def run_partial_sentences(cfg: RunConfig, cut: int, run_dir: str | Path, progress: bool = True,
                          log: Callable[[str], None] = print) -> dict[str, Any]:
    """Write the cut corpus into ``run_dir/data``, train ``cfg`` on it (resuming if possible), and run the
    final evaluation on the whole sentences of ``evaluation.splits``; ``results.json`` records the cut."""
    run = RunDirectory(run_dir)
    data_dir = run.path / "data"
    info_path = run.path / "partial_sentences.json"
    source = cfg.data.model_dump(mode="json")
    if info_path.is_file():
        info = json.loads(info_path.read_text())
        if info["source"] != source or info["statistics"]["cut"] != cut:
            raise MoglmError(f"{run.path} holds a partial-sentence run of another corpus or cut; choose another "
                             "--run-dir or pass --restart")
    else:
        info = {"source": source, "statistics": write_partial_corpus(cfg.data, cut, data_dir)}
        run.write_json(info_path, info)
    stats = info["statistics"]
    log(f"training sentences cut at {cut} tokens: {stats['train_lines_cut']:,} of {stats['train_lines']:,} lines cut; "
        "validation and test sentences whole")
    cfg = cfg.model_copy(deep=True)
    cfg.data = DataConfig(**{**source, "path": str(data_dir.resolve()), "files": None})
    _, results = train_and_evaluate(cfg, run.path, progress=progress, log=log, write=False)
    results["partial_sentences"] = info  # evaluation.splits, whole sentences
    run.write_json(run.results_path, results)
    return results
