"""The segment-memory Transformer (moglm.model.transformer) inside a LanguageModel: a stream read window by
window with its memory scores what one long window scores, its state resets like a recurrent one, it sizes
by budget, trains through the engine, and dynamic evaluation and the neural cache read it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import tiny_config, write_tiny_corpus
from moglm.dynamic_evaluation import Hyperparameters, SparseSpec, dynamic_evaluate
from moglm.errors import MoglmError
from moglm.evaluation.stream import evaluate_stream
from moglm.model.language_model import LanguageModel
from moglm.model.transformer import Transformer
from moglm.train import Trainer
from moglm.runs.build import build_model
from moglm.runs.config import load_config


def lm(memory=8, layers=2, hidden=12, heads=3, dtype=torch.float64, **kw):
    torch.manual_seed(0)
    model = LanguageModel(23, hidden, layers, "transformer", {"heads": heads, "memory": memory}, init="paper", **kw)
    return model.to(dtype).eval()


def test_windows_with_memory_score_like_one_long_window_when_the_memory_covers_the_past():
    """The reference twin: with a memory at least as long as the stream, reading it in windows of 5 (memory
    carried, detached) gives exactly the outputs of one causal pass over the whole stream."""
    model = lm(memory=64)
    ids = torch.randint(0, 23, (31, 3))  # [T, B]
    whole, _ = model(ids)  # [T, B, H]
    state, parts = None, []
    for s in range(0, 31, 5):
        h, state = model(ids[s : s + 5], state)
        parts.append(h)
        state = tuple(x.detach() for x in state)
    torch.testing.assert_close(torch.cat(parts), whole, rtol=1e-10, atol=1e-10)


def test_a_memory_of_m_positions_reaches_back_exactly_m_positions():
    """One layer, memory 4, windows of 4: window 2 attends to window 1, window 3 only to window 2, so a change
    of the stream's first token changes window 2's outputs and leaves window 3's exactly as they were."""
    model = lm(memory=4, layers=1)
    ids = torch.randint(0, 23, (12, 1))
    changed = ids.clone()
    changed[0] = (changed[0] + 1) % 23

    def windows(stream):
        state, outs = None, []
        for s in range(0, 12, 4):
            h, state = model(stream[s : s + 4], state)
            outs.append(h)
        return outs

    a, b = windows(ids), windows(changed)
    assert not torch.allclose(a[1], b[1])
    torch.testing.assert_close(a[2], b[2], rtol=0, atol=0)


def test_gradients_match_finite_differences_in_float64():
    model = lm(memory=3, layers=2, hidden=8, heads=2)
    ids = torch.randint(0, 23, (4, 2))
    _, state = model(ids)
    memory = state[0].detach().requires_grad_()
    params = [p for p in model.parameters()][:6]

    def f(*inputs):
        nll, _ = model.nll(ids, ids.roll(1, 0), (inputs[0], state[1]))
        return nll.sum()

    assert torch.autograd.gradcheck(f, (memory,), eps=1e-6, atol=1e-6)
    assert all(p.requires_grad for p in params)


def test_a_row_reset_to_zero_attends_to_no_memory():
    model = lm(memory=6)
    ids = torch.randint(0, 23, (5, 2))
    _, (memory, valid) = model(torch.randint(0, 23, (6, 2)))
    keep = torch.tensor([1.0, 0.0], dtype=torch.float64)
    reset = (memory * keep.view(1, -1, 1, 1), valid * keep.view(1, -1, 1))  # as the trainer resets a row
    h, _ = model(ids, reset)
    fresh, _ = model(ids[:, 1:])
    torch.testing.assert_close(h[:, 1:], fresh)


def test_bad_options_are_errors():
    with pytest.raises(ValueError, match="state_dropout"):
        Transformer(8, 8, 1, state_dropout=0.1)
    with pytest.raises(ValueError):
        Transformer(8, 8, 1, heads=0)


def test_dynamic_evaluation_recalls_a_passage_repeated_beyond_the_memory():
    """The repeated-passage check (thesis 4.4): a passage of 30 tokens recurs every 50 tokens, farther back
    than the memory (8) and a segment (5) reach, so static evaluation scores every copy alike; dynamic
    evaluation has learnt it in its weights and scores the later copies well below the first and below
    the random tokens between them."""
    model = lm(memory=8, hidden=16, heads=2, dtype=torch.float32)
    rng = np.random.RandomState(0)
    passage = rng.randint(0, 23, 30)
    ids = np.concatenate([part for _ in range(4) for part in (passage, rng.randint(0, 23, 20))])  # [200]
    result = dynamic_evaluate(model, ids, Hyperparameters(rule="sgd", lr=0.1, segment_length=5))
    static, dynamic = result.static_losses.flatten(), result.losses.flatten()  # [199]: loss of ids[t + 1]
    copies = [slice(50 * k, 50 * k + 29) for k in range(4)]  # predicting the 2nd-30th token of each copy
    fillers = [slice(50 * k + 30, 50 * k + 49) for k in range(4)]
    assert all(abs(float(static[c].mean() - static[copies[0]].mean())) < 0.02 for c in copies)
    first, later = float(dynamic[copies[0]].mean()), [float(dynamic[c].mean()) for c in copies[1:]]
    assert all(x < first - 0.4 for x in later), (first, later)
    recalled = torch.cat([dynamic[c] for c in copies[1:]]).mean()
    unseen = torch.cat([dynamic[f] for f in fillers[1:]]).mean()
    assert recalled < unseen - 0.15, (recalled, unseen)


def test_the_shipped_transformer_configs_sit_beside_the_recurrent_ones_at_equal_budget():
    for corpus, vocab in (("ptb-word", 10_000), ("ptb-char", 50)):
        t, m = load_config(f"{corpus}-transformer-cpu"), load_config(f"{corpus}-mogrifier-cpu")
        assert t.model.num_params == m.model.num_params
        assert (t.train.batch_size, t.train.bptt, t.train.max_steps) == (m.train.batch_size, m.train.bptt,
                                                                         m.train.max_steps)
        model = build_model(t.model, vocab)
        count = sum(p.numel() for p in model.parameters())
        assert 0.9 * t.model.num_params < count <= t.model.num_params


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("transformer")
    corpus = write_tiny_corpus(root / "corpus")
    cfg = tiny_config(corpus, model={"architecture": "transformer", "hidden_size": 16, "num_layers": 2,
                                     "cell": {"heads": 2, "memory": 10}, "state_dropout": 0.0},
                      train={"max_steps": 30, "eval_every": 15, "bptt": 10, "batch_size": 4})
    Trainer(cfg, root / "run", progress=False, log=lambda m: None).train()
    from moglm.runs.language_model import LanguageModelRun
    model, _, vocab = LanguageModelRun(root / "run").load_model("best")
    from moglm.runs.build import load_data
    return model, load_data(cfg.data)


def test_the_engine_trains_it_and_dynamic_evaluation_reads_it(trained):
    model, corpus = trained
    ids = corpus["valid"][:300]
    result = dynamic_evaluate(model, ids, Hyperparameters(rule="sgd", lr=0.1, segment_length=10), features=True)
    assert math.isfinite(result.scores.xent) and result.scores.tokens == len(ids) - 1
    assert result.features.shape == (len(ids) - 1, 1, 16)
    # the static pass it compares with reads the stream cut as the adaptation does (segments of 10)
    assert result.static.nll == pytest.approx(evaluate_stream(model, ids, 1, 10).nll, rel=1e-6)
    with pytest.raises(MoglmError, match="no recurrent layers"):
        dynamic_evaluate(model, ids, Hyperparameters(rule="sgd"), sparse=SparseSpec(4))


def _xl_layer_by_hand(layer, x, memory):
    """Thesis eq. 6.2 and a post-norm block, one query and one key at a time: the reference twin of
    positions = "xl", norm = "post" (one row, no dropout)."""
    from moglm.model.transformer import sinusoid

    h, d = layer.heads, layer.head_size
    inner = h * d
    w_k, w_v = layer.key_value.weight[:inner], layer.key_value.weight[inner:]
    b_k, b_v = layer.key_value.bias[:inner], layer.key_value.bias[inner:]
    context = torch.cat([memory, x])  # [M+T, H]
    m, t = memory.shape[0], x.shape[0]
    u_rel = sinusoid(torch.arange(m + t), x.shape[1]).to(x.dtype)  # [M+T, H]: U[distance]
    out = []
    for i in range(t):
        heads = []
        q = (layer.query.weight @ x[i] + layer.query.bias).view(h, d)
        scores = torch.full((h, m + t), float("-inf"), dtype=x.dtype)
        for n in range(m + i + 1):
            k = (w_k @ context[n] + b_k).view(h, d)
            r = (w_k @ u_rel[m + i - n]).view(h, d)  # W_k U[t - n]
            scores[:, n] = ((q * k).sum(-1) + (q * r).sum(-1) + (layer.u * k).sum(-1) + (layer.v * r).sum(-1))
        p = torch.softmax(scores / math.sqrt(d), -1)  # [h, M+T]
        values = torch.stack([(w_v @ context[n] + b_v).view(h, d) for n in range(m + t)])  # [M+T, h, d]
        for head in range(h):
            heads.append((p[head][:, None] * values[:, head]).sum(0))
        a = layer.out(torch.cat(heads))
        y = layer.norm_attention(x[i] + a)
        out.append(layer.norm_ff(y + layer.ff_out(torch.nn.functional.gelu(layer.ff_in(y)))))
    return torch.stack(out)


def test_transformer_xl_positions_and_post_norm_match_eq_6_2_computed_by_hand_in_float64():
    """positions = "xl", norm = "post": the thesis's Transformer-XL (eq. 6.2), against a plain loop, with a
    memory, in float64; u and v are trained parameters, set to random values here."""
    from moglm.model.transformer import Transformer

    torch.manual_seed(0)
    stack = Transformer(10, 10, 1, memory=3, heads=2, positions="xl", norm="post").double().eval()
    layer = stack.layers[0]
    with torch.no_grad():
        layer.u.normal_()
        layer.v.normal_()
    x = torch.randn(7, 1, 10, dtype=torch.float64)  # [T, B, H]
    first, state = stack.forward_layers(x[:4])
    second, _ = stack.forward_layers(x[4:], state)
    torch.testing.assert_close(first[0][:, 0], _xl_layer_by_hand(layer, x[:4, 0], x[:0, 0]))
    torch.testing.assert_close(second[0][:, 0], _xl_layer_by_hand(layer, x[4:, 0], x[1:4, 0]))  # memory: last 3 inputs
    assert isinstance(stack.norm, torch.nn.Identity)  # post-norm: no final LayerNorm


def test_the_xl_model_trains_and_reads_windows_like_one_long_pass():
    """Through a language model: a memory covering the stream gives one causal pass's outputs in windows, and
    every parameter, u and v included, gets a gradient."""
    torch.manual_seed(0)
    model = LanguageModel(23, 12, 2, "transformer", {"heads": 3, "memory": 64, "positions": "xl", "norm": "post"},
                          init="paper").double().eval()
    ids = torch.randint(0, 23, (17, 2))
    whole, _ = model(ids)
    state, parts = None, []
    for s in range(0, 17, 4):
        h, state = model(ids[s : s + 4], state)
        parts.append(h)
    torch.testing.assert_close(torch.cat(parts), whole, rtol=1e-10, atol=1e-10)
    model.train()
    model.nll(ids[:-1], ids[1:])[0].mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
