"""Shared test helpers: float64, small odd sizes, fixed seeds."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def grads_of(tensors):
    """Gradients of ``tensors`` (a list), with ``None`` for tensors that got none."""
    return [None if t.grad is None else t.grad.clone() for t in tensors]


def assert_close_all(actual, expected, **kw):
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert (a is None) == (e is None), f"item {i}: one gradient is missing"
        if a is not None:
            torch.testing.assert_close(a, e, **kw, msg=lambda m: f"item {i}: {m}")
