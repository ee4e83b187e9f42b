"""Polyphonic music corpora as piano rolls (Krause thesis 4.8; Boulanger-Lewandowski et al. 2012).

The format of Boulanger-Lewandowski et al. (2012), used for JSB Chorales, Nottingham, MuseData and
Piano-midi.de: a dict with keys ``train``, ``valid`` and ``test``; each value a list of songs; each song a list
of frames (one per quarter note for JSB Chorales); each frame a list or tuple of the MIDI pitches sounding,
possibly none. A song becomes a piano roll ``[T, 88]`` of 0s and 1s, column ``p - 21`` for MIDI pitch ``p``
(the piano's keys, A0 = 21 to C8 = 108).

:func:`read_music` reads that dict from JSON or from a pickle (:class:`RestrictedUnpickler`: loading data
never runs code), or reads a folder of ``train/``, ``valid/`` and ``test/`` MIDI files (:mod:`.midi`).
Every bad input is a one-line :class:`~moglm.errors.MoglmError` naming the file, split, song, frame and pitch.
"""

from __future__ import annotations

import json
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import MoglmError
from .frames import LOWEST_PITCH, song_roll

SPLITS = ("train", "valid", "test")
DATA_SUFFIXES = (".json", ".pkl", ".pickle")
MIDI_SUFFIXES = (".mid", ".midi")


# -- the restricted unpickler -----------------------------------------------------------------------
class _Dtype:
    """Stands in for ``numpy.dtype`` while unpickling: a plain integer or float type code (``i8``, ``u1``,
    ``f4``...) and its byte order, nothing else (no structured, object or string dtypes)."""

    def __init__(self, code: Any, align: Any = False, copy: Any = True) -> None:
        if not isinstance(code, str) or not re.fullmatch(r"[iuf][1248]", code):
            raise MoglmError(f"the pickle holds a numpy scalar of dtype {code!r:.20}; only integers and floats are "
                             "read")
        self.code, self.order = code, "="

    def __setstate__(self, state: Any) -> None:
        # numpy's dtype state: (version, byte order, subarray, names, fields, item size, alignment, flags[, metadata])
        if (not isinstance(state, tuple) or len(state) < 5 or state[1] not in ("<", ">", "|", "=")
                or any(s is not None for s in state[2:5])):
            raise MoglmError(f"the pickle's numpy dtype {self.code!r} has a state this reader does not accept")
        self.order = state[1]

    def numpy(self) -> np.dtype:
        dtype = np.dtype(self.code)
        return dtype.newbyteorder(self.order) if self.order in "<>" else dtype


def _scalar(dtype: Any, raw: Any = None) -> int | float:
    """Stands in for ``numpy.core.multiarray.scalar``: decodes one integer or float from its raw bytes (a
    Python 2 pickle read with ``encoding="latin1"`` gives them as a str) and returns a plain Python number."""
    if not isinstance(dtype, _Dtype):
        raise MoglmError("the pickle builds a numpy scalar from something other than a numpy dtype")
    if isinstance(raw, str):
        raw = raw.encode("latin1")
    if not isinstance(raw, bytes) or len(raw) != int(dtype.code[1]):
        raise MoglmError(f"the pickle holds a numpy {dtype.code!r} scalar whose data is not {dtype.code[1]} bytes")
    return np.frombuffer(raw, dtype=dtype.numpy())[0].item()


def _encode(text: Any, encoding: Any = "utf-8") -> bytes:
    """Stands in for ``_codecs.encode``, which Python 3 pickles of protocol 2 use to spell bytes: latin-1 only."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise MoglmError("the pickle calls _codecs.encode on something other than latin-1 text")
    return text.encode("latin1")


_SAFE_GLOBALS = {
    ("numpy.core.multiarray", "scalar"): _scalar,
    ("numpy._core.multiarray", "scalar"): _scalar,
    ("numpy", "dtype"): _Dtype,
    ("_codecs", "encode"): _encode,
}


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that builds only lists, tuples, dicts, sets, numbers, strings and bytes: loading data
    never runs code. numpy integer and float scalars (the Boulanger-Lewandowski pickles hold ``numpy.int64``
    pitches) are decoded from their bytes by replacements of this module's own and come back as Python
    numbers; numpy's functions are never called. Any other global (``os.system``, ``builtins.eval``, a class)
    is a one-line :class:`MoglmError` naming it. Read Python 2 pickles with ``encoding="latin1"``."""

    def find_class(self, module: str, name: str) -> Any:
        safe = _SAFE_GLOBALS.get((module, name))
        if safe is None:
            raise MoglmError(f"the pickle asks for {module}.{name}, refused: a music corpus holds only lists, "
                             "tuples, dicts, numbers and strings, and loading data never runs code")
        return safe

    def persistent_load(self, pid: Any) -> Any:
        raise MoglmError("the pickle refers to a persistent object, refused: a music corpus holds only lists, "
                         "tuples, dicts, numbers and strings")


# -- reading a corpus -------------------------------------------------------------------------------
@dataclass
class MusicCorpus:
    """The piano rolls of each split (``songs[split]``: a list of ``[T, 88]`` float32 tensors) and where they
    came from."""

    songs: dict[str, list[Tensor]]
    source: str

    def __getitem__(self, split: str) -> list[Tensor]:
        if split not in self.songs:
            raise MoglmError(f"split must be one of {SPLITS}, got {split!r}")
        return self.songs[split]

    def digest(self) -> str:
        """A hash of every split's piano rolls: a run records it, and later commands refuse another corpus."""
        import hashlib

        h = hashlib.sha256()
        for split in SPLITS:
            for song in self.songs.get(split, []):
                h.update(split.encode())
                h.update(song.to(torch.uint8).numpy().tobytes())
                h.update(str(tuple(song.shape)).encode())
        return h.hexdigest()[:16]

    def frames(self, split: str) -> int:
        """The number of frames (time steps) of ``split``, all songs together."""
        return sum(song.shape[0] for song in self[split])

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per split: songs, frames, mean notes per frame, and the lowest and highest MIDI pitch played
        (``None`` for a split with no notes), for logs."""
        out = {}
        for split in SPLITS:
            songs = self[split]
            used = torch.stack([song.amax(0) for song in songs]).amax(0).nonzero().flatten()  # [keys used]
            frames = self.frames(split)
            notes = sum(float(song.sum()) for song in songs)
            out[split] = {
                "songs": len(songs), "frames": frames, "notes_per_frame": notes / frames,
                "lowest": int(used[0]) + LOWEST_PITCH if len(used) else None,
                "highest": int(used[-1]) + LOWEST_PITCH if len(used) else None,
            }
        return out

    def summary(self) -> str:
        """One line for logs: songs, frames, notes per frame and pitch range of each split."""
        parts = []
        for split, s in self.stats().items():
            span = f"{s['lowest']}-{s['highest']}" if s["lowest"] is not None else "no notes"
            parts.append(f"{split} {s['songs']} songs, {s['frames']:,} frames, "
                         f"{s['notes_per_frame']:.2f} notes/frame, pitches {span}")
        return f"{self.source}: " + "; ".join(parts)


def _songs_of(data: Any, name: str) -> dict[str, list[Tensor]]:
    """Rolls of the Boulanger-Lewandowski dict ``data`` read from the file ``name``, checked throughout."""
    if not isinstance(data, dict):
        raise MoglmError(f"{name}: expected a dict with keys {', '.join(SPLITS)}, found {type(data).__name__}")
    songs = {}
    for split in SPLITS:
        if split not in data:
            keys = ", ".join(sorted(map(str, data))) or "none"
            raise MoglmError(f"{name}: no {split!r} split (its keys: {keys})")
        value = data[split]
        if not isinstance(value, (list, tuple)):
            raise MoglmError(f"{name}: the {split} split is {type(value).__name__}, not a list of songs")
        if not value:
            raise MoglmError(f"{name}: the {split} split has no songs")
        songs[split] = [song_roll(song, f"{name}: {split} song {i}") for i, song in enumerate(value)]
    return songs


def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise MoglmError(f"{path}: cannot be read ({e.strerror or e})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MoglmError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:
        raise MoglmError(f"{path}: not a music corpus (its JSON is nested too deeply to be songs of frames)") from None


def _read_pickle(path: Path) -> Any:
    try:
        with open(path, "rb") as f:
            return RestrictedUnpickler(f, encoding="latin1").load()
    except MoglmError as e:
        raise MoglmError(f"{path}: {e}") from None
    except OSError as e:
        raise MoglmError(f"{path}: cannot be read ({e.strerror or e})") from None
    except Exception as e:  # a damaged or truncated pickle: any of pickle's many error types
        message = " ".join(str(e).split())
        raise MoglmError(f"{path}: not a readable pickle ({type(e).__name__}: {message})") from None


def _read_file(path: Path) -> MusicCorpus:
    suffix = path.suffix.lower()
    if suffix == ".json":
        data = _read_json(path)
    elif suffix in (".pkl", ".pickle"):
        data = _read_pickle(path)
    else:
        raise MoglmError(f"{path}: not a music corpus (expected a .json, .pkl or .pickle file, or a folder)")
    return MusicCorpus(_songs_of(data, path.name), str(path))


def _read_midi_folder(root: Path, frames_per_beat: int) -> MusicCorpus:
    from .midi import read_midi

    songs = {}
    for split in SPLITS:
        folder = root / split
        if not folder.is_dir():
            raise MoglmError(f"{root}: no {split}/ folder (a MIDI corpus has train/, valid/ and test/ folders)")
        files = sorted(f for f in folder.iterdir() if f.is_file() and f.suffix.lower() in MIDI_SUFFIXES)
        if not files:
            raise MoglmError(f"{folder}: no .mid or .midi files")
        songs[split] = [read_midi(f, frames_per_beat=frames_per_beat) for f in files]
    return MusicCorpus(songs, str(root))


def _corpus_file(root: Path) -> Path:
    """The one corpus file in the folder ``root``; the JSON of a name that also has a pickle."""
    files = sorted(f for f in root.iterdir() if f.is_file() and f.suffix.lower() in DATA_SUFFIXES)
    if not files:
        raise MoglmError(f"{root}: no .json, .pkl or .pickle corpus file, and no train/, valid/ and test/ folders "
                         "of MIDI files")
    stems = sorted({f.stem for f in files})
    if len(stems) > 1:
        raise MoglmError(f"{root} holds several corpora ({', '.join(f.name for f in files)}): name one file")
    return next((f for f in files if f.suffix.lower() == ".json"), files[0])


def read_music(path: str | Path, *, frames_per_beat: int = 1) -> MusicCorpus:
    """A polyphonic music corpus from ``path``: a ``.json`` file, a ``.pkl``/``.pickle`` file (read by
    :class:`RestrictedUnpickler`), a folder holding one such corpus (the JSON when both forms of the same
    data are there), or a folder with ``train/``, ``valid/`` and ``test/`` folders of ``.mid``/``.midi``
    files, each read by :func:`moglm.music.midi.read_midi` at ``frames_per_beat`` frames per quarter note.
    A relative path is also looked up under ``$MOGLM_DATA``."""
    from ..data.corpus import resolve_path

    root = resolve_path(path)
    if root.is_file():
        return _read_file(root)
    if any((root / split).is_dir() for split in SPLITS):
        return _read_midi_folder(root, frames_per_beat)
    return _read_file(_corpus_file(root))
