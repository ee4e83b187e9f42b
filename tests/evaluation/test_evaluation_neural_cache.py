"""The neural cache: the vectorised streaming cache against a plain-loop twin, streaming invariance, the
mixture's edge cases and normalisation, the search, and settings validation."""

from __future__ import annotations

import math

import numpy as np
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


def _step_twin(steps, streams, hidden, vocab, settings):
    """Random features, targets and model distributions, and the evaluation cache's mixed nll of the targets
    (the twin a StepCache with the one lambda ``settings.lam`` must match): ``[N, B, H]``, ``[N, B]``,
    ``[N, B, V]``, ``[N, B]``."""
    features = torch.randn(steps, streams, hidden, dtype=torch.float64)  # [N, B, H]
    targets = torch.randint(vocab, (steps, streams))  # [N, B]
    p_model = torch.rand(steps, streams, vocab, dtype=torch.float64).softmax(-1)  # [N, B, V]
    nll = -p_model.gather(2, targets[..., None])[..., 0].log()  # [N, B]
    return features, targets, p_model, NeuralCache(settings.size, streams).score(nll, features, targets, settings)


def test_the_step_cache_for_coding_gives_the_segment_caches_probabilities_of_every_token_in_float64():
    """StepCache (compression's: the whole next-token distribution, one step at a time, in a ring) against
    NeuralCache (the segment twin, checked above against a plain loop): at every step and in every stream,
    its mixture's probability of the token that came is the one NeuralCache scores, past the ring's wrap
    (odd sizes: 3 streams, 23 steps, a cache of 7), with one lambda to choose from; the distribution sums to one,
    and before any position it is the model's alone."""
    from moglm.evaluation.neural_cache import StepCache, StepCacheSettings

    steps, streams, hidden, vocab = 23, 3, 5, 6
    features, targets, p_model, expected = _step_twin(steps, streams, hidden, vocab, CacheSettings(0.8, 0.35, 7))
    cache = StepCache(StepCacheSettings(theta=0.8, size=7, lams=(0.35,)), streams, hidden, vocab, dtype=torch.float64)
    first = p_model[0].numpy()
    assert cache.distribution(features[0]) is None and cache.mix(first, features[0]) is first
    for t in range(steps):
        mixed = cache.mix(p_model[t].numpy(), features[t])  # [B, V]
        assert mixed.sum(axis=1) == pytest.approx([1.0] * streams, abs=1e-12)
        got = -torch.log(torch.from_numpy(mixed)[torch.arange(streams), targets[t]])  # [B]
        torch.testing.assert_close(got, expected[t], rtol=0, atol=1e-12)
        cache.append(features[t], targets[t])


@pytest.mark.parametrize("repeats", [True, False], ids=["repeats", "random"])
def test_the_step_caches_learnt_weight_codes_within_log_k_of_the_best_fixed_lambda(repeats):
    """The Bayesian mixture over lambdas: the code length of every stream is at most the best fixed lambda's in
    hindsight plus log(K) nats, and the weight goes where the text takes it: up on a text that repeats
    itself (the cache's features find the repeats, and the code is shorter than without a cache), towards the
    smallest lambda on targets the cache cannot predict."""
    from moglm.evaluation.neural_cache import StepCache, StepCacheSettings

    steps, streams, hidden, vocab = 120, 2, 4, 7
    lams = (0.0, 0.2, 0.5, 0.8)
    torch.manual_seed(3)
    if repeats:  # a period of 6 steps: the same feature is always followed by the same token
        period = torch.randn(6, streams, hidden, dtype=torch.float64)
        features = period.repeat(steps // 6, 1, 1)  # [N, B, H]
        targets = torch.randint(vocab, (6, streams)).repeat(steps // 6, 1)  # [N, B]
    else:
        features = torch.randn(steps, streams, hidden, dtype=torch.float64)
        targets = torch.randint(vocab, (steps, streams))
    p_model = torch.rand(steps, streams, vocab, dtype=torch.float64).softmax(-1).numpy()  # [N, B, V]
    cache = StepCache(StepCacheSettings(theta=2.0, size=30, lams=lams), streams, hidden, vocab, dtype=torch.float64)
    fixed = [StepCache(StepCacheSettings(theta=2.0, size=30, lams=(lam,)), streams, hidden, vocab,
                       dtype=torch.float64) for lam in lams]
    learnt, each = np.zeros(streams), np.zeros((len(lams), streams))
    rows = np.arange(streams)
    for t in range(steps):
        y = targets[t]
        learnt -= np.log(cache.mix(p_model[t], features[t])[rows, y.numpy()])
        cache.append(features[t], y)
        for k, one in enumerate(fixed):
            each[k] -= np.log(one.mix(p_model[t], features[t])[rows, y.numpy()])
            one.append(features[t], y)
    assert (learnt <= each.min(axis=0) + math.log(len(lams)) + 1e-9).all()
    if repeats:
        assert (learnt < each[0]).all()  # the learnt weight beats no cache at all
    weight = cache.weight()
    assert (weight > 0.7).all() if repeats else (weight < 0.2).all()


def test_the_step_caches_ring_grows_as_it_fills_and_gives_the_same_probabilities(monkeypatch):
    """The ring starts small and doubles up to its size (a forged header's huge size costs memory only for what is
    read): through the growths (4 -> 8 -> 11) and the wrap, every token's probability is the evaluation twin's."""
    from moglm.evaluation import neural_cache
    from moglm.evaluation.neural_cache import StepCache, StepCacheSettings

    monkeypatch.setattr(neural_cache, "FIRST_CAPACITY", 4)
    steps, streams, hidden, vocab = 40, 2, 3, 5
    features, targets, p_model, expected = _step_twin(steps, streams, hidden, vocab, CacheSettings(0.6, 0.3, 11))
    cache = StepCache(StepCacheSettings(theta=0.6, size=11, lams=(0.3,)), streams, hidden, vocab,
                      dtype=torch.float64)
    capacities = []
    for t in range(steps):
        mixed = torch.from_numpy(cache.mix(p_model[t].numpy(), features[t]))  # [B, V]
        torch.testing.assert_close(-mixed[torch.arange(streams), targets[t]].log(), expected[t], rtol=0, atol=1e-12)
        cache.append(features[t], targets[t])
        capacities.append(cache._keys.shape[2])
    assert sorted(set(capacities)) == [4, 8, 11]
