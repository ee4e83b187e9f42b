"""Helpers to compare a moglm module with a torch.nn reference: outputs, final states and every gradient."""

from __future__ import annotations

import torch

from conftest import assert_close_all


def as_tuple(state):
    return (state,) if isinstance(state, torch.Tensor) else tuple(state)


def run_with_gradients(model, x, hx):
    """Forward ``x`` from ``hx`` (a tensor or tuple), backprop a loss touching every output and final state.
    Returns ``(outputs and final states, gradients of x, hx and every parameter, parameter names)``."""
    x = x.clone().requires_grad_()
    states = [t.clone().requires_grad_() for t in as_tuple(hx)]
    y, final = model(x, states[0] if isinstance(hx, torch.Tensor) else tuple(states))
    outputs = [y, *as_tuple(final)]
    loss = sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)).sum() + (o**2).sum() for o in outputs)
    loss.backward()
    grads = [x.grad, *(s.grad for s in states), *(p.grad for p in model.parameters())]
    return outputs, grads, [n for n, _ in model.named_parameters()]


def assert_matches_reference(ours, ref, x, hx):
    """Load ``ref``'s state dict into ``ours`` and compare names, outputs, states and all gradients."""
    ours.load_state_dict(ref.state_dict())
    out, grads, names = run_with_gradients(ours, x, hx)
    ref_out, ref_grads, ref_names = run_with_gradients(ref, x, hx)
    assert names == ref_names
    assert_close_all(out, ref_out)
    assert_close_all(grads, ref_grads)
