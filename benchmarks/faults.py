"""Fault benchmark: the command line as a hostile user and an unlucky machine meet it, many times over.

    python benchmarks/faults.py               # 252 cases, 6 minutes on two idle cores (13 when shared)
    python benchmarks/faults.py --quick       # about half the time: fewer repetitions
    python benchmarks/faults.py --exec        # every process a fresh interpreter (slower: torch imports each time)

Every case runs ``moglm`` commands as separate processes on a tiny generated corpus and a tiny model, in a
temporary folder, and ends in one outcome:

* clean error: a non-zero exit with one line on stderr, no traceback, naming what was wrong;
* recovery: the command (or the rerun after a fault) finished with exactly the result of an uninterrupted
  run: every metrics record, the best checkpoint's step, results.json and the sample, bit for bit;
* traceback: a Python traceback on stderr;
* silent wrong: exit 0 with a result that differs from the uninterrupted run's, or bad input accepted;
* data lost: work that was done cannot be recovered (a run that cannot resume, a trial never rerun);
* unclear error: a non-zero exit without a traceback that is not one line naming the culprit;
* hang: a process still running after ``CHILD_TIMEOUT_S`` (then killed).

Scenarios (repeated ``--repeats`` times): ``kill -9`` of ``moglm train`` at random times, then rerun;
SIGKILL and a full disk (ENOSPC) inside each stage of a checkpoint write (``tests/fault_injection.py``),
then rerun; a second trainer on a running trainer's directory (plain and ``--restart``); ``moglm tune``
killed during a trial, then rerun (a recovery only if the killed trial is rerun and the study ends with the
requested number of complete trials, a trial of the same parameters scoring what it scored in an
uninterrupted study). Then single cases: bad configs, bad corpora, damaged or malicious files, bad
arguments, read-only directories, and library misuse.

Processes are forked from this one after it imported moglm and torch (each still a separate process
running ``moglm.cli.main``, killed with SIGKILL), so that a case costs its work, not torch's import;
``--exec`` starts each from a fresh interpreter instead. Results go to benchmarks/results/faults.json
(no paths of this machine in it).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from conftest import tiny_config, write_tiny_corpus  # noqa: E402
from fault_injection import STAGES, drop_file_override, inject  # noqa: E402
from moglm.cli import main  # noqa: E402
from moglm.runs import RunDirectory  # noqa: E402

OUTCOMES = ("clean error", "recovery", "traceback", "silent wrong", "data lost", "unclear error", "hang")
TIMING = {"tokens_per_s", "seconds"}  # record fields that measure time, not the computation
TRAIN_STEPS, EVAL_EVERY = 16, 4
CHILD_TIMEOUT_S = 150  # a tiny run takes seconds, a study of three trials a minute: longer is a hang


# -- processes -------------------------------------------------------------------------------------------
def _warm_up() -> None:
    """Import what a command imports lazily, once, before any fork (no torch computation runs here)."""
    torch.set_num_threads(1)
    for module in ("torch._dynamo",  # torch.optim imports it on first use: seconds per process
                   "matplotlib.backends.backend_agg", "optuna", "moglm.sampling", "moglm.train.final_evaluation",
                   "moglm.train.trainer", "moglm.tune"):
        importlib.import_module(module)


def _child(argv: list[str], fault: list | None, as_owner: bool) -> int:
    """The body of a child process: ``moglm argv`` with an optional fault; returns the exit code."""
    torch.set_num_threads(1)
    if as_owner and os.geteuid() == 0:
        drop_file_override()  # root meets a read-only folder as its owner would
    with inject(*fault) if fault else contextlib.nullcontext():
        return main(argv)


class Child:
    """A running ``moglm`` process, forked from this one or (``--exec``) a fresh interpreter."""

    def __init__(self, argv: list[str], log: Path, fault: list | None = None, as_owner: bool = False,
                 fresh: bool = False) -> None:
        self.out, self.err = log.with_suffix(".out"), log.with_suffix(".err")
        self.code: int | None = None
        self.timed_out = False
        self.started = time.monotonic()
        self.popen = None
        if fresh:
            spec = json.dumps({"argv": argv, "fault": fault, "as_owner": as_owner})
            with open(self.out, "w") as out, open(self.err, "w") as err:
                self.popen = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", spec],
                                              stdout=out, stderr=err, stdin=subprocess.DEVNULL)
            self.pid = self.popen.pid
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 70
            try:
                for fd, path in ((1, self.out), (2, self.err)):
                    os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                code = _child(argv, fault, as_owner)
            except BaseException:
                traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code if isinstance(code, int) else 1)
        self.pid = pid

    def poll(self) -> int | None:
        if self.code is None:
            if self.popen is not None:
                self.code = self.popen.poll()
            else:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.code = os.waitstatus_to_exitcode(status)
        return self.code

    def wait(self, timeout: float = CHILD_TIMEOUT_S) -> int:
        while self.poll() is None:
            if time.monotonic() - self.started > timeout:
                self.timed_out = True
                self.kill()
            time.sleep(0.02)
        return self.code

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait()
            self.code = self.popen.returncode
        elif self.code is None:
            self.code = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])

    @property
    def stderr(self) -> str:
        return self.err.read_text(errors="replace") if self.err.exists() else ""


@dataclass
class Bench:
    fresh: bool
    rng: random.Random
    records: list[dict[str, Any]] = field(default_factory=list)
    n: int = 0

    def start(self, argv: list[str], fault: list | None = None, as_owner: bool = False) -> Child:
        self.n += 1
        return Child([str(a) for a in argv], Path("logs") / f"{self.n:05d}", fault, as_owner, self.fresh)

    def run(self, argv: list[str], fault: list | None = None, as_owner: bool = False,
            timeout: float = CHILD_TIMEOUT_S) -> Child:
        child = self.start(argv, fault, as_owner)
        child.wait(timeout)
        return child

    def record(self, scenario: str, name: str, outcome: str, detail: str = "", **extra: Any) -> None:
        for path, shown in ((Path.cwd(), "<tmp>"), (ROOT, "<repo>"), (ROOT.parent, "<work>")):  # no local paths
            detail = detail.replace(f"{path}/", f"{shown}/").replace(str(path), shown)
        self.records.append({"scenario": scenario, "case": name, "outcome": outcome,
                             **({"detail": detail[:300]} if detail else {}), **extra})


# -- outcomes ---------------------------------------------------------------------------------------------
def snapshot(run: Path) -> dict[str, Any]:
    """What an uninterrupted run must match: every metrics record (less timings), the best checkpoint's step
    and weights, results.json and the sample."""
    directory = RunDirectory(run)
    metrics = [{k: v for k, v in r.items() if k not in TIMING} for r in directory.read_metrics()]
    try:
        best = directory.checkpoints.pointer("best")
        best = best and {k: best[k] for k in ("step", "weights", "valid_xent") if k in best}
    except Exception as e:  # a damaged pointer: different from any reference
        best = f"unreadable: {e}"
    results = json.loads(directory.results_path.read_text()) if directory.results_path.is_file() else None
    sample = directory.sample_path.read_text() if directory.sample_path.is_file() else None
    return {"metrics": metrics, "best": best, "results": results, "sample": sample}


def _difference(got: dict[str, Any], want: dict[str, Any]) -> str:
    for key in want:
        if got[key] != want[key]:
            if key == "metrics" and len(got[key]) != len(want[key]):
                return f"metrics: {len(got[key])} records, expected {len(want[key])}"
            if key == "metrics":
                a, b = next((a, b) for a, b in zip(got[key], want[key]) if a != b)
                fields = [f"{k} {a.get(k)!r} vs {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
                return f"metrics: first differing record {b.get('kind')} step {b.get('step')}: {'; '.join(fields)}"
            return f"{key} differs"
    return ""


def error_outcome(child: Child, *names: str) -> tuple[str, str]:
    """A command expected to fail: (outcome, its error line). Clean: one ``error:`` line naming every one of
    ``names`` (beside it, only ``warning:`` lines, e.g. for a deprecated option), not the top-level handler's
    line for an exception nothing anticipated ("an internal error")."""
    lines = child.stderr.strip().splitlines()
    errors = [line for line in lines if not line.startswith("warning: ")]
    if child.timed_out:
        return "hang", f"killed after {CHILD_TIMEOUT_S} s"
    if any("Traceback" in line for line in lines):
        return "traceback", lines[-1]
    if child.code == 0:
        return "silent wrong", "exit 0"
    if child.code < 0:
        return "unclear error", f"died of signal {-child.code}"
    if (len(errors) == 1 and errors[0].startswith("error: ") and "(an internal error" not in errors[0]
            and all(name in errors[0] for name in names)):
        return "clean error", errors[0]
    return "unclear error", " | ".join(lines)


def rerun_outcome(child: Child, run: Path, reference: dict[str, Any]) -> tuple[str, str]:
    """A rerun expected to finish exactly like the reference run."""
    err = child.stderr
    if child.timed_out:
        return "hang", f"killed after {CHILD_TIMEOUT_S} s"
    if "Traceback" in err:
        return "traceback", err.strip().splitlines()[-1]
    if child.code != 0:
        return "data lost", f"exit {child.code}: {err.strip().splitlines()[-1] if err.strip() else ''}"
    diff = _difference(snapshot(run), reference)
    warnings = [line for line in err.splitlines() if "warning" in line.lower()]  # a fallback to another backend?
    return ("silent wrong", "; ".join([diff, *warnings[:2]])) if diff else ("recovery", "")


# -- setup --------------------------------------------------------------------------------------------------
def train_argv(run: str | Path, *more: str) -> list[str]:
    return ["train", "tiny.toml", "--run-dir", str(run), "--no-progress", *more]


def reference_run(bench: Bench) -> tuple[dict[str, Any], float]:
    """The uninterrupted run every recovery must match, twice: the two must agree (else nothing can)."""
    seconds, snapshots = [], []
    for name in ("reference", "reference-again"):
        child = bench.run(train_argv(Path("runs") / name))
        if child.code != 0:
            raise SystemExit(f"the reference run failed:\n{child.stderr}")
        seconds.append(time.monotonic() - child.started)
        snapshots.append(snapshot(Path("runs") / name))
    if snapshots[0] != snapshots[1]:
        raise SystemExit(f"two uninterrupted runs differ ({_difference(*snapshots)}): nothing to compare against")
    return snapshots[0], min(seconds)


# -- scenarios ---------------------------------------------------------------------------------------------
def kill_and_resume(bench: Bench, reference: dict[str, Any], seconds: float, i: int) -> None:
    """``kill -9`` of ``moglm train`` at a random time (once or twice), then rerun to the end."""
    run = Path("runs") / f"kill-{i}"
    kills = []
    for _ in range(bench.rng.choice((1, 1, 2))):
        child = bench.start(train_argv(run))
        at = bench.rng.uniform(0.05, 0.95) * seconds
        while child.poll() is None and time.monotonic() - child.started < at:
            time.sleep(0.01)
        finished = child.poll() is not None
        child.kill()
        kills.append(round(at, 2) if not finished else "finished first")
    if all(k == "finished first" for k in kills):
        bench.record("kill -9 and rerun", f"kill #{i}", "not reached", "the run finished before the kill")
        return
    outcome, detail = rerun_outcome(bench.run(train_argv(run)), run, reference)
    bench.record("kill -9 and rerun", f"kill #{i}", outcome, detail, kills_at_s=kills)
    shutil.rmtree(run, ignore_errors=True)


def arrivals(reference: dict[str, Any]) -> dict[str, int]:
    """How often an uninterrupted run reaches each stage of a checkpoint write."""
    valid = [r for r in reference["metrics"] if r["kind"] == "valid"]
    return {**dict.fromkeys(STAGES, len(valid)), "previous pointer": len(valid) - 1,
            "best pointer": sum(r["best"] for r in valid), "pruning": len(valid) - 2}


def fault_in_checkpoint(bench: Bench, reference: dict[str, Any], stage: str, action: str, nth: int) -> None:
    """SIGKILL or ENOSPC at the nth arrival at ``stage`` of a checkpoint write, then rerun to the end."""
    run = Path("runs") / f"{action}-{stage.replace(' ', '-')}-{nth}"
    name = f"{action} at {stage} (checkpoint arrival {nth})"
    child = bench.run(train_argv(run), fault=[stage, action, nth])
    scenario = "crash inside a checkpoint write" if action == "kill" else "full disk inside a checkpoint write"
    if child.timed_out:
        bench.record(scenario, name, "hang", f"killed after {CHILD_TIMEOUT_S} s")
        return
    if action == "kill" and child.code != -signal.SIGKILL:  # exit 0: the stage was never reached
        bench.record(scenario, name, *(error_outcome(child) if child.code else ("not reached", "")))
        return
    if action == "enospc":
        outcome, detail = error_outcome(child, "no space left on the device writing", str(run))
        if outcome != "clean error":
            bench.record(scenario, name, outcome, detail)
            return
    outcome, detail = rerun_outcome(bench.run(train_argv(run)), run, reference)
    bench.record(scenario, name, outcome, detail)
    shutil.rmtree(run, ignore_errors=True)


def _wait_for_lock(child: Child, run: Path, timeout: float = 120) -> bool:
    lock = run / ".lock"
    while time.monotonic() - child.started < timeout and child.poll() is None:
        with contextlib.suppress(OSError):
            if lock.read_text().strip() == str(child.pid):
                return True
        time.sleep(0.01)
    return False


def _locked(run: Path) -> bool:
    """Whether a process holds the run directory's lock now (read from /proc/locks: taking the lock to
    find out could refuse the trainer that tries at that moment)."""
    try:
        inode = (run / ".lock").stat().st_ino
        return any(line.split()[1] == "FLOCK" and line.split()[5].endswith(f":{inode}")
                   for line in Path("/proc/locks").read_text().splitlines())
    except (OSError, IndexError):
        return False


def concurrent_run(bench: Bench, reference: dict[str, Any], seconds: float, i: int, restart: bool) -> None:
    """A second ``moglm train`` (``--restart`` too) while the first holds the run directory: refused in one
    line naming the holder's pid, and the first finishes exactly."""
    run = Path("runs") / f"concurrent-{i}-{int(restart)}"
    name = f"second trainer{' with --restart' if restart else ''} #{i}"
    first = bench.start(train_argv(run))
    if not _wait_for_lock(first, run):
        first.wait()
        bench.record("concurrent trainers", name, "not reached", "the first trainer never held the lock")
        return
    time.sleep(bench.rng.uniform(0.0, 0.6) * seconds)
    with contextlib.suppress(ProcessLookupError):
        os.kill(first.pid, signal.SIGSTOP)  # held still (a slow trainer) while the second one tries
    if first.poll() is not None or not _locked(run):
        with contextlib.suppress(ProcessLookupError):
            os.kill(first.pid, signal.SIGCONT)
        first.wait()
        bench.record("concurrent trainers", name, "not reached", "the first trainer was done with the directory")
        return
    try:
        second = bench.run(train_argv(run, *(["--restart"] if restart else [])))
    finally:
        os.kill(first.pid, signal.SIGCONT)
    outcome, detail = error_outcome(second, f"pid {first.pid}")
    if restart and second.code == 0:  # it discarded the directory a running trainer was writing
        outcome, detail = "data lost", "the second trainer deleted the first one's run directory and trained"
    first.wait()
    if outcome == "clean error":
        outcome, detail = rerun_outcome(first, run, reference)
    bench.record("concurrent trainers", name, outcome, detail)
    shutil.rmtree(run, ignore_errors=True)


TUNE_TRIALS = 3


def study_trials(study: Path) -> list[tuple[str, Any, Any]]:
    """(state, params, value) of every trial of the study in ``study``."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    journal, db = study / "study.journal", study / "study.db"
    if journal.exists():
        from optuna.storages.journal import JournalFileBackend

        storage: Any = optuna.storages.JournalStorage(JournalFileBackend(str(journal)))
    elif db.exists():
        storage = f"sqlite:///{db}"
    else:
        return []
    summaries = optuna.get_all_study_summaries(storage)
    trials = optuna.load_study(study_name=summaries[0].study_name, storage=storage).get_trials()
    return [(t.state.name, t.params, t.value) for t in trials]


def _trial_running(study: Path, number: int) -> bool:
    """Whether trial ``number``'s run directory is held by a trainer now."""
    run = study / "trials" / f"{number:04d}"
    return _locked(run)


def tune_argv(study: Path) -> list[str]:
    return ["tune", "space.toml", "--study-dir", str(study), "--no-plots", "--no-progress"]


def killed_trial(bench: Bench, reference: list[tuple[str, Any, Any]], seconds: float, i: int) -> None:
    """``moglm tune`` killed during a trial, then rerun: a recovery if the study ends with all its trials
    complete, those with an uninterrupted study's parameters scoring as they did there."""
    study = Path("studies") / f"killed-{i}"
    child = bench.start(tune_argv(study))
    timeout = max(CHILD_TIMEOUT_S, 4 * seconds)  # a study runs several trials
    trial = bench.rng.randrange(TUNE_TRIALS)  # kill during this trial's run, a random time into it
    while child.poll() is None and time.monotonic() - child.started < timeout and not _trial_running(study, trial):
        time.sleep(0.005)
    time.sleep(bench.rng.uniform(0.0, 0.5) * seconds / TUNE_TRIALS)
    at = time.monotonic() - child.started
    if child.poll() is not None:
        bench.record("killed tuning trial", f"tune kill #{i}", "not reached", "the study finished first")
        return
    child.kill()
    running = [t for t in study_trials(study) if t[0] == "RUNNING"]
    rerun = bench.run(tune_argv(study), timeout=timeout)
    err = rerun.stderr
    trials = study_trials(study)
    if rerun.timed_out:
        bench.record("killed tuning trial", f"tune kill #{i}", "hang", f"rerun killed after {timeout:.0f} s: "
                     + " | ".join(rerun.stderr.strip().splitlines()[-2:]))
        return
    complete = {json.dumps(p, sort_keys=True): v for s, p, v in trials if s == "COMPLETE"}
    expected = {json.dumps(p, sort_keys=True): v for s, p, v in reference if s == "COMPLETE"}
    detail = f"{len(complete)} of {TUNE_TRIALS} complete after the rerun ({len(running)} running at the kill)"
    same = complete == expected  # an uninterrupted study's trials exactly (the seeds of later trials too)
    if "Traceback" in err:
        outcome = "traceback"
    elif rerun.code != 0 or len(complete) < TUNE_TRIALS:
        outcome = "data lost"
    elif any(complete[p] != expected[p] for p in complete.keys() & expected.keys()):
        outcome = "silent wrong"  # a trial of the same parameters scored differently
    else:
        outcome = "recovery"
        detail += "" if same else "; later trials drew other parameters than the uninterrupted study's"
    extra = {} if same else {"trials": trials, "uninterrupted": reference}
    bench.record("killed tuning trial", f"tune kill #{i}", outcome, detail, killed_at_s=round(at, 2),
                 killed_in_trial=trial, same_trials_as_uninterrupted=same, **extra)
    shutil.rmtree(study, ignore_errors=True)


# -- single cases -----------------------------------------------------------------------------------------
def copy_reference(name: str) -> Path:
    run = Path("runs") / name
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(Path("runs") / "reference", run)
    (run / ".lock").unlink(missing_ok=True)
    return run


def _damage_file(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 3])
    elif how == "flip":
        flipped = bytearray(data)
        flipped[-7] ^= 0x04
        path.write_bytes(bytes(flipped))


def _read_only(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        p.chmod(p.stat().st_mode & ~0o222)


@dataclass
class Single:
    """One command on prepared files. ``expect``: ``"error"`` (one line naming every one of ``names``) or
    ``"recovery"`` (exit 0 and the reference run's result in ``run``). ``after`` may turn the outcome into
    a worse one (results overwritten, code executed ...)."""

    scenario: str
    name: str
    argv: Callable[[], list[str]]
    expect: str = "error"
    names: tuple[str, ...] = ()
    as_owner: bool = False
    run: Path | None = None
    after: Callable[[], str | None] | None = None


def single_cases() -> list[Single]:
    cases: list[Single] = []

    def fresh(name):  # a run directory of its own: a failed start may leave its config behind
        return Path("runs") / name.replace(" ", "-")

    def bad_config(name, setting, *names):
        cases.append(Single("bad config", name, lambda: train_argv(fresh(name), "--set", setting),
                            names=names or (setting.split("=")[0].split(".")[-1],)))

    bad_config("batch size 0", "train.batch_size=0")
    bad_config("negative learning rate", "train.learning_rate=-1")
    bad_config("hidden size 0", "model.hidden_size=0")
    bad_config("no layers", "model.num_layers=0")
    bad_config("bptt 0", "train.bptt=0")
    bad_config("negative steps", "train.max_steps=-5")
    bad_config("dropout above 1", "model.state_dropout=1.5")
    bad_config("unknown architecture", "model.architecture=nope", "architecture")
    bad_config("unknown key", "train.no_such_key=1", "no_such_key")
    bad_config("unknown section", "nosection.key=1", "nosection")
    bad_config("value of the wrong type", "train.batch_size=many", "batch_size")
    bad_config("overlapping split fractions", "data.split_fractions=[0.5, 0.5, 0.5]", "split_fractions")
    bad_config("a missing corpus", "data.path=no/such/corpus", "no/such/corpus")
    bad_config("an unknown corpus format", "data.format=bogus", "format")
    bad_config("out of memory", "model.hidden_size=100000000", "out of memory")
    bad_config("a non-finite learning rate", "train.learning_rate=nan", "learning_rate")
    cases.append(Single("bad config", "a config that is not TOML", lambda: ["train", "garbage.toml", "--no-progress"],
                        names=("garbage.toml",)))
    cases.append(Single("bad config", "a missing config", lambda: ["train", "missing.toml", "--no-progress"],
                        names=("missing.toml",)))

    def bad_corpus(name, content: bytes, fmt="char", *names, prompt="''"):
        def argv():
            path = Path("corpora") / f"{name.replace(' ', '-')}.txt"
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(content)
            sets = [f"data.path={path}", f"data.format={fmt}", f"sample.prompt={prompt}"]
            return train_argv(fresh(name), *[a for s in sets for a in ("--set", s)])
        cases.append(Single("bad corpus", name, argv, names=names))

    bad_corpus("an empty file", b"", "char", "empty")
    bad_corpus("one character", b"a", "char", "no tokens")
    bad_corpus("a byte-order mark only", "\ufeff".encode(), "char", "empty")
    bad_corpus("not UTF-8", bytes(range(128, 256)) * 40, "char", "UTF-8")
    bad_corpus("no newline and an empty prompt", b"abcabcabc" * 60, "char", "line separator")
    bad_corpus("one word", b"word\n", "word", "tokens")
    bad_corpus("a prompt of unknown characters", b"abc abc\n" * 80, "char", "prompt", prompt="'xyz'")

    def damaged(name, what, argv, names, expect="error", keep_results=True, fix=None):
        run = Path("runs") / f"damaged-{name.replace(' ', '-')}"

        def prepare():
            copy_reference(run.name)
            what(run)
            return argv(run)

        results = {}

        def after():
            if fix is not None:
                return fix(run)
            if keep_results and (run / "results.json").read_text() != results.setdefault("reference", (
                    Path("runs") / "reference" / "results.json").read_text()):
                return "silent wrong"  # the results of a good run were overwritten
            return None

        cases.append(Single("damaged files", name, prepare, expect, names, run=run, after=after))

    def best(run):
        return RunDirectory(run).checkpoints.pointer("best")["path"]

    def last(run):
        return RunDirectory(run).checkpoints.pointer("last")["path"]

    def evaluate(run):
        return ["evaluate", str(run), "--no-progress"]

    damaged("truncated best weights", lambda r: _damage_file(best(r) / "model.safetensors", "truncate"), evaluate,
            ("model.safetensors",))
    damaged("flipped bit in best weights", lambda r: _damage_file(best(r) / "averaged.safetensors", "flip")
            if (best(r) / "averaged.safetensors").exists() else _damage_file(best(r) / "model.safetensors", "flip"),
            evaluate, ("safetensors", "damaged"))
    damaged("truncated best state", lambda r: _damage_file(best(r) / "state.json", "truncate"), evaluate,
            ("state.json",))
    damaged("missing manifest", lambda r: (best(r) / "manifest.json").unlink(), evaluate, ("manifest.json",))
    damaged("best pointer without dir", lambda r: (r / "checkpoints" / "best.json").write_text('{"step": 8}'),
            evaluate, ("best.json",))
    damaged("best pointer to a missing folder",
            lambda r: (r / "checkpoints" / "best.json").write_text('{"dir": "step-09999999", "step": 9}'),
            evaluate, ("best.json",))
    damaged("truncated vocabulary", lambda r: _damage_file(r / "vocab.json", "truncate"), evaluate, ("vocab.json",))
    damaged("config that is not TOML", lambda r: (r / "config.toml").write_text("[[[ not toml"), evaluate,
            ("config.toml",))
    damaged("no config", lambda r: (r / "config.toml").unlink(), evaluate, ("config.toml",))
    damaged("truncated model.json", lambda r: _damage_file(r / "model.json", "truncate"), evaluate, ("model.json",))
    def change_corpus(run):  # the run trained on a copy of the corpus, which then changes
        shutil.rmtree("tiny-changed", ignore_errors=True)
        shutil.copytree("tiny", "tiny-changed")
        config = run / "config.toml"
        config.write_text(config.read_text().replace('path = "tiny"', 'path = "tiny-changed"'))
        with open(Path("tiny-changed") / "test.txt", "a") as f:
            f.write("the owl sees the cat .\n")

    damaged("corpus changed since training", change_corpus, evaluate, ("changed",))

    def pickle_bomb(run):
        import pickle

        class Bomb:
            def __reduce__(self):
                return (os.system, ("touch pickle-ran",))

        (best(run) / "model.safetensors").write_bytes(pickle.dumps(Bomb()))

    def pickle_ran(run):
        ran = Path("pickle-ran").exists()
        Path("pickle-ran").unlink(missing_ok=True)
        return "silent wrong" if ran else None

    damaged("a malicious pickle as the weights", pickle_bomb, evaluate, ("model.safetensors",), fix=pickle_ran)

    # damage the last checkpoint of a finished run: `moglm train` again falls back and finishes as before
    def fallback(name, what):
        damaged(name, what, lambda r: train_argv(r), (), expect="recovery")

    fallback("truncated last weights, train again", lambda r: _damage_file(last(r) / "model.safetensors", "truncate"))
    fallback("flipped bit in last training tensors, train again",
             lambda r: _damage_file(last(r) / "training.safetensors", "flip"))
    fallback("truncated last state, train again", lambda r: _damage_file(last(r) / "state.json", "truncate"))
    fallback("last pointer is a list, train again", lambda r: (r / "checkpoints" / "last.json").write_text("[1, 2]"))
    fallback("empty last pointer, train again", lambda r: (r / "checkpoints" / "last.json").write_text(""))
    fallback("stale temporaries, train again",
             lambda r: ((r / "checkpoints" / ".last.json.x.tmp.json").write_text("{"),
                        (r / "checkpoints" / ".tmp-step-00000099-x").mkdir()))
    fallback("a metrics line cut short, train again",
             lambda r: open(r / "metrics.jsonl", "a").write('{"kind": "tra'))

    def cache_meta(run):
        for meta in Path("cache").glob("*/meta.json"):
            meta.write_text("{}")

    fallback("corpus cache meta.json of {}, train again from scratch",
             lambda r: (cache_meta(r), shutil.rmtree(r), r.mkdir()))

    def bad_argument(name, argv, *names):
        cases.append(Single("bad arguments", name, lambda: argv(copy_reference("arguments")), names=names))

    def evaluate_with(*args):
        return lambda r: [*evaluate(r), *args]

    bad_argument("evaluate --logit-factor 0", evaluate_with("--logit-factor", "0"), "logit factor")
    bad_argument("evaluate --logit-factor -2", evaluate_with("--logit-factor", "-2"), "logit factor")
    bad_argument("evaluate --temperature 0 (old spelling)", evaluate_with("--temperature", "0"), "0")
    bad_argument("evaluate --batch-size 0", evaluate_with("--batch-size", "0"), "batch size")
    bad_argument("evaluate --mc-samples -1", evaluate_with("--mc-samples", "-1"), "MC-dropout")
    bad_argument("sample --temperature nan", lambda r: ["sample", str(r), "--temperature", "nan"], "temperature")
    bad_argument("sample --temperature 0", lambda r: ["sample", str(r), "--temperature", "0"], "temperature")
    bad_argument("sample --top-k 0", lambda r: ["sample", str(r), "--top-k", "0"], "top")
    bad_argument("evaluate a missing run", lambda r: ["evaluate", "runs/no-such-run"], "runs/no-such-run")
    bad_argument("sample a folder that is no run", lambda r: ["sample", "corpora"], "corpora")
    bad_argument("train into a file", lambda r: train_argv("tiny.toml"), "tiny.toml")
    bad_argument("tune a missing space", lambda r: ["tune", "no-space.toml"], "no-space.toml")
    bad_argument("tune a space with an unknown parameter", lambda r: ["tune", "bad-space.toml", "--no-plots"],
                 "no.such_key")

    def read_only(name, argv, names, run_dir=True):
        def prepare():
            path = copy_reference("read-only") if run_dir else Path("studies") / "read-only"
            if not run_dir:
                shutil.rmtree(path, ignore_errors=True)
                path.mkdir(parents=True)
            _read_only(path)
            return argv(path)
        cases.append(Single("read-only directory", name, prepare, names=names, as_owner=True))

    read_only("train in a read-only run directory", lambda p: train_argv(p), ("runs/read-only",))
    read_only("train into a read-only parent", lambda p: train_argv(p / "inner"), ("runs/read-only/inner",))
    read_only("evaluate a read-only run", lambda p: ["evaluate", str(p), "--no-progress"], ("results.json",))
    read_only("tune in a read-only study directory", lambda p: tune_argv(p), ("studies/read-only",), run_dir=False)
    return cases


def run_single(bench: Bench, case: Single, reference: dict[str, Any]) -> None:
    try:
        argv = case.argv()
    except Exception as e:  # the benchmark's own preparation failed: not a moglm outcome
        bench.record(case.scenario, case.name, "not reached", f"preparation failed: {e}")
        return
    child = bench.run(argv, as_owner=case.as_owner)
    if case.expect == "error":
        outcome, detail = error_outcome(child, *case.names)
    else:
        outcome, detail = rerun_outcome(child, case.run, reference)
    worse = case.after() if case.after is not None and outcome in ("clean error", "recovery") else None
    bench.record(case.scenario, case.name, worse or outcome, detail if not worse else f"{worse}; {detail}")
    for folder in ("runs/read-only", "studies/read-only"):  # writable again, to be removed
        for p in Path(folder).rglob("*") if Path(folder).exists() else []:
            p.chmod(p.stat().st_mode | 0o200)
    if case.run is not None:
        shutil.rmtree(case.run, ignore_errors=True)


def library_cases(bench: Bench) -> None:
    """Library misuse, in this process (after every fork): an empty batch gives empty outputs as nn.LSTM's;
    no time steps, a wrong size or a wrong state is a ValueError naming the argument."""
    import warnings

    from moglm.modules import ARCHITECTURES

    warnings.simplefilter("ignore")  # the multi-matrix cells' note that they run the reference loop
    for name, cls in sorted(ARCHITECTURES.items()):
        model = cls(3, 5, 2, dropout=0.2, state_dropout=0.2)
        checks = [("empty batch", torch.randn(4, 0, 3), None, None),
                  ("no time steps", torch.randn(0, 2, 3), None, "time steps"),
                  ("wrong input size", torch.randn(4, 2, 7), None, "input_size"),
                  ("wrong state batch", torch.randn(4, 2, 3), model.zero_state(3), "hx")]
        for what, x, hx, message in checks:
            try:
                y, state = model(x, hx)
                states = (state,) if isinstance(state, torch.Tensor) else state
                right = y.shape == (4, 0, 5) and all(s.shape[:2] == (2, 0) for s in states)
                outcome = "recovery" if message is None and right else "silent wrong"
                detail = "" if outcome == "recovery" else f"returned {tuple(y.shape)}"
            except ValueError as e:
                outcome = "clean error" if message and message in str(e) else "unclear error"
                detail = str(e)
            except Exception as e:
                outcome, detail = "traceback", f"{type(e).__name__}: {e}"
            bench.record("library misuse", f"{name}: {what}", outcome, detail)


# -- the benchmark -----------------------------------------------------------------------------------------
def prepare_folder() -> None:
    write_tiny_corpus(Path("tiny"))
    Path("tiny.toml").write_text(tiny_config(Path("tiny"), train={"max_steps": TRAIN_STEPS, "eval_every": EVAL_EVERY},
                                             sample={"num_tokens": 8}).to_toml())
    Path("garbage.toml").write_text("[train\nbatch_size = = 3")
    base = Path("tune-base.toml")
    base.write_text(tiny_config(Path("tiny"), train={"max_steps": 12, "eval_every": EVAL_EVERY},
                                sample={"num_tokens": 0}).to_toml())
    space = (f'base = "{base}"\n[study]\nsampler = "random"\nseed = 0\n[pruner]\ntype = "none"\n'
             f'[budget]\ntrials = {TUNE_TRIALS}\n'
             '[params]\n"train.learning_rate" = { low = 0.002, high = 0.02, log = true }\n')
    Path("space.toml").write_text(space)
    Path("bad-space.toml").write_text(space.replace('"train.learning_rate"', '"no.such_key"'))
    Path("logs").mkdir()


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    counted = [r for r in records if r["outcome"] in OUTCOMES]
    by_scenario: dict[str, Counter] = {}
    for r in counted:
        by_scenario.setdefault(r["scenario"], Counter())[r["outcome"]] += 1
    totals = Counter(r["outcome"] for r in counted)
    return {"cases": len(counted), "not_reached": len(records) - len(counted),
            "totals": {o: totals.get(o, 0) for o in OUTCOMES},
            "by_scenario": {s: {o: c.get(o, 0) for o in OUTCOMES} for s, c in by_scenario.items()}}


def table(summary: dict[str, Any]) -> str:
    short = {"clean error": "clean", "recovery": "recovered", "traceback": "traceback", "silent wrong": "silent wrong",
             "data lost": "data lost", "unclear error": "unclear", "hang": "hang"}
    head = f"| scenario | cases | {' | '.join(short[o] for o in OUTCOMES)} |"
    lines = [head, "|" + " --- |" * (len(OUTCOMES) + 2)]
    for scenario, counts in [*summary["by_scenario"].items(), ("total", summary["totals"])]:
        lines.append(f"| {scenario} | {sum(counts.values())} | {' | '.join(str(counts[o]) for o in OUTCOMES)} |")
    return "\n".join(lines)


def main_benchmark(args: argparse.Namespace) -> int:
    out = (ROOT / args.out).resolve() if not Path(args.out).is_absolute() else Path(args.out)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    kills_per_repeat = 6 if args.quick else 20
    workdir = Path(tempfile.mkdtemp(prefix="moglm-faults-"))
    start = time.monotonic()
    os.chdir(workdir)
    os.environ["MOGLM_CACHE_DIR"] = "cache"
    os.environ.pop("MOGLM_DEBUG", None)
    if not args.exec:
        _warm_up()
    bench = Bench(fresh=args.exec, rng=random.Random(args.seed))
    tqdm.monitor_interval = 0  # no monitor thread in a process that forks
    try:
        prepare_folder()
        reference, seconds = reference_run(bench)
        print(f"reference run: {seconds:.1f} s; working in a temporary folder", flush=True)
        tune_ref = bench.run(tune_argv(Path("studies") / "reference"), timeout=600)
        tune_seconds = time.monotonic() - tune_ref.started
        tune_reference = study_trials(Path("studies") / "reference")
        if tune_ref.code != 0:
            raise SystemExit(f"the reference study failed:\n{tune_ref.stderr}")
        counts = arrivals(reference)
        jobs: list[tuple[str, Callable[[], None]]] = []
        for r in range(repeats):
            for k in range(kills_per_repeat):
                i = r * kills_per_repeat + k
                jobs.append(("kill", lambda i=i: kill_and_resume(bench, reference, seconds, i)))
            for stage in STAGES:
                for action in ("kill", "enospc"):
                    if stage == "pruning" and action == "enospc":
                        continue
                    reached = counts[stage]
                    nth = [n for n in (1, reached) if n >= 1] if not args.quick else [reached]
                    nth = sorted(set(nth)) if r == 0 else [bench.rng.randint(1, reached)] if reached else []
                    for n in nth:
                        jobs.append(("stage", lambda s=stage, a=action, n=n: fault_in_checkpoint(
                            bench, reference, s, a, n)))
            for restart in (False, True):
                jobs.append(("concurrent", lambda r=r, x=restart: concurrent_run(bench, reference, seconds, r, x)))
            for k in range(2 if args.quick else 4):
                i = r * 4 + k
                jobs.append(("tune", lambda i=i: killed_trial(bench, tune_reference, tune_seconds, i)))
        cases = single_cases()
        jobs += [("single", lambda c=c: run_single(bench, c, reference)) for c in cases]
        jobs = [(kind, job) for kind, job in jobs if not args.only or kind in args.only]
        for _, job in tqdm(jobs, desc="fault cases", unit="case", dynamic_ncols=True):
            job()
        if not args.only or "library" in args.only:
            library_cases(bench)
    finally:
        os.chdir(ROOT)
        if args.keep:
            print(f"kept {workdir}")
        else:
            for p in workdir.rglob("*"):  # read-only leftovers, writable again to be removed
                with contextlib.suppress(OSError):
                    p.chmod(p.stat().st_mode | 0o700)
            shutil.rmtree(workdir, ignore_errors=True)
    summary = summarize(bench.records)
    result = {
        "command": " ".join(["python benchmarks/faults.py", *(["--quick"] if args.quick else []), *(
            [f"--repeats {args.repeats}"] if args.repeats is not None else []), *(["--exec"] if args.exec else [])]),
        "processes": "fresh interpreters" if args.exec else "forked from the benchmark after importing moglm",
        "repeats": repeats, "seed": args.seed, "minutes": round((time.monotonic() - start) / 60, 1),
        "machine": {"cpu": _cpu_model(), "cores": len(os.sched_getaffinity(0)), "python": platform.python_version(),
                    "torch": torch.__version__},
        "reference_run_s": round(seconds, 2), **summary, "records": bench.records,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(summary))
    bad = [r for r in bench.records if r["outcome"] not in ("clean error", "recovery", "not reached")]
    for r in bad:
        print(f"  {r['outcome']}: {r['scenario']}: {r['case']}: {r.get('detail', '')}")
    print(f"{summary['cases']} cases ({summary['not_reached']} not reached, not counted) in {result['minutes']} "
          f"minutes; written to {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=None, help="Repetitions of the repeated scenarios "
                        "(default 3; 1 with --quick).")
    parser.add_argument("--quick", action="store_true", help="Fewer kills and faults: a few minutes.")
    parser.add_argument("--exec", action="store_true", help="Start every process from a fresh interpreter.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the kill times and the stages' arrivals.")
    parser.add_argument("--out", default="benchmarks/results/faults.json", help="Where the JSON goes.")
    parser.add_argument("--keep", action="store_true", help="Keep the temporary folder (its path is printed).")
    parser.add_argument("--only", nargs="+", choices=("kill", "stage", "concurrent", "tune", "single", "library"),
                        help="Run only these scenarios.")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.child:  # --exec: one moglm process
        spec = json.loads(arguments.child)
        sys.exit(_child(spec["argv"], spec["fault"], spec["as_owner"]))
    sys.exit(main_benchmark(arguments))
