"""Drop-in recurrent modules with torch.nn.LSTM's interface, one per architecture.

* :mod:`~moglm.modules.stack`: :class:`RecurrentStack`, the layers' parameters, masks, shape checks and
  forward (tensors or PackedSequences);
* :mod:`~moglm.modules.base`: :class:`RecurrentModule`, the constructor every architecture shares;
* :mod:`~moglm.modules.options`: the option fields architectures share;
* :mod:`~moglm.modules.lstm`, :mod:`~moglm.modules.gru`, :mod:`~moglm.modules.rnn`,
  :mod:`~moglm.modules.mogrifier`: the architectures, each naming its cell and its ``Options``.

``ARCHITECTURES[name]`` is the class of a config name; ``ARCHITECTURES[name].Options`` its options.
"""

from __future__ import annotations

from .base import RecurrentModule
from .gru import GRU
from .lstm import LSTM, MultiMatrixLSTM, MultiplicativeIntegrationLSTM, MultiplicativeLSTM
from .mogrifier import MogrifierGRU, MogrifierLSTM, MogrifierRNN
from .rnn import RNN, DyckRNN, MultiMatrixRNN, MultiplicativeRNN
from .stack import RecurrentStack, StackState

#: Architecture name (as used in configs) -> module class. Every class is constructed as
#: ``cls(input_size, hidden_size, num_layers, *, dropout=..., state_dropout=..., init=..., **asdict(options))``
#: with ``options`` a ``cls.Options``.
ARCHITECTURES: dict[str, type[RecurrentModule]] = {
    "lstm": LSTM,
    "mogrifier": MogrifierLSTM,
    "multiplicative_lstm": MultiplicativeLSTM,
    "mi_lstm": MultiplicativeIntegrationLSTM,
    "rnn": RNN,
    "multiplicative_rnn": MultiplicativeRNN,
    "mmrnn": MultiMatrixRNN,
    "mmlstm": MultiMatrixLSTM,
    "dyck_rnn": DyckRNN,
    "gru": GRU,
    "mogrifier_gru": MogrifierGRU,
    "mogrifier_rnn": MogrifierRNN,
}

__all__ = [
    "ARCHITECTURES",
    "GRU",
    "LSTM",
    "RNN",
    "DyckRNN",
    "MogrifierGRU",
    "MogrifierLSTM",
    "MogrifierRNN",
    "MultiMatrixLSTM",
    "MultiMatrixRNN",
    "MultiplicativeIntegrationLSTM",
    "MultiplicativeLSTM",
    "MultiplicativeRNN",
    "RecurrentModule",
    "RecurrentStack",
    "StackState",
]
