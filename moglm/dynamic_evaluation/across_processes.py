"""Dynamic evaluation of several streams split over the processes of a torchrun job
(``torchrun --nproc-per-node N -m moglm dyneval RUN --streams B``).

One process cuts a split into B stripes read side by side. Rank r of N reads stripes r B/N to
(r+1) B/N - 1 of those same B stripes (a contiguous block of the text, cut into B/N stripes: the same
tokens in the same stripes), runs the static pass and dynamic evaluation on them, and the per-token
losses of all stripes are gathered on every rank, so the report is that of the B stripes.

Sparse dynamic evaluation adapts one matrix per stripe, so each stripe scores what it scores in one
process (up to float rounding) unless the divergence guard fires: it rolls back and slows the
stripes of its own process only. Full dynamic evaluation adapts one copy of the weights per process,
shared by that process's B/N stripes, instead of one copy shared by all B: every token is still
predicted from text read before it, so the score is a valid likelihood, and it mixes fewer places
of the text into each adaptation.
"""

from __future__ import annotations

import numpy as np
from torch import Tensor

from ..errors import MoglmError
from ..data.corpus import TextSize
from ..evaluation.scores import scored
from ..evaluation.stream_model import StreamModel
from ..distributed import SINGLE, Group
from .evaluate import DynamicResult, Timing, dynamic_evaluate, static_pass
from .update_rules import Hyperparameters


def evaluate_streams(model: StreamModel, ids: np.ndarray, hp: Hyperparameters, rms: dict[str, Tensor] | None, *,
                     streams: int, bptt: int, factor: float, text: TextSize | None = None, progress: bool = False,
                     desc: str = "dyneval", group: Group = SINGLE, features: bool = False,
                     **options) -> DynamicResult:
    """The static pass and dynamic evaluation of ``ids`` in ``streams`` stripes (``options`` go to
    :func:`~moglm.dynamic_evaluation.evaluate.dynamic_evaluate`), this process's share of the stripes
    when ``group`` has several; every process returns the result of all the stripes."""
    if not group.distributed:
        static = static_pass(model, ids, streams, bptt, factor, text, progress, features)
        return dynamic_evaluate(model, ids, hp, rms, static=static, streams=streams, factor=factor,
                                progress=progress, desc=desc, features=features, **options)
    if features:
        raise MoglmError("the neural cache runs in one process (not under torchrun)")
    rows = group.rows(streams, "--streams")
    length = len(ids) // streams  # each stripe's tokens, as the batching cuts them
    block, mine = ids[rows.start * length: rows.stop * length], rows.stop - rows.start
    static = static_pass(model, block, mine, bptt, factor, None, progress)
    local = dynamic_evaluate(model, block, hp, rms, static=static, streams=mine, factor=factor, progress=progress,
                             desc=desc, **options)
    losses, static_losses = group.concat(local.losses, 1), group.concat(local.static_losses, 1)  # [L, B] each
    rollbacks, rescored, cpu, static_cpu = group.sum([local.rollbacks, local.rescored, local.timing.cpu_seconds,
                                                      local.static_timing.cpu_seconds])
    walls = group.gather((local.timing.seconds, local.static_timing.seconds, local.lr_scale))
    # the words and bytes the scored tokens span, as the one-process static pass counts them
    return DynamicResult(
        scored(float(losses.double().sum()), losses.numel(), len(ids), text),
        scored(float(static_losses.double().sum()), static_losses.numel(), len(ids), text), losses, static_losses, hp,
        Timing(max(w[0] for w in walls), cpu), Timing(max(w[1] for w in walls), static_cpu),
        int(rollbacks), int(rescored), min(w[2] for w in walls))
