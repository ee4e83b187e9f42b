"""The context mixer's step compiled (``kernel = "compiled"``): the mixture and the gradients of
:mod:`.context_mixing` in C++ (``moglm/recurrence/compiled/csrc/context_mixing.cpp``), from the tokens each
table's row has counted alone.

Where a row has not counted a token v, its estimate is the model's p(v) times a constant of the row, so its
logarithm is log p(v) plus that constant, which every weight set's normalisation removes; only the few counted
tokens need a logarithm of their own. The numpy mixer takes the logarithm of every estimate and mixes every input
in full: it is this kernel's reference twin, and the arithmetic of files of version 10 and older. Both are checked
against the plain loop at every step (tests/compression/test_compression_context_mixing.py), and against each
other on a byte-level step of many blocks (tests/compression/test_compression_compiled_mixing.py). One difference
is out of a model's reach: where a row's estimate of an uncounted token falls below 1e-300 (p(v) below about
1e-296), numpy floors it there and this kernel does not. The weights' steps and the counting are compiled too,
with the numpy mixer's arithmetic, and so are the hashing of the contexts, the choice of each weight set's row
and the moving on of every block's context (``csrc/mixer_contexts.cpp``: integer arithmetic, the same bits as the
numpy mixer's code, which the tests compare at every step). A step is then a few calls, where numpy's glue of
small arrays cost more than the kernels on a small model (docs/guides/compression.md).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from ..errors import MoglmError
from ..recurrence import compiled
from .context_mixing import (APM_EDGES, COUNT_LIMIT, MIXER_CONTEXTS, SPARSE_CONTEXTS, STEP_COUNTS, ContextMixer,
                             ContextSettings)


def kernel_available() -> bool:
    """Whether the compiled kernel can run here (it is built with the compiled recurrence, at first use)."""
    return compiled.available()


def usable(settings: ContextSettings | None) -> ContextSettings | None:
    """``settings`` as this machine can code with them: the compiled kernel where it is built, else the numpy one
    (the warning that the compiled library is unavailable says why, once)."""
    if settings is None or settings.kernel != "compiled" or kernel_available():
        return settings
    return replace(settings, kernel="numpy")


class CompiledContextMixer(ContextMixer):
    """:class:`~.context_mixing.ContextMixer` with its step's arithmetic compiled (see the module's text)."""

    def __init__(self, settings: ContextSettings, streams: int, vocab: int,
                 chars: dict[int, str] | None = None, tokens: int = 0) -> None:
        if not kernel_available():
            raise MoglmError("this file was coded with the compiled context mixer, which cannot be built here "
                             f"({compiled.unavailable_reason()}): decode it where moglm's compiled library builds")
        super().__init__(settings, streams, vocab, chars, tokens)
        tables, sets = len(self._tables), len(settings.mixers) + 1
        f64 = dict(dtype=torch.float64)
        stats = sets * (tables + 2) + len(APM_EDGES) + 1  # per block: each set's expectations, the map's bin sums
        self._work = [torch.zeros(streams, stats, **f64), torch.empty(streams, vocab, **f64),  # stats, lp
                      torch.zeros(streams, tables, dtype=torch.int32),  # counted
                      torch.empty(streams, tables, vocab, dtype=torch.int32),  # index
                      torch.empty(streams, tables, vocab, **f64),  # delta
                      torch.empty(sets, streams, vocab, **f64),  # logs
                      torch.empty(streams, vocab, **f64),  # mixed
                      torch.zeros(streams, vocab, dtype=torch.int64),  # cells
                      torch.empty(streams, vocab, **f64)]  # refined
        self._tables_t = torch.from_numpy(self._tables)  # [K, S, V] uint16, shares the numpy counts
        self._corrections_t = torch.from_numpy(self._corrections)  # shares the map's corrections
        self._sets_t = [torch.from_numpy(w) for w in [self._weights, *self._sets]]  # share the weights
        self._chosen: torch.Tensor | None = None  # [S, B]: each set's rows at the pending step
        # the contexts, updated in place by the ops (the numpy mixer reassigns them): the kinds of the last two
        # tokens, the last two tokens and the word's length share one array, each attribute a view of its row
        recent = np.stack([self._last, self._last2, self._before, self._before2, self._word_length])  # [5, B]
        self._last, self._last2, self._before, self._before2, self._word_length = recent
        self._recent_t = torch.from_numpy(recent)
        self._contexts_t = [torch.from_numpy(a.view(np.int64)) for a in (self._recent, self._word, self._above)]
        self._column_t, self._line_t = torch.from_numpy(self._column), torch.from_numpy(self._line.view(np.int64))
        self._codes = ([MIXER_CONTEXTS.index(m) for m in settings.mixers],
                       [SPARSE_CONTEXTS.index(m) for m in settings.sparse])
        self._gathered = torch.empty(sets, streams, tables + 1, **f64)  # [S, B, M]: the chosen rows of the weights
        self._lookup = [torch.from_numpy(a) for a in (self._newline, self._kinds, self._letters)]

    def _rows(self) -> np.ndarray:
        recent, word, above = self._contexts_t
        return torch.ops.moglm.context_rows(recent, word, self._column_t, above, list(self.settings.orders),
                                            self.settings.words, self._codes[1], self._bits).numpy()  # [K, B]

    def mix(self, p: np.ndarray) -> np.ndarray:
        rows = self._rows()  # [K, B]
        rows_t = torch.from_numpy(rows)
        totals = torch.ops.moglm.context_totals(self._tables_t, rows_t)  # [K, B]
        self._chosen = torch.ops.moglm.context_choose(totals, self._recent_t, self._codes[0],
                                                      [len(w) for w in self._sets], self.vocab, self._sets_t,
                                                      self._gathered)  # [S, B], and the weights' rows gathered
        torch.ops.moglm.context_mix(
            self._tables_t, rows_t, totals, torch.from_numpy(np.ascontiguousarray(p, np.float64)), self._gathered,
            torch.from_numpy(self._final), self._corrections_t, self._recent_t[2], float(self.settings.alpha),
            bool(self.settings.mixers), bool(self.settings.apm_lr), self._work)
        self._pending = (rows, None, None)
        out = self._work[8 if self.settings.apm_lr else 6]  # [B, V]: refined by the map, else mixed
        return out.numpy().copy()  # the workspace is rewritten at the next step

    def _learn(self, read: np.ndarray) -> None:
        if self._pending is None:
            return
        sets = len(self.settings.mixers) + 1
        final = torch.ops.moglm.context_learn_step(
            torch.from_numpy(np.ascontiguousarray(read, np.int64)), self._corrections_t, float(self.settings.apm_lr),
            bool(self.settings.mixers), bool(self.settings.apm_lr), sets, len(self._tables), self._work,
            self._sets_t, self._chosen, float(self.settings.lr))  # [B, S]; every set's weights stepped
        if self.settings.mixers:
            self._final += self.settings.final_lr * final.numpy().mean(axis=0)

    def _move_on(self, read: np.ndarray) -> None:
        recent, word, above = self._contexts_t
        torch.ops.moglm.context_move_on(torch.from_numpy(np.ascontiguousarray(read, np.int64)), recent,
                                        self._recent_t, self._column_t, self._line_t, above, word, *self._lookup,
                                        bool(self.settings.sparse), bool(self.settings.words))

    def _count_tables(self, read: np.ndarray, rows: np.ndarray) -> None:
        torch.ops.moglm.context_count(self._tables_t, torch.from_numpy(np.ascontiguousarray(rows)),
                                      torch.from_numpy(np.ascontiguousarray(read, np.int64)),
                                      min(self.streams, STEP_COUNTS), COUNT_LIMIT)


def context_mixer(settings: ContextSettings, streams: int, vocab: int, chars: dict[int, str] | None = None,
                  tokens: int = 0) -> ContextMixer:
    """The mixer whose arithmetic ``settings.kernel`` names."""
    kind = CompiledContextMixer if settings.kernel == "compiled" else ContextMixer
    return kind(settings, streams, vocab, chars, tokens)
