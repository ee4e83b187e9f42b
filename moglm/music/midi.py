"""Piano rolls to and from MIDI files, through ``pretty_midi`` (the ``music`` extra; thesis 4.8 reads
Boulanger-Lewandowski et al.'s piano rolls, this module lets a user bring their own music and listen to samples).

:func:`write_midi` writes a roll ``[T, 88]`` as one piano track at one quarter note per frame: a pitch that
sounds over consecutive frames is one held note, and a text event at ``T`` quarter notes marks the end of the
roll, so that trailing silent frames survive. :func:`read_midi` samples a file on a grid of ``frames_per_beat``
frames per quarter note, counted in the file's ticks (so it follows the tempo map): a frame holds the pitches
sounding an eighth of a frame after its start (a note struck a little late still counts from its beat), and the
roll ends with the last frame that starts before the file's last event. A roll written by :func:`write_midi`
reads back exactly (``frames_per_beat=1``), whatever ``seconds_per_frame``, unless it is silent throughout.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..atomic import atomic_write
from ..errors import MoglmError
from .frames import HIGHEST_PITCH, LOWEST_PITCH, PITCHES, _RANGE, check_roll

RESOLUTION = 480  # ticks per quarter note in written files
END_MARKER = "moglm: end of roll"
_TOLERANCE = 1 / 8  # a frame is sampled this far into it


def _pretty_midi():
    try:
        import pretty_midi
    except ImportError:
        raise MoglmError("MIDI files need the music extra: pip install 'moglm[music]'") from None
    return pretty_midi


def write_midi(roll: Tensor, path: str | Path, *, seconds_per_frame: float = 0.5, program: int = 0,
               velocity: int = 80) -> Path:
    """Write the piano roll ``roll`` ``[T, 88]`` to the MIDI file ``path`` (atomically): one track of General
    MIDI ``program`` (0: acoustic grand piano), one quarter note per frame at ``seconds_per_frame`` seconds
    (tempo ``60 / seconds_per_frame`` beats per minute), each run of consecutive 1s of a pitch one held note
    of ``velocity``, and a text event at the end of frame ``T``."""
    pretty_midi = _pretty_midi()
    roll = check_roll(roll)  # [T, 88]
    if not (isinstance(seconds_per_frame, (int, float)) and math.isfinite(seconds_per_frame)
            and seconds_per_frame > 0):
        raise MoglmError(f"seconds_per_frame must be a positive number, got {seconds_per_frame!r}")
    if not (isinstance(program, int) and 0 <= program <= 127):
        raise MoglmError(f"program must be a General MIDI program 0-127, got {program!r}")
    if not (isinstance(velocity, int) and 1 <= velocity <= 127):
        raise MoglmError(f"velocity must be 1-127, got {velocity!r}")
    midi = pretty_midi.PrettyMIDI(resolution=RESOLUTION, initial_tempo=60.0 / seconds_per_frame)
    piano = pretty_midi.Instrument(program=program)
    on = roll.numpy().astype(np.int8)  # [T, 88]
    edges = np.diff(np.pad(on, ((1, 1), (0, 0))), axis=0)  # [T + 1, 88]: +1 where a run starts, -1 after it ends
    for key in range(PITCHES):
        starts, ends = np.flatnonzero(edges[:, key] == 1), np.flatnonzero(edges[:, key] == -1)
        for a, b in zip(starts, ends):
            piano.notes.append(pretty_midi.Note(velocity=velocity, pitch=key + LOWEST_PITCH,
                                                start=a * seconds_per_frame, end=b * seconds_per_frame))
    piano.notes.sort(key=lambda n: (n.start, n.pitch))
    midi.instruments.append(piano)
    midi.text_events.append(pretty_midi.Text(END_MARKER, roll.shape[0] * seconds_per_frame))
    return atomic_write(Path(path), lambda tmp: midi.write(str(tmp)))


def read_midi(path: str | Path, *, frames_per_beat: int = 1, clip: bool = False) -> Tensor:
    """The piano roll ``[T, 88]`` float32 of the MIDI file ``path``: ``frames_per_beat`` frames per quarter
    note (by the file's tempo map), drum tracks left out. A note outside the piano's 21-108 is an error, or
    with ``clip`` is dropped; a file with no notes is an error."""
    pretty_midi = _pretty_midi()
    if not (isinstance(frames_per_beat, int) and not isinstance(frames_per_beat, bool) and frames_per_beat >= 1):
        raise MoglmError(f"frames_per_beat must be a positive integer, got {frames_per_beat!r}")
    path = Path(path)
    if not path.is_file():
        raise MoglmError(f"{path}: no such file")
    try:
        midi = pretty_midi.PrettyMIDI(str(path))
    except Exception as e:  # mido and pretty_midi raise many types for a damaged file
        message = " ".join(str(e).split())
        raise MoglmError(f"{path}: not a readable MIDI file ({type(e).__name__}: {message})") from None
    notes = [n for inst in midi.instruments if not inst.is_drum for n in inst.notes]
    outside = [n for n in notes if not LOWEST_PITCH <= n.pitch <= HIGHEST_PITCH]
    if outside and not clip:
        n = min(outside, key=lambda n: n.start)
        raise MoglmError(f"{path}: a note of pitch {n.pitch} at {n.start:.2f} s is outside {_RANGE} "
                         "(clip=True drops such notes)")
    notes = [n for n in notes if LOWEST_PITCH <= n.pitch <= HIGHEST_PITCH and n.end > n.start]
    if not notes:
        raise MoglmError(f"{path}: no notes" + (" on the piano's keys" if outside else "")
                         + " (drum tracks are left out)")
    step = midi.resolution / frames_per_beat  # ticks per frame
    end = midi.time_to_tick(midi.get_end_time())
    frames = max(math.ceil(end / step - _TOLERANCE), 1)
    samples = (np.arange(frames) + _TOLERANCE) * step  # [T]: the tick each frame is sampled at
    roll = np.zeros((frames, PITCHES), dtype=np.float32)  # [T, 88]
    for n in notes:
        first, last = np.searchsorted(samples, [midi.time_to_tick(n.start), midi.time_to_tick(n.end)], side="left")
        roll[first:last, n.pitch - LOWEST_PITCH] = 1.0
    return torch.from_numpy(roll)
