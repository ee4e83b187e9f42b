"""Dynamic evaluation on tiny models: lr 0 is static, each update rule is the thesis' formula, the model
is never changed, sparse matrices act inside the recurrence, divergence is caught, episodes reset."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from moglm.dynamic_evaluation import (
    RULES,
    DynamicEvaluator,
    Hyperparameters,
    SparseSpec,
    StatisticsSettings,
    dynamic_evaluate,
    gradient_rms,
)
from moglm.dynamic_evaluation.analysis import position_profile
from moglm.dynamic_evaluation.search import coordinate_search
from moglm.dynamic_evaluation.sparse import AdaptedCell
from moglm.errors import MoglmError
from moglm.evaluation.stream import evaluate_episodes, evaluate_stream
from moglm.model.language_model import LanguageModel
from moglm.recurrence import gemm

V = 23


def _model(dtype=torch.float32, architecture="mogrifier"):
    torch.manual_seed(0)
    options = {"rounds": 3, "rank": 4} if architecture == "mogrifier" else {}
    return LanguageModel(V, 12, 2, architecture, options, init="paper").to(dtype).eval()


def _ids(n=301, seed=0):
    """A stream with repetition (so adaptation helps) and an end-of-line token 0 every 10-20 tokens."""
    rng = np.random.RandomState(seed)
    ids = np.tile(rng.randint(1, V, 37), n // 37 + 1)[:n]
    ids[rng.rand(n) < 0.07] = 0
    return ids


def _rms(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {n: torch.rand(p.shape, generator=g, dtype=p.dtype) * 1e-2 + 1e-3 for n, p in model.named_parameters()}


def _state_dict(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


# -- lr = 0 is static; the model is never changed ---------------------------------------------------------
@pytest.mark.parametrize("rule", RULES)
def test_lr_zero_gives_exactly_the_static_result(rule):
    model, ids = _model(), _ids()
    result = dynamic_evaluate(model, ids, Hyperparameters(rule=rule, lr=0.0, segment_length=7), _rms(model))
    assert result.rollbacks == 0
    torch.testing.assert_close(result.losses, result.static_losses, rtol=1e-5, atol=1e-5)
    saved = gemm.ONEDNN
    gemm.ONEDNN = False  # the same products, windows and state carrying as the segments: bit for bit
    try:
        scores, losses = evaluate_stream(model, ids, 1, 7, per_token=True)
    finally:
        gemm.ONEDNN = saved
    assert torch.equal(result.losses, losses) and result.scores.nll == scores.nll


@pytest.mark.parametrize("sparse", [None, SparseSpec(5)])
def test_the_model_weights_are_unchanged_after_evaluation(sparse):
    model, ids = _model(), _ids()
    before = _state_dict(model)
    rms = None if sparse else _rms(model)
    hp = Hyperparameters(rule="sgd", lr=0.05) if sparse else Hyperparameters(lr=1e-3)
    result = dynamic_evaluate(model, ids, hp, rms, sparse=sparse)
    assert result.scores.xent != result.static.xent  # it did adapt
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not model.training and all(isinstance(c, type(model.rnn.cells[0])) for c in model.rnn.cells)


def test_adaptation_to_a_repetitive_stream_lowers_the_loss():
    model, ids = _model(), _ids(300)
    result = dynamic_evaluate(model, ids, Hyperparameters(rule="sgd", lr=0.5, segment_length=5))
    assert result.scores.xent < result.static.xent - 0.1 and result.gain > 0.1


# -- each rule is the thesis' formula --------------------------------------------------------------------
def _reference_steps(model, hp, rms, segments):
    """Two plain-Python updates with thesis eq. 4.3-4.7 and 5.10-5.12 (docs/method.md, "Update rules"), in
    float64."""
    names = [n for n, _ in model.named_parameters()]
    theta0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    theta = {n: t.clone() for n, t in theta0.items()}
    velocity = {n: torch.zeros_like(t) for n, t in theta0.items()}  # sgd-momentum's v
    square = {n: torch.zeros_like(t) for n, t in theta0.items()}  # rmsprop's MS
    r = {n: rms[n] for n in names}
    mean_rms = torch.cat([r[n].flatten() for n in names]).mean()
    state = None
    work = _model(torch.float64)
    for inputs, targets in segments:
        work.load_state_dict(theta, strict=False)
        params = [dict(work.named_parameters())[n] for n in names]
        nll, state = work.nll(inputs, targets, state)
        grads = dict(zip(names, torch.autograd.grad(nll.mean(), params)))
        state = tuple(s.detach() for s in state)
        for n in names:
            g, th = grads[n], theta[n]
            if hp.rule == "sgd-momentum":
                velocity[n] = hp.momentum * velocity[n] - hp.lr * g
                step = -velocity[n]
            elif hp.rule == "rmsprop":
                square[n] = hp.alpha * square[n] + (1 - hp.alpha) * g * g
                step = hp.lr * g / (square[n].sqrt() + hp.eps)
            else:
                step = hp.lr * g if hp.rule.startswith("sgd") else hp.lr * g / (r[n] + hp.eps)
            if hp.rule in ("sgd", "rms", "sgd-momentum", "rmsprop"):
                decay = 0.0
            elif hp.rule == "rms-rmsdecay":
                decay = hp.decay * torch.minimum(torch.full_like(th, 1 / hp.decay), r[n] / mean_rms)
            else:
                decay = hp.decay
            theta[n] = th - step + decay * (theta0[n] - th)
    return theta


@pytest.mark.parametrize("rule", RULES)
def test_each_rule_matches_a_hand_computed_step(rule):
    model = _model(torch.float64)
    rms = _rms(model)
    hp = Hyperparameters(rule=rule, lr=0.3 if rule.startswith("sgd") else 2e-3, decay=0.2, eps=1e-3, segment_length=4)
    ids = torch.as_tensor(_ids(9)).view(-1, 1)
    segments = [(ids[0:4], ids[1:5]), (ids[4:8], ids[5:9])]
    evaluator = DynamicEvaluator(model, hp, rms)
    state = None
    for inputs, targets in segments:
        _, state = evaluator.step(inputs, targets, state)
    expected = _reference_steps(model, hp, rms, segments)
    got = dict(zip(evaluator.adapted.names, evaluator.params))
    for n, value in expected.items():
        torch.testing.assert_close(got[n].detach(), value, rtol=1e-9, atol=1e-12, msg=lambda m: f"{rule} {n}: {m}")
    assert any(not torch.equal(expected[n], p) for n, p in model.named_parameters())  # the step moved


def test_rms_decay_weights_are_clipped_at_one():
    model = _model()
    rms = {n: torch.full_like(p, 1.0) for n, p in model.named_parameters()}
    rms["embedding.weight"][0, 0] = 1e6  # far above the mean: lam * rms_norm > 1 is clipped to 1
    evaluator = DynamicEvaluator(model, Hyperparameters(decay=0.5), rms)
    weights = dict(zip(evaluator.adapted.names, evaluator.rule.decay_weight))
    assert float(weights["embedding.weight"][0, 0]) == 1.0 and float(weights["embedding.weight"].max()) <= 1.0


# -- sparse dynamic evaluation ---------------------------------------------------------------------------
def test_sparse_with_zero_matrices_equals_static():
    model, ids = _model(), _ids()
    result = dynamic_evaluate(model, ids, Hyperparameters(rule="sgd", lr=0.0), sparse=SparseSpec(6))
    torch.testing.assert_close(result.losses, result.static_losses, rtol=1e-5, atol=1e-5)


def test_the_adaptation_matrix_acts_inside_the_recurrence():
    """h'_t = h_t + M h_t on the first H units replaces h_t for the next step and the layer's output."""
    model = _model(torch.float64)
    cell = model.rnn.cells[0]
    params = model.rnn.layer_parameters(0)
    m = torch.randn(4, 4, dtype=torch.float64) * 0.3
    wrapped = AdaptedCell(cell, m)
    x = torch.randn(3, 2, cell.input_size, dtype=torch.float64)  # [T, B, m]
    state = cell.zero_state(2, x)
    outputs = []
    for t in range(3):  # by hand: the cell's step, then the transform, which the next step sees
        h, state = cell.step(params, x[t], state)
        h = torch.cat([h[:, :4] + h[:, :4] @ m.t(), h[:, 4:]], 1)
        state = (h, *state[1:])
        outputs.append(h)
    got, wstate = [], wrapped.zero_state(2, x)
    for t in range(3):
        h, wstate = wrapped.step(params, x[t], wstate)
        got.append(h)
    torch.testing.assert_close(torch.stack(got), torch.stack(outputs))
    torch.testing.assert_close(wstate[1], state[1])


def test_sparse_streams_adapt_independent_matrices():
    """With two streams each stripe's matrix moves exactly as it would with that stripe alone."""
    model, ids = _model(torch.float64), _ids(200)
    hp = Hyperparameters(rule="sgd", lr=0.5, segment_length=5)
    both = DynamicEvaluator(model, hp, sparse=SparseSpec(5), streams=2)
    alone = DynamicEvaluator(model, hp, sparse=SparseSpec(5), streams=1)
    data = torch.as_tensor(ids).view(2, -1).t()  # [L, 2]: the two stripes
    s2 = s1 = None
    for start in range(0, 20, 5):
        _, s2 = both.step(data[start : start + 5], data[start + 1 : start + 6], s2)
        _, s1 = alone.step(data[start : start + 5, :1], data[start + 1 : start + 6, :1], s1)
    for m2, m1 in zip(both.params, alone.params):
        torch.testing.assert_close(m2[0], m1[0])
        assert not torch.equal(m2[1], m1[0])


def test_sparse_statistics_and_evaluation_run_with_several_streams():
    model, ids = _model(), _ids(400)
    rms = gradient_rms(model, ids, StatisticsSettings(fraction=1.0, batch_size=2, bptt=20), SparseSpec(5))
    assert sorted(rms) == ["sparse_M_l0", "sparse_M_l1"] and all(r.shape == (5, 5) for r in rms.values())
    result = dynamic_evaluate(model, ids, Hyperparameters(lr=1e-3), rms, sparse=SparseSpec(5), streams=3)
    assert result.losses.shape[1] == 3 and math.isfinite(result.scores.xent)


# -- divergence ------------------------------------------------------------------------------------------
def test_a_huge_learning_rate_gives_a_finite_result_and_counts_rollbacks():
    model, ids = _model(), _ids()
    result = dynamic_evaluate(model, ids, Hyperparameters(rule="sgd", lr=1e7, segment_length=5))
    assert math.isfinite(result.scores.xent) and math.isfinite(result.scores.perplexity)
    assert result.rollbacks > 0 and result.lr_scale < 1
    assert torch.isfinite(result.losses).all()


def test_non_finite_weights_are_rolled_back_and_the_segment_rescored(monkeypatch):
    model, ids = _model(), _ids(101)
    evaluator = DynamicEvaluator(model, Hyperparameters(rule="sgd", lr=0.1, segment_length=5))
    calls = {"n": 0}
    apply = evaluator.rule.apply

    def poisoned(params, grads):
        apply(params, grads)
        calls["n"] += 1
        if calls["n"] == 3:
            with torch.no_grad():
                params[0].fill_(float("nan"))

    monkeypatch.setattr(evaluator.rule, "apply", poisoned)
    data, state, losses = torch.as_tensor(ids).view(-1, 1), None, []
    for start in range(0, 100, 5):
        nll, state = evaluator.step(data[start : start + 5], data[start + 1 : start + 6], state)
        losses.append(nll)
    assert evaluator.rollbacks == 1 and evaluator.rescored == 1
    assert torch.isfinite(torch.cat(losses)).all()


# -- episodic mode ---------------------------------------------------------------------------------------
def test_episodic_lr_zero_equals_static_episodes():
    model, ids = _model(), _ids(150)
    result = dynamic_evaluate(model, ids, Hyperparameters(rule="sgd", lr=0.0, segment_length=4), boundary=0)
    assert result.episodes is not None and sum(result.episodes) == len(ids) == result.scores.tokens
    assert result.scores.xent == pytest.approx(evaluate_episodes(model, ids, 0).xent, rel=1e-5)


def test_episodes_reset_weights_and_state():
    """A sequence scores the same whatever came before it."""
    model, ids = _model(), _ids(120)
    hp = Hyperparameters(rule="sgd-decay", lr=0.5, decay=0.1, segment_length=3)
    ends = np.flatnonzero(ids == 0)
    first_end = int(ends[0]) + 1
    whole = dynamic_evaluate(model, ids, hp, boundary=0)
    rest = dynamic_evaluate(model, ids[first_end:], hp, boundary=0)
    assert whole.hyperparameters.decay == 0.0  # decay 0 in episodic mode
    torch.testing.assert_close(whole.losses[first_end:], rest.losses)
    assert not torch.allclose(whole.losses, whole.static_losses)  # it did adapt within sequences


# -- bad input, search, analysis -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"segment_length": 0}, "segment length must be an integer >= 1"),
        ({"rule": "adam"}, "unknown dynamic-evaluation rule 'adam'"),
        ({"lr": float("nan")}, "lr must be a finite number >= 0"),
        ({"eps": 0.0}, "eps must be > 0 for rule rms-rmsdecay"),
    ],
)
def test_bad_hyperparameters_are_clear_errors(kwargs, message):
    with pytest.raises(MoglmError, match=message):
        Hyperparameters(**kwargs)


def test_rms_rules_without_statistics_are_a_clear_error():
    with pytest.raises(MoglmError, match="needs the global RMS gradient statistics"):
        dynamic_evaluate(_model(), _ids(), Hyperparameters(rule="rms"))


def test_statistics_need_enough_training_data():
    with pytest.raises(MoglmError, match="too few"):
        gradient_rms(_model(), _ids(10), StatisticsSettings(fraction=0.1, batch_size=4))


def test_coordinate_search_finds_the_grid_minimum_without_trying_everything():
    target = {"lr": 3e-5, "decay": 1e-4, "eps": 1e-6, "segment_length": 10}

    def score(hp):
        d = sum(abs(math.log(getattr(hp, k) / v)) for k, v in target.items())
        return d, {"xent": d}

    best, trials = coordinate_search(score, Hyperparameters(), log=lambda s: None)
    assert {k: getattr(best, k) for k in target} == target
    assert len(trials) < 30


def test_position_profile_bins_and_cumulative_means():
    static = torch.ones(10, 2)
    dynamic = torch.linspace(1, 0, 10).view(-1, 1).expand(10, 2)
    p = position_profile(static, dynamic, points=5)
    assert p["bin_width"] == 2 and p["bin_start"] == [0, 2, 4, 6, 8] and p["static"] == [1.0] * 5
    assert p["dynamic"][0] > p["dynamic"][-1] and p["static_cumulative"][-1] == 1.0
    episodic = position_profile(torch.ones(6, 1), torch.zeros(6, 1), episodes=[4, 2], points=10)
    assert episodic["bin_width"] == 1 and episodic["static"] == [1.0] * 4 and episodic["dynamic"] == [0.0] * 4


# -- MC dropout with dynamic evaluation (Mogrifier paper, tables 1-2) ------------------------------------
def _dropout_model(rate):
    torch.manual_seed(0)
    return LanguageModel(V, 12, 2, "mogrifier", {"rounds": 3, "rank": 4}, init="paper", input_dropout=rate,
                         output_dropout=rate).eval()


def test_mc_dynamic_without_dropout_equals_dynamic_evaluation():
    """With every dropout rate 0 the S samples are identical, so their mean probability is each one's:
    the scores, the per-token losses and the updates are those of plain dynamic evaluation."""
    model, ids = _dropout_model(0.0), _ids()
    hp = Hyperparameters(rule="sgd", lr=0.05, segment_length=7)
    plain = dynamic_evaluate(model, ids, hp, streams=2)
    mc = dynamic_evaluate(model, ids, hp, streams=2, mc_samples=3)
    torch.testing.assert_close(mc.losses, plain.losses, rtol=1e-5, atol=1e-5)
    assert mc.scores.xent == pytest.approx(plain.scores.xent, rel=1e-6)


def test_mc_dynamic_averages_the_probabilities_of_dropout_samples():
    """One segment, lr 0: the loss is -log of the mean over samples of each sample's probability, drawn
    with the same masks as a hand-run pass of S rows in train mode."""
    model, ids = _dropout_model(0.5), _ids(40)
    evaluator = DynamicEvaluator(model, Hyperparameters(rule="sgd", lr=0.0, segment_length=40), mc_samples=4,
                                 mc_multiplier=0.5)
    inputs = torch.as_tensor(ids[:-1]).view(-1, 1)
    targets = torch.as_tensor(ids[1:]).view(-1, 1)
    torch.manual_seed(5)
    nll, state = evaluator.step(inputs, targets)  # [T, 1]
    work = evaluator.model
    work.train()
    torch.manual_seed(5)
    with torch.no_grad(), work.dropout_scaled(0.5):
        samples, _ = work.nll(inputs.expand(-1, 4), targets.expand(-1, 4))  # [T, 4]
    work.eval()
    expected = -(torch.logsumexp(-samples, 1, keepdim=True) - math.log(4))  # [T, 1]
    torch.testing.assert_close(nll, expected, rtol=1e-5, atol=1e-5)
    assert not evaluator.model.training


@pytest.mark.parametrize("kwargs, message", [
    ({"mc_samples": -1}, "MC-dropout samples"),
    ({"mc_samples": 2, "mc_multiplier": 0.0}, "multiplier"),
    ({"mc_samples": 2, "sparse": SparseSpec(4)}, "sparse"),
])
def test_bad_mc_dynamic_settings_are_clear_errors(kwargs, message):
    with pytest.raises(MoglmError, match=message):
        dynamic_evaluate(_model(), _ids(), Hyperparameters(rule="sgd"), **kwargs)
