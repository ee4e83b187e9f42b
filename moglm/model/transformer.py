"""A decoder-only Transformer with a segment memory (Transformer-XL, Dai et al. 2019; Krause thesis 6.2.1)
and rotary relative positions, as the sequence model of a :class:`~moglm.model.language_model.LanguageModel`.

It is read like the recurrent stacks: ``forward_layers(x [T, B, E], state) -> ([h [T, B, H]], state)``.
The state is the *segment memory*: for every layer, the inputs it saw at the last ``memory`` positions of
earlier segments (Transformer-XL's "segment-level recurrence"). A segment's queries attend to that memory
and causally to the segment itself, so a stream is read window by window exactly as a recurrent model
reads it, the memory playing the carried state's role (a trainer detaches it between windows, as it
detaches a recurrent state: gradients stay inside the window).

Positions are relative, in one of two ways (``positions``):

* ``"rotary"`` (the default, a departure from the thesis): queries and keys are rotated by their position
  within ``[memory; segment]`` (rotary embeddings, Su et al. 2021);
* ``"xl"``: Transformer-XL's relative encoding, thesis eq. 6.2 (Dai et al. 2019):
  ``A[t, n] = q_t.k_n + q_t.W_k U[t-n] + u.k_n + v.W_k U[t-n]``, with ``U`` the sinusoidal encoding of
  the distance ``t - n`` (eq. 2.35-2.36), ``W_k`` the key weights, and ``u``, ``v`` learned per head (the
  thesis's ``u^T W_q^T`` and ``v^T W_q^T``).

Either way an attention score depends only on the distance between two tokens, and the same weights read
any offset of an unbounded stream.

The state is ``(memory [L, B, M, H], valid [L, B, M])``: ``valid`` is 1 where a memory slot holds a real
position and 0 where it does not (a row whose state a trainer reset to zero, by multiplying both by 0,
attends to no memory). ``None`` is the empty memory.

Each layer is pre-norm (``norm = "pre"``, the default, a departure): ``h = x + drop(attn(LN(x), LN(mem)))``,
``h = h + drop(ff(LN(h)))``, with a final LayerNorm; or post-norm (``norm = "post"``, Transformer-XL's and
the thesis's): ``h = LN(x + drop(attn(x, mem)))``, ``h = LN(h + drop(ff(h)))``, no final LayerNorm.
Attention goes through :func:`torch.nn.functional.scaled_dot_product_attention` (eq. 6.2's position terms
as its additive mask). ``positions = "xl", norm = "post"`` is the thesis's Transformer-XL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

TransformerState = tuple[Tensor, Tensor]


@dataclass
class TransformerOptions:
    """The Transformer's own options (``[model.cell]`` of ``architecture = "transformer"``)."""

    heads: int = field(default=4, metadata={"help": "Attention heads per layer; the head size is "
                                                     "2 * ceil(hidden / (2 * heads)) (rotary needs it even)."})
    ff_ratio: float = field(default=4.0, metadata={"help": "Feed-forward width as a multiple of the hidden size."})
    memory: int = field(default=70, metadata={"help": "Positions of earlier segments every layer attends to "
                                                       "(Transformer-XL's memory length M; 0: none)."})
    attention_dropout: float = field(default=0.0, metadata={"help": "Dropout on the attention probabilities."})
    rope_base: float = field(default=10000.0, metadata={"help": "Rotary embedding base (wavelengths up to "
                                                                 "2 pi * base positions)."})
    positions: Literal["rotary", "xl"] = field(
        default="rotary", metadata={"help": "Relative positions: rotary (Su et al. 2021; a departure) or xl, "
                                            "Transformer-XL's sinusoidal relative encoding with u and v (thesis "
                                            "eq. 6.2)."})
    norm: Literal["pre", "post"] = field(
        default="pre", metadata={"help": "LayerNorm before each sublayer (pre; a departure) or after each residual "
                                         "sum (post, Transformer-XL's and the thesis's)."})


def _rotate(x: Tensor, positions: Tensor, base: float) -> Tensor:
    """Rotary position embedding of ``x`` ``[B, heads, N, d]`` at ``positions`` ``[N]`` (d even)."""
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)  # [d/2]
    angles = positions.to(torch.float32)[:, None] * inv[None, :]  # [N, d/2]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # [B, heads, N, d/2] each
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)  # [B, heads, N, d]


def sinusoid(positions: Tensor, size: int) -> Tensor:
    """The sinusoidal encoding ``[N, size]`` of ``positions`` ``[N]`` (thesis eq. 2.35-2.36): ``sin`` at even
    dimensions and ``cos`` at odd ones, of ``position / 10000^(2k / size)``."""
    k = torch.arange(0, size, 2, device=positions.device, dtype=torch.float32)  # [ceil(size/2)]
    angles = positions.to(torch.float32)[:, None] / 10000.0 ** (k / size)[None, :]  # [N, ceil(size/2)]
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)[:, :size]  # [N, size]


class TransformerLayer(nn.Module):
    """One block: attention over ``[memory; segment]`` then a feed-forward network (pre- or post-norm)."""

    def __init__(self, size: int, options: TransformerOptions) -> None:
        super().__init__()
        self.heads = options.heads
        self.head_size = 2 * math.ceil(size / (2 * options.heads))
        inner = self.heads * self.head_size
        self.options = options
        self.norm_attention = nn.LayerNorm(size)
        self.query = nn.Linear(size, inner)
        self.key_value = nn.Linear(size, 2 * inner)
        self.out = nn.Linear(inner, size)
        self.norm_ff = nn.LayerNorm(size)
        width = max(1, int(round(options.ff_ratio * size)))
        self.ff_in = nn.Linear(size, width)
        self.ff_out = nn.Linear(width, size)
        if options.positions == "xl":  # eq. 6.2's u and v, in the keys' space, one per head
            self.u = nn.Parameter(torch.zeros(self.heads, self.head_size))
            self.v = nn.Parameter(torch.zeros(self.heads, self.head_size))

    def _xl_position_bias(self, q: Tensor, m: int, t: int) -> Tensor:
        """Eq. 6.2's position terms ``(q_t + v).W_k U[t - n]`` ``[B, h, T, M+T]`` (0 where ``n > t``)."""
        inner = self.heads * self.head_size
        distances = torch.arange(m + t, device=q.device)  # [M+T]: 0 .. M+T-1
        keys = F.linear(sinusoid(distances, self.norm_attention.normalized_shape[0]).to(q.dtype),
                        self.key_value.weight[:inner])  # [M+T, h*d]
        keys = keys.view(m + t, self.heads, self.head_size).transpose(0, 1)  # [h, M+T, d]
        by_distance = torch.einsum("bhtd,hnd->bhtn", q + self.v[None, :, None, :], keys)  # [B, h, T, M+T]
        query_at = torch.arange(m, m + t, device=q.device)  # [T]
        distance = (query_at[:, None] - distances[None, :]).clamp(min=0)  # [T, M+T]
        return by_distance.gather(-1, distance.expand(*by_distance.shape[:2], t, m + t))  # [B, h, T, M+T]

    def forward(self, x: Tensor, memory: Tensor, valid: Tensor, dropout: float = 0.0) -> Tensor:
        """``x`` ``[B, T, H]``, ``memory`` ``[B, M, H]``, ``valid`` ``[B, M]`` -> ``[B, T, H]``; ``dropout``:
        the residual dropout rate."""
        b, t, _ = x.shape
        m = memory.shape[1]
        pre = self.options.norm == "pre"
        q_in = self.norm_attention(x) if pre else x  # [B, T, H]
        mem_in = self.norm_attention(memory) if pre else memory  # [B, M, H]
        kv_in = torch.cat([mem_in, q_in], 1) if m else q_in  # [B, M+T, H]
        q = self.query(q_in).view(b, t, self.heads, self.head_size).transpose(1, 2)  # [B, h, T, d]
        k, v = self.key_value(kv_in).view(b, m + t, 2, self.heads, self.head_size).permute(2, 0, 3, 1, 4)  # [B, h, M+T, d]
        positions = torch.arange(m + t, device=x.device)
        causal = positions[None, :] <= positions[m:, None]  # [T, M+T]: key j is at or before query i
        if m:
            seen = torch.cat([valid > 0, valid.new_ones(b, t, dtype=torch.bool)], 1)  # [B, M+T]
            mask = (causal[None] & seen[:, None, :])[:, None]  # [B, 1, T, M+T]
        else:
            mask = causal
        if self.options.positions == "rotary":
            q, k = _rotate(q, positions[m:], self.options.rope_base), _rotate(k, positions, self.options.rope_base)
        else:  # eq. 6.2: (q + u).k through the product, (q + v).W_k U[t - n] as the additive mask
            bias = self._xl_position_bias(q, m, t) / math.sqrt(self.head_size)  # [B, h, T, M+T]
            mask = bias.masked_fill(~mask, float("-inf"))
            q = q + self.u[None, :, None, :]
        p = self.options.attention_dropout if self.training else 0.0
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)  # [B, h, T, d]
        a = a.transpose(1, 2).reshape(b, t, self.heads * self.head_size)  # [B, T, h*d]
        h = x + F.dropout(self.out(a), dropout, self.training)  # [B, T, H]
        if not pre:
            h = self.norm_attention(h)
        f = self.ff_out(F.gelu(self.ff_in(self.norm_ff(h) if pre else h)))  # [B, T, H]
        h = h + F.dropout(f, dropout, self.training)
        return h if pre else self.norm_ff(h)


class Transformer(nn.Module):
    """A stack of ``num_layers`` :class:`TransformerLayer` with a segment memory (module docstring).

    Constructed like the recurrent stacks a language model holds: ``(input_size, hidden_size, num_layers,
    *, dropout, state_dropout, init, backend, **options)``. ``dropout`` is the residual dropout of every
    block; ``state_dropout`` must be 0 (there is no recurrent state to drop: use ``attention_dropout``);
    ``backend`` is accepted and ignored (it chooses a recurrence's time loop). ``init``: ``"torch"``
    (nn.Linear's defaults) or ``"paper"`` (GPT-2's N(0, 0.02), the residual outputs scaled by
    1/sqrt(2 L)). An input of another size than ``hidden_size`` is projected to it.
    """

    Options = TransformerOptions

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 2, *, dropout: float = 0.0,
                 state_dropout: float = 0.0, init: str = "torch", backend: str = "auto", **options) -> None:
        super().__init__()
        self.options = TransformerOptions(**options)
        o = self.options
        if hidden_size < 1 or num_layers < 1:
            raise ValueError(f"hidden size and layers must be >= 1, got {hidden_size} and {num_layers}")
        if o.heads < 1 or o.memory < 0 or o.ff_ratio <= 0 or not 0 <= o.attention_dropout < 1 or o.rope_base <= 1:
            raise ValueError(f"transformer options out of range: {o}")
        if o.positions not in ("rotary", "xl") or o.norm not in ("pre", "post"):
            raise ValueError(f"transformer positions must be rotary or xl and norm pre or post, got {o.positions!r} "
                             f"and {o.norm!r}")
        if state_dropout:
            raise ValueError("the transformer has no recurrent state to drop (state_dropout must be 0; "
                             "see cell.attention_dropout)")
        if init not in ("torch", "paper"):
            raise ValueError(f"init must be 'torch' or 'paper', got {init!r}")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.dropout, self.state_dropout, self.init = dropout, 0.0, init
        self.input_projection = None if input_size == hidden_size else nn.Linear(input_size, hidden_size, bias=False)
        self.layers = nn.ModuleList(TransformerLayer(hidden_size, o) for _ in range(num_layers))
        self.norm = nn.LayerNorm(hidden_size) if o.norm == "pre" else nn.Identity()  # post-norm: the blocks' own
        if init == "paper":
            self._gpt2_init()

    @torch.no_grad()
    def _gpt2_init(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() == 1:
                continue  # biases stay 0 and norms 1 (nn.Linear's biases are zeroed below)
            std = 0.02 / math.sqrt(2 * self.num_layers) if name.endswith(("out.weight", "ff_out.weight")) else 0.02
            nn.init.normal_(p, std=std)
        for module in self.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.zero_()

    def zero_state(self, batch: int) -> TransformerState | None:
        """The empty memory (``None``)."""
        return None

    def forward_layers(self, x: Tensor, state: TransformerState | None = None) -> tuple[list[Tensor], TransformerState]:
        """``x`` ``[T, B, E]`` -> ``([h [T, B, H]], (memory [L, B, M', H], valid [L, B, M']))`` with M' the
        memory kept for the next segment (at most ``options.memory``)."""
        t, b, _ = x.shape
        h = (x if self.input_projection is None else self.input_projection(x)).transpose(0, 1)  # [B, T, H]
        if state is None:
            memory = h.new_zeros(self.num_layers, b, 0, self.hidden_size)  # [L, B, 0, H]
            valid = h.new_zeros(self.num_layers, b, 0)  # [L, B, 0]
        else:
            memory, valid = state
            if memory.dim() != 4 or memory.shape[0] != self.num_layers or memory.shape[1] != b:
                raise ValueError(f"memory of shape {tuple(memory.shape)} does not fit {self.num_layers} layers "
                                 f"and batch {b}")
        keep = self.options.memory
        new_memory, new_valid = [], []
        for layer, mem, val in zip(self.layers, memory, valid):
            if keep:
                new_memory.append(torch.cat([mem, h], 1)[:, -keep:])  # [B, M', H]
                new_valid.append(torch.cat([val, val.new_ones(b, t)], 1)[:, -keep:])  # [B, M']
            h = layer(h, mem, val, self.dropout)  # [B, T, H]
        out = self.norm(h).transpose(0, 1)  # [T, B, H]
        if keep:
            return [out], (torch.stack(new_memory), torch.stack(new_valid))
        return [out], (memory[:, :, :0], valid[:, :, :0])
