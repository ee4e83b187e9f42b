"""torch.autograd.gradcheck of every cell's step, with respect to input, state and every parameter."""

from __future__ import annotations

import pytest
import torch

from moglm.cells import (
    DyckRNNCell,
    GRUCell,
    LSTMCell,
    MogrifierGRUCell,
    MogrifierLSTMCell,
    MogrifierRNNCell,
    MultiMatrixLSTMCell,
    MultiMatrixRNNCell,
    MultiplicativeIntegrationLSTMCell,
    MultiplicativeLSTMCell,
    MultiplicativeRNNCell,
    RNNCell,
)

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
    "mi_lstm": lambda: MultiplicativeIntegrationLSTMCell(4, 3),
    "mi_lstm_capped_no_bias": lambda: MultiplicativeIntegrationLSTMCell(4, 3, bias=False, capped_input_gate=True),
    "rnn": lambda: RNNCell(4, 3),
    "rnn_relu_no_bias": lambda: RNNCell(4, 3, bias=False, nonlinearity="relu"),
    "multiplicative_rnn": lambda: MultiplicativeRNNCell(4, 3),
    "mmrnn": lambda: MultiMatrixRNNCell(4, 3, num_matrices=3),
    "mmrnn_no_bias": lambda: MultiMatrixRNNCell(4, 3, bias=False, num_matrices=2),
    "mmlstm": lambda: MultiMatrixLSTMCell(4, 3, num_matrices=3),
    "mmlstm_capped": lambda: MultiMatrixLSTMCell(4, 3, num_matrices=2, capped_input_gate=True),
    "dyck_rnn": lambda: DyckRNNCell(4, 3),
    "dyck_rnn_no_bias": lambda: DyckRNNCell(2, 1, bias=False),
    "gru": lambda: GRUCell(4, 3),
    "gru_no_bias": lambda: GRUCell(4, 3, bias=False),
    "mogrifier_gru": lambda: MogrifierGRUCell(4, 3, rounds=5, rank=2),
    "mogrifier_gru_full_no_zigzag": lambda: MogrifierGRUCell(4, 3, rounds=4, rank=0, zigzag=False),
    "mogrifier_rnn": lambda: MogrifierRNNCell(4, 3, rounds=3, rank=2),
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
