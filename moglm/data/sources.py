"""Hugging Face ``datasets`` corpora as moglm splits (``data.source``), read as streams.

A source is one of:

* a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (memory-mapped Arrow: rows are read
  as they are needed, never the whole table into memory);
* local data files: one ``.txt``, ``.json``/``.jsonl``, ``.parquet`` or ``.csv`` file, a folder of them (their
  names give the splits, as ``datasets`` infers them), or a glob;
* a dataset on the Hugging Face Hub, ``name`` or ``name:configuration`` (``wikitext:wikitext-2-raw-v1``), where
  the machine has network; read with ``streaming=True``.

Each record's ``text_field`` is one piece of its split's text, followed by a newline unless it ends with one
(a ``.txt`` file's records are its lines, without their newlines). moglm's splits are ``train``, ``valid`` and
``test``; ``split_names`` maps them to the dataset's (default: ``train``; ``validation``, ``valid`` or ``dev``;
``test``). A dataset with only one split is cut into three by ``split_fractions`` of its records.

``datasets`` is an optional extra (``pip install 'moglm[data]'``), imported only here.
"""

from __future__ import annotations

import glob
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import MoglmError
from .paths import find_local

SPLITS = ("train", "valid", "test")
#: the dataset split names each moglm split is found under when ``split_names`` does not say
DEFAULT_NAMES = {"train": ("train",), "valid": ("validation", "valid", "dev"), "test": ("test",)}
BUILDERS = {".txt": "text", ".text": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet",
            ".csv": "csv"}
BATCH = 1000  # records read at once from a saved dataset


@dataclass
class OpenedSource:
    """A source's splits as :data:`moglm.data.corpus.Pieces`, its name, and what keys its cached corpus."""

    name: str
    splits: dict[str, Callable[[], Iterator[str]]]
    key: list[Any]


def _datasets():
    try:
        import datasets
    except ImportError:
        raise MoglmError("data.source needs the datasets package: pip install 'moglm[data]'") from None
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def open_source(source: str, text_field: str = "text", split_names: dict[str, str] | None = None,
                split_fractions: tuple[float, float, float] = (0.9, 0.05, 0.05)) -> OpenedSource:
    """The moglm splits of the ``datasets`` corpus ``source`` (see the module docstring); one-line errors for a
    source that cannot be read, a split or a text field it does not have."""
    datasets = _datasets()
    local = find_local(source)
    try:
        if local is not None and _is_saved(local):
            loaded, key = datasets.load_from_disk(str(local)), ["saved", *_file_stats(local)]
        elif local is not None or glob.has_magic(source):
            loaded, key = _load_files(datasets, local, source)
        else:
            name, _, configuration = source.partition(":")
            loaded = datasets.load_dataset(name, configuration or None, streaming=True)
            key = ["hub", source]
    except MoglmError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged folder, no network, no such dataset: one line each
        raise MoglmError(f"data.source {source!r}: cannot be read as a datasets corpus ({_first_line(e)})") from None
    if not isinstance(loaded, dict):  # one Dataset: its one split
        loaded = {"train": loaded}
    splits = _map_splits(source, dict(loaded), split_names, split_fractions, text_field)
    name = (local.name if local is not None else source.replace("/", "-").replace(":", "-")) or "datasets"
    return OpenedSource(name, splits, [*key, text_field, sorted((split_names or {}).items())])


def _is_saved(path: Path) -> bool:
    return path.is_dir() and ((path / "dataset_dict.json").is_file() or (path / "state.json").is_file())


def _file_stats(path: Path) -> list:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def _load_files(datasets, local: Path | None, source: str):
    """Local data files: one file, a folder of them, or a glob, read as a stream."""
    if local is not None and local.is_dir():
        return datasets.load_dataset(str(local), streaming=True), ["files", *_file_stats(local)]
    files = [local] if local is not None else sorted(Path(p) for p in glob.glob(source))
    if not files:
        raise MoglmError(f"data.source {source!r}: no file matches")
    suffixes = {p.suffix.lower() for p in files}
    builder = BUILDERS.get(next(iter(suffixes))) if len(suffixes) == 1 else None
    if builder is None:
        raise MoglmError(f"data.source {source!r}: data files must be one kind of {', '.join(sorted(BUILDERS))} "
                         f"(found {', '.join(sorted(suffixes))})")
    loaded = datasets.load_dataset(builder, data_files={"train": [str(p) for p in files]}, streaming=True)
    return loaded, ["files", *[s for p in files for s in _file_stats(p)]]


def _map_splits(source: str, loaded: dict, split_names: dict[str, str] | None,
                fractions: tuple[float, float, float], field: str) -> dict[str, Callable[[], Iterator[str]]]:
    unknown = set(split_names or {}) - set(SPLITS)
    if unknown:
        raise MoglmError(f"data.split_names: {sorted(unknown)[0]!r} is not a moglm split ({', '.join(SPLITS)})")
    available = ", ".join(loaded) or "none"
    chosen: dict[str, str] = {}
    for split in SPLITS:
        if split_names and split in split_names:
            if split_names[split] not in loaded:
                raise MoglmError(f"data.split_names: the dataset {source!r} has no split {split_names[split]!r} "
                                 f"(its splits: {available})")
            chosen[split] = split_names[split]
        else:
            found = [name for name in DEFAULT_NAMES[split] if name in loaded]
            if found:
                chosen[split] = found[0]
    for split in chosen.values():
        _check_field(source, loaded[split], field)
    if set(chosen) == set(SPLITS):
        return {s: (lambda d=loaded[name]: _texts(d, field)) for s, name in chosen.items()}
    if len(loaded) == 1:  # one split: cut by position, as one file is
        only = next(iter(loaded.values()))
        _check_field(source, only, field)
        return _cut(only, field, fractions)
    missing = ", ".join(s for s in SPLITS if s not in chosen)
    raise MoglmError(f"data.source {source!r}: no split found for {missing} (its splits: {available}); name them in "
                     "data.split_names, e.g. {valid = \"validation\"}")


def _check_field(source: str, dataset, field: str) -> None:
    """A one-line error when the records have no ``field`` (naming the fields they have)."""
    columns = getattr(dataset, "column_names", None)
    if columns is None:  # a stream whose features are not declared: look at its first record
        first = next(iter(dataset), None)
        columns = list(first) if isinstance(first, dict) else []
    if field not in columns:
        raise MoglmError(f"data.text_field {field!r}: the dataset {source!r} has no such field (its fields: "
                         f"{', '.join(columns) or 'none'})")


def _records(dataset, field: str) -> Iterator[Any]:
    if isinstance(dataset, _datasets().Dataset):  # a saved (memory-mapped) dataset: columns in batches
        for batch in dataset.select_columns([field]).iter(batch_size=BATCH):
            yield from batch[field]
    else:
        for record in dataset:
            yield record[field]


def _texts(dataset, field: str, start: int = 0, stop: int | None = None) -> Iterator[str]:
    """The records' texts from index ``start`` to ``stop``, each ended by a newline."""
    for i, text in enumerate(_records(dataset, field)):
        if stop is not None and i >= stop:
            return
        if i < start:
            continue
        if not isinstance(text, str):
            raise MoglmError(f"data.text_field {field!r}: record {i} holds {type(text).__name__}, not text")
        yield text if text.endswith("\n") else text + "\n"


def _cut(dataset, field: str, fractions: tuple[float, float, float]) -> dict[str, Callable[[], Iterator[str]]]:
    """Three splits of one dataset by ``fractions`` of its records (a stream is counted first)."""
    n = len(dataset) if hasattr(dataset, "__len__") else sum(1 for _ in _records(dataset, field))
    a = int(n * fractions[0])
    b = a + int(n * fractions[1])
    bounds = {"train": (0, a), "valid": (a, b), "test": (b, n)}
    return {s: (lambda lo=lo, hi=hi: _texts(dataset, field, lo, hi)) for s, (lo, hi) in bounds.items()}
