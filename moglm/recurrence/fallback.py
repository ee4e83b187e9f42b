"""When a fused recurrence hands a layer to the reference loop, and saying so once per reason.

The fused paths are plain eager code around a custom ``torch.autograd.Function``; they step aside
(``backend="auto"``) or refuse (``backend="fused"``) whenever that is not what is running: tracing by
torch.compile / torch.export / torch.jit, functorch transforms, forward-mode AD, autocast, a state-dropout
mask that itself needs a gradient. Double backward (``create_graph=True``) cannot be known at forward time:
the fused backward then recomputes the window with the reference loop and differentiates that instead.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .reference import reference_layer


class FusedFallbackWarning(UserWarning):
    """A layer ran the (slower) reference recurrence instead of the fused one."""


_warned: set[str] = set()


_LIBRARY_DIRS = (os.path.dirname(torch.__file__) + os.sep, os.path.dirname(os.path.dirname(__file__)) + os.sep)


def user_stacklevel() -> int:
    """The ``stacklevel`` at which a warning raised by this function's caller points at the user's code:
    the first frame outside moglm and torch (a module call passes through both)."""
    level, frame = 2, sys._getframe(2)  # stacklevel 2: the warning function's caller
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARY_DIRS):
        level += 1
        frame = frame.f_back
    return level


def warn_once(reason: str) -> None:
    """Warn that the reference loop runs because of ``reason``, once per reason and process."""
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(
            f"moglm: {reason}; this layer runs the reference recurrence (slower). Choose the reference backend "
            "to silence this (backend='reference' in Python, model.backend = \"reference\" in a config).",
            FusedFallbackWarning,
            stacklevel=user_stacklevel(),
        )


def _autocast_enabled(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4
        return torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()
    except RuntimeError:  # a device type without autocast (meta ...)
        return False


def autocast_dtype(t: Tensor) -> torch.dtype | None:
    """The low precision autocast asks for on ``t``'s device (``None`` when autocast is off there, or ``t`` is
    not a float32/half tensor that autocast would touch)."""
    if t.dtype not in (torch.float32, torch.bfloat16, torch.float16) or not _autocast_enabled(t.device.type):
        return None
    try:
        return torch.get_autocast_dtype(t.device.type)
    except AttributeError:  # torch < 2.4
        return torch.get_autocast_cpu_dtype() if t.device.type == "cpu" else torch.get_autocast_gpu_dtype()


def runtime_reason(tensors: Sequence[Tensor | None], h_mask: Tensor | None) -> str | None:
    """Why the fused path cannot run now on these tensors (``None`` if it can)."""
    if torch.jit.is_scripting() or torch.jit.is_tracing():
        return "tracing with torch.jit"
    if torch.compiler.is_compiling() or getattr(torch.compiler, "is_exporting", lambda: False)():
        return "tracing with torch.compile / torch.export"
    present = [t for t in tensors if t is not None]
    for t in present:
        if type(t) not in (Tensor, nn.Parameter):
            return f"tensor subclass {type(t).__name__} (tracing or a tensor wrapper)"
        if torch._C._functorch.is_functorch_wrapped_tensor(t):
            return "a functorch transform (vmap, grad, jacrev ...)"
    if torch.autograd.forward_ad._current_level >= 0:
        if any(torch.autograd.forward_ad.unpack_dual(t).tangent is not None for t in present):
            return "forward-mode AD"
    if h_mask is not None and h_mask.requires_grad:
        return "a state-dropout mask that requires grad"
    return None


def double_backward_by_reference(
    cell, names: Sequence[str], needs: Sequence[bool], inputs: Sequence[Tensor | None], grad_outputs
) -> tuple:
    """Gradients of ``(xs, h0, c0, mask, *params)`` by differentiating the reference loop with
    ``create_graph=True`` (so they can be differentiated again)."""
    warn_once("double backward (create_graph=True) through the fused recurrence")
    xs, h0, c0, mask, *params = inputs
    with torch.enable_grad():
        ys, (h_T, c_T) = reference_layer(cell, dict(zip(names, params)), xs, (h0, c0), mask)
        wrt = [t for t, need in zip(inputs, needs) if need]
        got = iter(torch.autograd.grad((ys, h_T, c_T), wrt, grad_outputs, create_graph=True, allow_unused=True))
    return tuple(next(got) if need else None for need in needs)
