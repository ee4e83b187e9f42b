"""The optimisers of Krause thesis 5.4 as dynamic-evaluation rules: ``sgd-momentum`` and ``rmsprop`` are the
thesis's equations (5.10-5.12) step for step, momentum 0 is SGD, RMSprop with a huge eps is SGD, their
state restarts on a rollback or reset, RMSprop needs no training statistics, bad settings are one-line
errors; ``moglm dyneval`` takes the rules and their options; non-local RMSprop fed by the scored text itself
is local RMSprop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import dyneval_report
from moglm.dynamic_evaluation import DynamicEvaluator, Hyperparameters, dynamic_evaluate, static_pass
from moglm.dynamic_evaluation.search import GRIDS, grid_for
from moglm.dynamic_evaluation.update_rules import UpdateRule, uses_eps, uses_rms
from moglm.errors import MoglmError
from moglm.model.language_model import LanguageModel

V = 23


def _model(dtype=torch.float64):
    torch.manual_seed(0)
    return LanguageModel(V, 12, 2, "mogrifier", {"rounds": 3, "rank": 4}, init="paper").to(dtype).eval()


def _ids(n=121, seed=0):
    rng = np.random.RandomState(seed)
    return np.tile(rng.randint(1, V, 17), n // 17 + 1)[:n]


def _tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64)]


def _gradients(steps=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64)]
            for _ in range(steps)]


def _close(got, want):
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


# -- each new rule is the thesis's equation --------------------------------------------------------------
def test_sgd_momentum_is_eq_5_10_and_5_11():
    hp = Hyperparameters(rule="sgd-momentum", lr=0.1, momentum=0.7)
    theta0 = _tensors()
    params = [p.clone() for p in theta0]
    rule = UpdateRule(hp, [p.clone() for p in theta0])
    want = [p.clone() for p in theta0]
    velocity = [torch.zeros_like(p) for p in theta0]
    for grads in _gradients():
        rule.apply(params, grads)
        for i, g in enumerate(grads):  # v <- mu v - lr g; th <- th + v
            velocity[i] = 0.7 * velocity[i] - 0.1 * g
            want[i] = want[i] + velocity[i]
        _close(params, want)
    _close(rule.velocity, velocity)


def test_rmsprop_is_eq_5_12_without_bias_correction():
    hp = Hyperparameters(rule="rmsprop", lr=0.01, alpha=0.9, eps=1e-3)
    theta0 = _tensors()
    params = [p.clone() for p in theta0]
    rule = UpdateRule(hp, [p.clone() for p in theta0])
    want = [p.clone() for p in theta0]
    square = [torch.zeros_like(p) for p in theta0]
    for grads in _gradients():
        rule.apply(params, grads)
        for i, g in enumerate(grads):  # MS <- alpha MS + (1 - alpha) g^2; th <- th - lr g / (sqrt(MS) + eps)
            square[i] = 0.9 * square[i] + 0.1 * g * g
            want[i] = want[i] - 0.01 * g / (square[i].sqrt() + 1e-3)
        _close(params, want)


def test_rmsprop_is_pytorchs_rmsprop():
    theta0 = _tensors()
    params = [p.clone() for p in theta0]
    rule = UpdateRule(Hyperparameters(rule="rmsprop", lr=0.01, alpha=0.99, eps=1e-8), [p.clone() for p in theta0])
    reference = [p.clone().requires_grad_() for p in theta0]
    optimiser = torch.optim.RMSprop(reference, lr=0.01, alpha=0.99, eps=1e-8)
    for grads in _gradients():
        rule.apply(params, grads)
        for p, g in zip(reference, grads):
            p.grad = g.clone()
        optimiser.step()
    _close(params, [p.detach() for p in reference])


def test_statistics_gradients_feed_only_the_mean_square():
    hp = Hyperparameters(rule="rmsprop", lr=0.01, alpha=0.9, eps=1e-3)
    theta0 = _tensors()
    params = [p.clone() for p in theta0]
    rule = UpdateRule(hp, [p.clone() for p in theta0])
    grads, other = _gradients(1, seed=1)[0], _gradients(1, seed=2)[0]
    rule.apply(params, grads, statistics_grads=other)
    _close(rule.mean_square, [0.1 * o * o for o in other])
    _close(params, [p - 0.01 * g / ((0.1 * o * o).sqrt() + 1e-3) for p, g, o in zip(theta0, grads, other)])


# -- limits: momentum 0 is SGD; a huge eps is SGD -----------------------------------------------------------
def _evaluate(hp, ids=None):
    evaluator = DynamicEvaluator(_model(), hp)
    state = None
    data = torch.as_tensor(_ids() if ids is None else ids).view(-1, 1)
    losses = []
    for start in range(0, 100, 10):
        nll, state = evaluator.step(data[start : start + 10], data[start + 1 : start + 11], state)
        losses.append(nll)
    return evaluator, torch.cat(losses)


def test_momentum_zero_is_exactly_sgd():
    sgd, sgd_losses = _evaluate(Hyperparameters(rule="sgd", lr=0.2, segment_length=10))
    momentum, momentum_losses = _evaluate(Hyperparameters(rule="sgd-momentum", lr=0.2, momentum=0.0,
                                                          segment_length=10))
    assert torch.equal(sgd_losses, momentum_losses)
    assert all(torch.equal(a, b) for a, b in zip(sgd.params, momentum.params))


def test_rmsprop_with_a_huge_eps_and_the_lr_scaled_by_it_is_sgd():
    eps = 1e12
    sgd, sgd_losses = _evaluate(Hyperparameters(rule="sgd", lr=0.2, segment_length=10))
    rmsprop, rmsprop_losses = _evaluate(Hyperparameters(rule="rmsprop", lr=0.2 * eps, eps=eps, segment_length=10))
    torch.testing.assert_close(rmsprop_losses, sgd_losses, rtol=1e-10, atol=1e-12)
    for a, b in zip(sgd.params, rmsprop.params):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert not torch.equal(sgd_losses[-10:], _evaluate(Hyperparameters(rule="sgd", lr=0.0, segment_length=10))[1][-10:])


# -- state: zero after a rollback or a reset ----------------------------------------------------------------
@pytest.mark.parametrize("rule", ["sgd-momentum", "rmsprop"])
def test_rollback_and_reset_zero_the_state(rule):
    evaluator, _ = _evaluate(Hyperparameters(rule=rule, lr=1e-3, segment_length=10))
    state = evaluator.rule.velocity if rule == "sgd-momentum" else evaluator.rule.mean_square
    assert any(float(s.abs().sum()) > 0 for s in state)
    evaluator.rollback()
    assert all(float(s.abs().sum()) == 0 for s in state) and evaluator.rule.lr_scale == 0.5
    data = torch.as_tensor(_ids()).view(-1, 1)
    evaluator.step(data[:10], data[1:11])
    assert any(float(s.abs().sum()) > 0 for s in state)
    evaluator.reset()
    assert all(float(s.abs().sum()) == 0 for s in state) and evaluator.rule.lr_scale == 1.0


def test_a_diverging_momentum_run_rolls_back_and_restarts_its_velocity():
    model, ids = _model(torch.float32), _ids(400)
    result = dynamic_evaluate(model, ids, Hyperparameters(rule="sgd-momentum", lr=50.0, momentum=0.9,
                                                          segment_length=5))
    assert result.rollbacks > 0 and torch.isfinite(result.losses).all()


# -- statistics, settings, grids ----------------------------------------------------------------------------
def test_rmsprop_needs_no_training_statistics():
    assert not uses_rms("rmsprop") and uses_eps("rmsprop") and uses_rms("rms") and not uses_eps("sgd-momentum")
    model, ids = _model(torch.float32), _ids(200)
    result = dynamic_evaluate(model, ids, Hyperparameters(rule="rmsprop", lr=1e-3, segment_length=10))
    assert result.scores.xent != result.static.xent
    with pytest.raises(MoglmError, match="needs the global RMS gradient statistics"):
        dynamic_evaluate(model, ids, Hyperparameters(rule="rms"))


@pytest.mark.parametrize("settings, message", [
    ({"rule": "sgd-momentum", "momentum": 1.0}, r"momentum must be in \[0, 1\), got 1.0"),
    ({"rule": "sgd-momentum", "momentum": -0.1}, r"momentum must be in \[0, 1\), got -0.1"),
    ({"rule": "rmsprop", "alpha": 1.0}, r"alpha must be in \(0, 1\), got 1.0"),
    ({"rule": "rmsprop", "alpha": 0}, r"alpha must be in \(0, 1\), got 0"),
    ({"rule": "rmsprop", "alpha": float("nan")}, r"alpha must be in \(0, 1\), got nan"),
    ({"rule": "rmsprop", "eps": 0.0}, r"eps must be > 0 for rule rmsprop"),
])
def test_bad_momentum_alpha_and_eps_are_one_line_errors(settings, message):
    with pytest.raises(MoglmError, match=message) as info:
        Hyperparameters(**settings)
    assert "\n" not in str(info.value)


def test_settings_name_only_what_the_rule_uses_and_read_back():
    assert Hyperparameters(rule="sgd-momentum", momentum=0.9).as_dict() == {
        "rule": "sgd-momentum", "lr": 0.03, "segment_length": 20, "momentum": 0.9}
    assert Hyperparameters(rule="rmsprop").as_dict() == {"rule": "rmsprop", "lr": 1e-4, "eps": 1e-3,
                                                          "segment_length": 20, "alpha": 0.99}
    assert set(Hyperparameters().as_dict()) == {"rule", "lr", "decay", "eps", "segment_length"}
    for hp in (Hyperparameters(rule="sgd-momentum", momentum=0.9), Hyperparameters(rule="rmsprop", alpha=0.5)):
        assert Hyperparameters(**hp.as_dict()) == hp


def test_search_grids_of_the_new_rules():
    assert grid_for("lr", Hyperparameters(rule="sgd-momentum")) == GRIDS["lr_sgd"]
    rmsprop = Hyperparameters(rule="rmsprop")
    assert grid_for("lr", rmsprop) == GRIDS["lr_rmsprop"] and grid_for("decay", rmsprop) == ()
    assert min(grid_for("eps", rmsprop)) == 1e-8 and max(grid_for("eps", rmsprop)) == 1.0  # thesis table 5.5
    assert grid_for("eps", Hyperparameters(rule="sgd-momentum")) == ()


# -- non-local RMSprop (the optimisers experiment) --------------------------------------------------------------
def test_nonlocal_rmsprop_fed_by_the_scored_text_is_local_rmsprop():
    from moglm.dynamic_evaluation.evaluate import nonlocal_rmsprop

    model, ids = _model(), _ids(161)
    hp = Hyperparameters(rule="rmsprop", lr=3e-3, eps=1e-2, segment_length=10)
    static = static_pass(model, ids, 1, 10)
    local = dynamic_evaluate(model, ids, hp, static=static)
    same = nonlocal_rmsprop(model, ids, hp, ids, static)
    assert torch.equal(same.losses, local.losses) and local.rollbacks == 0
    other = nonlocal_rmsprop(model, ids, hp, _ids(300, seed=5), static)
    assert not torch.equal(other.losses, local.losses) and other.scores.xent != static.scores.xent


def test_nonlocal_statistics_need_rmsprop():
    from moglm.dynamic_evaluation.evaluate import nonlocal_rmsprop

    model, ids = _model(), _ids(60)
    with pytest.raises(MoglmError, match="not rule sgd"):
        nonlocal_rmsprop(model, ids, Hyperparameters(rule="sgd"), ids, static_pass(model, ids, 1, 20))


# -- moglm dyneval ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from conftest import tiny_trained_run

    return tiny_trained_run(tmp_path_factory.mktemp("optimisers"), max_steps=8, eval_every=4)


def test_dyneval_cli_takes_the_new_rules_and_their_options(tiny_run, capsys):
    from moglm.cli import main

    assert main(["dyneval", str(tiny_run), "--rule", "rmsprop", "--alpha", "0.9", "--eps", "0.01",
                 "--learning-rate", "1e-3", "--eval-tokens", "60", "--no-progress"]) == 0
    report = dyneval_report(tiny_run, "full-first60")
    assert report["hyperparameters"] == {"rule": "rmsprop", "lr": 1e-3, "eps": 0.01, "segment_length": 20,
                                         "alpha": 0.9}
    assert report["statistics"] is None and not list((tiny_run / "dyneval").glob("rms-*.safetensors"))
    assert main(["dyneval", str(tiny_run), "--rule", "sgd-momentum", "--momentum", "0.9", "--eval-tokens", "60",
                 "--no-progress"]) == 0
    assert dyneval_report(tiny_run, "full-first60")["hyperparameters"]["momentum"] == 0.9
    capsys.readouterr()
    assert main(["dyneval", str(tiny_run), "--rule", "sgd-momentum", "--momentum", "1.5", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "momentum must be in [0, 1), got 1.5" in err and err.count("\n") == 1
