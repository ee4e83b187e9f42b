"""Polyphonic music (Krause thesis 4.8): piano rolls of the Boulanger-Lewandowski et al. (2012) corpora.

Modules: ``corpus`` (the train/valid/test songs as ``[T, 88]`` piano rolls, from JSON, a pickle read without
running code, or folders of MIDI files), ``midi`` (rolls to and from MIDI files; the ``music`` extra),
``piano_roll`` (a roll as a PNG), ``nade`` (the NADE output layer, thesis 2.6.1), ``model`` (the RNN-NADE with any
moglm stack, 2.6.2), ``config`` (a music run's typed config), ``training`` (through the one engine), ``evaluation``
(log-likelihood per frame), ``dynamic_evaluation`` (song by song, SGD or global RMS, 4.8), ``run`` (a trained run
end to end) and ``cli`` (``moglm music``).
"""

from .corpus import SPLITS, MusicCorpus, RestrictedUnpickler, read_music
from .frames import HIGHEST_PITCH, LOWEST_PITCH, PITCHES, from_roll, note_name, to_roll
from .midi import read_midi, write_midi
from .model import NadeSequenceModel
from .nade import NADE
from .piano_roll import plot_piano_roll

__all__ = [
    "HIGHEST_PITCH", "LOWEST_PITCH", "MusicCorpus", "NADE", "NadeSequenceModel", "PITCHES", "RestrictedUnpickler", "SPLITS", "from_roll",
    "note_name", "plot_piano_roll", "read_midi", "read_music", "to_roll", "write_midi",
]
