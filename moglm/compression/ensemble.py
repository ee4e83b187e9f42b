"""Runs mixed: several trained runs read the file side by side, and their distributions are combined before the
context mixer (``moglm compress --ensemble RUN``; the model mixing of the PAQ and cmix compressors, an ensemble).

In words: every run reads the same tokens with its own state, its own adaptation (``--dynamic``: each its own
weights, settings and divergence guard) and its own neural cache, and gives every block a distribution p_m. They
are combined geometrically,

    log p(v) = sum_m w_m log p_m(v) - log Z,

with weights w (one per run, shared by the blocks, 1/M at the start) learnt while coding by a gradient step on
each token's code length: w_m += lr * mean over the blocks of (log p_m(y) - sum_v p(v) log p_m(v)). This is the
context mixer's own rule (:mod:`.context_mixing`, the PAQ mixer's) over whole models in place of the file's tables.
Two runs trained apart err apart: on held-out English, the shipped byte-level run and the one trained on wrapped
text mixed coded 0.9-1.0% smaller than the shipped run alone static and 1.1-1.7% adapting, after the context mixer
and the match model (docs/guides/compression.md). Everything is float64 numpy in a fixed order, the same on both sides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import MoglmError

#: the weights' step, per step of the batch (the blocks' gradients averaged): on saved adapting predictions of
#: chapters 6-8 of the Vim user manual, two runs mixed, 2e-3 .. 2e-2 coded within 0.05% of each other and 4e-2 0.1%
#: larger (docs/guides/compression.md)
ENSEMBLE_LR = 5e-3
FLOOR = 1e-12  # probabilities are floored here before their logarithm: one run's confident miss costs at most this
MAX_RUNS = 8  # runs one file may mix


@dataclass(frozen=True)
class EnsembleSettings:
    """``lr``: the step of the runs' weights (recorded in the header)."""

    lr: float = ENSEMBLE_LR

    def __post_init__(self) -> None:
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not 0 <= self.lr <= 1:
            raise MoglmError(f"an ensemble's lr must be a number from 0 to 1, not {self.lr!r}")


@dataclass
class Member:
    """A further run of an ensemble, as the coder reads it: ``model`` (eval mode, CPU, float32) and its ``vocab``
    (the first run's), its logit ``factor``, its ``adapter`` (``None``: static) and the ``settings`` that rebuild
    it (recorded in the header)."""

    model: Any
    vocab: Any
    factor: float = 1.0
    adapter: Any = None
    settings: dict | None = None


class Ensemble:
    """The geometric mixture of ``runs`` distributions with learnt weights: :meth:`mix` a step's distributions,
    then :meth:`learn` from the tokens that were read."""

    def __init__(self, settings: EnsembleSettings, runs: int) -> None:
        self.settings = settings
        self.weights = np.full(runs, 1.0 / runs)  # [M]
        self._pending: tuple[np.ndarray, np.ndarray] | None = None

    def mix(self, distributions: list[np.ndarray]) -> np.ndarray:
        """``[B, V]``: the runs' distributions (each ``[B, V]``, rows positive and finite, normalised here)
        combined with the present weights."""
        logs = np.stack([np.log(np.maximum(p / p.sum(axis=1, keepdims=True), FLOOR))
                         for p in distributions])  # [M, B, V]
        mixed = np.einsum("m,mbv->bv", self.weights, logs)  # [B, V]: numpy's own loop, not BLAS, so a fixed order
        mixed -= mixed.max(axis=1, keepdims=True)
        p = np.exp(mixed)  # [B, V]
        p /= p.sum(axis=1, keepdims=True)
        self._pending = (logs, p)
        return p

    def learn(self, tokens) -> None:
        """One step of the weights on the code length of ``tokens`` (``[B]``, one per block) under the last
        :meth:`mix`."""
        if self._pending is None:
            return
        logs, p = self._pending  # [M, B, V], [B, V]
        read = np.asarray(tokens, dtype=np.int64)  # [B]
        rows = np.arange(len(read))  # [B]
        coded = logs[:, rows, read]  # [M, B]
        expected = np.einsum("bv,mbv->mb", p, logs)  # [M, B]
        self.weights += self.settings.lr * (coded - expected).mean(axis=1)
        self._pending = None


def check_runs(runs: int) -> None:
    """A one-line error for more runs mixed than a file may record (:data:`MAX_RUNS`)."""
    if runs > MAX_RUNS:
        raise MoglmError(f"at most {MAX_RUNS} runs can be mixed (the first and {MAX_RUNS - 1} with --ensemble), "
                         f"not {runs}")


def record(settings: EnsembleSettings, members: list[dict[str, Any]]) -> dict[str, Any]:
    """The header's ``ensemble`` field: the settings and each further run's record (digest, architecture, factor,
    adaptation)."""
    return {"lr": settings.lr, "runs": members}


MEMBER_FIELDS = {"run": str, "architecture": str, "factor": (int, float), "adapt": (dict, type(None)),
                 "adapt_digest": (str, type(None))}
MAX_FACTOR = 1e6  # the largest logit factor a header may record


def valid_factor(factor) -> bool:
    """Whether ``factor`` is a logit factor a header may record: a finite number from 0 (exclusive) to
    :data:`MAX_FACTOR` (an integer too large for a float is not)."""
    return isinstance(factor, (int, float)) and not isinstance(factor, bool) and 0 < factor <= MAX_FACTOR


def recorded(header: dict[str, Any], name: str = "the file") -> tuple[EnsembleSettings, list[dict[str, Any]]] | None:
    """The settings and the further runs' records a file's header gives (``None``: one run, as in files before
    version 13), or a one-line error where they are not those."""
    field = header.get("ensemble")
    if field is None:
        return None
    try:
        if not isinstance(field, dict) or set(field) != {"lr", "runs"} or not isinstance(field["runs"], list) \
                or not 1 <= len(field["runs"]) < MAX_RUNS:
            raise TypeError
        for entry in field["runs"]:
            if not isinstance(entry, dict) or set(entry) != set(MEMBER_FIELDS) \
                    or any(not isinstance(entry[k], t) or isinstance(entry[k], bool)
                           for k, t in MEMBER_FIELDS.items()) \
                    or not valid_factor(entry["factor"]):
                raise TypeError
        return EnsembleSettings(field["lr"]), [dict(entry) for entry in field["runs"]]
    except (TypeError, MoglmError):
        raise MoglmError(f"{name}: its header's ensemble is not one ({repr(field)[:200]}): damaged or forged") from None
