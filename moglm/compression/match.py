"""The match model: what followed the last time the recent tokens occurred, anywhere in the file read so far,
predicted beside the language model while coding (the match model of the PAQ compressors).

In words: each block (stream) keeps a pointer to an earlier position, in any block, whose preceding
``min_length`` tokens equal its own last ones, and predicts the token found there. While the prediction comes
true the pointer moves on with it and the match grows; when it fails the pointer is dropped, and a new one is
looked up in a hash table of every position read so far (all blocks; the most recent occurrence of a context
wins). The blocks are read in step, so at step t every block's tokens before t are known to the decoder too:
a pointer only ever names a token read at an earlier step.

The predicted token e gets the probability ``p_hit`` learnt from how often such predictions came true, counted
per (match length, the distribution's own probability of e) bin, shared by all blocks; the other tokens keep
their proportions and share ``1 - p_hit``. It is an adaptive probability map (an APM, as in PAQ) on top of the
model and the neural cache: the neural cache (:class:`~moglm.evaluation.neural_cache.StepCache`) finds
positions whose features look alike within a block's last 2,000, this finds exact repeats across the whole
file, which the blocks cut apart. Everything is float64 numpy arithmetic in a fixed order, the same on both
sides. :class:`CompiledMatchModel` runs the same step in C++ (``moglm/recurrence/compiled/csrc/match.cpp``) with
the same bits, so a file does not say which of the two coded it; :class:`MatchModel` is its reference twin.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import MoglmError
from ..recurrence import compiled
from .hashing import PRIME, table_slots

#: lower edges of the match-length bins (tokens matched before the predicted one)
LENGTH_EDGES = np.array([0, 8, 12, 16, 24, 32])
#: lower edges of the bins of the distribution's own probability of the predicted token
PROBABILITY_EDGES = np.array([0.0, 1e-3, 1e-2, 0.05, 0.2, 0.5, 0.8, 0.95])
LONGEST = 32  # tokens a new match's length is counted back to
P_HIT_RANGE = (1e-4, 1 - 1e-4)  # p_hit is kept inside this, so no token's probability becomes 0 or 1
MIN_LENGTH_RANGE = (2, 32)


@dataclass(frozen=True)
class MatchSettings:
    """``min_length``: how many tokens of context a match starts from (searched on chapters 6-8 of the Vim
    user manual: docs/guides/compression.md)."""

    min_length: int = 5

    def __post_init__(self) -> None:
        low, high = MIN_LENGTH_RANGE
        if isinstance(self.min_length, bool) or not isinstance(self.min_length, int) \
                or not low <= self.min_length <= high:
            raise MoglmError(f"a match model's min_length must be an integer from {low} to {high}, "
                             f"not {self.min_length!r}")


def table_bits(streams: int) -> int:
    """log2 of the hash table's slots for ``streams`` blocks: about twice the positions of blocks of 4 KB,
    at most 2^22 (32 MB); both sides compute it from the header's block count."""
    return int(min(22, np.ceil(np.log2(max(streams, 1) * 8192))))


class MatchModel:
    """The match model of ``streams`` blocks read side by side: :meth:`mix` a step's distributions, then
    :meth:`append` the tokens that were read."""

    def __init__(self, settings: MatchSettings, streams: int) -> None:
        self.settings, self.streams = settings, streams
        self._history = np.zeros((streams, 1024), dtype=np.int32)  # [B, capacity]: the tokens read (4 bytes each)
        self._length = 0  # tokens read per block
        self._bits = table_bits(streams)
        self._table = np.zeros(1 << self._bits, dtype=np.int64)  # slot -> 1 + block * 2^40 + position; 0: empty
        self._source = np.full(streams, -1, dtype=np.int64)  # [B]: the block a pointer names (-1: none)
        self._position = np.zeros(streams, dtype=np.int64)  # [B]: the position of the predicted token there
        self._matched = np.zeros(streams, dtype=np.int64)  # [B]: tokens matched so far
        shape = (len(LENGTH_EDGES), len(PROBABILITY_EDGES))
        self._hits, self._trials = np.full(shape, 0.5), np.ones(shape)  # per bin: predictions that came true, all
        self._pending: tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]] | None = None

    def predicted(self) -> tuple[np.ndarray, np.ndarray]:
        """The blocks with a match now (``[A]``) and the token each predicts (``[A]``)."""
        rows = np.flatnonzero(self._source >= 0)  # [A]
        return rows, self._history[self._source[rows], self._position[rows]]

    def mix(self, p: np.ndarray) -> np.ndarray:
        """``[B, V]``: the distributions ``p`` (each row normalised here) with every matched block's predicted
        token at its learnt ``p_hit`` and the rest scaled to ``1 - p_hit``."""
        p = np.asarray(p, dtype=np.float64)
        p = p / p.sum(axis=1, keepdims=True)  # [B, V]
        rows, tokens = self.predicted()  # [A], [A]
        if not len(rows):
            self._pending = None
            return p
        own = p[rows, tokens]  # [A]
        bins = (np.searchsorted(LENGTH_EDGES, self._matched[rows], side="right") - 1,
                np.searchsorted(PROBABILITY_EDGES, own, side="right") - 1)
        hit = np.clip(self._hits[bins] / self._trials[bins], *P_HIT_RANGE)  # [A]
        scale = (1.0 - hit) / np.maximum(1.0 - own, 1e-12)  # [A]
        p[rows] *= scale[:, None]
        p[rows, tokens] = hit
        self._pending = (rows, tokens, bins)
        return p

    def append(self, tokens) -> None:
        """Read ``tokens`` (``[B]``, one per block): learn how the last predictions fared, move the matches that
        held on and drop the others, remember the contexts that just gained their next token, and look up a new
        match for every block without one."""
        read = np.asarray(tokens, dtype=np.int32)  # [B]
        if self._pending is not None:
            rows, predicted, bins = self._pending
            np.add.at(self._trials, bins, 1.0)
            np.add.at(self._hits, bins, (read[rows] == predicted).astype(np.float64))
            self._pending = None
        i = self._length
        if i == self._history.shape[1]:
            self._history = np.concatenate([self._history, np.zeros_like(self._history)], axis=1)
        self._history[:, i] = read
        self._length = i + 1
        rows = np.flatnonzero(self._source >= 0)  # [A]: the matches that predicted this token
        held = self._history[self._source[rows], self._position[rows]] == read[rows]  # [A]
        self._position[rows[held]] += 1
        self._matched[rows[held]] += 1
        self._source[rows[~held]] = -1
        self._matched[rows[~held]] = 0
        n = self.settings.min_length
        if i >= n:  # every block's context ending at i - 1 is now followed by its token i
            slots = self._slots(self._history[:, i - n : i])  # [B]
            unique, last = np.unique(slots[::-1], return_index=True)  # a slot two blocks share: the last block's
            self._table[unique] = 1 + ((self.streams - 1 - last) << 40) + i
        if i + 1 >= n:
            self._look_up(i)

    def _slots(self, contexts: np.ndarray) -> np.ndarray:
        """``[R]`` table slots of ``contexts`` ``[R, n]`` (a polynomial of the tokens, then multiplicative
        hashing; collisions are caught by :meth:`_look_up` comparing the tokens)."""
        key = np.zeros(len(contexts), dtype=np.uint64)
        for j in range(contexts.shape[1]):
            key = key * PRIME + contexts[:, j].astype(np.uint64)
        return table_slots(key, self._bits)

    def _look_up(self, i: int) -> None:
        """A new match for every block without one, from its context ending at ``i`` (the token just read)."""
        n = self.settings.min_length
        free = np.flatnonzero(self._source < 0)  # [F]
        if not len(free):
            return
        entries = self._table[self._slots(self._history[free, i + 1 - n : i + 1])]  # [F]
        found = entries > 0
        free, entries = free[found], entries[found] - 1
        source, position = entries >> 40, entries & ((1 << 40) - 1)  # [F'], [F']: the token after the context
        back = np.arange(LONGEST)  # [S]: tokens back from the end of each context
        theirs_at = position[:, None] - 1 - back  # [F', S]
        valid = (theirs_at >= 0) & (i - back >= 0)  # [F', S]
        mine = self._history[free[:, None], np.maximum(i - back, 0)[None, :]]  # [F', S]
        theirs = self._history[source[:, None], np.maximum(theirs_at, 0)]  # [F', S]
        same = (mine == theirs) & valid  # [F', S]: true up to the first difference or the start of a block
        real = (position >= n) & same[:, :n].all(axis=1)  # [F']: not a hash collision
        free, source, position, same = free[real], source[real], position[real], same[real]
        self._source[free], self._position[free] = source, position
        self._matched[free] = np.where(same.all(axis=1), LONGEST, np.argmin(same, axis=1))


class CompiledMatchModel(MatchModel):
    """:class:`MatchModel` with its step in C++ (the same bits: its numpy state is shared with the ops, and the
    rows' normalisation stays numpy's); the per-step numpy calls of the twin cost more than its arithmetic."""

    def __init__(self, settings: MatchSettings, streams: int) -> None:
        if not kernel_available():  # builds or loads the library, whose ops these are
            raise MoglmError(f"the compiled match model cannot be built here ({compiled.unavailable_reason()})")
        super().__init__(settings, streams)
        self._predictions = np.full((streams, 3), -1, dtype=np.int64)  # [B, 3]: predicted token (-1: none), bins
        self._share()

    def _share(self) -> None:
        self._state = [torch.from_numpy(a) for a in (self._history, self._source, self._position, self._matched,
                                                     self._hits, self._trials, self._predictions)]
        self._table_t = torch.from_numpy(self._table)

    def mix(self, p: np.ndarray) -> np.ndarray:
        p = np.asarray(p, dtype=np.float64)
        p = np.ascontiguousarray(p / p.sum(axis=1, keepdims=True))  # [B, V]: written in place below
        torch.ops.moglm.match_mix(torch.from_numpy(p), *self._state)
        return p

    def append(self, tokens) -> None:
        read = np.ascontiguousarray(tokens, dtype=np.int64)  # [B]
        i = self._length
        if i == self._history.shape[1]:
            self._history = np.concatenate([self._history, np.zeros_like(self._history)], axis=1)
            self._share()
        history, *rest = self._state
        torch.ops.moglm.match_append(torch.from_numpy(read), history, i, self._table_t, *rest,
                                     self.settings.min_length, self._bits)
        self._length = i + 1


def kernel_available() -> bool:
    """Whether the compiled step can run here (it is built with the compiled recurrence, at first use)."""
    return compiled.available()


def match_model(settings: MatchSettings, streams: int) -> MatchModel:
    """The compiled match model where moglm's compiled library is built, else its numpy twin (the same bits)."""
    return (CompiledMatchModel if kernel_available() else MatchModel)(settings, streams)
