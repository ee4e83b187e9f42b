"""The path of the model's recurrence that a compressed file records (container version 12), so that its decoder
computes the encoder's bits whatever the decoding machine's own choice.

``backend="auto"`` runs each layer on the compiled window or the Python fused one, whichever it measured faster
on this machine for the layer's shape class (:mod:`moglm.recurrence.auto`). The two round differently, so a file
compressed where the fused window won (or where the compiled library cannot be built, or with
``MOGLM_COMPILED=0``) would not decode where the compiled one wins, and the same machine kind can choose either
where the two are close. So the encoder notes the path its first step took (:func:`coding_path`), runs every
step pinned to it (:func:`pinned`), and the header records it; the decoder pins the same path
(:func:`recorded_path`), or says in one line why it cannot (:func:`check_path`). With adaptation the path also
names the route of the compiled backward's weight-gradient products, which each machine probes for itself too.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import torch

from ..errors import MoglmError
from ..recurrence import auto, compiled
from ..recurrence.compiled.routes import (gemm_route, pinned_weight_gradient_route, route_name, stored_route,
                                          weight_gradient_route)

BACKENDS = ("compiled", "fused")


def coding_path(nets: Sequence, rows: int, start: int, adapting: bool = False) -> dict[str, Any] | None:
    """The path the recurrence of ``nets`` (the coder's model, or an ensemble's models: the first that has a choice
    decides) takes for the coder's steps (``[1, rows]`` tokens) on this machine: ``{"backend": "compiled", "route":
    name, "weight_gradient_route": name or None}`` or ``{"backend": "fused", "route": None, "weight_gradient_route":
    None}`` as ``auto`` chooses for its first layer, ``fused`` where the compiled window cannot run here, ``None``
    where no layer has a choice to make (cells without a fast path run their reference loop everywhere). A compiled
    choice without a route of its own (``MOGLM_AUTO_BACKEND``, an unstored or failed probe) runs on the machine's
    GEMM route, which is recorded in its place, so that the decoder does not take its own; ``adapting``: the
    compiled backward's weight-gradient route is recorded too (else ``None``: no backward runs). One step of
    ``start`` tokens is run to see it (and to probe, where this machine has not yet)."""
    with auto.recording() as seen, torch.no_grad():
        for net in nets:
            net(torch.full((1, rows), start, dtype=torch.long), None)
            if seen:
                break
    if seen:
        if seen[0]["backend"] != "compiled":
            return {"backend": seen[0]["backend"], "route": None, "weight_gradient_route": None}
        return {"backend": "compiled", "route": seen[0].get("route") or route_name(gemm_route(torch.float32)),
                "weight_gradient_route": route_name(weight_gradient_route(torch.float32)) if adapting else None}
    return None if compiled.available() else {"backend": "fused", "route": None, "weight_gradient_route": None}


@contextmanager
def pinned(path: dict[str, Any] | None) -> Iterator[None]:
    """While active, the recurrence computes on ``path`` (``None``: as this machine chooses): ``auto``'s choice for
    every layer it decides for (:func:`moglm.recurrence.auto.pinned`) and the weight gradients' route."""
    choice = None if path is None else {"backend": path["backend"], "route": path["route"]}
    with auto.pinned(choice), pinned_weight_gradient_route(None if path is None else path["weight_gradient_route"]):
        yield


def recorded_path(header: dict[str, Any], name: str = "the file") -> dict[str, Any] | None:
    """The path a file's header records (``None``: none, as in files before version 12, which decode with
    ``auto``'s own choice), or a one-line error where it is not one."""
    path = header.get("path")
    if path is None:
        return None
    if not isinstance(path, dict) or set(path) != {"backend", "route", "weight_gradient_route"} \
            or path["backend"] not in BACKENDS \
            or not all(_route_of(path, key) for key in ("route", "weight_gradient_route")):
        raise MoglmError(f"{name}: its header's recurrence path is not one this moglm runs ({repr(path)[:200]}): "
                         "damaged, forged or made by a newer moglm")
    return dict(path)


def _route_of(path: dict[str, Any], key: str) -> bool:
    """Whether ``path[key]`` is a route this moglm has (a compiled path's) or ``None``."""
    route = path[key]
    return route is None or (isinstance(route, str) and path["backend"] == "compiled"
                             and stored_route(route) is not None)


def check_path(path: dict[str, Any] | None, name: str = "the file") -> None:
    """A one-line error where this machine cannot run the recorded ``path`` (the compiled window unbuilt)."""
    if path is not None and path["backend"] == "compiled" and not compiled.available():
        raise MoglmError(f"{name} was coded with moglm's compiled recurrence, which cannot be built here "
                         f"({compiled.unavailable_reason()}): decompress it where it builds")
