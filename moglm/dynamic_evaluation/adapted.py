"""What dynamic evaluation adapts: the network's weights (thesis 4.3), a chosen subset of them (thesis 6.3.2:
GPT-2 adapted all but its embeddings), or only the sparse adaptation matrices (thesis 4.6). Each is a list
of named tensors and their starting values th0, on a private working copy of the model whose forward pass
depends on them; the parameters left out are frozen on the copy (no gradient is computed for them), and
th0, the RMS statistics and the divergence guard's snapshots cover the adapted tensors only."""

from __future__ import annotations

import copy
import fnmatch
from dataclasses import dataclass

from torch import Tensor, nn

from ..errors import MoglmError
from .sparse import SparseSpec, install, zero_matrices


@dataclass(frozen=True)
class ParameterSelection:
    """Which parameters adapt, by name: those matching any ``include`` glob (``fnmatch``: ``*`` matches dots
    too, so ``"transformer.h.1[01].*"`` selects two GPT-2 blocks), minus those matching any ``exclude``
    glob; ``embeddings=False`` also leaves out every embedding matrix (the parameters of ``nn.Embedding``
    modules, the model's output embedding, and whatever is tied to them), the thesis's choice for GPT-2."""

    include: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()
    embeddings: bool = True

    @classmethod
    def for_hf(cls, include: tuple[str, ...] = ("*",), exclude: tuple[str, ...] = (), **given) -> "ParameterSelection":
        """The default for a Hugging Face model: its embedding matrices stay as trained (the thesis's GPT-2
        choice, 6.3.2)."""
        return cls(include, exclude, **({"embeddings": False} | given))

    @property
    def is_all(self) -> bool:
        return self.include == ("*",) and not self.exclude and self.embeddings

    def names(self, model: nn.Module) -> list[str]:
        """The adapted parameters' names, in ``named_parameters`` order; an empty selection is an error."""
        embedding_ids = set() if self.embeddings else {id(p) for p in embedding_parameters(model)}
        names = [n for n, p in model.named_parameters()
                 if any(fnmatch.fnmatchcase(n, g) for g in self.include)
                 and not any(fnmatch.fnmatchcase(n, g) for g in self.exclude) and id(p) not in embedding_ids]
        if not names:
            raise MoglmError(f"no parameter matches the selection ({self.describe()}); "
                             f"the model's are e.g. {', '.join(n for n, _ in list(model.named_parameters())[:4])}")
        return names

    def describe(self) -> str:
        parts = [f"include {', '.join(self.include)}"]
        if self.exclude:
            parts.append(f"exclude {', '.join(self.exclude)}")
        if not self.embeddings:
            parts.append("no embeddings")
        return "; ".join(parts)

    def as_dict(self) -> dict:
        return {"include": list(self.include), "exclude": list(self.exclude), "embeddings": self.embeddings}


ALL = ParameterSelection()


def embedding_parameters(model: nn.Module) -> list[Tensor]:
    """The embedding matrices of ``model``: every ``nn.Embedding``'s weight, a Hugging Face model's output
    embeddings (``get_output_embeddings()``), and moglm's untied ``output_embedding``."""
    found = [m.weight for m in model.modules() if isinstance(m, nn.Embedding)]
    for module in model.modules():
        get = getattr(module, "get_output_embeddings", None)
        output = get() if callable(get) else None
        if output is not None and getattr(output, "weight", None) is not None:
            found.append(output.weight)
        if isinstance(getattr(module, "output_embedding", None), nn.Parameter):
            found.append(module.output_embedding)
    return found


@dataclass
class Adapted:
    """``model``: a private working copy in eval mode; ``params``: the tensors updates change
    (``requires_grad``); ``names``: their names; ``initial``: their starting values th0 (the trained
    weights, or zeros)."""

    model: nn.Module
    params: list[Tensor]
    names: list[str]
    initial: list[Tensor]
    sparse: SparseSpec | None = None


def adapted_tensors(model: nn.Module, sparse: SparseSpec | None = None, streams: int | None = None,
                    selection: ParameterSelection = ALL) -> Adapted:
    """A working copy of ``model`` and what to adapt on it; ``model`` itself is never changed.

    Full: the parameters of the copy that ``selection`` names, starting from the trained weights (the others
    frozen). Sparse: zero ``[H, H]`` matrices (``streams=None``: one shared by all rows) or ``[streams, H, H]``
    (one per stream).
    """
    work = copy.deepcopy(model).eval()
    if sparse is None:
        chosen = set(selection.names(work))
        params, names = [], []
        for n, p in work.named_parameters():
            p.requires_grad_(n in chosen)
            if n in chosen:
                params.append(p)
                names.append(n)
        initial = [p.detach().clone() for p in params]
        return Adapted(work, params, names, initial)
    if not selection.is_all:
        raise MoglmError("sparse dynamic evaluation adapts its own matrices: a parameter selection does not apply")
    for p in work.parameters():
        p.requires_grad_(False)
    matrices = zero_matrices(work, sparse, streams)
    initial = [m.detach().clone() for m in matrices]
    install(work, sparse, matrices)
    return Adapted(work, matrices, sparse.names(work), initial, sparse)
