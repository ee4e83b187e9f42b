"""The neural cache (Grave, Joulin and Usunier 2017; Krause thesis 2.2.1, the equation there): a model's next-token
probability is mixed with a distribution over the targets of recent positions, each weighted by how
similar its feature is to the current one.

In words: the cache keeps the pairs (h_i, y_i) of the last ``size`` positions i < t, where h_i is the
final hidden state before the softmax and y_i the token that followed. At position t each entry gets
the weight exp(theta * h_t . h_i); the cache probability of a word w is the normalised weight of the
entries whose target is w; and the scored probability is

    p(y_t) = (1 - lam) * p_model(y_t) + lam * p_cache(y_t).

``theta`` (the flatness, an inverse temperature) and ``lam`` are searched on validation
(:func:`search_cache`). Where the window is empty (a stream's first position) p_model is used alone.

Only the model's per-token nll and its features are needed, never the full distribution, so the
cache combines with any model (recurrent or Transformer) and with dynamic evaluation: it reads the
features the adapted model produced, and has no parameters of its own. Everything is computed in log
space: log p_cache is a log-sum-exp over the matching entries minus one over all entries, and the
mixture is ``logaddexp(log(1 - lam) - nll, log(lam) + log p_cache)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from ..errors import MoglmError

#: default search grid: features are un-normalised hidden states (|h|^2 up to the hidden size for an
#: LSTM), so theta spans four decades; lambda up to 0.7 for weak models whose cache helps a lot
THETAS = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
LAMS = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)


def _check(theta: float, lam: float, size: int) -> None:
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta) or theta < 0:
        raise MoglmError(f"cache theta must be a finite number >= 0, got {theta!r}")
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not 0 <= lam < 1:
        raise MoglmError(f"cache lambda must be a number in [0, 1), got {lam!r}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise MoglmError(f"cache size must be an integer >= 1, got {size!r}")


@dataclass(frozen=True)
class CacheSettings:
    """One cache setting: ``theta`` the flatness of the similarity, ``lam`` the interpolation weight,
    ``size`` the cache length in positions."""

    theta: float = 0.3
    lam: float = 0.1
    size: int = 500

    def __post_init__(self) -> None:
        _check(self.theta, self.lam, self.size)


class NeuralCache:
    """Streaming cache over ``streams`` parallel streams (stripes): holds the last ``size``
    (feature, target) pairs per stream, detached. Memory per :meth:`mix` call is a few
    ``[B, T, S + T]`` tensors (S <= size cached positions, T the segment length)."""

    def __init__(self, size: int, streams: int = 1):
        _check(0.0, 0.0, size)
        if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
            raise MoglmError(f"cache streams must be an integer >= 1, got {streams!r}")
        self.size, self.streams = size, streams
        self.reset()

    def reset(self) -> None:
        """Empty every stream's cache (episodic use)."""
        self._keys: Tensor | None = None  # [B, S, H]
        self._targets: Tensor | None = None  # [B, S]

    def mix(self, nll: Tensor, features: Tensor, targets: Tensor, thetas: Sequence[float],
            lams: Sequence[float]) -> Tensor:
        """Mixed nll ``[len(thetas), len(lams), T, B]`` of one segment (``nll [T, B]``, ``features
        [T, B, H]``, ``targets [T, B]``, stream order), each position reading the cache entries of the
        last ``size`` earlier positions; then appends the segment's pairs to the cache."""
        thetas, lams = [float(t) for t in thetas], [float(l) for l in lams]
        for theta in thetas:
            _check(theta, 0.0, self.size)
        for lam in lams:
            _check(0.0, lam, self.size)
        if nll.dim() != 2 or targets.shape != nll.shape or features.dim() != 3 or features.shape[:2] != nll.shape:
            raise MoglmError(f"cache wants nll [T, B], features [T, B, H], targets [T, B]; got "
                             f"{tuple(nll.shape)}, {tuple(features.shape)}, {tuple(targets.shape)}")
        T, B = nll.shape
        if B != self.streams:
            raise MoglmError(f"cache holds {self.streams} streams, got a segment of {B}")
        acc = torch.float64 if torch.float64 in (nll.dtype, features.dtype) else torch.float32
        query = features.detach().transpose(0, 1)  # [B, T, H]
        ys = targets.detach().transpose(0, 1).long()  # [B, T]
        if self._keys is not None:
            keys = torch.cat([self._keys.to(query.dtype), query], 1)  # [B, S+T, H]
            key_ys = torch.cat([self._targets, ys], 1)  # [B, S+T]
        else:
            keys, key_ys = query, ys
        S = keys.shape[1] - T
        sims = torch.bmm(query, keys.transpose(1, 2)).to(acc)  # [B, T, S+T]
        col = torch.arange(S + T, device=nll.device)  # [S+T]
        now = S + torch.arange(T, device=nll.device)[:, None]  # [T, 1]: column of position t itself
        window = (col >= now - self.size) & (col < now)  # [T, S+T]
        match = window & (key_ys[:, None, :] == ys[:, :, None])  # [B, T, S+T]
        empty = ~window.any(-1)  # [T]: no earlier position (a stream's first)
        model_lp = -nll.detach().transpose(0, 1).to(acc)  # [B, T]
        out = torch.empty(len(thetas), len(lams), B, T, dtype=acc, device=nll.device)
        for a, theta in enumerate(thetas):
            logits = theta * sims  # [B, T, S+T]
            log_all = logits.masked_fill(~window, -math.inf).logsumexp(-1)  # [B, T]
            log_hit = logits.masked_fill(~match, -math.inf).logsumexp(-1)  # [B, T]
            log_cache = (log_hit - log_all).masked_fill(empty | (log_hit == -math.inf), -math.inf)  # [B, T]
            for b, lam in enumerate(lams):
                if lam == 0:
                    out[a, b] = model_lp
                    continue
                mixed = torch.logaddexp(math.log1p(-lam) + model_lp, math.log(lam) + log_cache)  # [B, T]
                out[a, b] = torch.where(empty, model_lp, mixed)
        self._keys, self._targets = keys[:, -self.size:].detach(), key_ys[:, -self.size:]  # S <= size
        return -out.transpose(2, 3)  # [thetas, lams, T, B]

    def score(self, nll: Tensor, features: Tensor, targets: Tensor, settings: CacheSettings) -> Tensor:
        """Mixed nll ``[T, B]`` of one segment under one setting (``settings.size`` must be ``size``)."""
        if settings.size != self.size:
            raise MoglmError(f"cache settings have size {settings.size}, the cache {self.size}")
        return self.mix(nll, features, targets, [settings.theta], [settings.lam])[0, 0]


def _as_stripes(nll: Tensor, features: Tensor, targets: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    if nll.dim() == 1:  # one stream
        nll, features, targets = nll[:, None], features[:, None], targets[:, None]  # [N, 1], [N, 1, H], [N, 1]
    if nll.dim() != 2 or features.dim() != 3 or targets.shape != nll.shape or features.shape[:2] != nll.shape:
        raise MoglmError(f"cache wants nll [N, B], features [N, B, H], targets [N, B] (or [N], [N, H], [N]); "
                         f"got {tuple(nll.shape)}, {tuple(features.shape)}, {tuple(targets.shape)}")
    return nll, features, targets


def cache_nll(nll: Tensor, features: Tensor, targets: Tensor, settings: CacheSettings,
              segment: int = 256) -> Tensor:
    """Mixed nll ``[N]`` of one whole stream (``nll [N]``, ``features [N, H]``, ``targets [N]``), fed to
    a :class:`NeuralCache` ``segment`` positions at a time."""
    nll, features, targets = _as_stripes(nll, features, targets)  # [N, 1], [N, 1, H], [N, 1]
    cache = NeuralCache(settings.size)
    parts = [cache.score(nll[s : s + segment], features[s : s + segment], targets[s : s + segment], settings)
             for s in range(0, nll.shape[0], segment)]
    return torch.cat(parts)[:, 0]  # [N]


@dataclass
class CacheSearch:
    """The best setting, the base and best mean nll (nats per token), and every grid point tried
    (``{theta, lam, size, xent}``)."""

    best: CacheSettings
    base_xent: float
    xent: float
    trials: list[dict] = field(default_factory=list)


def search_cache(nll: Tensor, features: Tensor, targets: Tensor, size: int = 500,
                 thetas: Sequence[float] = THETAS, lams: Sequence[float] = LAMS,
                 segment: int = 256) -> CacheSearch:
    """Grid search of theta and lambda on validation outputs (``nll [N, B]``, ``features [N, B, H]``,
    ``targets [N, B]`` in stream order per stripe, or ``[N]``, ``[N, H]``, ``[N]`` for one stream): one
    pass of :class:`NeuralCache` scores every setting; the lowest mean mixed nll wins. If even the best
    is above ``base_xent`` the cache does not help this model."""
    nll, features, targets = _as_stripes(nll, features, targets)  # [N, B], [N, B, H], [N, B]
    if not thetas or not lams:
        raise MoglmError("cache search needs at least one theta and one lambda")
    if nll.numel() == 0:
        raise MoglmError("cache search needs at least one token")
    cache = NeuralCache(size, nll.shape[1])
    total = torch.zeros(len(thetas), len(lams), dtype=torch.float64, device=nll.device)  # [thetas, lams]
    for s in range(0, nll.shape[0], segment):
        mixed = cache.mix(nll[s : s + segment], features[s : s + segment], targets[s : s + segment], thetas, lams)
        total += mixed.double().sum((2, 3))  # [thetas, lams, T, B] -> [thetas, lams]
    xent = (total / nll.numel()).cpu()  # [thetas, lams]
    trials = [{"theta": float(t), "lam": float(l), "size": size, "xent": float(xent[a, b])}
              for a, t in enumerate(thetas) for b, l in enumerate(lams)]
    best = min(trials, key=lambda r: r["xent"])
    return CacheSearch(CacheSettings(best["theta"], best["lam"], size),
                       float(nll.double().mean()), best["xent"], trials)


@dataclass(frozen=True)
class StepCacheSettings:
    """The cache that coding mixes in (:class:`StepCache`): ``theta`` and ``size`` as in :class:`CacheSettings`,
    and the interpolation weights ``lams`` it chooses among as it reads (a Bayesian mixture over them; one weight
    is a fixed lambda)."""

    theta: float = 0.5
    size: int = 2000
    lams: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)

    def __post_init__(self) -> None:
        if not isinstance(self.lams, (tuple, list)) or not 1 <= len(self.lams) <= MAX_LAMS:
            raise MoglmError(f"cache weights must be a list of 1 to {MAX_LAMS} lambdas, got {self.lams!r:.80}")
        if isinstance(self.size, int) and self.size > MAX_STEP_CACHE:
            raise MoglmError(f"a coding cache holds at most {MAX_STEP_CACHE:,} positions, not {self.size:,}")
        object.__setattr__(self, "lams", tuple(self.lams))
        for lam in self.lams:
            _check(self.theta, lam, self.size)


FIRST_CAPACITY = 256  # positions a StepCache's ring holds before it first grows
MAX_STEP_CACHE = 65_536  # positions per stream a coding cache may hold (a forged header's size is refused)
MAX_LAMS = 64  # lambdas a coding cache may choose among
STEP_CACHE_BYTES = 1 << 30  # the most memory the features of all the streams' coding caches may take


def fitted(settings: StepCacheSettings, streams: int, hidden_size: int) -> StepCacheSettings:
    """``settings`` with the size cut so that ``streams`` caches of ``hidden_size`` float32 features fit in
    :data:`STEP_CACHE_BYTES` (a file of many blocks gets shorter caches; applied again, it changes nothing)."""
    room = max(1, STEP_CACHE_BYTES // (4 * streams * hidden_size))
    return settings if settings.size <= room else replace(settings, size=room)


class StepCache:
    """The cache read one step at a time for coding (:mod:`moglm.compression`): the whole next-token
    distribution of every stream, not only the probability of a known target. Holds the last ``size``
    (feature, target) pairs of each of ``streams`` streams in a ring; every stream has as many as the others
    (they advance together).

    The interpolation weight is learnt from the text already read, stream by stream, as a Bayesian mixture over
    the settings' ``lams``: each lambda's weight is its prior share (equal) times the probability its mixture gave
    every token so far, so the code length is within ``log(len(lams))`` nats of the best of them in hindsight, on
    text the cache helps (a weight near 0.6 on text unlike the training data) and on text it does not (near 0).
    With one lambda, its probability of a token is the one :meth:`NeuralCache.score` gives (the reference twin;
    summed in another order)."""

    def __init__(self, settings: StepCacheSettings, streams: int, hidden_size: int, vocab_size: int,
                 dtype: torch.dtype = torch.float32) -> None:
        self.settings, self.vocab_size = settings, vocab_size
        first = min(settings.size, FIRST_CAPACITY)  # the ring grows as it fills: memory for what was read only
        self._keys = torch.zeros(streams, hidden_size, first, dtype=dtype)  # [B, H, S]: a column a position
        self._targets = torch.zeros(streams, first, dtype=torch.long)  # [B, S]
        self._count = 0  # positions appended so far
        self._lams = np.array(settings.lams)  # [K]
        self._log_weights = np.full((streams, len(self._lams)), -math.log(len(self._lams)))  # [B, K]
        self._read: tuple[np.ndarray, np.ndarray] | None = None  # the last step's p_model and p_cache [B, V]

    def distribution(self, features: Tensor) -> Tensor | None:
        """``[B, V]``: p_cache(w) = sum over the cached positions i with target w of softmax_i(theta h_t . h_i),
        for the current features ``[B, H]``; ``None`` while the cache is empty."""
        filled = min(self._count, self.settings.size)
        if not filled:
            return None
        keys = self._keys[:, :, :filled]  # [B, H, S']
        sims = torch.bmm(features.detach().to(keys.dtype)[:, None, :], keys)[:, 0]  # [B, S']
        weights = torch.softmax(self.settings.theta * sims, dim=-1)  # [B, S']
        p = torch.zeros(features.shape[0], self.vocab_size, dtype=weights.dtype)  # [B, V]
        return p.scatter_add_(1, self._targets[:, :filled], weights)

    def weight(self) -> np.ndarray:
        """``[B]``: every stream's current interpolation weight, the mean of ``lams`` under its posterior."""
        w = np.exp(self._log_weights - self._log_weights.max(axis=1, keepdims=True))  # [B, K]
        return (w / w.sum(axis=1, keepdims=True)) @ self._lams

    def mix(self, p_model: np.ndarray, features: Tensor) -> np.ndarray:
        """``(1 - lam) p_model + lam p_cache`` (``p_model`` ``[B, V]`` float64), ``lam`` each stream's
        :meth:`weight`; ``p_model`` itself while the cache is empty."""
        p_cache = self.distribution(features)
        if p_cache is None:
            self._read = None
            return p_model
        p_cache = p_cache.double().numpy()  # [B, V]
        self._read = (p_model, p_cache)
        lam = self.weight()  # [B]
        lam[~np.isfinite(p_cache).all(axis=1)] = 0.0  # features a diverged adaptation left non-finite: the model
        return (1.0 - lam[:, None]) * p_model + lam[:, None] * np.nan_to_num(p_cache)

    def append(self, features: Tensor, targets: Tensor) -> None:
        """Read the tokens that followed the last :meth:`mix`, ``targets`` ``[B]``: every lambda's weight is
        multiplied by the probability its mixture gave them; then remember the pairs (``features`` ``[B, H]``)."""
        if self._read is not None:
            p_model, p_cache = self._read
            rows, ys = np.arange(len(p_model)), np.asarray(targets)
            chosen = ((1.0 - self._lams) * p_model[rows, ys][:, None]
                      + self._lams * p_cache[rows, ys][:, None])  # [B, K]
            with np.errstate(divide="ignore", invalid="ignore"):
                gain = np.log(chosen)  # [B, K]
            finite = np.isfinite(gain).all(axis=1)  # [B]: a row the model gave no finite distribution learns nothing
            self._log_weights[finite] += gain[finite]
            self._log_weights -= self._log_weights.max(axis=1, keepdims=True)
            self._read = None
        slot = self._count % self.settings.size
        if slot == self._keys.shape[2]:  # full below size: twice the room (the same slots, so the same sums)
            room = min(self.settings.size, 2 * slot)
            self._keys = torch.cat([self._keys, self._keys.new_zeros(*self._keys.shape[:2], room - slot)], 2)
            self._targets = torch.cat([self._targets, self._targets.new_zeros(len(self._targets), room - slot)], 1)
        self._keys[:, :, slot] = features.detach()
        self._targets[:, slot] = targets
        self._count += 1
