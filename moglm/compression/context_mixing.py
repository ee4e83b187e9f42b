"""Context mixing: adaptive order-k statistics of the file read so far, mixed with the model's distribution while
coding (the context models and the mixer of the PAQ compressors, with geometric mixing of whole distributions).

In words: for each order k (say 1 to 4), a table counts which token followed each context of k tokens, in every
block read so far (the blocks share the tables; a context is hashed to one of the table's rows). Before a step,
every block's own last k tokens name a row, whose counts n (N in all) give the estimate

    q_k(v) = (n(v) + alpha p(v)) / (N + alpha),

the counts smoothed towards p, the model's distribution (after the neural cache): with no counts q_k is p, with
many it is the file's own statistics. Word contexts (PAQ's word model) count the same way what followed the
letters of the current word so far (case folded), and those together with the previous word's; sparse contexts
(PAQ's sparse and column models) count what followed the token above (at the same column of the line before) with
the column, the two tokens above with the token just read, and the second and third tokens back. The mixer
combines p and the q_k geometrically,

    log p_mix(v) = sum_j w_j log q_j(v) - log Z,

with weights w learnt online, by a gradient step on each coded token's code length (lr times
``log q_j(y) - E_{p_mix}[log q_j]``), one set of weights per mixer context: the last table (orders, then
words) whose row has counts, how many (4 bins), and the kind of the token just read (a letter, a space, a line
break, a digit or anything else). With ``mixers`` (PAQ's mixer of several weight sets and a second layer), further
sets of weights, each chosen by its own context (the token just read; the last two tokens; the count bin and the
kinds of the last two tokens; the length of the current word), mix the same inputs, each learning on its own code
length, and a second layer mixes their normalised outputs geometrically with weights learnt on the final code
length (step ``final_lr``); there, the blocks that share a row of weights (all of them, in the second layer) step
it by the mean of their gradients, so that a file of many blocks learns at the rate of one of few. Last, an
adaptive probability map (PAQ's APM, or SSE) refines the mixture: for the token before and the bin of each token's
log-probability (12 bins over -12 to 0 nats), a learnt correction is added to the log-probability, and the
corrections take a gradient step on each coded token's code length.

A language model trained on other text is sure of the wrong things; the counts learn the file's own spelling
and vocabulary within a few repeats, and the weights learn when to trust them. Everything is float64 numpy
arithmetic in a fixed order, the same on both sides; the blocks advance in step, so the tables hold only tokens
read at earlier steps, which the decoder knows too.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import numpy as np

from ..errors import MoglmError
from .hashing import PRIME, table_slots

MAX_ORDER = 16
MAX_ORDERS = 8
MAX_WORDS = 2  # word contexts: the current word, then it and the previous one
#: the most counts a table holds (2^24 cells of 2 bytes, 32 MB a table): a vocabulary of 256 gets 2^16 rows
TABLE_CELLS = 1 << 24
TABLE_BITS_RANGE = (8, 16)
COUNT_BINS = 4  # bins of the top row's count in the mixer's context: log2(N + 1) / 1.5, capped
KINDS = 5  # kinds of the last token in the mixer's context: a letter, a space, a line break, a digit, other
COUNT_LIMIT = np.iinfo(np.uint16).max  # a row whose count could pass this is halved first
STEP_COUNTS = COUNT_LIMIT // 2  # the most one cell gains in a step (more than 32,767 blocks: capped there)
TINY = 1e-300  # probabilities are floored here before their logarithm
#: the edges of the adaptive probability map's bins of log-probability (nats): 12 bins, the outer ones open. They
#: are the integers -11 .. -1, so a log-probability's bin (how many edges lie below it) is its ceiling + 11.
APM_EDGES = np.linspace(-12.0, 0.0, 13)[1:-1]
#: the contexts that may choose a further set of the mixer's weights (``mixers``): the token just read, the last
#: two tokens, the top table's count bin with the kinds of the last two tokens, the current word's length so far
#: with the last token's kind
MIXER_CONTEXTS = ("token", "order2", "kinds", "word")
#: the most rows of the ``order2`` weights: a larger vocabulary's pairs are folded into them (a byte-level run's
#: 257^2 pairs just pass it, and those after byte 255 or at a block's start share the first 513 rows)
ORDER2_ROWS = 1 << 16
MAX_WORD_LENGTH = 15  # the ``word`` weights' lengths, the longer ones counted as this
#: contexts other than the last k tokens that may have tables of their own (``sparse``; PAQ's sparse and column
#: contexts): the token above (at the same column of the line before) with the column; the two tokens above (at the
#: column and the next) with the token just read; the second and third tokens back, skipping the last
SPARSE_CONTEXTS = ("above", "above_pair", "skip")
#: the arithmetic of a step: ``numpy`` (this module: the logarithm of every estimate, the mixer's reference twin, and
#: the only one of files of version 10 and older) or ``compiled`` (:mod:`.compiled_mixing`: the same mixture
#: computed in C++ from the counted tokens alone; it rounds differently, so a file decodes with the one it names)
KERNELS = ("numpy", "compiled")
LINE_WIDTH = 256  # the columns of a line that the ``above`` contexts remember (further ones have nothing above)


@dataclass(frozen=True)
class ContextSettings:
    """``orders``: the context lengths counted, increasing; ``words``: how many word contexts (0; 1: the current
    word's letters so far; 2: also with the previous word); ``alpha``: how many counts the model's distribution is
    worth in each estimate; ``lr``: the mixer's step; ``apm_lr``: the adaptive probability map's step (0: no map);
    ``mixers``: the contexts of further weight sets, from :data:`MIXER_CONTEXTS` (none: one set, no second layer);
    ``final_lr``: the second layer's step; ``sparse``: further tables, counted after the orders' and the words',
    for the contexts of :data:`SPARSE_CONTEXTS` named; ``kernel``: the arithmetic, from :data:`KERNELS`. Searched
    on chapters 6-8 of the Vim user manual (docs/guides/compression.md)."""

    orders: tuple[int, ...] = (1, 2, 3, 4, 6)
    words: int = 2
    alpha: float = 0.25
    lr: float = 1e-3
    apm_lr: float = 0.02
    mixers: tuple[str, ...] = ()
    final_lr: float = 5e-3
    sparse: tuple[str, ...] = ()
    kernel: str = "numpy"

    def __post_init__(self) -> None:
        orders = self.orders
        if not isinstance(orders, (list, tuple)) or not 1 <= len(orders) <= MAX_ORDERS \
                or any(isinstance(k, bool) or not isinstance(k, int) for k in orders) \
                or list(orders) != sorted(set(orders)) or not 1 <= orders[0] <= orders[-1] <= MAX_ORDER:
            raise MoglmError(f"context orders must be 1 to {MAX_ORDERS} increasing integers from 1 to {MAX_ORDER}, "
                             f"not {orders!r}")
        object.__setattr__(self, "orders", tuple(orders))
        if isinstance(self.words, bool) or not isinstance(self.words, int) or not 0 <= self.words <= MAX_WORDS:
            raise MoglmError(f"a context mixer's words must be an integer from 0 to {MAX_WORDS}, not {self.words!r}")
        for field, allowed in (("mixers", MIXER_CONTEXTS), ("sparse", SPARSE_CONTEXTS)):
            names = getattr(self, field)
            if not isinstance(names, (list, tuple)) or any(not isinstance(m, str) or m not in allowed for m in names) \
                    or len(set(names)) != len(names):
                raise MoglmError(f"a context mixer's {field} must be distinct names from {', '.join(allowed)}, "
                                 f"not {names!r}")
            object.__setattr__(self, field, tuple(names))
        if self.kernel not in KERNELS:
            raise MoglmError(f"a context mixer's kernel must be one of {', '.join(KERNELS)}, not {self.kernel!r}")
        for name, value, high in (("alpha", self.alpha, 1e6), ("lr", self.lr, 1.0), ("apm_lr", self.apm_lr, 1.0),
                                  ("final_lr", self.final_lr, 1.0)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= high \
                    or (name == "alpha" and value == 0):
                raise MoglmError(f"a context mixer's {name} must be a number in {'(0' if name == 'alpha' else '[0'}, "
                                 f"{high:g}], not {value!r}")


def table_bits(vocab: int) -> int:
    """log2 of each order's rows for a vocabulary of ``vocab`` tokens: as many as :data:`TABLE_CELLS` allow,
    within :data:`TABLE_BITS_RANGE`; both sides compute it from the run's vocabulary."""
    low, high = TABLE_BITS_RANGE
    return int(min(high, max(low, math.floor(math.log2(TABLE_CELLS / max(vocab, 1))))))


def letters(chars: dict[int, str], vocab: int) -> np.ndarray:
    """``[V]``: each token's letter as the word contexts read it (the id of its lower case where the vocabulary
    has one, else its own id), -1 for a token that is not a letter (``chars``: token id -> character)."""
    ids = {c: i for i, c in chars.items()}
    out = np.full(vocab, -1, dtype=np.int64)
    for i, c in chars.items():
        if 0 <= i < vocab and c.isalpha():
            out[i] = ids.get(c.lower(), i)
    return out


def kinds(chars: dict[int, str], vocab: int) -> np.ndarray:
    """``[V]``: each token's kind in the mixer's context: 0 a letter, 1 a space, 2 a line break, 3 a digit, 4
    anything else (a token with no character too)."""
    out = np.full(vocab, KINDS - 1, dtype=np.int64)
    for i, c in chars.items():
        if 0 <= i < vocab:
            out[i] = 0 if c.isalpha() else 1 if c == " " else 2 if c in "\r\n" else 3 if c.isdigit() else KINDS - 1
    return out


def map_bins(log_p: np.ndarray) -> np.ndarray:
    """The adaptive probability map's bin of each log-probability: how many of :data:`APM_EDGES` lie below it
    (``np.searchsorted(APM_EDGES, log_p)``), computed from its ceiling as the edges are consecutive integers."""
    return (np.clip(np.ceil(log_p), APM_EDGES[0], APM_EDGES[-1] + 1) - APM_EDGES[0]).astype(np.int64)


def zeroed(shape: tuple[int, ...], dtype, populate: bool) -> np.ndarray:
    """Zeros; with ``populate``, their memory mapped at once where the OS can (Linux's ``MAP_POPULATE``). The
    tables' rows are touched at random, one page fault per new page otherwise: on a 100 KB file that took 0.45 s,
    where mapping the 320 MB of a byte-level run's tables at once takes 0.13 s (docs/guides/compression.md)."""
    flag = getattr(mmap, "MAP_POPULATE", None)
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if populate and flag is not None and size:
        try:
            return np.frombuffer(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | flag),
                                 dtype).reshape(shape)
        except (OSError, ValueError):
            pass
    return np.zeros(shape, dtype)


class ContextMixer:
    """The context models and mixer of ``streams`` blocks read side by side over a vocabulary of ``vocab``:
    :meth:`mix` a step's distributions, then :meth:`append` the tokens that were read. ``chars``: each token's
    character (token id -> character; the word contexts' letters and the mixer's kinds of token are read from it,
    and a token without one is neither a letter nor a space); ``tokens``: about how many tokens all the blocks
    hold (from a sixteenth of a table's rows, the tables' memory is mapped at once: :func:`zeroed`)."""

    def __init__(self, settings: ContextSettings, streams: int, vocab: int,
                 chars: dict[int, str] | None = None, tokens: int = 0) -> None:
        self.settings, self.streams, self.vocab = settings, streams, vocab
        self._letters, self._kinds = letters(chars or {}, vocab), kinds(chars or {}, vocab)  # [V], [V]
        self._last = np.full(streams, KINDS - 1, dtype=np.int64)  # [B]: the kind of each block's last token
        self._bits = table_bits(vocab)
        orders = settings.orders
        tables = len(orders) + settings.words + len(settings.sparse)
        self._tables = zeroed((tables, 1 << self._bits, vocab), np.uint16,
                              tokens >= (1 << self._bits) // 16)  # [K, S, V]: the counts
        history = max(orders[-1], 3 if "skip" in settings.sparse else 1)  # the skip context reads 3 tokens back
        self._recent = np.zeros((streams, history), dtype=np.uint64)  # [B, k]: token + 1; 0 before the start
        self._newline = np.array([(chars or {}).get(i) == "\n" for i in range(vocab)])  # [V]: tokens ending a line
        self._column = np.zeros(streams, dtype=np.int64)  # [B]: each block's column in its line
        self._line = np.zeros((streams, LINE_WIDTH + 1), dtype=np.uint64)  # [B, W+1]: this line's token + 1 by column
        self._above = np.zeros((streams, LINE_WIDTH + 1), dtype=np.uint64)  # [B, W+1]: the line before's (0: none)
        self._word = np.zeros((streams, 2), dtype=np.uint64)  # [B, 2]: hashes of the current and the previous word
        inputs = tables + 1  # the model's distribution, then one estimate per table
        self._weights = np.full((inputs * COUNT_BINS * KINDS, inputs), 1.0 / inputs)  # [C, M]
        self._pending: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._log_q = np.zeros((inputs, streams, vocab))  # [M, B, V]: one step's log-estimates, reused
        self._before = np.full(streams, vocab, dtype=np.int64)  # [B]: each block's last token (vocab: none yet)
        self._corrections = np.zeros(((vocab + 1) * (len(APM_EDGES) + 1)))  # the map's, per (token before, bin)
        self._refined: tuple[np.ndarray, np.ndarray] | None = None
        sizes = {"token": vocab + 1, "order2": min((vocab + 1) ** 2, ORDER2_ROWS),
                 "kinds": COUNT_BINS * KINDS * KINDS, "word": (MAX_WORD_LENGTH + 1) * KINDS}
        self._sets = [np.full((sizes[m], inputs), 1.0 / inputs) for m in settings.mixers]  # each [C_s, M]
        sets = len(settings.mixers) + 1
        self._final = np.full(sets, 1.0 / sets)  # [S]: the second layer's weights
        self._log_sets = np.zeros((sets, streams, vocab)) if settings.mixers else None  # [S, B, V]: reused
        self._before2 = np.full(streams, vocab, dtype=np.int64)  # [B]: each block's token before the last
        self._last2 = np.full(streams, KINDS - 1, dtype=np.int64)  # [B]: its kind
        self._word_length = np.zeros(streams, dtype=np.int64)  # [B]: letters in the current word so far
        self._set_rows: list[np.ndarray] = []  # each set's rows ([B]) at the pending step

    def _rows(self) -> np.ndarray:
        """``[K, B]``: each table's row for every block's context: its last k tokens (a polynomial from the most
        recent back) hashed with k, then its current word, then that and the previous word."""
        keys, suffix = [], np.zeros(self.streams, dtype=np.uint64)  # [B]: the hash of the last j tokens
        for j in range(1, self.settings.orders[-1] + 1):
            suffix = suffix * PRIME + self._recent[:, -j]
            if j in self.settings.orders:
                keys.append(suffix * PRIME + np.uint64(j))
        current, previous = self._word[:, 0], self._word[:, 1]  # [B], [B]
        keys += [current * PRIME + np.uint64(MAX_ORDER + 1),
                 (current * PRIME + previous) * PRIME + np.uint64(MAX_ORDER + 2)][: self.settings.words]
        if self.settings.sparse:
            blocks, column = np.arange(self.streams), np.minimum(self._column, LINE_WIDTH)  # [B], [B]
            above = self._above[blocks, column]  # [B]: token + 1 above (the last entry is always 0)
            for name in self.settings.sparse:
                tag = np.uint64(MAX_ORDER + 3 + SPARSE_CONTEXTS.index(name))
                if name == "above":
                    key = above * PRIME + column.astype(np.uint64)
                elif name == "above_pair":
                    next_above = self._above[blocks, np.minimum(column + 1, LINE_WIDTH)]  # [B]
                    key = (above * PRIME + next_above) * PRIME + self._recent[:, -1]
                else:  # skip: the second and third tokens back
                    key = self._recent[:, -2] * PRIME + self._recent[:, -3]
                keys.append(key * PRIME + tag)
        return table_slots(np.stack(keys), self._bits)

    def mix(self, p: np.ndarray) -> np.ndarray:
        """``[B, V]``: the distributions ``p`` (each row normalised here) mixed with the context models'."""
        p = p / p.sum(axis=1, keepdims=True)  # [B, V]
        alpha = self.settings.alpha
        rows = self._rows()  # [K, B]
        tables = len(rows)
        log_q = self._log_q  # [M, B, V]: the model's distribution, then each table's estimate (logarithms below)
        n = log_q[1:]  # [K, B, V]: written in place, as no fresh array is, to spare the page faults of one per step
        n[...] = self._tables[np.arange(tables)[:, None], rows]
        totals = n.sum(axis=2)  # [K, B]
        n += alpha * p
        n /= totals[:, :, None] + alpha  # the estimates (n + alpha p) / (N + alpha)
        log_q[0] = p
        np.log(np.maximum(log_q, TINY, out=log_q), out=log_q)
        chosen = self._chosen_rows(totals)
        if self.settings.mixers:
            mixed = self._second_layer(chosen)
        else:
            log_mixed = np.einsum("bm,mbv->bv", self._weights[chosen[0]], log_q)  # [B, V]
            mixed = np.exp(log_mixed - log_mixed.max(axis=1, keepdims=True))  # [B, V]
            mixed /= mixed.sum(axis=1, keepdims=True)
        self._pending = (rows, chosen[0], mixed)
        return mixed if not self.settings.apm_lr else self._refine(mixed)

    def _chosen_rows(self, totals: np.ndarray) -> list[np.ndarray]:
        """``[B]`` per weight set: the row of its weights that each block's context chooses (``totals``: each
        table's count in each block's row, ``[K, B]``): the first set's by the top counted table, its count bin and
        the last token's kind, then each further set's (:meth:`_set_contexts`)."""
        tables = len(totals)
        counted = totals > 0  # [K, B]
        top = np.where(counted.any(axis=0), tables - np.argmax(counted[::-1], axis=0), 0)  # [B]: 0 = none
        top_total = np.where(top > 0, totals[np.maximum(top - 1, 0), np.arange(self.streams)], 0.0)  # [B]
        count_bin = np.minimum(COUNT_BINS - 1, np.floor(np.log2(top_total + 1) / 1.5).astype(np.int64))  # [B]
        context = (top * COUNT_BINS + count_bin) * KINDS + self._last  # [B]
        return [context, *self._set_contexts(count_bin)] if self.settings.mixers else [context]

    def _set_contexts(self, count_bin: np.ndarray) -> list[np.ndarray]:
        """``[B]`` per further weight set: the row its context chooses (``count_bin``: the top table's, ``[B]``)."""
        out = []
        for name, weights in zip(self.settings.mixers, self._sets):
            if name == "token":
                out.append(self._before)
            elif name == "order2":
                out.append((self._before * (self.vocab + 1) + self._before2) % len(weights))
            elif name == "kinds":
                out.append((count_bin * KINDS + self._last) * KINDS + self._last2)
            else:  # word
                out.append(np.minimum(self._word_length, MAX_WORD_LENGTH) * KINDS + self._last)
        return out

    def _second_layer(self, contexts: list[np.ndarray]) -> np.ndarray:
        """``[B, V]``: each weight set's geometric mixture of the inputs (by the row ``contexts`` choose),
        normalised, then their geometric mixture by the second layer's weights."""
        logs = self._log_sets  # [S, B, V]
        for s, (weights, context) in enumerate(zip([self._weights, *self._sets], contexts)):
            np.einsum("bm,mbv->bv", weights[context], self._log_q, out=logs[s])
            logs[s] -= logs[s].max(axis=1, keepdims=True)
            logs[s] -= np.log(np.exp(logs[s]).sum(axis=1, keepdims=True))
        self._set_rows = contexts
        log_mixed = np.einsum("s,sbv->bv", self._final, logs)  # [B, V]
        mixed = np.exp(log_mixed - log_mixed.max(axis=1, keepdims=True))  # [B, V]
        return mixed / mixed.sum(axis=1, keepdims=True)

    def _refine(self, p: np.ndarray) -> np.ndarray:
        """``[B, V]``: ``p`` through the adaptive probability map, each token's log-probability corrected by the
        map's entry for the block's token before and the bin of that log-probability."""
        log_p = np.log(np.maximum(p, TINY))  # [B, V]
        cells = self._before[:, None] * (len(APM_EDGES) + 1) + map_bins(log_p)  # [B, V]
        refined = log_p + self._corrections[cells]  # [B, V]
        refined = np.exp(refined - refined.max(axis=1, keepdims=True))
        refined /= refined.sum(axis=1, keepdims=True)
        self._refined = (cells, refined)
        return refined

    def append(self, tokens) -> None:
        """Read ``tokens`` (``[B]``, one per block): one gradient step of the mixer's weights on their code
        lengths, count them in their contexts' rows, and move every block's context on."""
        read = np.asarray(tokens, dtype=np.int64)  # [B]
        rows = self._pending[0] if self._pending is not None else self._rows()
        self._learn(read)
        self._pending = None
        self._count(read, rows)

    def _learn(self, read: np.ndarray) -> None:
        """The gradient steps of the adaptive probability map's corrections and of the mixer's weights on the
        code lengths of the tokens ``read`` (``[B]``), after a :meth:`mix`."""
        if self._refined is not None:
            cells, refined = self._refined
            gradient = -refined  # [B, V]: -d(code length)/d(correction) of every token's cell
            gradient[np.arange(self.streams), read] += 1.0
            self._corrections += self.settings.apm_lr * np.bincount(cells.ravel(), gradient.ravel(),
                                                                    len(self._corrections))
            self._refined = None
        if self._pending is not None:
            _, context, mixed = self._pending
            log_q, blocks = self._log_q, np.arange(self.streams)  # [M, B, V], [B]
            coded = log_q[:, blocks, read].T  # [B, M]: each input's log-probability of the token read
            if self.settings.mixers:
                logs = self._log_sets  # [S, B, V]
                final = logs[:, blocks, read].T - np.einsum("bv,sbv->bs", mixed, logs)  # [B, S]
                for weights, rows_s, log_s in zip([self._weights, *self._sets], self._set_rows, logs):
                    expected = np.einsum("bv,mbv->bm", np.exp(log_s), log_q)  # [B, M]: each set on its own code
                    _step(weights, rows_s, coded - expected, self.settings.lr, mean=True)
                self._final += self.settings.final_lr * final.mean(axis=0)
            else:
                expected = np.einsum("bv,mbv->bm", mixed, log_q)  # [B, M]
                _step(self._weights, context, coded - expected, self.settings.lr)  # -d(code length)/dw

    def _count(self, read: np.ndarray, rows: np.ndarray) -> None:
        """Count the tokens ``read`` (``[B]``) in their contexts' ``rows`` (``[K, B]``) and move every block's
        context on."""
        self._count_tables(read, rows)
        self._move_on(read)

    def _count_tables(self, read: np.ndarray, rows: np.ndarray) -> None:
        """Each table's row ``rows`` (``[K, B]``) counts the token each block read (``[B]``): a row about to
        overflow is halved first, and a cell that several blocks read gains one for each, at most
        :data:`STEP_COUNTS`."""
        tables, most = np.arange(len(rows))[:, None], min(self.streams, STEP_COUNTS)  # [K, 1], a cell's gain at most
        full = self._tables[tables, rows, read] >= COUNT_LIMIT - most  # [K, B]: rows that could overflow
        if full.any():
            table, row = np.unique(np.stack([np.broadcast_to(tables, rows.shape)[full], rows[full]]), axis=1)
            self._tables[table, row] //= 2
        cells, counts = np.unique((tables * self._tables.shape[1] + rows) * self.vocab + read, return_counts=True)
        self._tables.reshape(-1)[cells] += np.minimum(counts, most).astype(np.uint16)  # a cell two blocks share: 2

    def _move_on(self, read: np.ndarray) -> None:
        """Every block's context after the tokens ``read`` (``[B]``): its last tokens, kinds, line and words."""
        self._recent = np.concatenate([self._recent[:, 1:], (read + 1).astype(np.uint64)[:, None]], axis=1)
        self._last2, self._before2 = self._last, self._before
        if self.settings.sparse:
            ended = self._newline[read]  # [B]
            writing = np.flatnonzero(~ended & (self._column < LINE_WIDTH))
            self._line[writing, self._column[writing]] = (read[writing] + 1).astype(np.uint64)
            self._above[ended], self._line[ended] = self._line[ended], 0
            self._column = np.where(ended, 0, self._column + 1)
        self._last = self._kinds[read]
        self._before = read
        self._word_length = np.where(self._letters[read] >= 0, self._word_length + 1, 0)
        if self.settings.words:
            letter = self._letters[read]  # [B]: -1 where not a letter
            ended = (letter < 0) & (self._word[:, 0] != 0)  # [B]: a word just ended
            self._word[ended, 1] = self._word[ended, 0]
            self._word[:, 0] = np.where(letter >= 0, self._word[:, 0] * PRIME + (letter + 1).astype(np.uint64),
                                        np.where(ended, np.uint64(0), self._word[:, 0]))


def _step(weights: np.ndarray, rows: np.ndarray, gradient: np.ndarray, lr: float, mean: bool = False) -> None:
    """``weights[rows[b]] += lr * gradient[b]`` for every block b, the blocks that share a row summed first (with
    ``mean``, averaged: a row that a hundred blocks share then steps as one block's would, where a sum of their
    steps ran away)."""
    order = np.argsort(rows, kind="stable")  # the blocks that share a row, side by side
    unique, first, counts = np.unique(rows[order], return_index=True, return_counts=True)
    total = np.add.reduceat(gradient[order], first, axis=0)  # [R, M]
    weights[unique] += lr * (total / counts[:, None] if mean else total)
