"""The compiled recurrence: the fused window in C++ for CPU (``csrc/``), built for this machine at first use.

What it computes is what :mod:`moglm.recurrence.fused_lstm` and :mod:`.fused_multiplicative_lstm`
compute (and what :mod:`moglm.recurrence.reference` computes step by step); how it runs
(docs/fused-recurrence.md):

* the forward loop and the backward data-gradient loop are batch-parallel: each thread takes a block of
  batch rows through all T steps alone, with single-threaded products on its rows;
* per step only what is sequential (the mogrifier rounds, the gate product, the cell), with the pointwise
  work of a step in one vectorised loop per cell or round;
* everything else (input projections, dX when it does not depend on the recurrence, every weight
  gradient) as multi-threaded products over all T*B rows, before or after the loop.

Its parts: :mod:`.build` builds and loads ``csrc/`` (and says why not, where it cannot); :mod:`.routes` owns
what was chosen on this machine (the GEMM routes, ``auto``'s backends) and where it is stored;
:mod:`.functions` holds the autograd Functions the stack runs.
"""

from __future__ import annotations

import torch

from . import build, routes
from .build import (
    CompiledUnavailableWarning,
    available,
    blocked_products,
    blocks_products,
    empty_cache,
    flush_denormals,
    flushes_denormals,
    unavailable_reason,
    workspace_cache,
)
from .functions import CompiledLSTMFunction, CompiledMultiplicativeLSTMFunction, can_run, run_compiled
from .routes import (
    COLUMNS,
    COLUMNS_SUFFIX,
    ROUTES,
    candidate_routes,
    class_route,
    gemm_route,
    route_code,
    route_name,
    stored_route,
    weight_gradient_route,
)


def info(paths: bool = True) -> dict:
    """What runs on CPU here: whether the compiled path is loaded, why not, its GEMM route and timings;
    ``paths=False`` leaves out this machine's build directory (for results that get committed)."""
    ok = build.available()
    out = {"compiled": ok, "reason": build.unavailable_reason(), "cpu": build.cpu_id().split("|")[0],
           "threads": torch.get_num_threads()}
    if paths:
        folder = build.build_dir()
        out["build_dir"] = str(folder) if folder is not None else None
    if ok:
        out["gemm_route"] = route_name(routes.gemm_route(torch.float32))
        out["gemm_route_probe_seconds"] = routes.probe_seconds(torch.float32)
        out["weight_gradient_route"] = route_name(routes.weight_gradient_route(torch.float32))
        out["weight_gradient_route_probe_seconds"] = routes.probe_seconds(torch.float32, "weight_gradient_route")
        out["mkl_thread_control"] = bool(torch.ops.moglm.mkl_thread_control_available())
        out["workspace_cache"] = build.workspace_cache()
        out["flush_denormals"] = build.flushes_denormals()
        out["blocked_products"] = build.blocks_products()
        out["auto_backend"] = routes.stored_backends()  # per shape class: compiled or fused, with the probe's timings
    return out


__all__ = [
    "COLUMNS",
    "COLUMNS_SUFFIX",
    "ROUTES",
    "CompiledLSTMFunction",
    "CompiledMultiplicativeLSTMFunction",
    "CompiledUnavailableWarning",
    "available",
    "blocked_products",
    "blocks_products",
    "can_run",
    "candidate_routes",
    "class_route",
    "empty_cache",
    "flush_denormals",
    "flushes_denormals",
    "gemm_route",
    "info",
    "route_code",
    "route_name",
    "run_compiled",
    "stored_route",
    "unavailable_reason",
    "weight_gradient_route",
    "workspace_cache",
]
