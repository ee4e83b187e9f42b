"""The MI-LSTM (Wu et al. 2016; thesis 2.4.3): its step is the general multiplicative-integration formula,
checked against a plain loop in float64 at odd sizes (outputs, final states, every gradient including the
initial state's); alpha = 0, beta = 1 is exactly the LSTM; it builds from a config and trains."""

from __future__ import annotations

import pytest
import torch

import moglm
from conftest import assert_close_all, tiny_config, write_tiny_corpus

D = torch.float64


def _plain_loop(m: moglm.MultiplicativeIntegrationLSTM, xs, h0, c0):
    """Each gate pre-activation written out: alpha * Wx * Uh + beta_h * Uh + beta_x * Wx + b, then the LSTM."""
    outputs, hs, cs = xs, [], []
    for layer in range(m.num_layers):
        p = {n: getattr(m, f"{n}_l{layer}") for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "mi_alpha",
                                                      "mi_beta_h", "mi_beta_x")}
        h, c, ys = h0[layer], c0[layer], []
        for x in outputs:
            wx, uh = x @ p["weight_ih"].T, h @ p["weight_hh"].T
            a = p["mi_alpha"] * wx * uh + p["mi_beta_h"] * uh + p["mi_beta_x"] * wx + p["bias_ih"] + p["bias_hh"]
            i, f, j, o = a.chunk(4, -1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(j)
            h = torch.sigmoid(o) * torch.tanh(c)
            ys.append(h)
        outputs = torch.stack(ys)
        hs.append(h)
        cs.append(c)
    return outputs, torch.stack(hs), torch.stack(cs)


def _gradients(m, run, xs, h0, c0):
    for t in (xs, h0, c0, *m.parameters()):
        t.grad = None
    ys, h, c = run(xs, h0, c0)
    ((ys ** 2).sum() + (h ** 3).sum() + (c * 0.7).sum()).backward()
    return [ys, h, c, xs.grad, h0.grad, c0.grad, *[p.grad for p in m.parameters()]]


def test_the_mi_lstm_is_the_general_multiplicative_integration_formula():
    torch.manual_seed(0)
    m = moglm.MultiplicativeIntegrationLSTM(5, 7, 2, dtype=D)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))  # gating vectors away from their initial ones
    xs = torch.randn(9, 3, 5, dtype=D, requires_grad=True)
    h0, c0 = (torch.randn(2, 3, 7, dtype=D, requires_grad=True) for _ in range(2))

    def module(xs, h0, c0):
        ys, (h, c) = m(xs, (h0, c0))
        return ys, h, c

    assert_close_all(_gradients(m, module, xs, h0, c0), _gradients(m, lambda *a: _plain_loop(m, *a), xs, h0, c0),
                     rtol=1e-10, atol=1e-12)


def test_alpha_zero_and_beta_one_is_exactly_the_lstm():
    torch.manual_seed(0)
    lstm = moglm.LSTM(5, 7, 2, dtype=D)
    mi = moglm.MultiplicativeIntegrationLSTM(5, 7, 2, dtype=D)
    mi.load_state_dict(lstm.state_dict(), strict=False)
    with torch.no_grad():
        for layer in range(2):
            getattr(mi, f"mi_alpha_l{layer}").zero_()
    xs = torch.randn(6, 3, 5, dtype=D)
    expected, (h, c) = lstm(xs)
    got, (h2, c2) = mi(xs)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close((h2, c2), (h, c), rtol=1e-12, atol=1e-12)


def test_gating_vectors_start_at_one_and_the_module_follows_torch_conventions():
    m = moglm.MultiplicativeIntegrationLSTM(4, 6, 1, batch_first=True)
    assert all(torch.all(getattr(m, f"{n}_l0") == 1) for n in ("mi_alpha", "mi_beta_h", "mi_beta_x"))
    ys, (h, c) = m(torch.randn(2, 5, 4))  # [B, T, m]
    assert ys.shape == (2, 5, 6) and h.shape == c.shape == (1, 2, 6)
    assert moglm.ARCHITECTURES["mi_lstm"] is moglm.MultiplicativeIntegrationLSTM


def test_an_mi_lstm_language_model_trains_from_a_config(tmp_path):
    from moglm.runs import RunDirectory
    from moglm.train import Trainer

    cfg = tiny_config(write_tiny_corpus(tmp_path / "tiny"), model={"architecture": "mi_lstm", "cell": {}},
                      train={"max_steps": 12, "eval_every": 4}, sample={"num_tokens": 0})
    Trainer(cfg, tmp_path / "run", progress=False, log=lambda s: None).train()
    valid = [r["xent"] for r in RunDirectory(tmp_path / "run").read_metrics() if r["kind"] == "valid"]
    assert len(valid) == 3 and valid[-1] < valid[0]
