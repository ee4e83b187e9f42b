"""Range coding of a file's blocks with a language model's predictions (Krause thesis 2.1.2: a model's
cross-entropy is a compression rate), optionally adapting the model as it codes (dynamic evaluation, thesis ch. 4).

The entropy coder is ``constriction``'s range coder (a maintained library; no coder is written here). The file
is cut into B blocks (:mod:`.container`), read side by side as one batch of B streams: every step, the model
reads one token of every block (``[1, B]``) and gives every block's next-token distribution at once, and each
block's symbols go through that block's own range coder. The encoder and the decoder run the *same* model loop,
:class:`Predictor`, on the same batch, so they compute bit-identical probabilities (float32 on the CPU with the
header's number of threads). With adaptation the batch shares one set of weights (as ``moglm dyneval
--streams`` does): after each segment of n steps, one update on the segment's ``[n, B]`` tokens, with the state
carried in from before it. With the neural cache (:class:`~moglm.evaluation.neural_cache.StepCache`) every
block's distribution is mixed with its own cache of its recent positions, appended as the tokens are read.
Then the context mixer (:mod:`.context_mixing`) mixes in the file's own order-k statistics, and the match model
(:mod:`.match`) raises the token that followed the last occurrence, in any block, of a block's recent tokens.
Before each token the gap of characters that are not tokens (:mod:`.layout`) is coded with :class:`GapModel`, an
adaptive frequency table of the gaps seen so far (one per block); a layout in which every character is a token
(a byte-level run) has no gaps and codes none.

A block stored raw (:mod:`.container`: its model code was longer than its bytes) is not decoded: its tokens are
known, and its row of the batch reads them as the encoder's did, so the other rows and the shared adaptation
see exactly what they saw when encoding. A block that has run out of tokens reads ``start`` tokens until the
longest block ends (their predictions are never coded).
"""

from __future__ import annotations

import gc
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from ..errors import MoglmError
from ..evaluation.neural_cache import StepCache, fitted
from ..progress import progress_bar
from .compiled_mixing import context_mixer
from .context_mixing import ContextSettings
from .ensemble import Ensemble, EnsembleSettings, Member
from .match import MatchSettings, match_model
from .run import guard_margin, warmup_tokens

LITERAL_END = 256  # a new gap is spelled as bytes 0-255, then this symbol
MAX_GAPS = 1024  # distinct gaps the table keeps
TINY = np.finfo(np.float64).tiny  # the ideal code length of a probability that underflowed is counted from here
CHUNK = 64  # steps whose token probabilities the encoder of a gapless layout codes in one call per block


def _constriction():
    try:
        import constriction
    except ImportError:
        raise MoglmError("compression needs the constriction package: pip install 'moglm[compress]'") from None
    return constriction


class Reader:
    """One run's next-token probabilities for ``rows`` streams read side by side, one step at a time, optionally
    adapting after every segment: its own state, adaptation, divergence guard and neural cache.

    ``model``: a language model in eval mode; ``start``: the token every stream reads before its first;
    ``factor``: the logit factor (the run's tuned softmax temperature); ``adapter``: a
    :class:`~moglm.dynamic_evaluation.DynamicEvaluator` (its private copy of the model is the one read; its
    weights are shared by the streams); ``guard``: with an adapter, the
    margin of its divergence guard (nats per token; it replaces the adapter's): every segment is scored with
    ``model`` too (the trained weights, which never change), and where the adaptation's code has been longer
    than theirs by the margin over the recent text, it rolls back and its step halves (``None``: only a
    non-finite loss rolls back, as in files written before the guard); ``warmup``: with an adapter, its step
    grows linearly from 0 to its full size over the first ``warmup`` tokens read (all streams together; 0: full
    from the start). Its neural cache, if any, is :meth:`attach`-ed."""

    def __init__(self, model, start: int, rows: int = 1, factor: float = 1.0, adapter=None,
                 guard: float | None = None, warmup: int = 0) -> None:
        self.net = model if adapter is None else adapter.model
        self.factor, self.adapter, self.warmup, self.steps = factor, adapter, warmup, 0
        self.static = model if adapter is not None and guard is not None else None
        if self.static is not None:
            adapter.margin = guard
        self.static_state = None  # the trained model's state before the segment, for the guard
        first = torch.full((rows,), start, dtype=torch.long)  # [B]
        self.segment, self.before = [first], None  # the segment's inputs (each [B]), the state before its first
        self.log_p, self.features, self.state = self._read(first, None)
        self.cache: StepCache | None = None

    def attach(self, cache) -> None:
        """Mix the neural cache of the (already fitted) :class:`~moglm.evaluation.neural_cache.StepCacheSettings`
        ``cache`` into every stream's distribution (Krause thesis 2.2.1; each stream caches its own positions, with
        the features of the model as it was when it read them)."""
        rows, hidden = self.features.shape
        self.cache = StepCache(cache, rows, hidden, self.log_p.shape[-1])

    def _read(self, tokens: torch.Tensor, state):
        with torch.no_grad():
            h, state = self.net(tokens.view(1, -1), state)  # [1, B, H]
            log_p = self.net.output_log_probs(h, self.factor)  # [1, B, V]
        return log_p[0], h[0], state  # [B, V], [B, H]

    def probabilities(self) -> np.ndarray:
        """``[B, V]`` float64: every stream's distribution of its next token, mixed with the cache's (uniform in a
        row where it is not finite: an adaptation that diverged is rolled back after its segment, and both sides
        see the same)."""
        p = self.log_p.to(torch.float64, copy=True).exp_().numpy()  # [B, V]: a copy, as log_p is kept
        if self.cache is not None:
            p = self.cache.mix(p, self.features)  # [B, V]
        total = p.sum(axis=1)  # [B]: every entry is at most 1 or not finite, so this is finite iff they all are
        bad = ~(np.isfinite(total) & (total > 0))  # [B]
        if bad.any():
            p[bad] = 1.0
        return p

    def advance(self, tokens: torch.Tensor) -> None:
        """Read ``tokens`` (``[B]``, one per stream, a tensor the segment may keep): update on the segment they
        complete (with an adapter), then predict the next."""
        if self.cache is not None:
            self.cache.append(self.features, tokens)
        adapter = self.adapter
        if adapter is not None:
            if len(self.segment) == adapter.hp.segment_length:
                inputs = torch.stack(self.segment)  # [n, B]
                targets = torch.stack(self.segment[1:] + [tokens])  # [n, B]
                static_nll = None
                if self.static is not None:
                    with torch.no_grad():
                        static_nll, self.static_state = self.static.nll(inputs, targets, self.static_state,
                                                                        self.factor)  # [n, B]
                # the state the update's own pass ends in (rescored with the restored weights after a rollback,
                # so a diverged update cannot carry a non-finite state on): both sides compute the same
                scale = adapter.rule.lr_scale  # halved by every rollback so far
                warm = min(1.0, (self.steps + 1) * len(tokens) / self.warmup) if self.warmup else 1.0
                adapter.rule.lr_scale = scale * warm
                rollbacks = adapter.rollbacks
                _, self.state = adapter.step(inputs, targets, self.before, static_nll)
                adapter.rule.lr_scale = scale * 0.5 ** (adapter.rollbacks - rollbacks)
                self.segment, self.before = [], self.state
            self.segment.append(tokens)
        self.steps += 1
        self.log_p, self.features, self.state = self._read(tokens, self.state)


class Predictor:
    """The next-token probabilities of ``rows`` streams read side by side, one step at a time: the run's
    (:class:`Reader`; the arguments up to ``warmup`` but ``cache`` are its), or with ``others`` several runs'
    combined (:mod:`.ensemble`), then the context mixer's and the match model's.

    ``cache``: the :class:`~moglm.evaluation.neural_cache.StepCacheSettings` of every run's neural cache, one size for
    all, cut so that the runs' caches fit in memory together (``None``: none);
    ``contexts``: the :class:`~.context_mixing.ContextSettings` of the context mixer applied after the cache (the
    file's own order-k statistics; ``None``: none), ``chars`` each token's character (the layout's, read by its
    word contexts and its mixer, ``tokens`` about how many tokens the streams hold in all (its tables' memory is
    mapped at once for many); ``match``: the :class:`~.match.MatchSettings` of the match model applied last (exact
    repeats of the recent tokens anywhere in the file read so far; ``None``: none); ``others``: further runs
    (:class:`~.ensemble.Member`: each read with its own factor, adapter and the guard and warm-up its settings
    give, and the same neural cache settings), mixed with the run by an :class:`~.ensemble.Ensemble` of
    ``ensemble``'s settings."""

    def __init__(self, model, start: int, rows: int = 1, factor: float = 1.0, adapter=None, cache=None,
                 guard: float | None = None, warmup: int = 0, match: MatchSettings | None = None,
                 contexts: ContextSettings | None = None, chars: dict[int, str] | None = None,
                 tokens: int = 0, others: Sequence[Member] = (), ensemble: EnsembleSettings | None = None) -> None:
        self.readers = [Reader(model, start, rows, factor, adapter, guard, warmup)] + [
            Reader(m.model, start, rows, m.factor, m.adapter, guard_margin(m.settings),
                   warmup_tokens(m.settings)) for m in others]
        if cache is not None:  # one size for every run's cache: all of them fit in the caches' memory together
            cache = fitted(cache, rows, sum(r.features.shape[-1] for r in self.readers))
            for reader in self.readers:
                reader.attach(cache)
        self.cache = self.readers[0].cache
        self.ensemble = Ensemble(ensemble or EnsembleSettings(), len(self.readers)) if others else None
        vocab = self.readers[0].log_p.shape[-1]
        self.contexts = None if contexts is None else context_mixer(contexts, rows, vocab, chars, tokens)
        self.match = None if match is None else match_model(match, rows)

    @property
    def rollbacks(self) -> int:
        """Times the runs' divergence guards rolled their adaptations back, all runs together."""
        return sum(r.adapter.rollbacks for r in self.readers if r.adapter is not None)

    def probabilities(self) -> np.ndarray:
        """``[B, V]`` float64: every stream's distribution of its next token: the run's with its cache (the runs'
        combined), then with the context mixer's statistics, then with the match model's prediction."""
        if self.ensemble is None:
            p = self.readers[0].probabilities()  # [B, V]
        else:
            p = self.ensemble.mix([r.probabilities() for r in self.readers])  # [B, V]
        if self.contexts is not None:
            p = self.contexts.mix(p)  # [B, V]
        return p if self.match is None else self.match.mix(p)

    def advance(self, tokens) -> None:
        """Read ``tokens`` (``[B]``, one per stream): every run updates on the segment they complete (with an
        adapter), then predicts the next."""
        tokens = torch.tensor(np.asarray(tokens, dtype=np.int64))  # [B], a copy: the segments keep it
        if self.ensemble is not None:
            self.ensemble.learn(tokens.numpy())
        if self.contexts is not None:
            self.contexts.append(tokens)
        if self.match is not None:
            self.match.append(tokens)
        for reader in self.readers:
            reader.advance(tokens)


class GapModel:
    """An adaptive frequency table over the gaps seen so far (starting with the empty gap) and an escape
    symbol; an escaped gap is spelled out byte by byte (uniform over 257 symbols) and joins the table, up to
    ``MAX_GAPS`` of them (beyond, new gaps are spelled out every time: the table's cost per symbol stays
    bounded on a file that is mostly gaps). ``limit``: the most bytes a decoded gap can have (the file's
    length), so that damaged data cannot spell forever."""

    def __init__(self, to_bytes: Callable[[str], bytes], from_bytes: Callable[[bytes], str],
                 limit: int | None = None) -> None:
        self.gaps, self.index = [""], {"": 0}
        self.counts = np.ones(MAX_GAPS + 1)  # [G_max + 1]: counts of the table's gaps, then the escape's 1
        self.to_bytes, self.from_bytes, self.limit = to_bytes, from_bytes, limit
        self.bits = 0.0  # the ideal code length of what was coded, in bits

    def _probabilities(self) -> np.ndarray:
        g = len(self.gaps)
        return np.concatenate([self.counts[:g], self.counts[-1:]])  # [G + 1]: the last is the escape

    def _learn(self, symbol: int, gap: str) -> None:
        if symbol < len(self.gaps):
            self.counts[symbol] += 1
        elif len(self.gaps) < MAX_GAPS:
            self.index[gap] = len(self.gaps)
            self.gaps.append(gap)

    def encode(self, coder: "Coder", gap: str) -> None:
        p = self._probabilities()
        symbol = self.index.get(gap, len(self.gaps))
        self.bits += coder.encode(symbol, p)
        if symbol == len(self.gaps):
            for b in [*self.to_bytes(gap), LITERAL_END]:
                self.bits += coder.encode(b, coder.uniform)
        self._learn(symbol, gap)

    def decode(self, coder: "Coder") -> str:
        symbol = coder.decode(self._probabilities())
        if symbol < len(self.gaps):
            gap = self.gaps[symbol]
        else:
            spelled = bytearray()
            while (b := coder.decode(coder.uniform)) != LITERAL_END:
                spelled.append(b)
                if self.limit is not None and len(spelled) > self.limit:
                    raise MoglmError("the compressed data is damaged (a gap longer than the whole file)")
            gap = self.from_bytes(bytes(spelled))
        self._learn(symbol, gap)
        return gap


class Coder:
    """One block's symbols through constriction's range coder, with categorical models given as probabilities
    (rescaled and quantised identically on both sides, one symbol at a time or many in one call)."""

    uniform = np.ones(LITERAL_END + 1)

    def __init__(self, compressed: np.ndarray | None = None) -> None:
        queue = _constriction().stream.queue
        self.family = _constriction().stream.model.Categorical(perfect=False)
        self.encoder = queue.RangeEncoder() if compressed is None else None
        self.decoder = None if compressed is None else queue.RangeDecoder(compressed)
        self.decoded_bits = 0.0  # a lower bound of the payload the decoded symbols took (see check_payload)
        self.payload_bits = 0 if compressed is None else 32 * len(compressed)

    def encode(self, symbol: int, probabilities: np.ndarray) -> float:
        """Code ``symbol``; returns its ideal code length in bits (-log2 of its probability)."""
        self.encoder.encode(np.array([symbol], dtype=np.int32), self.family, probabilities[None])
        return -math.log2(max(probabilities[symbol] / probabilities.sum(), TINY))

    def encode_all(self, symbols: np.ndarray, probabilities: np.ndarray) -> None:
        """Code ``symbols`` ``[K]`` in order, each with its row of ``probabilities`` ``[K, V]`` (the same
        code as K calls of :meth:`encode`)."""
        self.encoder.encode(symbols.astype(np.int32), self.family, np.ascontiguousarray(probabilities))

    def symbol(self, probabilities: np.ndarray) -> int:
        """The next symbol, decoded with ``probabilities`` (its cost is not counted: see :meth:`decode`)."""
        try:
            return int(self.decoder.decode(self.family, probabilities[None])[0])
        except Exception as e:  # the coder's own error on data that is not what it wrote
            raise MoglmError(f"the compressed data is damaged (the range decoder failed: {e})") from None

    def decode(self, probabilities: np.ndarray) -> int:
        symbol = self.symbol(probabilities)
        self.decoded_bits += float(least_bits(probabilities[symbol] / probabilities.sum(), len(probabilities)))
        return symbol

    def check_payload(self) -> None:
        """Decoding past the payload reads zeros, and the symbols it yields cost bits the payload never held:
        a header that claims more tokens than the payload can hold (a forged or damaged file) is stopped here
        after at most about the payload's own length in tokens, instead of decoding until killed."""
        check_payloads(np.array([self.decoded_bits]), np.array([self.payload_bits]))

    def compressed(self) -> np.ndarray:
        return self.encoder.get_compressed()  # uint32 words


def least_bits(chosen, vocab: int):
    """What a decoded symbol of probability ``chosen`` (normalised; a number or an array) costs at least: the coder
    quantises to 24 bits, so -log2(p + V 2^-24), whatever p was."""
    return -np.log2(np.minimum(1.0, chosen + vocab * 2.0**-24))


def check_payloads(decoded_bits: np.ndarray, payload_bits: np.ndarray) -> None:
    """:meth:`Coder.check_payload` for many blocks at once (their decoded symbols' least bits, their payloads')."""
    over = np.flatnonzero(decoded_bits > 1.01 * payload_bits + 64)
    if len(over):
        raise MoglmError(f"the compressed data is damaged: its header claims more tokens than its "
                         f"{int(payload_bits[over[0]]) // 8:,}-byte payload holds")


@dataclass
class Block:
    """One block as the coder sees it: ``gaps[0] tokens[0] ... tokens[n-1] gaps[n]``, its range-coded words
    (``None`` for a block stored raw, whose tokens are known to the decoder) and the ideal code lengths of
    what was coded, in bits."""

    tokens: list[int] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    words: np.ndarray | None = None
    model_bits: float = 0.0
    gap_bits: float = 0.0


def _ideal_bits(p: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """``[R]``: -log2 of each row's probability of its token (``p`` ``[R, V]``, ``tokens`` ``[R]``)."""
    chosen = p[np.arange(len(tokens)), tokens] / p.sum(axis=1)  # [R]
    return -np.log2(np.maximum(chosen, TINY))


def _token_matrix(blocks: list[Block], start: int, length: int) -> np.ndarray:
    """``[L, B]``: block b's (known) tokens in column b, ``start`` after them."""
    matrix = np.full((length, len(blocks)), start, dtype=np.int64)  # [L, B]
    for b, block in enumerate(blocks):
        matrix[: len(block.tokens), b] = block.tokens
    return matrix


@contextmanager
def collector_paused():
    """Python's cyclic garbage collector paused over a coding loop (as it was after): every step makes small
    objects (tensors, arrays, lists) that reference counting frees, and the collector's passes over them took a
    few percent of a small model's time; what a step leaves in a cycle is collected once, after the loop."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def encode(predictor: Predictor, blocks: list[Block], gap_model: Callable[[], GapModel] | None, start: int,
           progress: bool = True) -> None:
    """Code every block (each ``tokens`` and ``gaps``) side by side, setting each block's ``words`` and ideal
    code lengths. ``gap_model``: makes each block's gap table (``None``: a gapless layout, nothing but tokens)."""
    coders = [Coder() for _ in blocks]
    gaps = [gap_model() for _ in blocks] if gap_model is not None else None
    counts = np.array([len(b.tokens) for b in blocks])  # [B]
    matrix = _token_matrix(blocks, start, int(counts.max(initial=0)))  # [L, B]
    model_bits = np.zeros(len(blocks))  # [B]
    pending: list[np.ndarray] = []  # gapless: the steps' probabilities [B, V] not yet coded
    bar = progress_bar(int(counts.sum()), "compress", 1, progress)
    with collector_paused():
        for t in range(matrix.shape[0]):
            p = predictor.probabilities()  # [B, V]
            rows = np.flatnonzero(counts > t)  # [R]: the blocks that have a token t
            model_bits[rows] += _ideal_bits(p if len(rows) == len(p) else p[rows], matrix[t, rows])
            if gaps is None:
                pending.append(p)
                if len(pending) == CHUNK or t == matrix.shape[0] - 1:
                    _encode_chunk(coders, matrix, counts, pending, t + 1 - len(pending))
                    pending = []
            else:
                for b in rows:
                    gaps[b].encode(coders[b], blocks[b].gaps[t])
                    coders[b].encode(int(matrix[t, b]), p[b])
            predictor.advance(matrix[t])
            bar.update(len(rows))
    bar.close()
    for b, block in enumerate(blocks):
        if gaps is not None:
            gaps[b].encode(coders[b], block.gaps[-1])
            block.gap_bits = gaps[b].bits
        block.model_bits, block.words = float(model_bits[b]), coders[b].compressed()


def _encode_chunk(coders: list[Coder], matrix: np.ndarray, counts: np.ndarray, pending: list[np.ndarray],
                  first: int) -> None:
    """Code steps ``first, first + 1 ...`` of every block from their probabilities, one call per block."""
    stacked = np.stack(pending, axis=1)  # [B, K, V]
    for b, coder in enumerate(coders):
        k = min(len(pending), max(0, int(counts[b]) - first))
        if k:
            coder.encode_all(matrix[first : first + k, b], stacked[b, :k])


def decode(predictor: Predictor, blocks: list[Block], payloads: list[np.ndarray | None], counts: list[int],
           gap_model: Callable[[], GapModel] | None, start: int, progress: bool = True) -> None:
    """Fill in the ``tokens`` and ``gaps`` of every block whose payload (uint32 words) is given, ``counts[b]``
    tokens each, reading the blocks side by side exactly as :func:`encode` did; a block whose payload is
    ``None`` is raw: its ``tokens`` (already set) are read as they are."""
    coders = [None if words is None else Coder(words) for words in payloads]
    coded = [b for b, c in enumerate(coders) if c is not None]
    gaps = {b: gap_model() for b in coded} if gap_model is not None else {}
    counts_ = np.array(counts)  # [B]
    matrix = _token_matrix(blocks, start, max(counts, default=0))  # [L, B]: raw blocks' tokens, start elsewhere
    coded_ = np.array(coded, dtype=np.int64)  # [C]: the coded blocks
    decoded_bits = np.zeros(len(coded))  # [C]: gapless, what each coded block's symbols cost at least, in bits
    payload_bits = np.array([coders[b].payload_bits for b in coded], dtype=np.float64)  # [C]
    bar = progress_bar(sum(counts), "decompress", 1, progress)
    with collector_paused():
        for t in range(matrix.shape[0]):
            p = predictor.probabilities()  # [B, V]
            if gaps:
                for b in coded:
                    if t < counts[b]:
                        coder, block = coders[b], blocks[b]
                        block.gaps.append(gaps[b].decode(coder))
                        matrix[t, b] = coder.decode(p[b])
                        coder.check_payload()
            else:  # the symbols one coder call each, their costs and the payloads' check for every block at once
                live = counts_[coded_] > t  # [C]
                rows = coded_[live]  # [R]
                matrix[t, rows] = [coders[b].symbol(p[b]) for b in rows.tolist()]
                chosen = p[rows, matrix[t, rows]] / (p if len(rows) == len(p) else p[rows]).sum(axis=1)  # [R]
                decoded_bits[live] += least_bits(chosen, p.shape[1])
                check_payloads(decoded_bits[live], payload_bits[live])
            predictor.advance(matrix[t])
            bar.update(int((counts_ > t).sum()))
    bar.close()
    for b in coded:  # the tokens read, and the gap after the last one
        blocks[b].tokens = matrix[: counts[b], b].tolist()
        if gaps:
            blocks[b].gaps.append(gaps[b].decode(coders[b]))
        else:
            blocks[b].gaps = [""] * (counts[b] + 1)
