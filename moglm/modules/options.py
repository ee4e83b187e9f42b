"""The option fields several architectures share, as dataclasses that an architecture's ``Options`` inherits.

Every ``Options`` is a plain :func:`dataclasses.dataclass` with simple field types (int, bool, Literal,
Optional) and a ``metadata["help"]`` on every field, so a config layer can build its validation and its help
text from it. The stack's own arguments (sizes, ``bias``, dropouts, ``init`` ...) are not options.

This module does not use ``from __future__ import annotations``: the field types stay real types.
"""

from dataclasses import dataclass, field
from typing import Literal, Optional

from ..cells.mogrifier import PAPER_RANK


@dataclass
class CappedInputGateOption:
    capped_input_gate: bool = field(
        default=False,
        metadata={"help": "c = f*c + min(1-f, i)*j, the capped input gate of the authors' released code (a departure "
                          "from the paper's equations, section 2), instead of the paper's and torch's c = f*c + i*j "
                          "(docs/method.md, 'The LSTM cell')."},
    )


@dataclass
class NonlinearityOption:
    nonlinearity: Literal["tanh", "relu"] = field(
        default="tanh", metadata={"help": "The Elman step's nonlinearity, tanh or relu (as torch.nn.RNN's)."}
    )


@dataclass
class MultiMatrixOption:
    num_matrices: int = field(
        default=4,
        metadata={"help": "K >= 1, the shared transition matrices a softmax key mixes per gate (the student "
                          "report's eq. 6-22); 1 is exactly the plain cell."},
    )


@dataclass
class MogrifierRoundsOption:
    rounds: int = field(
        default=5,
        metadata={"help": "Mogrifier rounds r >= 0 (Mogrifier paper, eq. 1-2); 0 is exactly the underlying cell."},
    )
    rank: Optional[int] = field(
        default=None,
        metadata={"help": f"Rank k of every round matrix Q_i, R_i. None (the default; null in a config): "
                          f"{PAPER_RANK}, the paper's, in a layer whose input and hidden sizes are both >= "
                          f"{PAPER_RANK}, else full rank (a factorisation that wide has more parameters than the "
                          "full matrix and spans the same). k <= 0: full rank. An explicit k may not exceed "
                          "min(input, hidden) of any layer."},
    )
    zigzag: bool = field(
        default=True,
        metadata={"help": "False: the paper's no-zigzag ablation (section 4.1, Fig. 2): every round is gated by "
                          "the original x and h instead of the latest ones."},
    )
