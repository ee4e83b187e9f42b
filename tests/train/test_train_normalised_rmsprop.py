"""RMSprop with normalised updates (Krause thesis 3.5.1, eq. 3.14): the optimiser against a plain loop in
float64, and through the training engine, where a killed run resumes exactly."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import tiny_config
from moglm.train.normalised_rmsprop import NormalisedRMSprop
from test_train_trainer import _kill_at_7_and_resume, _losses


def test_each_update_is_rmsprops_direction_rescaled_to_the_learning_rate_over_all_parameters():
    torch.manual_seed(0)
    a, b = torch.randn(3, 4, dtype=torch.float64, requires_grad=True), torch.randn(5, dtype=torch.float64,
                                                                                     requires_grad=True)
    ref = [a.detach().clone(), b.detach().clone()]
    square = [torch.zeros_like(t) for t in ref]
    optimiser = NormalisedRMSprop([a, b], lr=0.05, alpha=0.9, eps=1e-6)
    for step in range(3):
        grads = [torch.randn_like(t) for t in ref]
        a.grad, b.grad = grads[0].clone(), grads[1].clone()
        optimiser.step()
        directions = []  # the reference: eq. 3.14 written out
        for i, g in enumerate(grads):
            square[i] = 0.9 * square[i] + 0.1 * g * g
            directions.append(g / (square[i].sqrt() + 1e-6))
        length = math.sqrt(sum(float((d * d).sum()) for d in directions))
        for i, d in enumerate(directions):
            ref[i] = ref[i] - 0.05 * d / length
        torch.testing.assert_close(a.detach(), ref[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(b.detach(), ref[1], rtol=1e-12, atol=1e-12)


def test_the_update_has_the_learning_rates_length_whatever_the_gradients_scale():
    torch.manual_seed(1)
    for scale in (1e-6, 1.0, 1e6):
        w = torch.zeros(10, dtype=torch.float64, requires_grad=True)
        w.grad = scale * torch.randn(10, dtype=torch.float64)
        NormalisedRMSprop([w], lr=0.3).step()
        assert float(w.detach().norm()) == pytest.approx(0.3, rel=1e-9)


def test_bad_settings_are_errors():
    with pytest.raises(ValueError, match="normalised RMSprop needs"):
        NormalisedRMSprop([torch.zeros(1, requires_grad=True)], lr=0.0)


def test_a_run_trained_with_it_learns_and_resumes_exactly_after_a_kill(tiny_corpus, tmp_path):
    cfg = tiny_config(tiny_corpus, train={"max_steps": 14, "eval_every": 4, "optimizer": "normalised_rmsprop",
                                          "learning_rate": 0.05, "adam_beta2": 0.9})
    _kill_at_7_and_resume(cfg, tmp_path)
    losses = [x for _, x in _losses(tmp_path / "killed")]
    assert losses[-1] < losses[0]
