"""Running a study: storage, sampler, pruner, worker processes, budgets, resuming.

* Storage: Optuna's JournalStorage on a file in the study directory (``study.journal``; it takes
  concurrent writers, on one machine or a shared filesystem) unless ``storage`` names another: a file
  path (a journal) or any SQLAlchemy URL Optuna accepts (PostgreSQL for workers on many machines; a
  study directory that holds an earlier ``study.db`` goes on with that SQLite file).
* Dead workers: every running trial records its worker (machine and process) and a heartbeat. Before
  it counts the trials, each invocation and each worker fails the running trials whose worker is gone
  (a process of this machine that no longer exists, or no heartbeat for ``GRACE_S``) and queues them
  again once, resuming their run directories; RDB storages also run Optuna's own heartbeat.
* Workers: ``workers`` processes on this machine (spawned; ``threads`` torch threads each, by default
  the cores divided among them). Workers elsewhere join with ``worker=True`` (``moglm tune SPACE
  --storage URL --worker``): the study's settings come from the storage, and they run trials until its
  budget is spent. Under torchrun, each trial is a data-parallel job of every process
  (:class:`optuna_integration.TorchDistributedTrial`).
* Budgets: ``trials`` is the total number of trials in the study (every invocation counts against
  it: rerunning the command resumes the study, and rerunning it with the same total adds nothing); a
  wall time after which no new trial starts (running trials finish, as with Optuna's ``timeout``); a
  token budget per trial.
* Reproducibility: each trial's sampler is seeded from the space's seed, the number of trials before
  it (as the budget counts them: a killed trial that was queued again counts once) and the worker's
  index, so a one-worker study with a seed repeats exactly, killed and resumed or not, and parallel
  workers never draw the same random start-up points.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import shutil
import socket
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Union

import optuna
from optuna.trial import TrialState

from ..device import usable_cores
from .. import distributed
from ..errors import MoglmError, TrainingInterrupted
from ..registry import for_tuning
from .objective import Objective, TrialSetup, requeue_stale_trial
from .search_space import StudySettings, load_space

if TYPE_CHECKING:
    from .dynamic_evaluation import DynevalSetup

Setup = Union[TrialSetup, "DynevalSetup"]

HEARTBEAT_S = 30
GRACE_S = 180
SQLITE_LOCK_TIMEOUT_S = 600


def best_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.value is not None
            and math.isfinite(t.value)]
    return min(done, key=lambda t: t.value) if done else None


def drop_checkpoints(study: optuna.Study, study_dir: Path) -> None:
    """Remove the checkpoints of finished trials other than the best (their metrics, configs and logs stay);
    runs that a waiting or running trial will resume are kept."""
    trials = study.get_trials(deepcopy=False)
    keep = {t.user_attrs.get("run") for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)}
    best = best_trial(study)
    if best is not None:
        keep.add(best.user_attrs.get("run"))
    for t in trials:
        run = t.user_attrs.get("run")
        if t.state.is_finished() and run is not None and run not in keep:
            shutil.rmtree(study_dir / "trials" / f"{run:04d}" / "checkpoints", ignore_errors=True)


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """A journal file (a path), or an Optuna RDB storage (a URL) with a heartbeat (stale trials are failed
    and re-queued); SQLite waits for locks."""
    _check_writable(url)
    if "://" not in url:
        from optuna.storages.journal import JournalFileBackend

        try:
            return optuna.storages.JournalStorage(JournalFileBackend(url))
        except OSError as e:
            raise MoglmError(f"storage {url}: cannot open the journal file ({e.strerror})") from None
    engine_kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("sqlite"):
        engine_kwargs = {"connect_args": {"timeout": SQLITE_LOCK_TIMEOUT_S}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=HEARTBEAT_S,
                                              grace_period=GRACE_S, heartbeat_stale_trial_callback=requeue_stale_trial)
        except (ImportError, ValueError) as e:
            raise MoglmError(f"storage {url!r}: {e}") from None
        except Exception as e:  # sqlalchemy: unreachable server, bad credentials, ...
            raise MoglmError(f"storage {public_url(url)}: {type(e).__name__}: {str(e).splitlines()[0]}") from None


def _check_writable(url: str) -> None:
    """A study's file (a journal, or SQLite's database, which also writes beside it) must be writable: say so
    before a trial runs, not when Optuna first records one."""
    path = Path(url[len("sqlite:///"):] if url.startswith("sqlite:///") else url) if "://" not in url or \
        url.startswith("sqlite:///") else None
    if path is None or url.endswith(":memory:"):
        return
    needs = [path] if path.exists() else []
    needs += [path.parent] if url.startswith("sqlite") or not path.exists() else []
    for needed in needs:
        if needed.exists() and not os.access(needed, os.W_OK):
            raise MoglmError(f"cannot write the study's storage {needed} (Permission denied); use a writable "
                             "--study-dir or --storage")


def public_url(url: str) -> str:
    """The storage URL without its password."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("@")[-1]


def check_sampler(settings: StudySettings) -> None:
    """The Gaussian-process sampler needs scipy: say so before any worker starts."""
    if settings.sampler == "gp":
        try:
            import scipy  # noqa: F401
        except ImportError:
            raise MoglmError("the gp sampler needs scipy: pip install 'moglm[tune]' (or use --sampler tpe)") from None


def make_sampler(settings: StudySettings, seed: int | None) -> optuna.samplers.BaseSampler:
    if settings.sampler == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=settings.startup_trials,
                                         warn_independent_sampling=False)
    if settings.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=settings.startup_trials, multivariate=True,
                                          constant_liar=True)
    return optuna.samplers.RandomSampler(seed=seed)


def make_pruner(setup: Setup) -> optuna.pruners.BasePruner:
    settings = setup.space.pruner
    warmup, steps, eval_every = setup.pruning_warmup_steps()
    if settings.type == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=settings.startup_trials, n_warmup_steps=warmup)
    if settings.type == "percentile":
        return optuna.pruners.PercentilePruner(settings.percentile, n_startup_trials=settings.startup_trials,
                                               n_warmup_steps=warmup)
    if settings.type == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(warmup, eval_every), max_resource=steps)
    return optuna.pruners.NopPruner()


def check_compatible(study: optuna.Study, setup: Setup) -> None:
    """A resumed study must draw each parameter as before (Optuna's rule: same kind of distribution)."""
    seen: dict[str, Any] = {}
    for t in study.get_trials(deepcopy=False):
        seen.update(t.distributions)
    for name, spec in setup.space.params.items():
        if name in seen:
            try:
                optuna.distributions.check_distribution_compatibility(seen[name], spec.distribution())
            except ValueError:
                raise MoglmError(f"study {study.study_name!r} drew {name} from {seen[name]}; the search space now "
                                 f"says {spec.distribution()}: use another --study-name") from None


def trial_seed(seed: int | None, trials_before: int, worker: int) -> int | None:
    return None if seed is None else (seed * 1_000_003 + trials_before * 7_919 + worker * 104_729) % 2**32


WORKER, HEARTBEAT = "moglm:worker", "moglm:heartbeat"  # a running trial's system attributes


def _process_start(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot), ``"?"`` where /proc is missing, ``None`` if
    there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except FileNotFoundError:
        return None
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return "?"


def _machine() -> str:
    """This machine and process namespace: a pid means the same process only where this is the same."""
    parts = [socket.gethostname()]
    for path in ("/proc/sys/kernel/random/boot_id", "/proc/self/ns/pid"):
        try:
            parts.append(open(path).read().strip() if "boot" in path else str(os.stat(path).st_ino))
        except OSError:
            parts.append("?")
    return "/".join(parts)


def this_worker() -> dict[str, Any]:
    return {"machine": _machine(), "pid": os.getpid(), "start": _process_start(os.getpid())}


def worker_gone(trial: optuna.trial.FrozenTrial, now: float | None = None) -> bool:
    """Whether the worker of a running trial is gone: a process of this machine that no longer exists (or
    is another process by now), or no heartbeat for ``GRACE_S`` seconds."""
    worker, beat = trial.system_attrs.get(WORKER), trial.system_attrs.get(HEARTBEAT)
    if worker is None:  # started by an earlier moglm: Optuna's heartbeat (RDB storages) looks after it
        return False
    if worker["machine"] == _machine():
        start = _process_start(worker["pid"])
        return start is None or (start != "?" and start != worker["start"])
    return beat is not None and (now or time.time()) - beat > GRACE_S


def reclaim_dead_trials(study: optuna.Study) -> list[int]:
    """Fail the running trials whose worker is gone and queue each again once (it resumes its run
    directory); returns their numbers. Safe to race: a trial another worker failed first is skipped."""
    storage, reclaimed = study._storage, []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not worker_gone(trial):
            continue
        try:
            storage.set_trial_user_attr(trial._trial_id, "error", "its worker died (killed, or the machine went away)")
            if not storage.set_trial_state_values(trial._trial_id, TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        requeue_stale_trial(study, storage.get_trial(trial._trial_id))
        reclaimed.append(trial.number)
    return reclaimed


@contextmanager
def tracked(trial: optuna.Trial):
    """Record this process as ``trial``'s worker and beat its heartbeat while the body runs."""
    storage, trial_id = trial.study._storage, trial._trial_id
    storage.set_trial_system_attr(trial_id, WORKER, this_worker())
    storage.set_trial_system_attr(trial_id, HEARTBEAT, time.time())
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            try:
                storage.set_trial_system_attr(trial_id, HEARTBEAT, time.time())
            except Exception:  # the trial finished meanwhile, or the storage is briefly unreachable
                pass

    thread = threading.Thread(target=beat, name="moglm-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def counted_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Trials that count against the budget: those started (any state but waiting), less those re-queued
    as a later trial (a waiting trial takes a place of the budget when it starts)."""
    trials = study.get_trials(deepcopy=False)
    replaced = {t.user_attrs["replaces"] for t in trials if "replaces" in t.user_attrs}
    return [t for t in trials if t.number not in replaced and t.state != TrialState.WAITING]


class Quota:
    """Trials this invocation may still start, shared by its worker processes (exact on this machine;
    trials started elsewhere are seen through the storage before each trial)."""

    def __init__(self, remaining: int, total: int, context=None) -> None:
        self.value = (context or multiprocessing).Value("i", remaining)
        self.total = total

    def take(self, study: optuna.Study) -> bool:
        with self.value.get_lock():
            if self.value.value <= 0 or len(counted_trials(study)) >= self.total:
                self.value.value = 0
                return False
            self.value.value -= 1
            return True


@dataclass
class WorkerArgs:
    setup: Setup
    settings: StudySettings
    storage: str
    study_name: str
    deadline: float | None
    threads: int
    keep_checkpoints: bool
    progress: bool = False  # a progress bar per trial
    echo: bool = False  # every trial's log lines on stdout, "[trial N] ..." (evaluations, averaging, the result)


def work(args: WorkerArgs, quota: Quota, index: int = 0) -> bool:
    """One worker: trials until the quota, the budget or the wall time runs out. Returns whether Ctrl-C
    interrupted it."""
    import torch


    previous_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        study = optuna.load_study(study_name=args.study_name, storage=open_storage(args.storage),
                                  pruner=make_pruner(args.setup))
        objective = args.setup.objective()
        if isinstance(objective, Objective):  # a training trial: what it does while it trains
            objective.progress, objective.log_to_stdout = args.progress, args.echo
        group = _trial_group(args.setup, objective)
        if not group.is_main:
            return _follow(group, objective, args.study_name)

        def run_trial(trial: optuna.Trial) -> float:
            with tracked(trial):
                return objective(distributed_trial(trial, group, args.study_name))

        while not objective.interrupted and (args.deadline is None or time.time() < args.deadline):
            reclaim_dead_trials(study)
            if not group.broadcast(quota.take(study)):
                break
            before = len(counted_trials(study))  # a killed trial queued again counts once, as in the budget
            study.sampler = make_sampler(args.settings, trial_seed(args.settings.seed, before, index))
            study.optimize(run_trial, n_trials=1, catch=(Exception,), gc_after_trial=True)
            if not args.keep_checkpoints:
                drop_checkpoints(study, args.setup.study_dir)
        else:
            group.broadcast(False)
        return objective.interrupted
    finally:
        torch.set_num_threads(previous_threads)


def _trial_group(setup: Setup, objective: Any) -> distributed.Group:
    """One process, or under torchrun the processes that train each trial together (data parallel)."""
    if not distributed.launched():
        return distributed.SINGLE
    if type(objective) is not Objective:  # the synthetic tasks' trials train in one process
        if not distributed.is_main_process():
            raise distributed.ReportedByRankZero()
        raise MoglmError("under torchrun, moglm tune trains each trial data-parallel: a space that trains a "
                         "language model is needed")
    from ..device import resolve_device

    return distributed.process_group(resolve_device(str(setup.base.get("train", {}).get("device", "auto"))))


class _Follower:
    """What rank r > 0 sees of the study: its name; rank 0 enqueues and stops."""

    def __init__(self, study_name: str) -> None:
        self.study_name = study_name

    def enqueue_trial(self, *args: Any, **kwargs: Any) -> None:
        pass

    def stop(self) -> None:
        pass


def distributed_trial(trial: optuna.Trial | None, group: distributed.Group, study_name: str) -> Any:
    """``trial`` itself for one process; under torchrun an optuna_integration.TorchDistributedTrial (rank 0
    holds the trial, every rank gets its parameters, reports and pruning decisions) with ``study``."""
    if not group.distributed:
        return trial
    try:
        from optuna_integration import TorchDistributedTrial
    except ImportError:
        raise MoglmError("data-parallel trials need optuna-integration: pip install 'moglm[tune]'") from None
    shared = TorchDistributedTrial(trial)
    shared.study = trial.study if trial is not None else _Follower(study_name)
    return shared


def _follow(group: distributed.Group, objective: Objective, study_name: str) -> bool:
    """Rank r > 0 under torchrun: train every trial rank 0 starts, until it says there are no more."""
    while group.broadcast(None):
        try:
            objective(distributed_trial(None, group, study_name))
        except Exception:  # rank 0 records the trial's fate
            pass
    return objective.interrupted


def _worker_process(args: WorkerArgs, quota: Quota, index: int) -> None:
    code = 130 if work(args, quota, index) else 0
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the storage and every file are closed; skip seconds of interpreter teardown (torch)


@dataclass
class StudyResult:
    study: optuna.Study
    setup: Setup
    storage: str
    directory: Path
    started: int  # trials this invocation asked for
    failed_workers: list[str]


def run_study(
    space: str | Path,
    *,
    base: str | None = None,
    overrides: list[str] | None = None,
    study_name: str | None = None,
    study_dir: str | Path | None = None,
    storage: str | None = None,
    workers: int = 1,
    threads: int | None = None,
    trials: int | None = None,
    timeout: float | None = None,
    max_tokens: int | None = None,
    sampler: str | None = None,
    seed: int | None | str = "space",
    keep_checkpoints: bool = False,
    log: Callable[[str], None] = print,
    progress: bool = False,
    worker: bool = False,
) -> StudyResult:
    """Create or resume a study and run trials until its budget is spent; arguments left ``None`` come from
    the search-space file (``seed="space"``: the space's seed). ``progress``: print each training trial's log
    lines as it runs (``[trial N] step 400: valid ...``), with a progress bar when there is one worker.
    ``worker``: join an existing study in ``storage`` (from another machine): its base config, overrides,
    token budget and trial budget come from the storage, as the command that created it gave them."""
    spec, path = load_space(space)
    if workers < 1:
        raise MoglmError(f"--workers must be >= 1, got {workers}")
    if distributed.launched():  # torchrun: the processes train each trial together; rank 0 speaks
        if workers > 1:
            raise MoglmError("under torchrun every trial is trained by all the processes: leave out --workers")
        log = log if distributed.is_main_process() else (lambda message: None)
    if worker:
        study_name, stored = _joined(path, storage, study_name, study_dir)
        if base is not None or overrides or max_tokens is not None:
            raise MoglmError("--worker takes the base config, --set and the token budget from the study; "
                             "leave them out")
        base, overrides, max_tokens = stored.get("base_arg"), stored.get("overrides", []), stored.get("max_tokens")
        trials = stored.get("trials") if trials is None else trials
    updates: dict[str, Any] = {}
    if sampler is not None:
        updates["sampler"] = sampler
    if seed != "space":
        updates["seed"] = seed
    settings = StudySettings.model_validate({**spec.study.model_dump(), **updates})
    check_sampler(settings)
    name = study_name or (path.stem if base is None else f"{path.stem}-{Path(base).stem}")
    directory = Path(study_dir or Path("studies") / name)
    prepare = for_tuning(spec.target).hook("tuning_prepare")
    setup: Any = prepare(spec, path.stem, base, list(overrides or []), max_tokens, directory.resolve())
    directory.mkdir(parents=True, exist_ok=True)
    url = storage or default_storage(directory)
    study = optuna.create_study(storage=open_storage(url), study_name=name, direction="minimize",
                                load_if_exists=True)
    check_compatible(study, setup)
    if "space" not in study.user_attrs:
        study.set_user_attr("space", str(path))
        study.set_user_attr("base", setup.base_name)
    total = spec.budget.trials if trials is None else trials
    if not worker:  # what a worker joining from elsewhere needs to run the same trials
        study.set_user_attr("setup", {"base_arg": base, "overrides": list(overrides or []), "max_tokens": max_tokens,
                                      "trials": total})
    reclaimed = reclaim_dead_trials(study)
    if reclaimed:
        log(f"trial{'s' * (len(reclaimed) > 1)} {', '.join(map(str, reclaimed))} lost {'their' if len(reclaimed) > 1 else 'its'} "
            "worker: queued again, resuming from the last checkpoint")
    remaining = total - len(counted_trials(study))
    timeout = timeout if timeout is not None else spec.budget.timeout
    deadline = None if timeout is None else time.time() + timeout
    threads = threads or max(1, usable_cores() // workers)
    args = WorkerArgs(setup, settings, url, name, deadline, threads, keep_checkpoints,
                      progress=progress and workers == 1, echo=progress)
    n = min(workers, max(remaining, 1))
    log(f"study {name!r} ({public_url(url)}): {total - max(remaining, 0)} of {total} trials exist; "
        + (f"running up to {remaining} with {n} worker{'s' * (n > 1)} x {threads} "
           f"thread{'s' * (threads > 1)}" if remaining > 0 else "nothing to run"))
    failed: list[str] = []
    if remaining > 0:
        if workers == 1:
            if work(args, Quota(remaining, total)):
                raise TrainingInterrupted("interrupted; rerun the same command to resume the study")
        else:
            failed = _run_processes(args, remaining, total, workers)
    return StudyResult(study, setup, url, directory, max(remaining, 0), failed)


def default_storage(directory: Path) -> str:
    """The study directory's storage: its ``study.journal`` (an earlier moglm's ``study.db`` if it has one)."""
    if (directory / "study.db").is_file():
        return f"sqlite:///{(directory / 'study.db').resolve()}"
    return str((directory / "study.journal").resolve())


def _joined(path: Path, storage: str | None, study_name: str | None,
            study_dir: str | Path | None) -> tuple[str, dict[str, Any]]:
    """The study a ``--worker`` joins (named, or the one study of this space in the storage) and the
    settings its creator stored."""
    url = storage or default_storage(Path(study_dir or Path("studies") / (study_name or path.stem)))
    if "://" not in url and not Path(url).is_file():
        raise MoglmError(f"--worker: no study at {url}; start it with `moglm tune {path} --storage ...` first")
    names = [s.study_name for s in optuna.get_all_study_summaries(open_storage(url), include_best_trial=False)]
    matches = [study_name] if study_name in names else [] if study_name else \
        [n for n in names if n == path.stem or n.startswith(f"{path.stem}-")]
    if len(matches) != 1:
        which = f"no study {study_name!r}" if study_name else (
            f"{len(matches)} studies of space {path.stem}" if matches else f"no study of space {path.stem}")
        raise MoglmError(f"--worker: {public_url(url)} holds {which} ({', '.join(names) or 'none'}); "
                         + ("pass --study-name" if len(matches) > 1 else f"start it with `moglm tune {path}` first"))
    study = optuna.load_study(study_name=matches[0], storage=open_storage(url))
    return matches[0], study.user_attrs.get("setup", {})


def _run_processes(args: WorkerArgs, remaining: int, total: int, workers: int) -> list[str]:
    context = multiprocessing.get_context("spawn")
    quota = Quota(remaining, total, context)
    processes = [context.Process(target=_worker_process, args=(args, quota, i), name=f"moglm-tune-{i}")
                 for i in range(min(workers, remaining))]
    for p in processes:
        p.start()
    interrupted = False
    while True:
        try:
            for p in processes:
                p.join()
            break
        except KeyboardInterrupt:  # the workers got SIGINT too: they checkpoint and stop
            interrupted = True
    if interrupted or any(p.exitcode == 130 for p in processes):
        raise TrainingInterrupted("interrupted; rerun the same command to resume the study")
    return [f"worker {i} exited with code {p.exitcode}" for i, p in enumerate(processes) if p.exitcode]
