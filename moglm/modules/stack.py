"""A stack of recurrent layers with torch.nn.LSTM's interface.

:class:`RecurrentStack` owns the parameters of every layer under torch.nn.LSTM's names (the cell's
parameter name plus ``_l{k}``: ``weight_ih_l0``, ``mogrifier_q_left_l1`` ...), samples the dropout masks,
checks shapes, and runs the layers one after another through :func:`moglm.recurrence.run_layer`.
State is passed in and returned, never stored on the module.

Input is a tensor (time-major, batch-first or unbatched) or a
:class:`~torch.nn.utils.rnn.PackedSequence`. A packed batch runs as a padded one whose rows are sorted by
length; wherever a row ends, the layer's loop stops for it (the window is cut at every length, and the
rows still running continue from their state), so each sequence's final state is the one at its own
last step and nothing past its end reaches the outputs or the gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from ..cells.base import Cell, Params, State
from ..recurrence import check_backend, run_layer

StackState = Tensor | tuple[Tensor, ...]


def _check_rate(name: str, p: float) -> float:
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p < 1.0:
        raise ValueError(f"{name} must be a number in [0, 1), got {p!r}")
    return float(p)


def variational_mask(batch: int, size: int, p: float, like: Tensor) -> Tensor:
    """One inverted-dropout mask ``[batch, size]`` with keep probability ``1 - p`` (Gal & Ghahramani 2016)."""
    return like.new_empty(batch, size).bernoulli_(1.0 - p).div_(1.0 - p)


class Packing(NamedTuple):
    """How a PackedSequence was laid out: the padded run's rows are sorted by length, longest first."""

    batch_sizes: Tensor  # [T] live rows at each step (CPU int64)
    lengths: Tensor  # [B] length of each sorted row (CPU int64)
    sorted_indices: Tensor | None  # [B] sorted row -> original row
    unsorted_indices: Tensor | None  # [B] original row -> sorted row


def runs_of_equal_batch_size(batch_sizes: Tensor) -> list[tuple[int, int, int]]:
    """``(start, stop, rows)`` for each run of steps in which the first ``rows`` rows are live."""
    sizes = batch_sizes.tolist()
    runs, start = [], 0
    for t in range(1, len(sizes) + 1):
        if t == len(sizes) or sizes[t] != sizes[start]:
            runs.append((start, t, sizes[start]))
            start = t
    return runs


def run_packed_layer(
    cell: Cell, params: Params, xs: Tensor, state: State, h_mask: Tensor | None, backend: str,
    runs: list[tuple[int, int, int]],
) -> tuple[Tensor, State]:
    """:func:`~moglm.recurrence.run_layer` over a padded batch whose rows are sorted by length, one window per
    run of equal batch size. Returns ``(outputs [T, B, H], final state)``: outputs are zero past each row's
    end and the final state of each row is the one at its own last step."""
    batch = xs.shape[1]
    outputs, finished = [], []
    for start, stop, rows in runs:
        if rows < state[0].shape[0]:  # the rows from ``rows`` on ended at ``start``
            finished.append(tuple(s[rows:] for s in state))
            state = tuple(s[:rows] for s in state)
        mask = None if h_mask is None else h_mask[:rows]  # [rows, H]
        ys, state = run_layer(cell, params, xs[start:stop, :rows], state, mask, backend)  # [t, rows, H]
        outputs.append(F.pad(ys, (0, 0, 0, batch - rows)))  # [t, B, H]
    finished.append(state)
    final = tuple(torch.cat([part[j] for part in reversed(finished)]) for j in range(len(state)))  # each [B, *]
    return torch.cat(outputs), final  # [T, B, H]


class RecurrentStack(nn.Module):
    """Layers of :class:`~moglm.cells.base.Cell` with ``forward(input, hx=None) -> (output, h_n)``.

    Args:
        cells: one cell per layer; layer k's input size must be layer k-1's hidden size.
        batch_first: input and output are ``[B, T, *]`` instead of ``[T, B, *]`` (states stay ``[L, B, *]``).
        dropout: inter-layer dropout on the outputs of every layer but the last (as torch.nn.LSTM's),
            a fresh mask at every time step.
        state_dropout: variational dropout on h_prev (Mogrifier paper, section 3.3): one mask per
            sequence, shared over time, independent per layer.
        backend: which implementation of the time loop runs (see :mod:`moglm.recurrence`).
    """

    def __init__(
        self,
        cells: Sequence[Cell],
        batch_first: bool = False,
        dropout: float = 0.0,
        state_dropout: float = 0.0,
        backend: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if not cells:
            raise ValueError("num_layers must be an integer >= 1, got 0")
        for k in range(1, len(cells)):
            if cells[k].input_size != cells[k - 1].hidden_size:
                raise ValueError(f"cells[{k}].input_size must equal cells[{k - 1}].hidden_size")
        self.cells = list(cells)
        self.input_size = cells[0].input_size
        self.hidden_size = cells[-1].hidden_size
        self.num_layers = len(cells)
        self.bias = cells[0].bias
        self.batch_first = bool(batch_first)
        self.dropout = _check_rate("dropout", dropout)
        self.state_dropout = _check_rate("state_dropout", state_dropout)
        self.backend = check_backend(backend)
        self.state_names = cells[0].state_names
        for k, cell in enumerate(self.cells):
            for name, shape in cell.parameter_shapes().items():
                self.register_parameter(f"{name}_l{k}", nn.Parameter(torch.empty(shape, device=device, dtype=dtype)))
        self.reset_parameters()

    # -- parameters -------------------------------------------------------------------------
    def layer_parameters(self, layer: int) -> dict[str, Tensor]:
        """Layer ``layer``'s parameters under the cell's own names (``weight_ih`` ...)."""
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be in [0, {self.num_layers}), got {layer}")
        cell = self.cells[layer]
        known = self.__dict__.setdefault("_layer_parameter_names", {})  # layer -> (its cell, (name, attribute) ...)
        if layer not in known or known[layer][0] is not cell:  # a new cell (sparse dynamic evaluation wraps them)
            known[layer] = (cell, tuple((name, f"{name}_l{layer}") for name in cell.parameter_shapes()))
        # read from the registered parameters where they are (a one-token step asks at every layer and step, and a
        # getattr each is most of the cost); a parametrized one (torch.nn.utils.parametrize) is an attribute
        registered = self._parameters
        return {name: registered[attr] if attr in registered else getattr(self, attr) for name, attr in known[layer][1]}

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Re-initialise every parameter with its cell's scheme."""
        for k, cell in enumerate(self.cells):
            cell.reset_parameters(self.layer_parameters(k))

    # -- state ------------------------------------------------------------------------------
    def _split_state(self, hx: StackState | None, batch: int, like: Tensor) -> list[State]:
        """Check ``hx`` (``[L, B, *]`` tensors) and split it into one state tuple per layer."""
        if hx is None:
            return [cell.zero_state(batch, like) for cell in self.cells]
        tensors = (hx,) if isinstance(hx, Tensor) else tuple(hx)
        n = len(self.state_names)
        if len(tensors) != n or not all(isinstance(t, Tensor) for t in tensors):
            names = ", ".join(f"{s}_0" for s in self.state_names)
            raise ValueError(f"hx must be {'a tensor' if n == 1 else f'a tuple ({names})'} of [num_layers, batch, size]")
        sizes = self.cells[-1].state_sizes()
        for j, t in enumerate(tensors):
            expected = (self.num_layers, batch, sizes[j])
            if tuple(t.shape) != expected:
                raise ValueError(f"hx[{j}] ({self.state_names[j]}_0) must have shape {expected}, got {tuple(t.shape)}")
            if t.dtype != like.dtype:
                raise ValueError(f"hx[{j}] ({self.state_names[j]}_0) has dtype {t.dtype}, expected {like.dtype}")
        return [tuple(t[k] for t in tensors) for k in range(self.num_layers)]

    def zero_state(self, batch: int) -> StackState:
        """The default initial state for ``batch`` rows (zeros, ``[num_layers, batch, *]``), on the
        parameters' device and dtype."""
        like = next(self.parameters())
        return self._join_state([cell.zero_state(batch, like) for cell in self.cells])

    def _join_state(self, states: list[State]) -> StackState:
        joined = tuple(torch.stack([s[j] for s in states]) for j in range(len(self.state_names)))  # each [L, B, *]
        return joined[0] if len(joined) == 1 else joined

    # -- forward ----------------------------------------------------------------------------
    def _check_features(self, input: Tensor) -> None:
        """The input's last dimension and dtype must match the parameters'."""
        if input.shape[-1] != self.input_size:
            raise ValueError(f"input: last dimension must be input_size={self.input_size}, got {input.shape[-1]}")
        weight = next(self.parameters(), None)
        if weight is not None and input.dtype != weight.dtype:
            raise ValueError(f"input has dtype {input.dtype} but the parameters are {weight.dtype}")

    def _check_input(self, input: Tensor, hx: StackState | None) -> tuple[Tensor, StackState | None, bool]:
        """Validate; return time-major batched input ``[T, B, m]``, batched ``hx`` and whether it was unbatched."""
        if not isinstance(input, Tensor):
            raise ValueError(f"input must be a torch.Tensor or a PackedSequence, got {type(input).__name__}")
        if input.dim() not in (2, 3):
            raise ValueError(f"input must be 2-D (unbatched) or 3-D, got shape {tuple(input.shape)}")
        self._check_features(input)
        unbatched = input.dim() == 2
        if unbatched:
            input = input.unsqueeze(1)  # [T, 1, m]
            if hx is not None:
                tensors = (hx,) if isinstance(hx, Tensor) else tuple(hx)
                for j, t in enumerate(tensors):
                    if isinstance(t, Tensor) and t.dim() != 2:
                        raise ValueError(f"hx[{j}] must be 2-D for unbatched input, got shape {tuple(t.shape)}")
                tensors = tuple(t.unsqueeze(1) if isinstance(t, Tensor) else t for t in tensors)
                hx = tensors[0] if isinstance(hx, Tensor) else tensors
        elif self.batch_first:
            input = input.transpose(0, 1)  # [T, B, m]
        if input.shape[0] == 0:
            raise ValueError(f"input has no time steps (sequence length 0, shape {tuple(input.shape)}); "
                             "torch.nn.LSTM refuses it too. An empty batch (0 rows) is fine")
        return input, hx, unbatched

    def _unpack(self, input: PackedSequence) -> tuple[Tensor, Packing]:
        """The padded time-major batch ``[T, B, m]`` of a PackedSequence, rows sorted by length (longest first)."""
        data, batch_sizes, sorted_indices, unsorted_indices = input
        if data.dim() != 2:
            raise ValueError(f"input: a PackedSequence's data must be 2-D [steps, features], got {tuple(data.shape)}")
        self._check_features(data)
        xs, lengths = pad_packed_sequence(PackedSequence(data, batch_sizes))  # [T, B, m], in sorted order
        return xs, Packing(batch_sizes, lengths, sorted_indices, unsorted_indices)

    def forward_layers(
        self, input: Tensor | PackedSequence, hx: StackState | None = None
    ) -> tuple[list[Tensor] | list[PackedSequence], StackState]:
        """Like :meth:`forward` but returns every layer's output (before inter-layer dropout), for skip-sum
        stacking. Outputs follow ``input``'s layout (PackedSequences for a PackedSequence)."""
        packing = None
        if isinstance(input, PackedSequence):
            xs, packing = self._unpack(input)
            unbatched = False
        else:
            xs, hx, unbatched = self._check_input(input, hx)
        batch = xs.shape[1]
        states = self._split_state(hx, batch, xs)
        runs = [(0, xs.shape[0], batch)]
        if packing is not None:
            runs = runs_of_equal_batch_size(packing.batch_sizes)
            if hx is not None and packing.sorted_indices is not None:  # hx rows follow the caller's order
                states = [tuple(s.index_select(0, packing.sorted_indices) for s in state) for state in states]
        outputs, finals = [], []
        for k, cell in enumerate(self.cells):
            if k > 0 and self.training and self.dropout > 0:
                xs = F.dropout(xs, self.dropout, training=True)  # fresh mask per step
            h_mask = None
            if self.training and self.state_dropout > 0:
                h_mask = variational_mask(batch, cell.hidden_size, self.state_dropout, xs)  # [B, H]
            params = self.layer_parameters(k)
            if len(runs) == 1:
                xs, final = run_layer(cell, params, xs, states[k], h_mask, self.backend)  # [T, B, H]
            else:
                xs, final = run_packed_layer(cell, params, xs, states[k], h_mask, self.backend, runs)  # [T, B, H]
            outputs.append(xs)
            finals.append(final)
        state = self._join_state(finals)
        if packing is not None:
            return self._pack(outputs, state, packing)
        if unbatched:
            outputs = [o.squeeze(1) for o in outputs]
            state = state.squeeze(1) if isinstance(state, Tensor) else tuple(s.squeeze(1) for s in state)
        elif self.batch_first:
            outputs = [o.transpose(0, 1) for o in outputs]
        return outputs, state

    @staticmethod
    def _pack(outputs: list[Tensor], state: StackState, packing: Packing) -> tuple[list[PackedSequence], StackState]:
        """Padded sorted outputs back into PackedSequences, and the final state's rows back into the caller's order."""
        packed = [
            PackedSequence(pack_padded_sequence(o, packing.lengths).data, packing.batch_sizes,
                           packing.sorted_indices, packing.unsorted_indices)
            for o in outputs
        ]  # each data [sum(lengths), H]
        if packing.unsorted_indices is not None:
            order = packing.unsorted_indices
            state = state.index_select(1, order) if isinstance(state, Tensor) else tuple(
                s.index_select(1, order) for s in state
            )
        return packed, state

    def forward(
        self, input: Tensor | PackedSequence, hx: StackState | None = None
    ) -> tuple[Tensor | PackedSequence, StackState]:
        """``input`` ``[T, B, m]`` (``[B, T, m]`` if batch_first, ``[T, m]`` unbatched, or a PackedSequence) and
        optional state (``(h_0, c_0)``, each ``[num_layers, B, H]``; zeros when omitted). Returns the last layer's
        output (a PackedSequence for a PackedSequence) and the final state, shaped like torch.nn.LSTM's; for
        packed input, each sequence's final state is the one at its own last step."""
        outputs, state = self.forward_layers(input, hx)
        return outputs[-1], state

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        for name, value in self._repr_options():
            s += f", {name}={value}"
        for name in ("batch_first", "dropout", "state_dropout"):
            value = getattr(self, name)
            if value:
                s += f", {name}={value}"
        if not self.bias:
            s += ", bias=False"
        return s

    def _repr_options(self) -> list[tuple[str, object]]:
        """(name, value) of the options shown in the repr (a module's, when not at their default)."""
        return []
