"""The run directory: everything a run produces, and everything later commands read.

::

    runs/<name>/
      config.toml          the resolved config (a language model's RunConfig, or a task's settings)
      vocab.json           the vocabulary (language models: from the training split, or a subword tokenizer's)
      tokenizer.json       a subword run's tokenizer, as the tokenizers library writes it
      model.json           resolved model sizes (hidden size chosen by budget, parameter count)
      metrics.jsonl        one JSON record per line: train / valid / final
      learning_curve.png   the learning curve, redrawn at every evaluation
      results.json         the final evaluation
      sample.txt           a sample from the best checkpoint (language models)
      checkpoints/         see moglm.runs.checkpoints
      tensorboard/         TensorBoard events, when tensorboard is installed

Every run (``moglm train``, the synthetic tasks, tuning trials) uses this one API: :meth:`RunDirectory.prepare`
starts a run or checks that the saved config is the same before it resumes, and the metrics log is cut
back to the checkpoint a resumed run restarts from.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: runs are not locked
    fcntl = None

from ..atomic import atomic_write_text
from ..data.vocabulary import Vocabulary
from ..errors import MoglmError
from .checkpoints import CheckpointStore, json_object

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def plain(mapping: Any) -> Any:
    """``mapping`` as TOML stores it: JSON types, tuples as lists, ``None`` values left out."""
    if isinstance(mapping, dict):
        return {str(k): plain(v) for k, v in mapping.items() if v is not None}
    if isinstance(mapping, (list, tuple)):
        return [plain(v) for v in mapping]
    return mapping


def first_difference(saved: Any, now: Any, prefix: str = "") -> str | None:
    """The first dotted key whose value differs, as ``"key: a (saved) vs b (now)"``, or ``None``."""
    if isinstance(saved, dict) and isinstance(now, dict):
        for key in sorted(set(saved) | set(now)):
            d = first_difference(saved.get(key), now.get(key), f"{prefix}{key}.")
            if d:
                return d
        return None
    return None if saved == now else f"{prefix[:-1]}: {saved!r} (saved) vs {now!r} (now)"


def to_toml(mapping: dict[str, Any]) -> str:
    import tomli_w

    return tomli_w.dumps(plain(mapping))


#: the names moglm writes at the top of a run directory, for every kind of run (language model, music, the
#: synthetic tasks, tuning trials, experiments' evaluations); ``--restart`` removes a folder holding only these
RUN_ENTRIES = frozenset({
    ".lock", "config.toml", "vocab.json", "tokenizer.json", "model.json", "metrics.jsonl", "learning_curve.png", "results.json",
    "sample.txt", "sample.mid", "sample.png", "checkpoints", "tensorboard", "evaluations", "dyneval", "data", "lm",
    "partial_sentences.json", "tune.log",
})


#: what only a run that started training holds: a folder with one of these and no config.toml is a damaged run
RUN_EVIDENCE = ("checkpoints", "metrics.jsonl", "model.json", "vocab.json")


def _temporary(name: str) -> bool:
    """A leftover of an atomic write cut short by a kill (``moglm.atomic``'s hidden temporary names)."""
    return name.startswith(".tmp-") or (name.startswith(".") and ".tmp" in name)


def _run_entry(name: str) -> bool:
    return name in RUN_ENTRIES or _temporary(name)


_held: dict[Path, int] = {}  # run directories this process has locked, and how many times (re-entrant)
_held_lock = threading.Lock()


class RunInUse(MoglmError):
    """Another process holds the run directory's lock."""


class RunDirectory:
    """The files of one run (see the module docstring); creating the object touches nothing on disk."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.config_path = self.path / "config.toml"
        self.vocab_path = self.path / "vocab.json"
        self.tokenizer_path = self.path / "tokenizer.json"
        self.model_info_path = self.path / "model.json"
        self.metrics_path = self.path / "metrics.jsonl"
        self.plot_path = self.path / "learning_curve.png"
        self.results_path = self.path / "results.json"
        self.sample_path = self.path / "sample.txt"
        self.checkpoints = CheckpointStore(self.path / "checkpoints")

    # -- ownership ------------------------------------------------------------------------------
    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the run directory for this process: a second process that tries (a second ``moglm train``
        on the same ``--run-dir``) gets a one-line :class:`RunInUse` naming the holder's pid. The lock is
        an ``flock`` on ``.lock``, so a killed holder releases it; it is re-entrant within a process."""
        key = self.path.resolve()
        with _held_lock:
            if key in _held:
                _held[key] += 1
                acquired = None
            else:
                acquired = self._acquire()
                _held[key] = 1
        try:
            yield
        finally:
            with _held_lock:
                _held[key] -= 1
                if _held[key] == 0:
                    del _held[key]
                    if acquired is not None:
                        fcntl.flock(acquired, fcntl.LOCK_UN)
                        os.close(acquired)

    def _acquire(self) -> int | None:
        self.check_own_folder()
        if fcntl is None:
            return None
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # a file of that name, a read-only parent ...
            raise MoglmError(f"{self.path}: cannot create the run directory ({e.strerror})") from None
        path = self.path / ".lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:
            raise MoglmError(f"{self.path}: cannot write to the run directory ({e.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunInUse(f"{self.path} is in use by another moglm process (pid {holder}); wait for it to finish "
                           "or choose another --run-dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return fd

    def discard(self) -> None:
        """Remove everything the run holds (``--restart``) under its lock: while another process runs in it,
        this one is refused and nothing is removed. The lock file stays (another process may be waiting on it).

        Only a run's own files are ever removed: a folder that holds anything moglm does not write in a run
        (:data:`RUN_ENTRIES`), or that is not a run at all (no ``config.toml``), is refused whole, and so are
        the working folder, the home folder, the root and every folder above them (:meth:`check_own_folder`)."""
        self.check_own_folder()
        if not self.path.exists():
            return
        if not self.path.is_dir():
            raise MoglmError(f"{self.path} is a file, not a run directory: --restart removes nothing")
        entries = list(self.path.iterdir())
        foreign = sorted(e.name for e in entries if not _run_entry(e.name))
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise MoglmError(f"{self.path} holds files that are not a moglm run's ({shown}): --restart removes only "
                             "what a run wrote, so nothing was removed; choose another --run-dir")
        if (any(e.name != ".lock" and not _temporary(e.name) for e in entries) and not self.config_path.is_file()
                and not any((self.path / name).exists() for name in RUN_EVIDENCE)):
            raise MoglmError(f"{self.path} is not a moglm run (no config.toml): --restart removed nothing; "
                             "choose another --run-dir")
        with self.lock():
            for entry in self.path.iterdir():
                if entry.name == ".lock":
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()

    def check_own_folder(self) -> None:
        """Refuse a run directory that is the working folder, the home folder, the root, or a folder above one
        of them (``.``, ``..``, ``~``): a run writes and ``--restart`` deletes there, so it needs a folder of its own."""
        try:
            here = self.path.expanduser().resolve()
        except (OSError, RuntimeError) as e:  # a symlink loop
            raise MoglmError(f"{self.path}: not a usable run directory ({e})") from None
        for name, folder in (("the working folder", Path.cwd()), ("the home folder", Path.home())):
            try:
                folder = folder.resolve()
            except (OSError, RuntimeError):  # pragma: no cover - a deleted working folder
                continue
            if folder == here or here in folder.parents:
                what = name if folder == here else f"a folder above {name}"
                raise MoglmError(f"{self.path} is {what} ({here}): a run needs a folder of its own; "
                                 "choose another --run-dir")
        if here == Path(here.anchor):
            raise MoglmError(f"{self.path} is the root folder: a run needs a folder of its own; choose another --run-dir")

    # -- starting or resuming -------------------------------------------------------------------
    def prepare(self, config: dict[str, Any], what: str = "",
                identity: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> bool:
        """Create the directory for ``config`` (a mapping; ``None`` values are left out) and return whether
        a checkpoint of the same config exists to resume. A different saved config is an error: a resumed
        run must continue exactly. ``what`` names the kind of run in that error ("a Dyck run"); ``identity``
        maps a config to what says whether two are one run (default: the config itself), for both sides."""
        self.check_own_folder()
        config = plain(config)
        if self.config_path.is_file():
            # a config's description says what it is for and changes no result: configs equal but for it are one run
            def unlabelled(c: dict[str, Any]) -> dict[str, Any]:
                return {k: v for k, v in (c if identity is None else identity(c)).items() if k != "description"}

            diff = first_difference(unlabelled(self.read_config()), unlabelled(config))
            if diff:
                kind = f"a {what} run" if what else "a run"
                raise MoglmError(f"{self.path} holds {kind} with a different config ({diff}); "
                                 "choose another --run-dir, or pass --restart to discard it")
            return (self.checkpoints.root / "last.json").is_file()  # damaged or not: the engine opens it
        if any((self.path / name).exists() for name in RUN_EVIDENCE):
            raise MoglmError(f"{self.path} holds a run whose config.toml is missing, so it cannot be resumed or "
                             "checked; pass --restart to discard it, or choose another --run-dir")
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.config_path, to_toml(config))
        return False

    def read_config(self) -> dict[str, Any]:
        """The saved config as a mapping (one line of error for a missing or unreadable file)."""
        if not self.config_path.is_file():
            raise MoglmError(f"{self.path}: not a run directory (no config.toml)")
        try:
            return tomllib.loads(self.config_path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise MoglmError(f"{self.config_path}: not a readable config ({e})") from None

    def write_json(self, path: Path, data: Any) -> None:
        """Write ``data`` as indented JSON to ``path`` (a file of this run) atomically."""
        atomic_write_text(path, json.dumps(data, indent=1))

    # -- metrics --------------------------------------------------------------------------------
    def append_metrics(self, record: dict[str, Any]) -> None:
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def read_metrics(self) -> list[dict[str, Any]]:
        if not self.metrics_path.is_file():
            return []
        out = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a kill
                continue
        return out

    def truncate_metrics(self, step: int) -> None:
        """Drop records after ``step`` (written after the checkpoint a resumed run restarts from)."""
        kept = [r for r in self.read_metrics() if r.get("step", 0) <= step and r.get("kind") != "final"]
        atomic_write_text(self.metrics_path, "".join(json.dumps(r) + "\n" for r in kept))

    # -- reading a finished (or running) run ------------------------------------------------------
    def load_vocab(self) -> Vocabulary:
        if not self.vocab_path.is_file():
            raise MoglmError(f"{self.path}: no vocab.json (the run never started training)")
        try:
            return Vocabulary.from_json(self.vocab_path.read_text())
        except (ValueError, KeyError, TypeError) as e:  # not JSON, not UTF-8, fields missing or of the wrong type
            raise MoglmError(f"{self.vocab_path}: damaged, not a vocabulary ({type(e).__name__}: {e})") from None

    def load_weights(self, model, which: str = "best"):
        """``model`` with the weights of checkpoint ``which`` (``best``: those that scored best on validation,
        averaged if averaging was on; ``last``: the latest raw training weights); a one-line error when there is
        none or they do not fit."""
        from .checkpoints import load_group

        pointer = self.checkpoints.open(which)
        if pointer is None:
            raise MoglmError(f"{self.path}: no {which} checkpoint yet")
        state = pointer["path"] / "state.json"
        if state.is_file():
            saved = json_object(state, "damaged (not JSON)", "damaged (not a JSON object)", MoglmError).get("run_id")
            ours = self.run_id()
            if saved is not None and ours is not None and saved != ours:
                raise MoglmError(f"{pointer['path']}: these are the weights of another run (run {saved}; this run is "
                                 f"{ours}): they would be scored as this run's. Restore this run's checkpoints")
        weights = load_group(pointer["path"], pointer.get("weights", "model"))
        missing, unexpected = model.load_state_dict(weights, strict=False)
        if missing or unexpected:
            raise MoglmError(f"{pointer['path']}: weights do not fit the model ({(missing or unexpected)[0]})")
        return model

    def write_model_info(self, info: dict[str, Any]) -> None:
        """Write ``model.json`` (sizes, parameter count, corpus digest), keeping the run's identity (``run_id``,
        made once, at the run's first start): every checkpoint records it, so weights copied in from another
        run are refused on loading (:meth:`load_weights`)."""
        import uuid

        previous = self.model_info().get("run_id") if self.model_info_path.is_file() else None
        self.write_json(self.model_info_path, {**info, "run_id": previous or uuid.uuid4().hex})

    def run_id(self) -> str | None:
        """The run's identity (``model.json``), or ``None`` for a run made before runs had one."""
        if not self.model_info_path.is_file():
            return None
        found = self.model_info().get("run_id")
        return found if isinstance(found, str) else None

    def model_info(self) -> dict[str, Any]:
        if not self.model_info_path.is_file():
            raise MoglmError(f"{self.path}: no model.json (the run never started training)")
        return json_object(self.model_info_path, "damaged (not JSON)", "damaged (not a JSON object)", MoglmError)
