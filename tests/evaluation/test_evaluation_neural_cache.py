"""The neural cache: the vectorised streaming cache against a plain-loop twin, streaming invariance, the
mixture's edge cases and normalisation, the search, and settings validation."""

from __future__ import annotations

import math

import pytest
import torch

from moglm.errors import MoglmError
from moglm.evaluation.neural_cache import CacheSettings, NeuralCache, cache_nll, search_cache


def _reference(nll, features, targets, theta, lam, size):
    """Plain-loop twin of one stream: nll [N], features [N, H], targets [N] -> mixed nll [N] (floats)."""
    out = []
    for t in range(len(nll)):
        window = range(max(0, t - size), t)
        p_model = math.exp(-float(nll[t]))
        if not window:
            out.append(float(nll[t]))
            continue
        weights = {i: math.exp(theta * float(features[t] @ features[i])) for i in window}
        p_cache = sum(w for i, w in weights.items() if targets[i] == targets[t]) / sum(weights.values())
        out.append(-math.log((1 - lam) * p_model + lam * p_cache))
    return torch.tensor(out, dtype=torch.float64)


def _data(n, b, h, vocab):
    nll = torch.rand(n, b, dtype=torch.float64) * 3  # [N, B]
    features = torch.randn(n, b, h, dtype=torch.float64)  # [N, B, H]
    targets = torch.randint(vocab, (n, b))  # [N, B]
    return nll, features, targets


def _mix_in_segments(cache, nll, features, targets, lengths, thetas, lams):
    parts, start = [], 0
    for length in lengths:
        parts.append(cache.mix(nll[start : start + length], features[start : start + length],
                               targets[start : start + length], thetas, lams))
        start += length
    assert start == nll.shape[0]
    return torch.cat(parts, 2)  # [thetas, lams, N, B]


def test_vectorised_cache_matches_plain_loop_twin_across_segments_streams_and_settings():
    n, b, size, segment = 37, 3, 7, 4
    nll, features, targets = _data(n, b, 5, vocab=4)
    thetas, lams = [0.0, 0.3, 1.7], [0.0, 0.1, 0.45]
    cache = NeuralCache(size, streams=b)
    mixed = _mix_in_segments(cache, nll, features, targets, [segment] * 9 + [1], thetas, lams)
    assert mixed.shape == (3, 3, n, b) and mixed.dtype == torch.float64
    for a, theta in enumerate(thetas):
        for c, lam in enumerate(lams):
            for s in range(b):
                expected = _reference(nll[:, s], features[:, s], targets[:, s], theta, lam, size)
                torch.testing.assert_close(mixed[a, c, :, s], expected, rtol=0, atol=1e-10)
            settings = CacheSettings(theta, lam, size)
            one = cache_nll(nll[:, 1], features[:, 1], targets[:, 1], settings, segment=segment)  # [N]
            torch.testing.assert_close(one, mixed[a, c, :, 1], rtol=0, atol=1e-10)
    assert cache._keys.shape == (b, size, 5)  # memory bounded by size


def test_streaming_in_uneven_segments_equals_one_segment():
    nll, features, targets = _data(41, 2, 6, vocab=5)
    thetas, lams = [0.2, 2.0], [0.05, 0.3]
    whole = NeuralCache(9, 2).mix(nll, features, targets, thetas, lams)
    pieces = _mix_in_segments(NeuralCache(9, 2), nll, features, targets, [1, 3, 13, 2, 8, 14], thetas, lams)
    torch.testing.assert_close(pieces, whole, rtol=0, atol=1e-12)


def test_lambda_zero_is_the_model_and_a_streams_first_position_is_unchanged():
    nll, features, targets = _data(12, 2, 4, vocab=3)
    cache = NeuralCache(5, 2)
    mixed = cache.mix(nll, features, targets, [0.0, 1.0], [0.0, 0.2, 0.9])
    assert torch.equal(mixed[:, 0], nll.expand(2, 12, 2))
    assert torch.equal(mixed[:, :, 0], nll[0].expand(2, 3, 2))
    assert torch.equal(cache.mix(nll[:3], features[:3], targets[:3], [1.0], [0.0])[0, 0], nll[:3])
    cache.reset()  # episodic: the next segment starts a fresh stream
    assert torch.equal(cache.mix(nll[:3], features[:3], targets[:3], [1.0], [0.5])[0, 0, 0], nll[0])


def test_mixed_probabilities_of_every_target_sum_to_one():
    vocab, n = 5, 9
    _, features, targets = _data(n, 1, 4, vocab=vocab - 1)  # history never shows the last word
    p_model = torch.rand(vocab, dtype=torch.float64).softmax(0)  # [V] full distribution at the last position
    for settings in (CacheSettings(0.7, 0.35, 6), CacheSettings(0.0, 0.1, 3), CacheSettings(3.0, 0.9, 50)):
        total = 0.0
        for w in range(vocab):
            ys = targets[:, 0].clone()
            ys[-1] = w
            nll = torch.full((n,), 1.0, dtype=torch.float64)
            nll[-1] = -p_model[w].log()
            total += math.exp(-float(cache_nll(nll, features[:, 0], ys, settings, segment=4)[-1]))
        assert total == pytest.approx(1.0, abs=1e-12)


def test_search_finds_a_helpful_cache_on_repeats_and_none_on_unseen_targets():
    vocab, n = 8, 300
    pattern = torch.randperm(vocab)
    inputs = pattern[torch.arange(n) % vocab]  # [N]: a repeating pattern
    targets = pattern[(torch.arange(n) + 1) % vocab]  # [N]
    features = torch.nn.functional.one_hot(inputs, vocab).double()  # [N, V]: identical per input
    nll = torch.full((n,), math.log(vocab), dtype=torch.float64)  # uniform model
    found = search_cache(nll, features, targets, size=50, segment=32)
    assert found.best.lam > 0 and found.xent < found.base_xent - 0.5
    assert found.base_xent == pytest.approx(math.log(vocab))
    assert len(found.trials) == 9 * 10 and min(r["xent"] for r in found.trials) == found.xent
    # the same stream as 3 stripes ([N, B] / [N, B, H]) also finds the cache
    striped = search_cache(nll.view(3, 100).T, features.view(3, 100, vocab).transpose(0, 1),
                           targets.view(3, 100).T, size=50, thetas=(0.3, 3.0), lams=(0.1, 0.4))
    assert striped.xent < striped.base_xent and len(striped.trials) == 4

    unseen = torch.arange(n)  # [N]: no target ever repeats
    random_features = torch.randn(n, 6, dtype=torch.float64)  # [N, H]
    nll = torch.rand(n, dtype=torch.float64) * 4
    found = search_cache(nll, random_features, unseen, size=50, segment=32)
    assert found.xent >= found.base_xent


@pytest.mark.parametrize("kw", [{"lam": 1.0}, {"lam": -0.1}, {"theta": -0.5}, {"theta": math.inf},
                                {"size": 0}, {"size": 2.5}])
def test_bad_settings_raise_moglm_error(kw):
    with pytest.raises(MoglmError):
        CacheSettings(**kw)


def test_bad_cache_arguments_raise_moglm_error():
    with pytest.raises(MoglmError):
        NeuralCache(0)
    nll, features, targets = _data(4, 2, 3, vocab=3)
    with pytest.raises(MoglmError):
        NeuralCache(5, 3).mix(nll, features, targets, [0.1], [0.1])  # wrong number of streams
    with pytest.raises(MoglmError):
        NeuralCache(5, 2).mix(nll, features, targets, [0.1], [1.0])
    with pytest.raises(MoglmError):
        NeuralCache(5, 2).score(nll, features, targets, CacheSettings(size=6))
