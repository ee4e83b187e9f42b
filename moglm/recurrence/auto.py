"""What ``backend="auto"`` runs on a CPU layer: the compiled window or the Python fused one, whichever is
faster on this machine for the layer's shape class, measured once per machine.

Neither path wins everywhere: the compiled window runs the products of a step on each thread's own rows,
the Python one runs each step's product over all rows on every thread through oneDNN, and which is faster
depends on the CPU, the GEMM library's code paths for it, the hidden size, the rows per thread and whether
a backward follows (docs/fused-recurrence.md, "Choosing the path"). So the first layer of each shape
class that ``auto`` meets is run both ways on a window of random data of its own shape (at most
:data:`PROBE_STEPS` steps), with copies of its weights and a private random generator (the user's
gradients and RNG stream are untouched), in
interleaved rounds until, over the last :data:`MIN_PAIRS` rounds, every timing of one path is below every
timing of the others (equally fast paths separate that way by chance with probability 2/252 at each check,
and where they are equally fast either choice is right), or :data:`MAX_PAIRS` pairs have run; the faster
median of all pairs wins. A probe that fails (out of memory running both, say) stores the compiled window
for its class with the error, and where nothing can be stored (a read-only cache) ``auto`` runs the
compiled window without probing: either way every process on the machine takes the same path.

The compiled window's per-step GEMM route is chosen with it, per class, since which route is fastest
depends on the widths as well as the CPU: :func:`moglm.recurrence.compiled.routes.class_route` times every
route on the layer's own per-step products, and the probe above times the compiled window on each of the
:data:`PROBED_ROUTES` fastest of them that split a step by rows and the :data:`PROBED_ROUTES` fastest that
split it by columns (``+columns``), against the fused window (the rule generalises: one path's last
timings all below every other's); the choice records the route.

The choice is stored beside the compiled library by :mod:`moglm.recurrence.compiled.routes`, the one owner
of what was chosen on this machine (``backend_choice_v2.json``, whose directory is keyed by the C++ sources,
torch, Python and the CPU, so a change to any of them probes again), first writer per class wins, and every
later process reads it: every run on a machine takes the same path for the same shapes, so a resumed run
computes exactly as the uninterrupted one would have. ``moglm info`` lists the choices and their timings.
``MOGLM_AUTO_BACKEND=compiled`` or ``=fused`` skips the probe and forces one path for
``auto``; delete the file to probe again.

Where two machines must compute the same bits, a choice made on one is not enough: the other's probe can choose
otherwise (the paths round differently), or it may not build the compiled window at all. :func:`pinned` makes
every layer take a given path, before the variable and the stored choices, and :func:`recording` lists the
choices made, so that a compressed file's header records the path its encoder took and its decoder takes it too.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import warnings
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

import torch
from torch import Tensor

from ..cells.base import Cell, Params
from .compiled.routes import COLUMNS_SUFFIX, UNSTORED, backend_choice, route_code

#: the most interleaved (compiled, fused) timing pairs a probe runs before it takes the faster median
MAX_PAIRS = 15
#: the fewest pairs before the two paths' timings are compared
MIN_PAIRS = 5
#: the most steps of the probe's window (its steps, up to this, its batch and sizes are the layer's own: on
#: windows much shorter than the layer's, the per-window costs weigh more and mislead the choice)
PROBE_STEPS = 70


def _bucket(value: int, edges: tuple[int, ...]) -> str:
    for edge in edges:
        if value <= edge:
            return f"<={edge}"
    return f">{edges[-1]}"


#: shape classes already named, by what names them (a one-token step asks at every layer and step, and building
#: the string took most of ``choose``'s time there); bounded, as windows of many lengths could fill it
_CLASS_NAMES: dict[tuple, str] = {}
_CLASS_NAMES_MAX = 4096


def shape_class(cell: Cell, xs: Tensor, training: bool) -> str:
    """The class a layer's choice is stored under: cell kind, dtype, width, rows per thread, window steps,
    threads, and whether a backward follows."""
    threads = torch.get_num_threads()
    named = (type(cell), getattr(cell, "rounds", 0), cell.input_size, cell.hidden_size, xs.shape[0], xs.shape[1],
             xs.dtype, threads, training)
    name = _CLASS_NAMES.get(named)
    if name is None:
        name = _class_name(cell, xs, training, threads)
        if len(_CLASS_NAMES) < _CLASS_NAMES_MAX:
            _CLASS_NAMES[named] = name
    return name


def _class_name(cell: Cell, xs: Tensor, training: bool, threads: int) -> str:
    kind = type(cell).__name__
    if getattr(cell, "rounds", 0):
        kind += f"-r{cell.rounds}"
    width = _bucket(max(cell.input_size, cell.hidden_size), (128, 384, 768, 1536))
    rows = _bucket(xs.shape[1] // max(threads, 1), (4, 16, 48, 128))
    steps = _bucket(xs.shape[0], (4, 16, 48))
    dtype = str(xs.dtype).removeprefix("torch.")
    return (f"{kind}|{dtype}|width{width}|rows/thread{rows}|steps{steps}|threads{threads}|"
            f"{'train' if training else 'eval'}")


def _time(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def probe(cell: Cell, params: Params, xs: Tensor, training: bool, runners: dict) -> dict:
    """Time ``runners`` (``{"compiled": f, "fused": f}``, each ``f(cell, params, xs, state)``) on a random
    window of ``xs``'s batch and sizes; the faster by the rule in the module docstring."""
    gen = torch.Generator().manual_seed(0)
    B, m, n = xs.shape[1], xs.shape[2], cell.hidden_size
    x = torch.randn(min(xs.shape[0], PROBE_STEPS), B, m, generator=gen, dtype=xs.dtype)
    state = tuple(torch.randn(B, n, generator=gen, dtype=xs.dtype) for _ in range(2))
    copies = {name: p.detach().clone().requires_grad_(training) for name, p in params.items()}

    def once(run) -> float:
        if not training:
            with torch.no_grad():
                return _time(lambda: run(cell, copies, x, state))

        def step():
            ys, (h, c) = run(cell, copies, x.requires_grad_(), state)
            (ys.sum() + h.sum() + c.sum()).backward()

        with torch.enable_grad():
            return _time(step)

    seconds: dict[str, list[float]] = {name: [] for name in runners}
    for name, run in runners.items():  # warm-up: packing caches, oneDNN's JIT, the allocator
        once(run)
    separated = False
    for pair in range(MAX_PAIRS):
        for name, run in (runners.items() if pair % 2 == 0 else reversed(runners.items())):
            seconds[name].append(once(run))
        last = {name: v[-MIN_PAIRS:] for name, v in seconds.items()}  # the last rounds: an early outlier ages out
        if pair + 1 >= MIN_PAIRS and any(all(max(last[name]) < min(other) for o, other in last.items() if o != name)
                                         for name in last):  # one path's margin over every other exceeds the noise
            separated = True
            break
    med = {k: statistics.median(v) for k, v in seconds.items()}
    return {"backend": min(med, key=med.get), "seconds": med, "pairs": len(next(iter(seconds.values()))),
            "separated": separated}


#: the per-step routes whose compiled windows the probe times, of each way of splitting a step (by rows,
#: by columns): the fastest on the class's products by :func:`moglm.recurrence.compiled.routes.class_route`,
#: which times the forward products alone, so close routes are told apart on whole windows, backward included.
#: (On an Intel Xeon the product timings ranked oneDNN's ukernel first among the column splits for the
#: multiplicative LSTM's forward at H = 1024, and its whole window ran slower than on MKL's packed GEMM.)
PROBED_ROUTES = 2


def probed_routes(route_seconds: dict[str, float]) -> list[str]:
    """The routes whose whole windows the probe times, from the product timings: the :data:`PROBED_ROUTES`
    fastest by rows and the fastest split by columns (the product timings leave out the barriers, the rounds'
    phase and the backward). Ties go by name, so a stored probe (whose keys are sorted) names the same."""
    ranked = sorted(route_seconds, key=lambda route: (route_seconds[route], route))
    return ([r for r in ranked if COLUMNS_SUFFIX not in r][:PROBED_ROUTES]
            + [r for r in ranked if COLUMNS_SUFFIX in r][:PROBED_ROUTES])


def _probe_class(cell: Cell, params: Params, xs: Tensor, training: bool, runners: dict, route_probe) -> dict:
    """Where ``route_probe`` is given: the compiled window on each of the class's :data:`PROBED_ROUTES`
    fastest routes and the fused window, timed together; the fastest wins, with its route."""
    if route_probe is None:
        return probe(cell, params, xs, training, runners)
    forced, route_seconds = route_probe(cell, params, xs, training)
    routes = probed_routes(route_seconds) or [forced]  # no timings: forced
    compiled_run = runners["compiled"]
    on_routes = {f"compiled:{route}": (lambda *args, _code=route_code(route): compiled_run(*args, route=_code))
                 for route in routes}
    result = probe(cell, params, xs, training, {**on_routes, "fused": runners["fused"]})
    backend, _, route = result["backend"].partition(":")
    fastest_compiled = min(on_routes, key=result["seconds"].get).partition(":")[2]
    return {**result, "backend": backend, "route": route or fastest_compiled, "route_seconds": route_seconds}


#: the path every layer takes while :func:`pinned` is active (``None``: none pinned), and the choices that
#: :func:`recording` collects
_PINNED: ContextVar[dict | None] = ContextVar("moglm_auto_pinned", default=None)
_SEEN: ContextVar[list | None] = ContextVar("moglm_auto_seen", default=None)


@contextmanager
def pinned(choice: dict | None) -> Iterator[None]:
    """While active, :func:`choose` returns ``choice`` for every layer it decides for, without probing or reading
    the stored choices or ``MOGLM_AUTO_BACKEND``: ``{"backend": "compiled", "route": name or None}`` or
    ``{"backend": "fused"}`` (``None``: nothing pinned, ``auto`` as usual). Layers ``auto`` does not decide for
    take their own path as before: a cell without a fast path, sparse dynamic evaluation's adaptation, an empty
    batch, or a window the compiled code cannot run (which then runs fused)."""
    token = _PINNED.set(None if choice is None else dict(choice))
    try:
        yield
    finally:
        _PINNED.reset(token)


@contextmanager
def recording() -> Iterator[list[dict]]:
    """While active, every choice :func:`choose` returns is appended to the list this yields, in call order."""
    seen: list[dict] = []
    token = _SEEN.set(seen)
    try:
        yield seen
    finally:
        _SEEN.reset(token)


def choose(cell: Cell, params: Params, xs: Tensor, runners: dict, route_probe=None) -> dict:
    """The choice for this layer (module docstring): ``{"backend": "compiled" or "fused", ...}``, with the
    compiled window's per-step ``"route"`` where ``route_probe(cell, params, xs, training) -> (route,
    seconds per route)`` chose one for the class; ``runners["compiled"]`` takes it as ``route=``. A
    :func:`pinned` path comes first; :func:`recording` sees what is returned."""
    pin = _PINNED.get()
    choice = dict(pin) if pin is not None else _chosen(cell, params, xs, runners, route_probe)
    seen = _SEEN.get()
    if seen is not None:
        seen.append(dict(choice))  # a copy: the choice may be this process's stored one
    return choice


def _chosen(cell: Cell, params: Params, xs: Tensor, runners: dict, route_probe) -> dict:
    """:func:`choose`'s choice where nothing is pinned: ``MOGLM_AUTO_BACKEND``, else the stored or probed one."""
    forced = os.environ.get("MOGLM_AUTO_BACKEND", "").strip().lower()
    if forced in ("compiled", "fused"):
        return {"backend": forced}
    training = torch.is_grad_enabled() and any(t.requires_grad for t in (xs, *params.values()))
    key = shape_class(cell, xs, training)

    def timed() -> dict:
        started = time.perf_counter()
        print(f"moglm: timing the compiled and Python recurrences for {key} (once per machine; seconds)...",
              file=sys.stderr, flush=True)
        try:
            result = _probe_class(cell, params, xs, training, runners, route_probe)
            print(f"moglm: {key}: {result.get('backend', '?')} chosen in {time.perf_counter() - started:.1f}s "
                  "(moglm info --verbose lists the timings)", file=sys.stderr, flush=True)
            return result
        except Exception as error:  # noqa: BLE001 - e.g. out of memory running both
            warnings.warn(f"moglm: could not time the compiled and Python windows for {key} "
                          f"({type(error).__name__}: {error}); this class runs the compiled window on this machine",
                          stacklevel=5)  # choose's caller (past backend_choice, _chosen and choose)
            return {**UNSTORED, "failed": f"{type(error).__name__}: {error}"[:200]}

    return backend_choice(key, timed)
