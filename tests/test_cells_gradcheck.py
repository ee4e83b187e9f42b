"""torch.autograd.gradcheck of every cell's step, with respect to input, state and every parameter."""

from __future__ import annotations

import pytest
import torch

from moglm.cells import LSTMCell, MogrifierLSTMCell, MultiplicativeLSTMCell

D = torch.float64

CELLS = {
    "lstm": lambda: LSTMCell(4, 3),
    "lstm_capped": lambda: LSTMCell(4, 3, capped_input_gate=True),
    "lstm_no_bias": lambda: LSTMCell(4, 3, bias=False),
    "mogrifier_low_rank": lambda: MogrifierLSTMCell(4, 3, rounds=5, rank=2),
    "mogrifier_full_rank": lambda: MogrifierLSTMCell(4, 3, rounds=4, rank=0),
    "mogrifier_no_zigzag": lambda: MogrifierLSTMCell(4, 3, rounds=6, rank=2, zigzag=False),
    "mogrifier_capped": lambda: MogrifierLSTMCell(4, 3, rounds=3, rank=0, capped_input_gate=True),
    "multiplicative_lstm": lambda: MultiplicativeLSTMCell(4, 3),
}


@pytest.mark.parametrize("name", sorted(CELLS))
def test_gradcheck_cell_step(name):
    cell = CELLS[name]()
    shapes = cell.parameter_shapes()
    params = {k: torch.empty(s, dtype=D) for k, s in shapes.items()}
    with torch.no_grad():
        cell.reset_parameters(params)
        for p in params.values():
            p.add_(0.1 * torch.randn_like(p))  # move biases and zero-initialised parts off special points
    names = list(params)
    x = torch.randn(2, cell.input_size, dtype=D)
    state = tuple(torch.randn(2, n, dtype=D) for n in cell.state_sizes())

    def f(x, *rest):
        st, ps = rest[: len(state)], rest[len(state) :]
        h, new_state = cell.step(dict(zip(names, ps)), x, st)
        return (h, *new_state)

    inputs = [x, *state, *params.values()]
    inputs = [t.detach().requires_grad_() for t in inputs]
    assert torch.autograd.gradcheck(f, inputs)
