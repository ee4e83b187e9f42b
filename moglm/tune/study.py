"""Running a study: storage, sampler, pruner, worker processes, budgets, resuming.

* Storage: a SQLite file in the study directory unless a storage URL is given (any SQLAlchemy URL
  Optuna accepts, e.g. PostgreSQL for workers on many machines). SQLite waits up to 10 minutes for a
  lock, and a heartbeat marks the trials of dead workers as failed and re-queues them once.
* Workers: ``workers`` processes on this machine (spawned; ``threads`` torch threads each, by default
  the cores divided among them). Workers elsewhere join by running the same command with the same
  storage and study name.
* Budgets: ``trials`` is the total number of trials in the study (every invocation counts against
  it: rerunning the command resumes the study, and rerunning it with the same total adds nothing); a
  wall time after which no new trial starts (running trials finish, as with Optuna's ``timeout``); a
  token budget per trial.
* Reproducibility: each trial's sampler is seeded from the space's seed, the number of trials before
  it and the worker's index, so a one-worker study with a seed repeats exactly, and parallel workers
  never draw the same random start-up points.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Union

import optuna
from optuna.trial import TrialState

from ..errors import MoglmError
from ..train.trainer import TrainingInterrupted
from .objective import Objective, TrialSetup, prepare, requeue_stale_trial
from .search_space import StudySettings, load_space

if TYPE_CHECKING:
    from .dyneval import DynevalSetup

Setup = Union[TrialSetup, "DynevalSetup"]

HEARTBEAT_S = 30
GRACE_S = 180
SQLITE_LOCK_TIMEOUT_S = 600


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna RDB storage with a heartbeat (stale trials are failed and re-queued); SQLite waits for locks."""
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
            raise MoglmError(f"storage {_public(url)}: {type(e).__name__}: {str(e).splitlines()[0]}") from None


def _public(url: str) -> str:
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

    from .report import drop_checkpoints

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        study = optuna.load_study(study_name=args.study_name, storage=open_storage(args.storage),
                                  pruner=make_pruner(args.setup))
        objective = args.setup.objective()
        if isinstance(objective, Objective):  # a training trial: what it does while it trains
            objective.progress, objective.log_to_stdout = args.progress, args.echo
        while not objective.interrupted and (args.deadline is None or time.time() < args.deadline):
            if not quota.take(study):
                break
            before = len(study.get_trials(deepcopy=False))
            study.sampler = make_sampler(args.settings, trial_seed(args.settings.seed, before, index))
            study.optimize(objective, n_trials=1, catch=(Exception,), gc_after_trial=True)
            if not args.keep_checkpoints:
                drop_checkpoints(study, args.setup.study_dir)
        return objective.interrupted
    finally:
        torch.set_num_threads(previous_threads)


def _worker_process(args: WorkerArgs, quota: Quota, index: int) -> None:
    code = 130 if work(args, quota, index) else 0
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the storage and every file are closed; skip seconds of interpreter teardown (torch)


def default_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


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
) -> StudyResult:
    """Create or resume a study and run trials until its budget is spent; arguments left ``None`` come from
    the search-space file (``seed="space"``: the space's seed). ``progress``: print each training trial's log
    lines as it runs (``[trial N] step 400: valid ...``), with a progress bar when there is one worker."""
    spec, path = load_space(space)
    if workers < 1:
        raise MoglmError(f"--workers must be >= 1, got {workers}")
    updates: dict[str, Any] = {}
    if sampler is not None:
        updates["sampler"] = sampler
    if seed != "space":
        updates["seed"] = seed
    settings = StudySettings.model_validate({**spec.study.model_dump(), **updates})
    check_sampler(settings)
    name = study_name or (path.stem if base is None else f"{path.stem}-{Path(base).stem}")
    directory = Path(study_dir or Path("studies") / name)
    if spec.target == "dyneval":
        from .dyneval import prepare_dyneval

        if overrides:
            raise MoglmError("--set changes run configs; a dynamic-evaluation space takes its settings in [fixed]")
        setup: Any = prepare_dyneval(spec, path.stem, base, max_tokens, directory.resolve())
    else:
        setup = prepare(spec, path.stem, base, list(overrides or []), max_tokens, directory.resolve())
    directory.mkdir(parents=True, exist_ok=True)
    url = storage or f"sqlite:///{(directory / 'study.db').resolve()}"
    study = optuna.create_study(storage=open_storage(url), study_name=name, direction="minimize",
                                load_if_exists=True)
    check_compatible(study, setup)
    if "space" not in study.user_attrs:
        study.set_user_attr("space", str(path))
        study.set_user_attr("base", setup.base_name)
    total = spec.budget.trials if trials is None else trials
    remaining = total - len(counted_trials(study))
    timeout = timeout if timeout is not None else spec.budget.timeout
    deadline = None if timeout is None else time.time() + timeout
    threads = threads or max(1, default_cores() // workers)
    args = WorkerArgs(setup, settings, url, name, deadline, threads, keep_checkpoints,
                      progress=progress and workers == 1, echo=progress)
    n = min(workers, max(remaining, 1))
    log(f"study {name!r} ({_public(url)}): {total - max(remaining, 0)} of {total} trials exist; "
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
