"""The constructor every architecture shares: a stack of one cell type, with torch's positional arguments.

An architecture is a subclass that names its cell (:attr:`RecurrentModule.cell_class`) and its own options
(:attr:`RecurrentModule.Options`, a dataclass, see :mod:`moglm.modules.options`). The stack's arguments, the
constructor's signature, its docstring's option list and the repr are made here, once, from those two.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any, ClassVar

import torch

from ..cells.base import Cell
from .stack import RecurrentStack


def check_num_layers(num_layers: int) -> int:
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1:
        raise ValueError(f"num_layers must be an integer >= 1, got {num_layers!r}")
    return num_layers


class RecurrentModule(RecurrentStack):
    """A multi-layer stack of one cell type, constructed like torch.nn.LSTM (unidirectional, no projection).

    Positional arguments mean what they mean for torch.nn.LSTM / torch.nn.GRU: ``input_size, hidden_size,
    num_layers=1, bias=True, batch_first=False, dropout=0.0``; an architecture whose torch counterpart takes
    more positionally (torch.nn.RNN's ``nonlinearity``, after ``num_layers``) lists it in
    :attr:`positional_options`. Everything else is keyword-only:

    Args:
        state_dropout: variational dropout on h_prev (Mogrifier paper, section 3.3): one mask per sequence,
            shared over time, independent per layer.
        init: ``"torch"`` (default): torch.nn.LSTM's U(-1/sqrt(H), 1/sqrt(H)) for every parameter, so that
            replacing a torch module by a moglm one does not change where training starts; ``"paper"``: the
            original experiments' truncated normals with forget-gate bias 1 (docs/method.md,
            "Initialisation"), which the paper configs select. Mogrifier round matrices have no torch
            counterpart and always start as in the paper.
        backend: the time loop's implementation (see :mod:`moglm.recurrence`).
        device: where the parameters are created.
        dtype: the parameters' precision.
        **options: the fields of the class's :attr:`Options` (listed in each class's docstring).
    """

    #: the cell of every layer; built as ``cell_class(layer input size, hidden_size, bias=, init=, **options)``
    cell_class: ClassVar[type[Cell]]
    #: the architecture's own options, a dataclass; the constructor takes exactly its fields as keywords
    Options: ClassVar[type]
    #: options that the torch counterpart takes positionally right after ``num_layers`` (nn.RNN's nonlinearity)
    positional_options: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        *,
        state_dropout: float = 0.0,
        init: str = "torch",
        backend: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **options: Any,
    ) -> None:
        chosen = self.Options(**options)
        fields = dataclasses.asdict(chosen)
        cells = [
            self.cell_class(input_size if k == 0 else hidden_size, hidden_size, bias=bias, init=init, **fields)
            for k in range(check_num_layers(num_layers))
        ]
        super().__init__(cells, batch_first, dropout, state_dropout, backend, device, dtype)
        self.init = init
        self.options = chosen
        for name, value in fields.items():  # attributes, like nn.RNN's rnn.nonlinearity
            setattr(self, name, value)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Give an architecture (a subclass with ``Options`` and no constructor of its own) its constructor:
        :meth:`RecurrentModule.__init__` under the signature :func:`constructor_signature` makes."""
        super().__init_subclass__(**kwargs)
        inherited = cls.__init__
        made_here = inherited is RecurrentModule.__init__ or getattr(inherited, "generated", False)
        if not hasattr(cls, "Options") or not made_here:
            return  # abstract, or below a class that wrote its own constructor
        signature = constructor_signature(cls)

        def __init__(self: RecurrentModule, *args: Any, **kwargs: Any) -> None:
            try:
                arguments = signature.bind(self, *args, **kwargs).arguments
            except TypeError as e:
                raise TypeError(f"{cls.__name__}(): {e}") from None
            del arguments["self"]
            RecurrentModule.__init__(self, **arguments)

        __init__.__signature__ = signature  # type: ignore[attr-defined]
        __init__.__qualname__ = f"{cls.__qualname__}.__init__"
        __init__.__module__ = cls.__module__
        __init__.generated = True  # type: ignore[attr-defined]
        cls.__init__ = __init__  # type: ignore[method-assign]
        if "Options" in vars(cls) and cls.__doc__:
            cls.__doc__ = f"{inspect.cleandoc(cls.__doc__)}\n\n{options_doc(cls)}"

    def _repr_options(self) -> list[tuple[str, object]]:
        fields = dataclasses.fields(self.options)
        shown = [(f.name, getattr(self.options, f.name)) for f in fields if getattr(self.options, f.name) != f.default]
        return shown + ([("init", self.init)] if self.init != "torch" else [])


def constructor_signature(cls: type[RecurrentModule]) -> inspect.Signature:
    """``cls``'s constructor: torch's positional arguments (``cls.positional_options`` after ``num_layers``),
    then the stack's keyword-only arguments and the fields of ``cls.Options``, keyword-only."""
    shared = list(inspect.signature(RecurrentModule.__init__, eval_str=True).parameters.values())[:-1]  # no **options
    hints = typing.get_type_hints(cls.Options)
    fields = {f.name: f for f in dataclasses.fields(cls.Options)}

    def option(name: str, kind: inspect._ParameterKind) -> inspect.Parameter:
        return inspect.Parameter(name, kind, default=fields[name].default, annotation=hints[name])

    split = [p.name for p in shared].index("num_layers") + 1
    positional = [option(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in cls.positional_options]
    keyword = [option(name, inspect.Parameter.KEYWORD_ONLY) for name in fields if name not in cls.positional_options]
    return inspect.Signature([*shared[:split], *positional, *shared[split:], *keyword])


def options_doc(cls: type[RecurrentModule]) -> str:
    """The docstring section listing ``cls.Options``'s fields with their defaults and help."""
    fields = dataclasses.fields(cls.Options)
    if not fields:
        return f"Options: none beyond the stack's (``{cls.__name__}.Options`` is empty)."
    positional = ", ".join(cls.positional_options)
    kind = f"keyword-only but {positional}, fourth as in torch" if positional else "keyword-only"
    lines = [f"Options ({kind}; the fields of ``{cls.__name__}.Options``):"]
    lines += [f"    {f.name} (default {f.default!r}): {f.metadata['help']}" for f in fields]
    return "\n".join(lines)
