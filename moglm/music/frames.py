"""Frames <-> piano rolls (Krause thesis 4.8): a song is a list of frames, each the MIDI pitches sounding
(21-108, the piano's keys); its roll is ``[T, 88]`` of 0s and 1s, column ``p - 21`` for pitch ``p``."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import MoglmError

LOWEST_PITCH = 21  # A0, the piano's lowest key
HIGHEST_PITCH = 108  # C8, its highest
PITCHES = 88
_NAMES = ("C", "C#", "D", "D#", "E", "F", "F#", "G", "G#", "A", "A#", "B")


def note_name(pitch: int) -> str:
    """Scientific pitch notation of a MIDI pitch: 21 -> ``A0``, 60 -> ``C4``, 108 -> ``C8``."""
    return f"{_NAMES[pitch % 12]}{pitch // 12 - 1}"


_RANGE = f"the piano's {LOWEST_PITCH}-{HIGHEST_PITCH} ({note_name(LOWEST_PITCH)}-{note_name(HIGHEST_PITCH)})"


def _is_pitch_type(p: Any) -> bool:
    return isinstance(p, (int, np.integer)) and not isinstance(p, (bool, np.bool_))


# -- frames <-> piano rolls -------------------------------------------------------------------------
def song_roll(frames: Any, where: str) -> Tensor:
    """The roll ``[T, 88]`` of one song (a list of frames); errors start with ``where`` (file, split, song)."""
    if not isinstance(frames, (list, tuple)):
        raise MoglmError(f"{where} is {type(frames).__name__}, not a list of frames")
    if not frames:
        raise MoglmError(f"{where} has no frames")
    roll = np.zeros((len(frames), PITCHES), dtype=np.float32)  # [T, 88]
    for t, frame in enumerate(frames):
        if not isinstance(frame, (list, tuple)):
            raise MoglmError(f"{where}, frame {t} is {frame!r:.40}, not a list of pitches")
        for p in frame:
            if not _is_pitch_type(p):
                raise MoglmError(f"{where}, frame {t} has pitch {p!r:.40}, not an integer MIDI pitch")
            if not LOWEST_PITCH <= p <= HIGHEST_PITCH:
                raise MoglmError(f"{where}, frame {t} has pitch {int(p)}, outside {_RANGE}")
            roll[t, p - LOWEST_PITCH] = 1.0
    return torch.from_numpy(roll)


def to_roll(frames: Any) -> Tensor:
    """A song (a list of frames, each a list of MIDI pitches 21-108) as a piano roll ``[T, 88]`` float32 of
    0s and 1s, column ``p - 21`` for pitch ``p``."""
    return song_roll(frames, "the song")


def check_roll(roll: Any, what: str = "roll") -> Tensor:
    """``roll`` as a ``[T, 88]`` float32 tensor of 0s and 1s (T >= 1), else a one-line error."""
    roll = torch.as_tensor(roll) if not isinstance(roll, Tensor) else roll
    if roll.dim() != 2 or roll.shape[1] != PITCHES:
        raise MoglmError(f"{what} must be [T, {PITCHES}] (one column per piano key), got {list(roll.shape)}")
    if roll.shape[0] == 0:
        raise MoglmError(f"{what} has no frames")
    roll = roll.detach().cpu().float()
    if not bool(((roll == 0) | (roll == 1)).all()):
        raise MoglmError(f"{what} must hold only 0s and 1s")
    return roll


def from_roll(roll: Tensor) -> list[tuple[int, ...]]:
    """The frames of a piano roll ``[T, 88]``: for each frame, the MIDI pitches sounding, lowest first."""
    roll = check_roll(roll)
    return [tuple(int(k) + LOWEST_PITCH for k in row.nonzero().flatten()) for row in roll]
