"""Building and loading the compiled recurrence's C++ (``csrc/``) for this machine, at first use. The same
library holds the context mixer's compiled step (``csrc/context_mixing.cpp``,
:mod:`moglm.compression.compiled_mixing`) and the match model's (``csrc/match.cpp``, :mod:`moglm.compression.match`).

``torch.utils.cpp_extension.load`` (ninja) with ``-O3 -march=native -fopenmp``, into a cache directory keyed by
the sources, torch, Python and this CPU (``MOGLM_EXTENSIONS_DIR``, default ``~/.cache/moglm/extensions``), so a
machine builds once (about a minute on two cores) and every later process loads it. ``MOGLM_COMPILED=0`` turns
it off. Where it cannot be built (no compiler, a build error), :func:`available` is False,
:func:`unavailable_reason` says why, and the stack runs the Python fused path instead, saying so once.

This module also holds the windows' workspace cache (``csrc/workspace.h``), which lives in the loaded library.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import sys
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

from ...atomic import exclusive_lock
from ...errors import MoglmError
from ..fallback import FusedFallbackWarning, user_stacklevel

SOURCES = ("workspace.h", "window.h", "mogrifier_lstm.cpp", "multiplicative_lstm.cpp", "context_mixing.cpp",
           "mixer_contexts.cpp", "match.cpp")
#: -fno-trapping-math lets GCC turn the pointwise kernels' comparisons into vector selects; nothing here
#: changes values the way -ffast-math would (torch itself is built with it and -fno-math-errno)
CFLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fno-trapping-math", "-fno-math-errno", "-fopenmp", "-DNDEBUG")
LDFLAGS = ("-fopenmp",)

_lock = threading.Lock()
#: this process's build, read through :func:`available`, :func:`unavailable_reason` and :func:`build_dir`
_state: dict = {"loaded": None, "reason": None, "build_dir": None}


class CompiledUnavailableWarning(FusedFallbackWarning):
    """The compiled recurrence could not be built or loaded here; the Python fused path runs instead."""


def cpu_id() -> str:
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
    for part in (torch.__version__, sys.version, cpu_id(), " ".join(CFLAGS + LDFLAGS), *install):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def extensions_dir() -> Path:
    if os.environ.get("MOGLM_EXTENSIONS_DIR"):
        return Path(os.environ["MOGLM_EXTENSIONS_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "moglm" / "extensions"


@contextmanager
def _build_lock(build_dir: Path, built: bool = False):
    """torch's build lock (a ``lock`` file it creates and deletes) outlives a process killed mid-build, and
    every later build then waits for it forever. Builds of this directory are serialised by an ``flock``
    here, which the kernel releases with its holder, so a ``lock`` file found while holding it is stale.
    A process that waits for another's build says so, unless the library was ``built`` already (then the other
    process is only checking it, which takes a moment)."""

    def waiting() -> None:
        if not built:
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
        built = any(build_dir.glob(f"{name}*.so"))
        if not built:
            print("moglm: building the compiled recurrence for this machine (once; about a minute)...",
                  file=sys.stderr, flush=True)
        with _build_lock(build_dir, built):
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


def build_dir() -> Path | None:
    """The folder the library was built in (``None`` before :func:`available` has been asked, or with
    ``MOGLM_COMPILED=0``); :mod:`.routes` stores this machine's choices beside it."""
    return Path(_state["build_dir"]) if _state["build_dir"] else None


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




@contextmanager
def flush_denormals(on: bool):
    """While inside, the compiled windows flush subnormal floats to zero (``on``, the default outside) or
    compute with them as IEEE 754 says (``off``), process-wide, then as before. Subnormals (below 1.2e-38 in
    float32) cost a microcode assist per multiply-add on x86 CPUs, and a trained model's steps make them; the
    windows flush them (``csrc/window.h``, ``DenormalScope``). Off is for what must round as before the flush
    existed: a compressed file written then (:mod:`moglm.compression.container`). Loads the library (building
    it on first use); a no-op where it is not loaded or the CPU is not x86-64."""
    if not available() or not torch.ops.moglm.flush_denormals_supported():
        yield
        return
    with _switched("set_flush_denormals", on):
        yield


@contextmanager
def _switched(setter: str, on: bool):
    """One of the library's process-wide switches (``torch.ops.moglm.<setter>``, which returns the old value) set
    to ``on`` while inside, then as before."""
    saved = getattr(torch.ops.moglm, setter)(on)
    try:
        yield
    finally:
        getattr(torch.ops.moglm, setter)(saved)


def flushes_denormals() -> bool:
    """Whether the compiled windows flush subnormals to zero now (False where they do not run)."""
    return bool(_state["loaded"]) and bool(torch.ops.moglm.flush_denormals_enabled())


@contextmanager
def blocked_products(on: bool):
    """While inside, the compiled windows' per-step products on oneDNN's ukernel sum a left operand larger than
    768 KiB (of at most 256 rows) in chunks of 256 KiB (``on``, the default outside), so that each chunk stays in
    a core's L2 while the weight's panels stream past, or sum it whole (``off``), process-wide, then as before.
    The two round differently; off is for what must round as before the chunks existed: a compressed file
    written then (:mod:`moglm.compression.container`). Loads the library (building it on first use); a no-op
    where it is not loaded."""
    if not available():
        yield
        return
    with _switched("set_blocked_products", on):
        yield


def blocks_products() -> bool:
    """Whether the compiled windows sum large per-step products in chunks now (False where they do not run)."""
    return bool(_state["loaded"]) and bool(torch.ops.moglm.blocked_products_enabled())
