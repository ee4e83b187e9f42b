"""Hashing a context of tokens to a table slot, for the match model (:mod:`.match`) and the context mixer
(:mod:`.context_mixing`): the tokens as a polynomial in :data:`PRIME` (uint64, wrapping), then multiplicative
hashing (Knuth): the top ``bits`` bits of the key times 2^64 over the golden ratio. Part of both models' file
format: a change here changes what files decode to."""

from __future__ import annotations

import numpy as np

PRIME = np.uint64(1_000_003)  # a context's tokens are hashed as a polynomial in this
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # multiplicative hashing's constant (2^64 / the golden ratio)


def table_slots(keys: np.ndarray, bits: int) -> np.ndarray:
    """The table slots (int64, in ``[0, 2^bits)``) of the uint64 ``keys``, any shape."""
    return ((keys * _GOLDEN) >> np.uint64(64 - bits)).astype(np.int64)
