"""The one owner of what the compiled recurrence chose on this machine: its GEMM routes and ``auto``'s backends.

GEMM routes (the products inside the loop, each on one thread's rows):

* ``aten``: ``at::mm_out`` on views (public API, any build);
* ``blas``: the BLAS ``sgemm_``/``dgemm_`` that torch's CPU library exports (MKL on x86), with MKL's
  thread-local thread count set to 1 in each worker;
* ``mkl_packed``: MKL's packed GEMM (``cblas_sgemm_pack``/``_compute``), each weight packed once per window;
* ``panels`` (float32): moglm's own kernel, each weight packed once per window into column panels and
  multiplied by a register-blocked micro-kernel (``csrc/window.h``);
* ``brgemm`` (float32): oneDNN's batch-reduce GEMM ukernel, which oneDNN JIT-compiles for the CPU it runs
  on (AVX2 or AVX-512), through the ``at::native::cpublas::brgemm`` that torch exports from its own
  oneDNN; each weight packed once per window into panels of 64 columns shared by the threads.

None is right on every machine, so :func:`gemm_route` times the available ones on this machine and keeps
the fastest, once per machine (stored beside the built library, so every process computes with the same
products); ``backend="auto"`` refines it per layer shape class (:func:`class_route`, stored with the class's
choice), since the ranking changes with the widths too. The weight-gradient products after the loop take
their own route, the ukernel or ``at::mm``, probed once per machine (:func:`weight_gradient_route`).
``MOGLM_GEMM_ROUTE=aten|blas|mkl_packed|panels|brgemm`` forces one everywhere.

The windows can also split a step's products by output units instead of batch rows (a route with
``+columns``, e.g. ``brgemm+columns``): every thread then multiplies all rows by its own block of the
weight, half the weight traffic per thread, and the threads meet at a barrier between a step's phases
(``csrc/window.h``, "Column-split loops"; the Mogrifier's rounds stay split by rows). The rounds may take
a route of their own (``mkl_packed+columns:brgemm``). ``auto`` times all of these per shape class, and
``MOGLM_GEMM_ROUTE`` forces any of them.

Every choice is probed at first use and stored beside the built library (:func:`store_dir`), first writer
wins, and every later process reads it: routes round differently, and a resumed run must compute bit for bit
as the uninterrupted one. This process's memory of the choices lives here too (:func:`forget` drops it).
``auto``'s backends (compiled or fused window, per shape class) are timed by :mod:`moglm.recurrence.auto`
and stored here (:func:`backend_choice`).
"""

from __future__ import annotations

import contextvars
import functools
import json
import os
import threading
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor

from ...atomic import atomic_write_text, exclusive_lock, write_once
from . import build

#: route name -> the code the ops take (``csrc/window.h``)
ROUTES = {"aten": 0, "blas": 1, "panels": 2, "mkl_packed": 3, "brgemm": 4}
#: added to a route's code: the windows split their per-step products by columns (``COLUMNS`` in
#: ``csrc/window.h``)
COLUMNS = 8
COLUMNS_SUFFIX = "+columns"
#: the Mogrifier rounds' own route, in a route's name after this (``mkl_packed+columns:brgemm``) and in its
#: code as (route + 1) << 4 (``StepRoutes`` in ``csrc/window.h``)
ROUNDS_SEPARATOR = ":"


def split_name(name: str) -> tuple[str, bool, str | None]:
    """``(gates' route, split by columns, rounds' route or None)`` of a route name."""
    gates, _, rounds = name.partition(ROUNDS_SEPARATOR)
    return gates.removesuffix(COLUMNS_SUFFIX), gates.endswith(COLUMNS_SUFFIX), rounds or None


def route_code(name: str) -> int:
    """The code the ops take for a route name: ``<gates>[+columns][:<rounds>]``, e.g. ``brgemm``,
    ``mkl_packed+columns`` or ``mkl_packed+columns:brgemm`` (the rounds on their own route)."""
    gates, columns, rounds = split_name(name)
    return ROUTES[gates] | (COLUMNS if columns else 0) | ((ROUTES[rounds] + 1) << 4 if rounds else 0)


def route_name(code: int) -> str:
    """The inverse of :func:`route_code`."""
    names = {v: k for k, v in ROUTES.items()}
    rounds = (code >> 4) & 7
    return (names[code & 7] + (COLUMNS_SUFFIX if code & COLUMNS else "")
            + (ROUNDS_SEPARATOR + names[rounds - 1] if rounds else ""))


@functools.lru_cache(maxsize=256)
def stored_route(name: str | None) -> int | None:
    """The code of a route name stored with a choice (``None`` for none, or a name this version lacks); kept per
    name, as a one-token step asks at every layer and step."""
    if not name:
        return None
    gates, _, rounds = split_name(name)
    return route_code(name) if gates in ROUTES and (rounds is None or rounds in ROUTES) else None


_lock = threading.Lock()
#: this process's view of the stored choices: per dtype ``(route code, probe seconds)``, and ``auto``'s per
#: shape class
_routes: dict[torch.dtype, tuple[int, dict]] = {}
_weight_gradient_routes: dict[torch.dtype, tuple[int, dict]] = {}
_backends: dict[str, dict] = {}


def store_dir() -> Path | None:
    """Where this machine's choices are stored: the built library's folder (``None`` where none was built)."""
    return build.build_dir()


def route_file(dtype: torch.dtype, kind: str = "gemm_route") -> Path | None:
    """The stored choice of :func:`gemm_route` (or ``kind``) for ``dtype``: ``<kind>_<dtype>.json``."""
    folder = store_dir()
    return folder / f"{kind}_{str(dtype).split('.')[-1]}.json" if folder is not None else None


def backend_file() -> Path | None:
    """``auto``'s stored choices (``backend_choice_v2.json``)."""
    folder = store_dir()
    return folder / "backend_choice_v2.json" if folder is not None else None


def forget() -> None:
    """Drop this process's memory of every choice (tests); the next use reads the stored files again."""
    _routes.clear()
    _weight_gradient_routes.clear()
    _backends.clear()


def candidate_routes(dtype: torch.dtype) -> list[str]:
    """The plain routes this machine's build has for ``dtype``."""
    double = dtype == torch.float64
    routes = ["aten"]
    if torch.ops.moglm.blas_route_available(double):
        routes.append("blas")
        if not double and torch.ops.moglm.packed_gemm_available():
            routes.append("mkl_packed")
    if not double:
        routes.append("panels")
        if torch.ops.moglm.brgemm_route_available():
            routes.append("brgemm")
    return routes


def _probe(dtype: torch.dtype, candidates: list[str]) -> dict[str, float]:
    """Seconds per route: the best of three interleaved timings of a gate-sized and two round-sized
    products, batch-parallel as the windows run them, with each route's weight packing included."""
    double = dtype == torch.float64
    shapes = ((512, 1024, 10), (256, 32, 100), (32, 256, 100))  # (K, N, products per thread)
    times = {route: float("inf") for route in candidates}
    for _ in range(3):
        for route in candidates:
            seconds = sum(time_route(ROUTES[route], 64, k, n, reps, double) for k, n, reps in shapes)
            times[route] = min(times[route], seconds)
    return times


def _read_route(path: Path | None, candidates: list[str]) -> tuple[str, dict] | None:
    try:
        data = json.loads(path.read_text())
        return (data["route"], data["seconds"]) if data["route"] in candidates else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _probed_route(kind: str, dtype: torch.dtype, candidates: list[str], probe) -> tuple[int, dict]:
    """The fastest of ``candidates`` by ``probe(dtype, candidates)`` (seconds per route), probed once per
    machine: the first process to probe stores its choice next to the built library (``<kind>_<dtype>.json``,
    never overwritten by a racing process) and every process reads it from there, so that every run on a
    machine computes with the same products (the routes round differently: a resumed run must continue bit
    for bit). Delete that file to probe again; ``MOGLM_GEMM_ROUTE`` overrides every choice."""
    forced = os.environ.get("MOGLM_GEMM_ROUTE", "").strip().lower()
    if forced in candidates:
        return ROUTES[forced], {}
    if stored_route(forced) is not None:  # a route this kind does not take as a whole
        gates = split_name(forced)[0]
        if kind == "gemm_route" and gates in candidates:  # with the column split or the rounds' own route
            return route_code(forced), {}
        if kind != "gemm_route":  # the weight gradients take the gates' route, or at::mm where it has no form
            return ROUTES[gates if gates in candidates else "aten"], {}
    if len(candidates) == 1:
        return ROUTES[candidates[0]], {}
    path = route_file(dtype, kind)
    stored = _read_route(path, candidates)
    if stored is None:
        times = probe(dtype, candidates)
        stored = (min(times, key=times.get), times)
        if path is not None:
            _store_first(path, json.dumps({"route": stored[0], "seconds": stored[1]}))
            stored = _read_route(path, candidates) or stored  # a racing process may have stored first
    return ROUTES[stored[0]], stored[1]


def gemm_route(dtype: torch.dtype) -> int:
    """The GEMM route for products inside the loop (module docstring), probed once per machine
    (:func:`_probed_route`, ``gemm_route_<dtype>.json``)."""
    if dtype not in _routes:
        _routes[dtype] = _probed_route("gemm_route", dtype, candidate_routes(dtype), _probe)
    return _routes[dtype][0]


def _probe_weight_gradients(dtype: torch.dtype, candidates: list[str]) -> dict[str, float]:
    """Seconds per route of weight-gradient products ``A^T B`` over all T*B rows (T = 70, B = 64): a
    gate-sized and a round-sized one, the best of three interleaved timings."""
    shapes = ((4480, 1024, 512), (4480, 256, 64))  # (rows, N, K)
    times = {route: float("inf") for route in candidates}
    for _ in range(3):
        for route in candidates:
            seconds = sum(torch.ops.moglm.time_product_tn(ROUTES[route], rows, n, k, 1) for rows, n, k in shapes)
            times[route] = min(times[route], seconds)
    return times


#: the weight-gradient products' route while :func:`pinned_weight_gradient_route` is active (``None``: the machine's)
_weight_gradient_pin: contextvars.ContextVar[int | None] = contextvars.ContextVar("moglm_weight_gradient_route",
                                                                                  default=None)


@contextmanager
def pinned_weight_gradient_route(name: str | None):
    """While active, :func:`weight_gradient_route` is ``name``'s route whatever this machine probed (``None``: the
    machine's own): a compressed file's header records the one its encoder's adaptation took."""
    token = _weight_gradient_pin.set(None if name is None else route_code(name))
    try:
        yield
    finally:
        _weight_gradient_pin.reset(token)


def weight_gradient_route(dtype: torch.dtype) -> int:
    """The route of the weight-gradient products after the loop: oneDNN's ukernel (``brgemm``) or ``at::mm``
    (MKL), whichever is faster here, probed once per machine (``weight_gradient_route_<dtype>.json``), unless
    :func:`pinned_weight_gradient_route` pins one. Which wins depends on the CPU: the ukernel at about 1.6x MKL's
    rate on an AMD EPYC (Zen 4), MKL at about 1.8x the ukernel's on an Intel Xeon with AMX (``moglm bench
    gemm-routes``, "weight gradient" rows)."""
    pinned = _weight_gradient_pin.get()
    if pinned is not None:
        return pinned
    if dtype not in _weight_gradient_routes:
        candidates = ["aten", "brgemm"] if "brgemm" in candidate_routes(dtype) else ["aten"]
        _weight_gradient_routes[dtype] = _probed_route("weight_gradient_route", dtype, candidates,
                                                       _probe_weight_gradients)
    return _weight_gradient_routes[dtype][0]


def probe_seconds(dtype: torch.dtype, kind: str = "gemm_route") -> dict[str, float]:
    """The probe's seconds per route behind :func:`gemm_route` (``kind="weight_gradient_route"``:
    :func:`weight_gradient_route`), ``{}`` where it was forced or had one candidate."""
    (gemm_route if kind == "gemm_route" else weight_gradient_route)(dtype)
    return (_routes if kind == "gemm_route" else _weight_gradient_routes).get(dtype, (None, {}))[1]  # (pinned: none)


#: the per-step route of the window being run, where ``backend="auto"`` chose one for the layer's shape class
_step_route: contextvars.ContextVar[int | None] = contextvars.ContextVar("moglm_step_route", default=None)


def step_route(dtype: torch.dtype) -> int:
    """The route of the per-step products now: the shape class's (:func:`class_route`, set by
    :func:`.functions.run_compiled`), else the machine's (:func:`gemm_route`)."""
    route = _step_route.get()
    return gemm_route(dtype) if route is None else route


class using_route:  # noqa: N801 - a context manager used as a function, as contextlib's are
    """Run the windows inside on ``route`` (``None``: the machine's, :func:`gemm_route`). A class, not a
    generator: a one-step window enters it at every layer and step, and the generator's frame cost more."""

    __slots__ = ("route", "token")

    def __init__(self, route: int | None) -> None:
        self.route, self.token = route, None

    def __enter__(self) -> None:
        if self.route is not None:
            self.token = _step_route.set(self.route)

    def __exit__(self, *exc) -> None:
        if self.token is not None:
            _step_route.reset(self.token)
            self.token = None


def class_route(function, spec, xs: Tensor, training: bool, reps: int = 20) -> tuple[str, dict[str, float]]:
    """The fastest route for one layer's per-step products at its own sizes and batch (``function``'s
    :meth:`step_products`), each timed ``reps`` times as the window runs them, the best of three interleaved
    timings: which route wins depends on the widths (on an Intel Xeon oneDNN's ukernel runs the Mogrifier's
    ``low -> out`` at 73 GFLOP/s at H = 1024 and at 356 at H = 650 in one run, and MKL's packed GEMM the gate product
    faster than the ukernel at H = 650), so ``auto`` stores one per shape class. The gate products and the
    Mogrifier's round products are timed apart and take their own fastest routes (``gates:rounds`` where
    they differ); where the window can split its gate products by columns (``function.column_split``, two
    threads or more) each route is timed that way too (``<route>+columns``). Returns the fastest name and
    the seconds of every gate route, each with the fastest rounds' route. The products are timed in windows of
    the layer's own steps (at most ``reps``), each packing its weights once as a window does: one-token steps
    (generation, compression) pay a route's packing at every step, which on a probe that packed once for all
    ``reps`` ranked the packing routes first where they were the slowest. ``MOGLM_GEMM_ROUTE`` forces its
    route here too (no timings)."""
    plain = candidate_routes(xs.dtype)
    gate_routes = plain + ([r + COLUMNS_SUFFIX for r in plain] if column_split_possible(function, spec) else [])
    forced = os.environ.get("MOGLM_GEMM_ROUTE", "").strip().lower()
    if stored_route(forced) is not None and split_name(forced)[0] in plain:
        return forced, {}  # (where the window cannot split by columns, it runs by rows)
    double = xs.dtype == torch.float64
    products = function.step_products(spec, training)
    round_products = function.round_products(spec) if hasattr(function, "round_products") else []
    gate_products = products[:len(products) - len(round_products)]

    steps = min(int(xs.shape[0]), reps)

    def timed(routes: list[str], products) -> dict[str, float]:
        times = {route: float("inf") for route in routes}
        if not products:
            return {route: 0.0 for route in routes}
        for _ in range(3):
            for route in routes:
                code = route_code(route)
                times[route] = min(times[route], sum(
                    count * time_route(code, xs.shape[1], k, n, reps, double, spec.hidden_size, steps)
                    for k, n, count in products))
        return times

    gate_times, round_times = timed(gate_routes, gate_products), timed(plain, round_products)
    best_rounds = min(round_times, key=round_times.get)
    times = {}
    for route in gate_routes:
        base = split_name(route)[0]
        rounds = base if not round_products or round_times[base] <= round_times[best_rounds] else best_rounds
        name = route + (ROUNDS_SEPARATOR + rounds if rounds != base else "")
        times[name] = gate_times[route] + round_times[rounds]
    return min(times, key=times.get), times


def time_route(code: int, batch: int, k: int, n: int, reps: int, double: bool, units: int = -1,
               steps: int = 0) -> float:
    """Seconds of ``reps`` [batch, k] x [k, n] products on route ``code`` as the windows run them, in windows of
    ``steps`` products that each pack the weights once (0: one window); ``csrc`` ``time_gemm_route``."""
    return torch.ops.moglm.time_gemm_route(code, batch, k, n, reps, double, units, steps)


def column_split_possible(function, spec) -> bool:
    """Whether ``function``'s window would split its gate products by columns here (``csrc/window.h``,
    ``column_partitions``: two threads or more, outside a parallel region, 16 units a thread at least)."""
    return bool(getattr(function, "column_split", False)) and int(
        torch.ops.moglm.column_partitions(spec.hidden_size)) > 1


def _store_first(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` unless it already holds a valid file (first writer wins, so every process
    on the machine uses one route); an unreadable file is replaced, a read-only cache skipped."""
    write_once(path, text, lambda p: _read_route(p, list(ROUTES)) is not None)


#: what ``auto`` runs where no choice can be stored: the same in every process, so that the ranks of a job and
#: a resumed run agree without a file
UNSTORED = {"backend": "compiled", "seconds": {}, "pairs": 0, "separated": False}


def stored_backends() -> dict[str, dict]:
    """Every stored backend choice on this machine: ``{class: {"backend", "seconds", "pairs", "separated",
    "route", "route_seconds"}}`` (``route``: the compiled window's per-step route for the class, where one was
    probed)."""
    path = backend_file()
    try:
        data = json.loads(path.read_text()) if path is not None else {}
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict) and v.get("backend") in ("compiled", "fused")}


def _store_backend(key: str, choice: dict) -> dict | None:
    """Store ``choice`` under ``key`` unless a racing process stored one first; returns the stored one,
    or ``None`` where nothing can be stored (a read-only cache)."""
    path = backend_file()
    if path is None:
        return None
    try:
        with exclusive_lock(path.with_name(".backend_choice.lock")):  # read-modify-write between processes
            data = stored_backends()
            if key not in data:
                data[key] = choice
                atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True))
            return data[key]
    except OSError:
        return None


def backend_choice(key: str, probe) -> dict:
    """``auto``'s backend for shape class ``key``: this process's, else the stored one, else ``probe()``'s,
    stored (first writer wins); :data:`UNSTORED`, without probing, where nothing can be stored."""
    if key not in _backends:
        with _lock:
            if key not in _backends:
                found, path = stored_backends().get(key), backend_file()
                if found is None:
                    if path is None or not os.access(path.parent, os.W_OK):
                        found = UNSTORED  # nowhere to store: no probe, the same path in every process
                    else:
                        found = _store_backend(key, probe()) or UNSTORED
                _backends[key] = found
    return _backends[key]


def backends_used() -> dict[str, dict]:
    """The backend choices this process has used so far, by class (benchmarks record them with their results)."""
    return dict(_backends)
