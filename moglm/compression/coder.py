"""Range coding of a file with a language model's predictions (Krause thesis 2.1.2: a model's cross-entropy
is a compression rate), optionally adapting the model as it codes (dynamic evaluation, thesis ch. 4).

The entropy coder is ``constriction``'s range coder (a maintained library; no coder is written here). The
encoder and the decoder run the *same* loop, :class:`Predictor`, so they compute bit-identical
probabilities: the model reads one token at a time (``[1, 1]``, whatever the encoder could batch, since the
decoder cannot), in float32 on the CPU with a fixed number of threads, and adapts exactly as
``moglm sample --adapt-output`` does: after each segment of n tokens, one update on that segment, with the
state carried in from before it. Before each token the gap of characters that are not tokens
(:mod:`.layout`) is coded with :class:`GapModel`, an adaptive frequency table of the gaps seen so far.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from ..errors import MoglmError
from ..progress import progress_bar

LITERAL_END = 256  # a new gap is spelled as bytes 0-255, then this symbol
MAX_GAPS = 1024  # distinct gaps the table keeps
TINY = np.finfo(np.float64).tiny  # the ideal code length of a probability that underflowed is counted from here


def _constriction():
    try:
        import constriction
    except ImportError:
        raise MoglmError("compression needs the constriction package: pip install 'moglm[compress]'") from None
    return constriction


class Predictor:
    """The model's next-token probabilities, one token at a time, optionally adapting after every segment.

    ``model``: a language model in eval mode; ``start``: the token read before the first; ``factor``: the
    logit factor (the run's tuned softmax temperature); ``adapter``: a
    :class:`~moglm.dynamic_evaluation.DynamicEvaluator` (its private copy of the model is the one read)."""

    def __init__(self, model, start: int, factor: float = 1.0, adapter=None) -> None:
        self.net = model if adapter is None else adapter.model
        self.factor, self.adapter = factor, adapter
        self.segment, self.before = [start], None  # the segment's inputs, the state before its first
        self.log_p, self.state = self._read(start, None)

    def _read(self, token: int, state):
        with torch.no_grad():
            log_p, state = self.net.log_probs(torch.tensor([[token]]), state, self.factor)  # [1, 1, V]
        return log_p[0, 0], state

    def probabilities(self) -> np.ndarray:
        """``[V]`` float64: the distribution of the next token (uniform where the model's is not finite: an
        adaptation that diverged is rolled back after its segment, and both sides see the same)."""
        p = self.log_p.double().exp().numpy()
        return p if np.isfinite(p).all() and p.sum() > 0 else np.ones_like(p)

    def advance(self, token: int) -> None:
        """Read ``token``: update on the segment it completes (with an adapter), then predict the next."""
        adapter = self.adapter
        if adapter is not None:
            if len(self.segment) == adapter.hp.segment_length:
                inputs = torch.tensor(self.segment).view(-1, 1)  # [n, 1]
                targets = torch.tensor(self.segment[1:] + [token]).view(-1, 1)  # [n, 1]
                # the state the update's own pass ends in (rescored with the restored weights after a rollback,
                # so a diverged update cannot carry a non-finite state on): both sides compute the same
                _, self.state = adapter.step(inputs, targets, self.before)
                self.segment, self.before = [], self.state
            self.segment.append(token)
        self.log_p, self.state = self._read(token, self.state)


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
    """One symbol at a time through constriction's range coder, with a categorical model given as
    probabilities (rescaled and quantised identically on both sides)."""

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

    def decode(self, probabilities: np.ndarray) -> int:
        try:
            symbol = int(self.decoder.decode(self.family, probabilities[None])[0])
        except Exception as e:  # the coder's own error on data that is not what it wrote
            raise MoglmError(f"the compressed data is damaged (the range decoder failed: {e})") from None
        # the coder quantises to 24 bits: a symbol costs at least -log2(p + V 2^-24), whatever p was
        p = probabilities[symbol] / probabilities.sum() + len(probabilities) * 2.0**-24
        self.decoded_bits += -math.log2(min(1.0, p))
        return symbol

    def check_payload(self) -> None:
        """Decoding past the payload reads zeros, and the symbols it yields cost bits the payload never held:
        a header that claims more tokens than the payload can hold (a forged or damaged file) is stopped here
        after at most about the payload's own length in tokens, instead of decoding until killed."""
        if self.decoded_bits > 1.01 * self.payload_bits + 64:
            raise MoglmError(f"the compressed data is damaged: its header claims more tokens than its "
                             f"{self.payload_bits // 8:,}-byte payload holds")

    def compressed(self) -> np.ndarray:
        return self.encoder.get_compressed()  # uint32 words


def encode(predictor: Predictor, gaps: GapModel, tokens: list[int], gap_list: list[str],
           progress: bool = True) -> tuple[np.ndarray, float]:
    """The range-coded words of ``gap_list[0] tokens[0] ... gap_list[N]`` and the model's ideal code length
    of the tokens in bits (its cross-entropy on them, with the probabilities the coder used)."""
    coder, bits = Coder(), 0.0
    bar = progress_bar(len(tokens), "compress", 1, progress)
    for i, token in enumerate(tokens):
        gaps.encode(coder, gap_list[i])
        bits += coder.encode(token, predictor.probabilities())
        predictor.advance(token)
        if i % 256 == 255:
            bar.update(256)
    gaps.encode(coder, gap_list[-1])
    bar.close()
    return coder.compressed(), bits


def decode(predictor: Predictor, gaps: GapModel, compressed: np.ndarray, count: int,
           progress: bool = True) -> tuple[list[int], list[str]]:
    """The ``count`` tokens and ``count + 1`` gaps that :func:`encode` coded into ``compressed``."""
    coder, tokens, gap_list = Coder(compressed), [], []
    bar = progress_bar(count, "decompress", 1, progress)
    for i in range(count):
        gap_list.append(gaps.decode(coder))
        token = coder.decode(predictor.probabilities())
        tokens.append(token)
        predictor.advance(token)
        coder.check_payload()
        if i % 256 == 255:
            bar.update(256)
    gap_list.append(gaps.decode(coder))
    bar.close()
    return tokens, gap_list
