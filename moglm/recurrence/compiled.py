"""The compiled recurrence: the fused window in C++ for CPU (``csrc/``), built for this machine at first use.

What it computes is what :mod:`moglm.recurrence.fused_lstm` and :mod:`.fused_multiplicative_lstm`
compute (and what :mod:`.reference` computes step by step); how it runs (docs/fused-recurrence.md):

* the forward loop and the backward data-gradient loop are batch-parallel: each thread takes a block of
  batch rows through all T steps alone, with single-threaded products on its rows;
* per step only what is sequential (the mogrifier rounds, the gate product, the cell), with the pointwise
  work of a step in one vectorised loop per cell or round;
* everything else (input projections, dX when it does not depend on the recurrence, every weight
  gradient) as multi-threaded products over all T*B rows, before or after the loop.

Building: ``torch.utils.cpp_extension.load`` (ninja) with ``-O3 -march=native -fopenmp``, into a cache
directory keyed by the sources, torch, Python and this CPU (``MOGLM_EXTENSIONS_DIR``, default
``~/.cache/moglm/extensions``), so a machine builds once (about a minute on two cores) and every later
process loads it. ``MOGLM_COMPILED=0`` turns it off. Where it cannot be built (no compiler, a build
error), :func:`available` is False, :func:`unavailable_reason` says why, and the stack runs the Python
fused path instead, saying so once.

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
"""

from __future__ import annotations

import contextvars
import hashlib
from contextlib import contextmanager
import json
import os
import platform
import re
import sys
import threading
import warnings
from pathlib import Path

import torch
from torch import Tensor

from ..atomic import exclusive_lock, write_once
from ..cells.base import Params
from ..errors import MoglmError
from .fallback import FusedFallbackWarning, autocast_dtype, double_backward_by_reference, user_stacklevel

SOURCES = ("workspace.h", "window.h", "mogrifier_lstm.cpp", "multiplicative_lstm.cpp")
#: -fno-trapping-math lets GCC turn the pointwise kernels' comparisons into vector selects; nothing here
#: changes values the way -ffast-math would (torch itself is built with it and -fno-math-errno)
CFLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fno-trapping-math", "-fno-math-errno", "-fopenmp", "-DNDEBUG")
LDFLAGS = ("-fopenmp",)
ROUTES = {"aten": 0, "blas": 1, "panels": 2, "mkl_packed": 3, "brgemm": 4}
#: added to a route's code: the windows split their per-step products by columns (``COLUMNS`` in
#: ``csrc/window.h``)
COLUMNS = 8
COLUMNS_SUFFIX = "+columns"
#: the Mogrifier rounds' own route, in a route's name after this (``mkl_packed+columns:brgemm``) and in its
#: code as (route + 1) << 4 (``StepRoutes`` in ``csrc/window.h``)
ROUNDS_SEPARATOR = ":"


def _split_name(name: str) -> tuple[str, bool, str | None]:
    gates, _, rounds = name.partition(ROUNDS_SEPARATOR)
    return gates.removesuffix(COLUMNS_SUFFIX), gates.endswith(COLUMNS_SUFFIX), rounds or None


def route_code(name: str) -> int:
    """The code the ops take for a route name: ``<gates>[+columns][:<rounds>]``, e.g. ``brgemm``,
    ``mkl_packed+columns`` or ``mkl_packed+columns:brgemm`` (the rounds on their own route)."""
    gates, columns, rounds = _split_name(name)
    return ROUTES[gates] | (COLUMNS if columns else 0) | ((ROUTES[rounds] + 1) << 4 if rounds else 0)


def route_name(code: int) -> str:
    """The inverse of :func:`route_code`."""
    names = {v: k for k, v in ROUTES.items()}
    rounds = (code >> 4) & 7
    return (names[code & 7] + (COLUMNS_SUFFIX if code & COLUMNS else "")
            + (ROUNDS_SEPARATOR + names[rounds - 1] if rounds else ""))


def stored_route(name: str | None) -> int | None:
    """The code of a route name stored with a choice (``None`` for none, or a name this version lacks)."""
    if not name:
        return None
    gates, _, rounds = _split_name(name)
    return route_code(name) if gates in ROUTES and (rounds is None or rounds in ROUTES) else None


#: a worker thread takes at least this many batch rows; with fewer rows per thread the window runs on
#: one thread and its products use every thread instead (batch 1 sampling, small dynamic evaluation)
MIN_ROWS = 8

_lock = threading.Lock()
_state: dict = {"loaded": None, "reason": None, "build_dir": None, "routes": {}, "weight_gradient_routes": {}}


class CompiledUnavailableWarning(FusedFallbackWarning):
    """The compiled recurrence could not be built or loaded here; the Python fused path runs instead."""


def _cpu_id() -> str:
    """The CPU's model and feature flags (what ``-march=native`` compiles for)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        fields = {}
        for line in text.splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
        return f"{fields.get('model name', '')}|{fields.get('flags', fields.get('Features', ''))}"
    except OSError:
        return f"{platform.machine()}|{platform.processor()}"


def source_dir() -> Path:
    return Path(__file__).with_name("csrc")


def build_key() -> str:
    """Hash of everything the built library depends on, and of the install it belongs to: the sources' folder,
    torch's and the interpreter's, so that two installs (two checkouts, two virtual environments) never share
    a build folder whose ``build.ninja`` names the other's paths, which would relink at every switch."""
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update((source_dir() / name).read_bytes())
    install = (str(source_dir().resolve()), str(Path(torch.__file__).resolve().parent), sys.prefix)
    for part in (torch.__version__, sys.version, _cpu_id(), " ".join(CFLAGS + LDFLAGS), *install):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def extensions_dir() -> Path:
    if os.environ.get("MOGLM_EXTENSIONS_DIR"):
        return Path(os.environ["MOGLM_EXTENSIONS_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "moglm" / "extensions"


@contextmanager
def _build_lock(build_dir: Path):
    """torch's build lock (a ``lock`` file it creates and deletes) outlives a process killed mid-build, and
    every later build then waits for it forever. Builds of this directory are serialised by an ``flock``
    here, which the kernel releases with its holder, so a ``lock`` file found while holding it is stale.
    A process that waits for another's build says so."""

    def waiting() -> None:
        print("moglm: waiting for another process that is building the compiled recurrence (once; about a "
              "minute)...", file=sys.stderr, flush=True)

    with exclusive_lock(build_dir / ".moglm-build", on_wait=waiting):
        (build_dir / "lock").unlink(missing_ok=True)
        yield


def _load() -> bool:
    if os.environ.get("MOGLM_COMPILED", "1").strip().lower() in ("0", "false", "no", "off"):
        _state["reason"] = "turned off by MOGLM_COMPILED=0"
        return False
    try:
        from torch.utils import cpp_extension

        key = build_key()
        name = f"moglm_recurrence_{key}"
        build_dir = extensions_dir() / name
        build_dir.mkdir(parents=True, exist_ok=True)
        _state["build_dir"] = str(build_dir)
        if not any(build_dir.glob(f"{name}*.so")):
            print("moglm: building the compiled recurrence for this machine (once; about a minute)...",
                  file=sys.stderr, flush=True)
        with _build_lock(build_dir):
            cpp_extension.load(
                name=name,
                sources=[str(source_dir() / s) for s in SOURCES if s.endswith(".cpp")],
                extra_cflags=list(CFLAGS),
                extra_ldflags=list(LDFLAGS),
                build_directory=str(build_dir),
                is_python_module=False,
                verbose=False,
            )
        torch.ops.moglm.mogrifier_lstm_forward  # noqa: B018 - the ops are registered
        return True
    except Exception as error:  # noqa: BLE001 - any build or load failure means: fall back
        _state["reason"] = build_failure_reason(error)
        return False


#: what a failed build's output says, most telling first: the compiler's error, the linker's, a missing
#: program or file, then any line that says it failed
_TELLING = (re.compile(r"(fatal )?error:", re.I), re.compile(r"undefined reference|cannot find -l", re.I),
            re.compile(r"not found|no such file", re.I), re.compile(r"error|failed", re.I))
#: the command lines ninja echoes (a compile's or the link's), which name every flag and path but no reason
_ECHOED_COMMAND = re.compile(r"^\[\d+/\d+\] | -MMD | -shared ")


def build_failure_reason(error: BaseException) -> str:
    """One line saying why the build or load failed: the compiler's own error where there is one, not the
    command line that ninja echoes before it (torch's message puts that on its first line)."""
    text = str(error).strip()
    built = re.match(r"(Error building extension '[^']*'): ", text)  # torch's: "...'x': [1/2] c++ ...\n..."
    head, rest = (built.group(1), text[built.end():]) if built else ("", "")
    lines = [line.strip() for line in (rest if rest else text).splitlines() if line.strip()]
    lines = [line for line in lines if not _ECHOED_COMMAND.search(line)]
    telling = next((line for pattern in _TELLING for line in lines if pattern.search(line)), None)
    if telling is None:
        said = text.splitlines()[0] if text else repr(error)
    else:
        said = f"{head}: {telling}" if rest else telling
    return f"{type(error).__name__}: {said}"[:300]


#: the workspace cache's settings (:func:`workspace_cache`; ``MOGLM_WORKSPACE_POISON=1``, for tests, fills
#: every block it hands out with NaN), whole numbers from 0 to 2^40 read once a process (``csrc/workspace.h``
#: checks them with the same rule)
WORKSPACE_SETTINGS = ("MOGLM_WORKSPACE_CACHE_MB", "MOGLM_WORKSPACE_CACHE_MIN_KB", "MOGLM_WORKSPACE_POISON")


def available() -> bool:
    """Whether the compiled recurrence is built and loaded (building it on first call)."""
    if _state["loaded"] is None:
        for name in WORKSPACE_SETTINGS:
            value = os.environ.get(name, "")
            if value and not (re.fullmatch("[0-9]+", value) and int(value) <= 2**40):
                raise MoglmError(f"{name} must be a whole number from 0 to 2^40, got {value!r}")
        with _lock:
            if _state["loaded"] is None:
                _state["loaded"] = _load()
                if not _state["loaded"]:
                    warnings.warn(
                        f"moglm: the compiled recurrence is unavailable ({_state['reason']}); CPU layers run the "
                        "Python fused recurrence (slower)",
                        CompiledUnavailableWarning,
                        stacklevel=user_stacklevel(),
                    )
    return bool(_state["loaded"])


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (``None`` when it is True or has not been asked yet)."""
    return None if _state["loaded"] else _state["reason"]


def _candidate_routes(dtype: torch.dtype) -> list[str]:
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
            seconds = sum(torch.ops.moglm.time_gemm_route(ROUTES[route], 64, k, n, reps, double) for k, n, reps in shapes)
            times[route] = min(times[route], seconds)
    return times


def _route_file(dtype: torch.dtype, kind: str = "gemm_route") -> Path | None:
    return Path(_state["build_dir"]) / f"{kind}_{str(dtype).split('.')[-1]}.json" if _state["build_dir"] else None


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
        gates = _split_name(forced)[0]
        if kind == "gemm_route" and gates in candidates:  # with the column split or the rounds' own route
            return route_code(forced), {}
        if kind != "gemm_route":  # the weight gradients take the gates' route, or at::mm where it has no form
            return ROUTES[gates if gates in candidates else "aten"], {}
    if len(candidates) == 1:
        return ROUTES[candidates[0]], {}
    path = _route_file(dtype, kind)
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
    routes = _state["routes"]
    if dtype not in routes:
        routes[dtype] = _probed_route("gemm_route", dtype, _candidate_routes(dtype), _probe)
    return routes[dtype][0]


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


def weight_gradient_route(dtype: torch.dtype) -> int:
    """The route of the weight-gradient products after the loop: oneDNN's ukernel (``brgemm``) or ``at::mm``
    (MKL), whichever is faster here, probed once per machine (``weight_gradient_route_<dtype>.json``). Which
    wins depends on the CPU: the ukernel at about 1.6x MKL's rate on an AMD EPYC (Zen 4), MKL at about 1.8x
    the ukernel's on an Intel Xeon with AMX (``moglm bench gemm-routes``, "weight gradient" rows)."""
    routes = _state["weight_gradient_routes"]
    if dtype not in routes:
        candidates = ["aten", "brgemm"] if "brgemm" in _candidate_routes(dtype) else ["aten"]
        routes[dtype] = _probed_route("weight_gradient_route", dtype, candidates, _probe_weight_gradients)
    return routes[dtype][0]


#: the per-step route of the window being run, where ``backend="auto"`` chose one for the layer's shape class
_step_route: contextvars.ContextVar[int | None] = contextvars.ContextVar("moglm_step_route", default=None)


def step_route(dtype: torch.dtype) -> int:
    """The route of the per-step products now: the shape class's (:func:`class_route`, set by
    :func:`run_compiled`), else the machine's (:func:`gemm_route`)."""
    route = _step_route.get()
    return gemm_route(dtype) if route is None else route


@contextmanager
def _using_route(route: int | None):
    token = _step_route.set(route) if route is not None else None
    try:
        yield
    finally:
        if token is not None:
            _step_route.reset(token)


def class_route(function, spec, xs: Tensor, training: bool, reps: int = 20) -> tuple[str, dict[str, float]]:
    """The fastest route for one layer's per-step products at its own sizes and batch (``function``'s
    :meth:`step_products`), each timed ``reps`` times as the window runs them, the best of three interleaved
    timings: which route wins depends on the widths (on an Intel Xeon oneDNN's ukernel runs the Mogrifier's
    ``low -> out`` at 73 GFLOP/s at H = 1024 and at 356 at H = 650 in one run, and MKL's packed GEMM the gate product
    faster than the ukernel at H = 650), so ``auto`` stores one per shape class. The gate products and the
    Mogrifier's round products are timed apart and take their own fastest routes (``gates:rounds`` where
    they differ); where the window can split its gate products by columns (``function.column_split``, two
    threads or more) each route is timed that way too (``<route>+columns``). Returns the fastest name and
    the seconds of every gate route, each with the fastest rounds' route. ``MOGLM_GEMM_ROUTE`` forces its
    route here too (no timings)."""
    plain = _candidate_routes(xs.dtype)
    gate_routes = plain + ([r + COLUMNS_SUFFIX for r in plain] if column_split_possible(function, spec) else [])
    forced = os.environ.get("MOGLM_GEMM_ROUTE", "").strip().lower()
    if stored_route(forced) is not None and _split_name(forced)[0] in plain:
        return forced, {}  # (where the window cannot split by columns, it runs by rows)
    double = xs.dtype == torch.float64
    products = function.step_products(spec, training)
    round_products = function.round_products(spec) if hasattr(function, "round_products") else []
    gate_products = products[:len(products) - len(round_products)]

    def timed(routes: list[str], products) -> dict[str, float]:
        times = {route: float("inf") for route in routes}
        if not products:
            return {route: 0.0 for route in routes}
        for _ in range(3):
            for route in routes:
                code = route_code(route)
                times[route] = min(times[route], sum(
                    count * torch.ops.moglm.time_gemm_route(code, xs.shape[1], k, n, reps, double, spec.hidden_size)
                    for k, n, count in products))
        return times

    gate_times, round_times = timed(gate_routes, gate_products), timed(plain, round_products)
    best_rounds = min(round_times, key=round_times.get)
    times = {}
    for route in gate_routes:
        base = _split_name(route)[0]
        rounds = base if not round_products or round_times[base] <= round_times[best_rounds] else best_rounds
        name = route + (ROUNDS_SEPARATOR + rounds if rounds != base else "")
        times[name] = gate_times[route] + round_times[rounds]
    return min(times, key=times.get), times


def column_split_possible(function, spec) -> bool:
    """Whether ``function``'s window would split its gate products by columns here (``csrc/window.h``,
    ``column_partitions``: two threads or more, outside a parallel region, 16 units a thread at least)."""
    return bool(getattr(function, "column_split", False)) and int(
        torch.ops.moglm.column_partitions(spec.hidden_size)) > 1


def _store_first(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` unless it already holds a valid file (first writer wins, so every process
    on the machine uses one route); an unreadable file is replaced, a read-only cache skipped."""
    write_once(path, text, lambda p: _read_route(p, list(ROUTES)) is not None)


def info(paths: bool = True) -> dict:
    """What runs on CPU here: whether the compiled path is loaded, why not, its GEMM route and timings;
    ``paths=False`` leaves out this machine's build directory (for results that get committed)."""
    ok = available()
    out = {"compiled": ok, "reason": unavailable_reason(), "cpu": _cpu_id().split("|")[0],
           "threads": torch.get_num_threads()}
    if paths:
        out["build_dir"] = _state["build_dir"]
    if ok:
        out["gemm_route"] = route_name(gemm_route(torch.float32))
        out["gemm_route_probe_seconds"] = _state["routes"][torch.float32][1]
        out["weight_gradient_route"] = route_name(weight_gradient_route(torch.float32))
        out["weight_gradient_route_probe_seconds"] = _state["weight_gradient_routes"][torch.float32][1]
        out["mkl_thread_control"] = bool(torch.ops.moglm.mkl_thread_control_available())
        out["workspace_cache"] = workspace_cache()
        from . import auto

        out["auto_backend"] = auto.stored()  # per shape class: compiled or fused, with the probe's timings
    return out


def workspace_cache() -> dict[str, int]:
    """The windows' workspace cache (``csrc/workspace.h``): the freed large buffers it keeps for the next
    window of the same sizes, so that a training loop stops paying the OS's page faults for them at every
    step. ``{"cached_bytes", "cached_blocks", "hits", "misses", "limit_bytes"}``; all zero where the compiled
    path is not loaded (neither function builds it). ``MOGLM_WORKSPACE_CACHE_MB`` sets the limit (default 2048, 0 turns the cache off),
    ``MOGLM_WORKSPACE_CACHE_MIN_KB`` the smallest block it keeps (default 1024), both read once a process."""
    keys = ("cached_bytes", "cached_blocks", "hits", "misses", "limit_bytes")
    values = torch.ops.moglm.workspace_cache_stats() if _state["loaded"] else [0] * len(keys)
    return dict(zip(keys, (int(v) for v in values), strict=True))


def empty_cache() -> None:
    """Hand the workspace cache's blocks back to the OS, as ``torch.cuda.empty_cache`` does for CUDA's (the
    buffers windows still use are kept until they are freed, then cached again)."""
    if _state["loaded"]:
        torch.ops.moglm.workspace_cache_clear()


def can_run(xs: Tensor) -> str | None:
    """Why the compiled path cannot run on ``xs`` (``None`` if it can)."""
    if xs.device.type != "cpu":
        return f"the compiled recurrence runs on CPU only (input on {xs.device.type})"
    if xs.dtype not in (torch.float32, torch.float64):
        return f"the compiled recurrence takes float32 or float64 (input is {xs.dtype})"
    if autocast_dtype(xs) is not None:
        return "autocast is on (the fused window runs its products in the autocast dtype)"
    if not available():
        return f"the compiled recurrence is unavailable ({unavailable_reason()})"
    return None


# -- the layers ------------------------------------------------------------------------------------------


def _round_lists(spec, p: Params) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """Per round (in round order): its matrix (full rank) or right factor, its left factor, its bias."""
    mats, lefts, biases = [], [], []
    for i in range(1, spec.rounds + 1):
        kind, j = ("q", (i - 1) // 2) if i % 2 == 1 else ("r", i // 2 - 1)
        prefix = f"mogrifier_{kind}_"
        if spec.rank > 0:
            mats.append(p[prefix + "right"][j])
            lefts.append(p[prefix + "left"][j])
        else:
            mats.append(p[prefix + "weight"][j])
        if prefix + "bias" in p:
            biases.append(p[prefix + "bias"][j])
    return mats, lefts, biases


def _bias(p: Params) -> Tensor | None:
    return p["bias_ih"] + p["bias_hh"] if "bias_ih" in p else None


class _CompiledFunction(torch.autograd.Function):
    """Autograd over a whole window: ``apply(spec, cell, xs, h0, c0, mask, adapt, *params) -> (ys, h_T, c_T)``;
    ``adapt`` is sparse dynamic evaluation's matrix M (or ``None``). Subclasses define ``run_forward`` and
    ``run_backward`` (the ops' calls)."""

    @classmethod
    def forward(cls, ctx, spec, cell, xs, h0, c0, mask, adapt, *params):
        p = dict(zip(spec.names, params))
        out = cls.run_forward(spec, xs, h0, c0, mask, p, save=True, adapt=adapt)
        ctx.spec, ctx.cell, ctx.route = spec, cell, step_route(xs.dtype)  # the backward's products take it too
        ctx.save_for_backward(xs, h0, c0, mask, adapt, *params, out[0], *out[3:])
        return out[0], out[1], out[2]

    @classmethod
    def backward(cls, ctx, dys, dh_T, dc_T):
        spec = ctx.spec
        tensors = ctx.saved_tensors
        k = 5 + len(spec.names)
        needs = ctx.needs_input_grad[2:]
        xs, h0, c0, mask, adapt = tensors[:5]
        if torch.is_grad_enabled():  # create_graph=True: differentiate the reference loop instead
            if adapt is not None:
                raise RuntimeError("double backward through sparse dynamic evaluation's adaptation is not supported "
                                   "by the compiled recurrence; use backend='reference'")
            inputs = (xs, h0, c0, mask, *tensors[5:k])
            grads = double_backward_by_reference(ctx.cell, spec.names, needs[:4] + needs[5:], inputs,
                                                 (dys, dh_T, dc_T))
            return (None, None, *grads[:4], None, *grads[4:])
        p = dict(zip(spec.names, tensors[5:k]))
        with _using_route(ctx.route):
            grads = cls.run_backward(spec, xs, h0, c0, mask, p, list(tensors[k:]), (dys, dh_T, dc_T),
                                     bool(needs[0]), any(needs[5:]), adapt)
        out = [grads["x"], grads["h0"], grads["c0"], None, grads.get("adapt"), *(grads.get(name) for name in spec.names)]
        return (None, None, *(g if need else None for g, need in zip(out, needs)))


class CompiledLSTMFunction(_CompiledFunction):
    """The LSTM (rounds = 0) and the Mogrifier LSTM (``csrc/mogrifier_lstm.cpp``)."""

    #: the window can split its gate products by columns (``+columns`` routes)
    column_split = True

    @staticmethod
    def step_products(spec, training: bool) -> list[tuple[int, int, int]]:
        """``(K, N, count)`` of the products a step runs forward: the gate product's two halves (the LSTM in
        training multiplies ``W_ih x`` for all rows before the loop) and each round's one or two."""
        m, n = spec.input_size, spec.hidden_size
        gates = [(n, 4 * n, 1)] if spec.rounds == 0 and training else [(m, 4 * n, 1), (n, 4 * n, 1)]
        return gates + CompiledLSTMFunction.round_products(spec)

    @staticmethod
    def round_products(spec) -> list[tuple[int, int, int]]:
        """The rounds' ``(K, N, count)`` among :meth:`step_products` (the last ones), which may take a route of
        their own."""
        m, n, k = spec.input_size, spec.hidden_size, spec.rank
        out = []
        for i in range(1, spec.rounds + 1):
            src, dst = (n, m) if i % 2 == 1 else (m, n)  # odd rounds gate x from h, even ones h from x
            out += [(src, k, 1), (k, dst, 1)] if k > 0 else [(src, dst, 1)]
        return out

    @staticmethod
    def run_forward(spec, xs, h0, c0, mask, p: Params, save: bool, adapt: Tensor | None = None) -> list[Tensor]:
        mats, lefts, biases = _round_lists(spec, p)
        return torch.ops.moglm.mogrifier_lstm_forward(
            xs, h0, c0, mask, p["weight_ih"], p["weight_hh"], _bias(p), mats, lefts, biases, spec.rounds,
            spec.rank, spec.zigzag, spec.capped, save, step_route(xs.dtype), MIN_ROWS, adapt,
        )

    @staticmethod
    def run_backward(spec, xs, h0, c0, mask, p: Params, saved, grads_out, need_dx: bool, need_weights: bool,
                     adapt: Tensor | None = None) -> dict:
        mats, lefts, biases = _round_lists(spec, p)
        g = torch.ops.moglm.mogrifier_lstm_backward(
            xs, h0, c0, mask, p["weight_ih"], p["weight_hh"], "bias_ih" in p, mats, lefts, biases, spec.rounds,
            spec.rank, spec.zigzag, spec.capped, saved, *grads_out, need_dx, need_weights, step_route(xs.dtype),
            MIN_ROWS, adapt, weight_gradient_route(xs.dtype),
        )
        out = {"x": g[0], "h0": g[1], "c0": g[2], "weight_ih": g[3], "weight_hh": g[4], "adapt": g[-1]}
        if "bias_ih" in p:
            out["bias_ih"] = out["bias_hh"] = g[5]
        if need_weights and spec.rounds:
            per_round = [g[6 + 3 * i : 9 + 3 * i] for i in range(spec.rounds)]  # (mat or right, left, bias)
            for kind, first in (("q", 0), ("r", 1)):
                rounds = per_round[first::2]
                if not rounds:
                    continue
                prefix = f"mogrifier_{kind}_"
                if spec.rank > 0:
                    out[prefix + "right"] = torch.stack([r[0] for r in rounds])
                    out[prefix + "left"] = torch.stack([r[1] for r in rounds])
                else:
                    out[prefix + "weight"] = torch.stack([r[0] for r in rounds])
                if prefix + "bias" in p:
                    out[prefix + "bias"] = torch.stack([r[2] for r in rounds])
        return out


class CompiledMultiplicativeLSTMFunction(_CompiledFunction):
    """Krause's multiplicative LSTM (``csrc/multiplicative_lstm.cpp``)."""

    #: the window can split both its per-step products by columns (``+columns`` routes)
    column_split = True

    @staticmethod
    def step_products(spec, training: bool) -> list[tuple[int, int, int]]:
        """``(K, N, count)`` of a step's products: ``W_mh h`` and ``W_hh m`` (the x parts run before the loop)."""
        n = spec.hidden_size
        return [(n, n, 1), (n, 4 * n, 1)]

    @staticmethod
    def run_forward(spec, xs, h0, c0, mask, p: Params, save: bool, adapt: Tensor | None = None) -> list[Tensor]:
        return torch.ops.moglm.multiplicative_lstm_forward(
            xs, h0, c0, mask, p["weight_ih"], p["weight_hh"], _bias(p), p["weight_mx"], p["weight_mh"], spec.capped,
            save, step_route(xs.dtype), MIN_ROWS, adapt,
        )

    @staticmethod
    def run_backward(spec, xs, h0, c0, mask, p: Params, saved, grads_out, need_dx: bool, need_weights: bool,
                     adapt: Tensor | None = None) -> dict:
        g = torch.ops.moglm.multiplicative_lstm_backward(
            xs, h0, c0, mask, p["weight_ih"], p["weight_hh"], "bias_ih" in p, p["weight_mx"], p["weight_mh"],
            spec.capped, saved, *grads_out, need_dx, need_weights, step_route(xs.dtype), MIN_ROWS, adapt,
            weight_gradient_route(xs.dtype),
        )
        out = {"x": g[0], "h0": g[1], "c0": g[2], "weight_ih": g[3], "weight_hh": g[4], "weight_mx": g[6],
               "weight_mh": g[7], "adapt": g[8]}
        if "bias_ih" in p:
            out["bias_ih"] = out["bias_hh"] = g[5]
        return out


def run_compiled(function, spec, cell, params: Params, xs: Tensor, state, h_mask: Tensor | None,
                 adapt: Tensor | None = None, route: int | None = None):
    """Run ``function`` over ``xs`` ``[T, B, m]``; ``(ys, (h_T, c_T))``. ``adapt``: sparse dynamic
    evaluation's M (``[U, U]`` or ``[B, U, U]``), applied to the first U units of h after every step.
    ``route``: the per-step products' route (``None``: the machine's, :func:`gemm_route`). Without
    anything to differentiate, only the forward runs, saving nothing."""
    with _using_route(route):
        return _run_compiled(function, spec, cell, params, xs, state, h_mask, adapt)


def _run_compiled(function, spec, cell, params: Params, xs: Tensor, state, h_mask: Tensor | None,
                  adapt: Tensor | None):
    xs = xs.contiguous()
    h0, c0 = (s.contiguous() for s in state)
    values = tuple(params.values())
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (xs, h0, c0, adapt, *values)):
        ys, h_T, c_T = function.apply(spec, cell, xs, h0, c0, h_mask, adapt, *values)
    else:
        ys, h_T, c_T = function.run_forward(spec, xs, h0, c0, h_mask, params, save=False, adapt=adapt)[:3]
    return ys, (h_T, c_T)
