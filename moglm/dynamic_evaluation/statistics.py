"""Global RMS gradient statistics from the training split (Krause thesis 4.5, eq. 4.4; 5.4.4).

``rms = sqrt(MS_g)``, ``MS_g = (1/N_b) sum_k g_k^2``: the mean squared gradient of the *training* loss
over ``N_b`` batches, elementwise, for every adapted tensor. As in the paper (Mogrifier appendix A;
docs/method.md): no l2 penalty, no clipping, and a fraction of the training data (1% is enough, thesis table
5.6). Each batch is ``batch_size`` stripes x ``bptt`` steps of the first ``fraction`` of the training
stream, read in order with the state carried across windows (like evaluation); ``g_k`` is the gradient
of the mean per-token cross-entropy of batch k, the same per-token normalisation as the segment loss
of :mod:`.evaluate`. The batch size is a hyperparameter (larger batches give smaller RMS values).

The model is in eval mode (dropout off): dynamic evaluation differentiates the deterministic
eval-mode network, so its step sizes are normalised by gradients of that same function; dropout's
noise would inflate the RMS of exactly the units it drops most.

The statistics are cached in the run directory, ``dyneval/rms-<key>.safetensors``, keyed by the
checkpoint and every setting above; safetensors files load without executing code.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from ..atomic import atomic_write
from ..data.batching import StreamBatches
from ..errors import MoglmError
from ..evaluation.stream_model import StreamModel, detach_state
from ..progress import progress_bar
from .adapted import ALL, ParameterSelection, adapted_tensors
from .sparse import SparseSpec


@dataclass(frozen=True)
class StatisticsSettings:
    """``fraction`` of the training stream, read as ``batch_size`` stripes in windows of ``bptt``."""

    fraction: float = 0.01
    batch_size: int = 8
    bptt: int = 70

    @classmethod
    def for_hf(cls, **given) -> "StatisticsSettings":
        """The defaults for a Hugging Face model, whose statistics text (``--stats-text``) is read whole, one
        stream at a time."""
        return cls(**({"fraction": 1.0, "batch_size": 1} | given))

    def __post_init__(self) -> None:
        if not 0 < self.fraction <= 1:
            raise MoglmError(f"statistics fraction must be in (0, 1], got {self.fraction}")
        if self.batch_size < 1 or self.bptt < 1:
            raise MoglmError("statistics batch size and bptt must be >= 1")


def gradient_rms(
    model: StreamModel,
    train_ids: np.ndarray,
    settings: StatisticsSettings = StatisticsSettings(),
    sparse: SparseSpec | None = None,
    progress: bool = False,
    selection: ParameterSelection = ALL,
) -> dict[str, Tensor]:
    """``sqrt(mean_k g_k^2)`` per adapted tensor (eq. 4.4; those ``selection`` names, or the sparse
    matrices), by name, of the training loss (softmax temperature 1). ``model`` (any
    :class:`~moglm.evaluation.stream_model.StreamModel`) is not changed."""
    ids = np.asarray(train_ids)
    ids = ids[: int(len(ids) * settings.fraction)]
    if len(ids) < settings.batch_size * 2:
        raise MoglmError(
            f"RMS statistics: {len(ids)} training tokens ({settings.fraction:g} of the split) are too few "
            f"for batch size {settings.batch_size}; raise the fraction or lower the batch size"
        )
    adapted = adapted_tensors(model, sparse, selection=selection)  # sparse: one [H, H] matrix shared by the rows
    batches = StreamBatches(ids, settings.batch_size, settings.bptt)
    device = adapted.params[0].device

    def losses(stream_model):
        state = None
        for batch in batches:
            batch = batch.to(device)
            nll, state = stream_model.nll(batch.inputs, batch.targets, state)  # [T, B]
            yield nll.mean()
            state = detach_state(state)

    bar = progress_bar(len(batches), "RMS statistics", settings.batch_size * settings.bptt, enabled=progress)
    try:
        return rms_of_gradients(adapted, losses, bar.update)
    finally:
        bar.close()


def rms_of_gradients(adapted, losses: Callable[[Any], Iterator[Tensor]],
                     on_batch: Callable[[], None] = lambda: None) -> dict[str, Tensor]:
    """``sqrt(mean_k g_k^2)`` by name over the losses ``losses(model)`` yields, one per batch, each the gradient of
    a batch's mean loss with respect to ``adapted``'s tensors (eq. 4.4): the one accumulation every kind of data
    (a token stream, songs) shares."""
    squares = [torch.zeros_like(p, dtype=torch.float64) for p in adapted.params]
    count = 0
    with torch.enable_grad():  # the forward passes run inside the loop, as the generator is drawn
        for loss in losses(adapted.model):
            grads = torch.autograd.grad(loss, adapted.params)
            for sq, g in zip(squares, grads):
                sq.add_(g.double().square())
            count += 1
            on_batch()
    if not count:
        raise MoglmError("RMS statistics: no training batches")
    rms = {n: (sq / count).sqrt().to(p.dtype) for n, sq, p in zip(adapted.names, squares, adapted.params)}
    if not all(torch.isfinite(r).all() for r in rms.values()):
        raise MoglmError("RMS statistics: the training loss has a non-finite gradient under these weights")
    return rms


def cache_key(checkpoint: dict, settings: StatisticsSettings, sparse: dict | None,
              selection: ParameterSelection = ALL) -> str:
    """A short hash of everything the statistics depend on (the selection only when it is not "all", so
    the statistics cached before selections existed are still found)."""
    what = {"checkpoint": checkpoint, "settings": asdict(settings), "sparse": sparse}
    if not selection.is_all:
        what["selection"] = selection.as_dict()
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def load_or_collect(
    path,
    names: list[str],
    collect: Callable[[], dict[str, Tensor]],
    metadata: dict,
    log: Callable[[str], None] = print,
) -> dict[str, Tensor]:
    """The statistics cached at ``path`` if present and complete, else ``collect()`` them and cache them."""
    if path.is_file():
        try:
            rms = load_file(str(path))
        except Exception as e:  # a truncated or foreign file: collect again
            log(f"ignoring unreadable RMS statistics {path} ({type(e).__name__})")
        else:
            if sorted(rms) == sorted(names):
                return rms
    rms = collect()
    tensors = {k: v.detach().contiguous().cpu() for k, v in rms.items()}
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata={"moglm": json.dumps(metadata, sort_keys=True)}))
    log(f"RMS statistics cached in {path}")
    return rms
