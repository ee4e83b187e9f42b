"""The cell contract: one time step of one recurrent layer.

A cell describes a layer (its sizes and options) and computes one step,
``step(params, x_t, state) -> (h_t, state)``. It holds no tensors: the
parameters live on the module that stacks the cells (so they can carry
torch.nn.LSTM's names, ``weight_ih_l0`` ...) and are handed to ``step`` as a
mapping from the cell's own parameter names (``weight_ih`` ...) to tensors.
Binding them gives the contract every time loop uses::

    step = functools.partial(cell.step, params)   # (x_t, state) -> (h_t, state)

By convention ``state[0]`` is the layer's previous output h (the tensor that
state dropout masks); the rest (an LSTM's c, ...) is passed through untouched.

A cell that wraps another and changes only its output, ``h[:, :U] += M h[:, :U]`` after every step (sparse
dynamic evaluation, Krause thesis eq. 4.8), says so through :meth:`Cell.output_adaptation`, so that the
time loop can run the wrapped cell's fast window with M applied inside it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

from torch import Tensor

State = tuple[Tensor, ...]
Params = Mapping[str, Tensor]


class Cell(ABC):
    """Abstract base of every moglm cell.

    Subclasses set :attr:`state_names` (``("h", "c")`` for LSTMs) and implement
    :meth:`parameter_shapes`, :meth:`reset_parameters` and :meth:`step`.
    """

    #: names of the state tensors, in order; ``state_names[0]`` is always ``"h"``.
    state_names: tuple[str, ...] = ("h",)

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True) -> None:
        if input_size < 1:
            raise ValueError(f"input_size must be >= 1, got {input_size}")
        if hidden_size < 1:
            raise ValueError(f"hidden_size must be >= 1, got {hidden_size}")
        self.input_size = int(input_size)
        self.hidden_size = int(hidden_size)
        self.bias = bool(bias)

    # -- parameters -------------------------------------------------------------------------
    @abstractmethod
    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of every parameter of this layer, in registration order."""

    @abstractmethod
    def reset_parameters(self, params: Params) -> None:
        """Initialise ``params`` in place (called under ``torch.no_grad()``)."""

    # -- state ------------------------------------------------------------------------------
    def state_sizes(self) -> tuple[int, ...]:
        """Trailing size of each state tensor (all are ``[batch, size]``)."""
        return (self.hidden_size,) * len(self.state_names)

    def zero_state(self, batch: int, like: Tensor) -> State:
        """An all-zero state for ``batch`` rows, on ``like``'s device and dtype."""
        return tuple(like.new_zeros(batch, n) for n in self.state_sizes())

    # -- computation ------------------------------------------------------------------------
    @abstractmethod
    def step(self, params: Params, x: Tensor, state: State) -> tuple[Tensor, State]:
        """One time step: ``x`` is ``[B, input_size]``; returns ``(h [B, hidden], new state)``."""

    def output_adaptation(self) -> tuple[Cell, Tensor] | None:
        """``(inner cell, M)`` where this cell's step is ``inner``'s followed by ``h[:, :U] += M h[:, :U]``
        (output and carried h; M ``[U, U]`` or ``[B, U, U]``, Krause thesis eq. 4.8); ``None``, the default,
        where the step is the cell's own."""
        return None

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.extra_repr()})"
