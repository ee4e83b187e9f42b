"""What dynamic evaluation adapts: every weight of the network (thesis 4.3), or only the sparse
adaptation matrices (thesis 4.6). Both are a list of named tensors and their starting values th0, on a
private working copy of the model whose forward pass depends on them."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from torch import Tensor

from ..model.language_model import LanguageModel
from .sparse import SparseSpec, install, zero_matrices


@dataclass
class Adapted:
    """``model``: a private working copy in eval mode; ``params``: the tensors updates change
    (``requires_grad``); ``names``: their names; ``initial``: their starting values th0 (the trained
    weights, or zeros)."""

    model: LanguageModel
    params: list[Tensor]
    names: list[str]
    initial: list[Tensor]
    sparse: SparseSpec | None = None


def adapted_tensors(model: LanguageModel, sparse: SparseSpec | None = None, streams: int | None = None) -> Adapted:
    """A working copy of ``model`` and what to adapt on it; ``model`` itself is never changed.

    Full: every parameter of the copy, starting from the trained weights. Sparse: zero ``[H, H]``
    matrices (``streams=None``: one shared by all rows) or ``[streams, H, H]`` (one per stream).
    """
    work = copy.deepcopy(model).eval()
    if sparse is None:
        names, params = zip(*work.named_parameters())
        initial = [p.detach().clone() for p in params]
        return Adapted(work, list(params), list(names), initial)
    for p in work.parameters():
        p.requires_grad_(False)
    matrices = zero_matrices(work, sparse, streams)
    initial = [m.detach().clone() for m in matrices]
    install(work, sparse, matrices)
    return Adapted(work, matrices, sparse.names(work), initial, sparse)
