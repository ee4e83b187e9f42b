"""The mogrifier rounds and the Mogrifier LSTM step (Melis et al. 2020, section 2, eq. 1-2).

Before an ordinary LSTM step, the input x (size m) and the previous output h (size n) gate each other
for r rounds, x first::

    odd i:   x = 2 * sigmoid(Q_i h + a_i) * x          Q_i: n -> m, shape [m, n]
    even i:  h = 2 * sigmoid(R_i x + b_i) * h          R_i: m -> n, shape [n, m]

Every round has its own matrix and a zero-initialised bias. With rank k > 0 each matrix is a product
of two factors, ``Q_i = Q_i^left [m, k] @ Q_i^right [k, n]``; k <= 0 means full rank, and ``None`` chooses
from the sizes (:func:`default_rank`: the paper's 40 where it fits, else full rank). With
``zigzag=False`` (the paper's ablation, Fig. 2) every round is conditioned on the ORIGINAL x and h.
Only h_prev is mogrified; c_prev reaches the LSTM unchanged, and the state carried forward is the
LSTM's new (h, c).

Parameters of one layer, stacked over rounds (``nq = ceil(r/2)`` Q rounds, ``nr = floor(r/2)`` R rounds)::

    low rank:   mogrifier_q_left [nq, m, k]  mogrifier_q_right [nq, k, n]  mogrifier_q_bias [nq, m]
                mogrifier_r_left [nr, n, k]  mogrifier_r_right [nr, k, m]  mogrifier_r_bias [nr, n]
    full rank:  mogrifier_q_weight [nq, m, n]                              mogrifier_q_bias [nq, m]
                mogrifier_r_weight [nr, n, m]                              mogrifier_r_bias [nr, n]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Params, State
from .initialisation import fan_in_normal_, low_rank_factor_
from .lstm import LSTMCell, lstm_pointwise

PREFIX = "mogrifier_"

#: the rank the Mogrifier paper's experiments use most (section 4.1: the best k lay in [40, 90])
PAPER_RANK = 40


def num_q_rounds(rounds: int) -> int:
    """Rounds that gate x (the odd ones)."""
    return (rounds + 1) // 2


def num_r_rounds(rounds: int) -> int:
    """Rounds that gate h (the even ones)."""
    return rounds // 2


def default_rank(input_size: int, hidden_size: int) -> int:
    """The rank ``rank=None`` means: :data:`PAPER_RANK` where both sizes are at least that, else 0 (full rank).
    A factorisation of rank min(m, n) or more spans every matrix and has more parameters than the matrix."""
    return PAPER_RANK if min(input_size, hidden_size) >= PAPER_RANK else 0


def check_rounds_rank(rounds: int, rank: int | None, input_size: int, hidden_size: int) -> int:
    """Validate ``rounds`` and ``rank``; returns the rank to build (0 for full rank)."""
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 0:
        raise ValueError(f"rounds must be an integer >= 0, got {rounds!r}")
    if rank is None:
        return default_rank(input_size, hidden_size)
    if not isinstance(rank, int) or isinstance(rank, bool):
        raise ValueError(f"rank must be an integer (<= 0 for full rank) or None (chosen from the sizes), got {rank!r}")
    if rounds > 0 and rank > min(input_size, hidden_size):
        raise ValueError(
            f"rank must be <= min(input_size, hidden_size) = {min(input_size, hidden_size)} "
            f"(or <= 0 for full rank), got {rank}"
        )
    return max(rank, 0)


def mogrifier_parameter_shapes(m: int, n: int, rounds: int, rank: int, bias: bool) -> dict[str, tuple[int, ...]]:
    """Shapes of the round parameters of a layer with input size m and hidden size n."""
    shapes: dict[str, tuple[int, ...]] = {}
    for kind, count, out, inp in (("q", num_q_rounds(rounds), m, n), ("r", num_r_rounds(rounds), n, m)):
        if count == 0:
            continue
        if rank > 0:
            shapes[f"{PREFIX}{kind}_left"] = (count, out, rank)
            shapes[f"{PREFIX}{kind}_right"] = (count, rank, inp)
        else:
            shapes[f"{PREFIX}{kind}_weight"] = (count, out, inp)
        if bias:
            shapes[f"{PREFIX}{kind}_bias"] = (count, out)
    return shapes


def reset_mogrifier_parameters(params: Params, rank: int, identity: bool = False) -> None:
    """Init (docs/method.md, "Initialisation"): factors std (1/(fan_in*k))^(1/4), full-rank std
    sqrt(1/fan_in), biases zero.

    ``identity=True`` makes every gate exactly 1 (so the cell computes a plain LSTM) while keeping
    gradients alive: the left factors (or full matrices) are zero, the right factors are random.
    """
    for name, p in params.items():
        if not name.startswith(PREFIX):
            continue
        fan_in = p.shape[-1] if not name.endswith("_left") else params[name.replace("_left", "_right")].shape[-1]
        if name.endswith("_bias") or (identity and (name.endswith("_left") or name.endswith("_weight"))):
            p.zero_()
        elif name.endswith("_weight"):
            fan_in_normal_(p, fan_in)
        else:
            low_rank_factor_(p, fan_in, rank)


def _round_gate(params: Params, kind: str, index: int, source: Tensor) -> Tensor:
    """``2*sigmoid(M_i source + bias_i)`` for round matrix ``M`` (kind ``q`` or ``r``) number ``index``."""
    bias = params[f"{PREFIX}{kind}_bias"][index] if f"{PREFIX}{kind}_bias" in params else None
    if f"{PREFIX}{kind}_weight" in params:
        pre = F.linear(source, params[f"{PREFIX}{kind}_weight"][index], bias)  # [B, out]
    else:
        low = F.linear(source, params[f"{PREFIX}{kind}_right"][index])  # [B, k]
        pre = F.linear(low, params[f"{PREFIX}{kind}_left"][index], bias)  # [B, out]
    return 2.0 * torch.sigmoid(pre)


def mogrify(params: Params, x: Tensor, h: Tensor, rounds: int, zigzag: bool = True) -> tuple[Tensor, Tensor]:
    """Apply ``rounds`` mogrifier rounds to ``x`` ``[B, m]`` and ``h`` ``[B, n]``; returns ``(x_up, h_up)``."""
    x0, h0 = x, h
    for i in range(1, rounds + 1):
        if i % 2 == 1:
            x = _round_gate(params, "q", (i - 1) // 2, h if zigzag else h0) * x  # [B, m]
        else:
            h = _round_gate(params, "r", i // 2 - 1, x if zigzag else x0) * h  # [B, n]
    return x, h


def round_matrices(params: Params, rounds: int) -> list[Tensor]:
    """Dense Q_1, R_2, Q_3, ... in round order (products of the factors when low-rank)."""
    out = []
    for i in range(1, rounds + 1):
        kind, index = ("q", (i - 1) // 2) if i % 2 == 1 else ("r", i // 2 - 1)
        if f"{PREFIX}{kind}_weight" in params:
            out.append(params[f"{PREFIX}{kind}_weight"][index])
        else:
            out.append(params[f"{PREFIX}{kind}_left"][index] @ params[f"{PREFIX}{kind}_right"][index])
    return out


class MogrifierRounds:
    """Mixin adding the mogrifier rounds to a cell (``rounds``, ``rank``, ``zigzag``): their parameters,
    their initialisation and :meth:`mogrify`. Put it before the cell class in the bases."""

    def _init_rounds(self, rounds: int, rank: int | None, zigzag: bool) -> None:
        self.rank = check_rounds_rank(rounds, rank, self.input_size, self.hidden_size)
        self.rounds = rounds
        self.zigzag = bool(zigzag)

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = super().parameter_shapes()
        shapes.update(mogrifier_parameter_shapes(self.input_size, self.hidden_size, self.rounds, self.rank, self.bias))
        return shapes

    def reset_parameters(self, params: Params) -> None:
        super().reset_parameters(params)
        reset_mogrifier_parameters(params, self.rank)

    def mogrify(self, params: Params, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """``(x_up [B, m], h_up [B, H])`` after this cell's rounds."""
        return mogrify(params, x, h, self.rounds, self.zigzag)

    def extra_repr(self) -> str:
        s = super().extra_repr() + f", rounds={self.rounds}, rank={self.rank if self.rank else 'full'}"
        return s + ("" if self.zigzag else ", zigzag=False")


class MogrifierLSTMCell(MogrifierRounds, LSTMCell):
    """Mogrifier LSTM step: ``LSTM(x_up, c_prev, h_up)`` with ``(x_up, h_up) = mogrify(x, h_prev)``."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        rounds: int = 5,
        rank: int | None = None,
        zigzag: bool = True,
        capped_input_gate: bool = False,
        init: str = "paper",
    ) -> None:
        super().__init__(input_size, hidden_size, bias, capped_input_gate, init)
        self._init_rounds(rounds, rank, zigzag)

    def step(self, params: Params, x: Tensor, state: State) -> tuple[Tensor, State]:
        h_prev, c_prev = state
        x, h_up = self.mogrify(params, x, h_prev)  # [B, m], [B, H]
        h, c = lstm_pointwise(self.gates(params, x, h_up), c_prev, self.capped_input_gate)
        return h, (h, c)
