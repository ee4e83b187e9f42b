"""The thesis's mLSTM recipe (3.5.1) as model options: orthogonal hidden weights, the forget-gate bias, and
weight normalisation that every backend trains through (outputs, final states and every gradient, g and v
included, match the reference loop in float64 at odd sizes); configs that ask for it build, size and
load; an architecture without LSTM gates or recurrent weights is a clear error."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_close_all
from moglm.errors import MoglmError
from moglm.runs.build import build_model
from moglm.runs.config import validate


def _model(architecture="multiplicative_lstm", dtype=torch.float64, **recipe):
    torch.manual_seed(0)
    options = {"orthogonal_init": 0.9, "forget_bias": 3.0, "weight_norm": True} | recipe
    cfg = validate({"data": {"format": "char"}, "model": {"architecture": architecture, "hidden_size": 13,
                                                            "num_layers": 2, "input_embedding_ratio": 0.6,
                                                            "state_dropout": 0.2, **options}})
    return build_model(cfg.model, 11).to(dtype)


def test_hidden_weights_start_orthogonal_per_gate_and_the_forget_bias_is_set():
    model = _model(weight_norm=False)
    stack = model.rnn
    for layer in range(2):
        for name in ("weight_hh", "weight_mh"):
            weight = getattr(stack, f"{name}_l{layer}")  # [G * 13, 13]
            for block in weight.split(13):
                torch.testing.assert_close(block @ block.T, 0.81 * torch.eye(13, dtype=block.dtype), atol=1e-6, rtol=0)  # made in float32
        assert torch.all(getattr(stack, f"bias_ih_l{layer}")[13:26] == 3.0)
        assert torch.all(getattr(stack, f"bias_hh_l{layer}")[13:26] == 0.0)


@pytest.mark.parametrize("backend", ["fused", "compiled"])
@pytest.mark.parametrize("architecture", ["multiplicative_lstm", "lstm", "mogrifier"])
def test_weight_normalised_layers_match_the_reference_loop_in_every_gradient(architecture, backend):
    if backend == "compiled":
        from moglm.recurrence import compiled

        if not compiled.available():
            pytest.skip("the compiled recurrence does not build here")
    model = _model(architecture).train()
    names = [n for n, _ in model.named_parameters()]
    assert any("parametrizations.weight_hh_l1.original0" in n for n in names)  # g
    ids = torch.randint(0, 11, (9, 3))  # [T, B]
    results = []
    for which in ("reference", backend):
        model.rnn.backend = which
        model.zero_grad()
        torch.manual_seed(1)  # the same dropout masks
        h0 = tuple(torch.randn(2, 3, 13, dtype=torch.float64, requires_grad=True) for _ in range(2))
        out, state = model(ids, h0)  # [T, B, H]
        ((out ** 2).sum() + sum((s ** 3).sum() for s in state)).backward()
        results.append([out, *state, *[p.grad for p in model.parameters()], *[s.grad for s in h0]])
    assert_close_all(results[1], results[0], rtol=1e-9, atol=1e-10)


def test_a_config_with_the_recipe_sizes_by_budget_and_counts_the_norms():
    cfg = validate({"data": {"format": "char"}, "model": {"architecture": "multiplicative_lstm", "num_params": 60_000,
                                                            "weight_norm": True, "orthogonal_init": 1.0}})
    model = build_model(cfg.model, 50)
    assert 0.9 * 60_000 < sum(p.numel() for p in model.parameters()) <= 60_000


@pytest.mark.parametrize("model, message", [
    ({"architecture": "gru", "forget_bias": 1.0}, "forget_bias needs LSTM gates"),
    ({"architecture": "transformer", "weight_norm": True, "cell": {"heads": 1}}, "need a recurrent model"),
])
def test_the_recipe_on_an_architecture_it_does_not_fit_is_a_one_line_error(model, message):
    cfg = validate({"data": {"format": "char"}, "model": {"hidden_size": 8, **model}})
    with pytest.raises(MoglmError, match=message):
        build_model(cfg.model, 11)
