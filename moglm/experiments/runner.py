"""Running an experiment: train every run, give it its evaluations, resume whatever was interrupted.

Layout, under a root (``experiments/`` by default)::

    <root>/<scale>[-<your corpus>]/runs/<corpus>-<variant>-s<seed>/   ordinary run directories
                                  runs/index.json                   config digest -> run directory
                                  <experiment>/experiment.json      its runs, and the command that ran them
                                  <experiment>/report.md, *.png     (moglm report)

Runs are shared between the experiments of a scale: a run whose resolved config (all but its name)
equals one already made, such as the Mogrifier of the ablation, the rounds sweep's r = 5 and the
headline's Mogrifier, is trained once and used by each.

Every evaluation of a run is a file in its ``evaluations/`` folder, written when it completes, so a
rerun skips what is done: ``static.json`` (the final evaluation: best checkpoint, softmax temperature
searched on validation), ``mc_dropout.json``, ``dynamic.json``, ``mc_dynamic.json`` and
``token_losses.safetensors`` (per-token test losses, static and dynamic, for the surprise analysis; the
dynamic evaluation's pass over test writes them too). Runs go to ``workers`` processes at once, the cores shared among them.
An analysis adds only its own evaluations to the runs it uses (such as ``optimisers.json``, Krause thesis
5.4), sized by its own scale (``eval_tokens`` ...); the runs are trained at the used experiment's.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shlex
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from ..atomic import atomic_write_bytes, atomic_write_text
from ..device import usable_cores
from ..errors import MoglmError, TrainingInterrupted
from ..registry import for_experiment
from .spec import Experiment, RunSpec, Scale, load_experiment, runs, scale_of

EVALUATION_FILES = {"static": "static.json", "mc_dropout": "mc_dropout.json",
                    "mc_dropout_searched": "mc_dropout_searched.json", "dynamic": "dynamic.json",
                    "mc_dynamic": "mc_dynamic.json", "token_losses": "token_losses.safetensors",
                    "cache": "cache.json", "dynamic_cache": "dynamic_cache.json", "out_of_domain": "out_of_domain.json",
                    "optimisers": "optimisers.json", "dynamic_sgd": "dynamic_sgd.json",
                    "dynamic_rms": "dynamic_rms.json"}


def scale_dir(root: str | Path, scale: str, data: str | None = None) -> Path:
    """The runs of one scale (a user's corpus gets its own)."""
    return Path(root) / (f"{scale}-{Path(data).stem}" if data else scale)


def experiment_dir(root: str | Path, exp: Experiment, scale: str, data: str | None = None) -> Path:
    """Where an experiment's manifest and report live."""
    return scale_dir(root, scale, data) / exp.name


def config_digest(config: dict[str, Any]) -> str:
    """SHA-256 of a run's resolved config without its name and description (and without the fields added
    since digests were first recorded where they hold their defaults: :func:`without_added_defaults`)."""
    import hashlib

    from ..runs.config import without_added_defaults

    body = without_added_defaults({k: v for k, v in config.items() if k not in ("name", "description")})
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def assign_run_dirs(pool: Path, exp: Experiment, specs: list[RunSpec]) -> dict[str, Path]:
    """The run directory of each spec: an existing one with the same config, else ``runs/<name>`` (or
    ``runs/<experiment>-<name>`` when that name is taken by another config). Recorded in ``index.json``."""
    index = read_index(pool)
    taken = set(index.values())
    out = {}
    for s in specs:
        digest = config_digest(_resolved(exp, s))
        if digest not in index:
            name = s.name if s.name not in taken else f"{exp.name}-{s.name}"
            index[digest] = name
            taken.add(name)
        out[s.name] = pool / index[digest]
    atomic_write_text(pool / "index.json", json.dumps(index, indent=1))
    return out


def read_index(pool: Path) -> dict[str, str]:
    """Config digest -> run directory name, for the runs of one scale."""
    path = pool / "index.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _resolved(exp: Experiment, spec: RunSpec) -> dict[str, Any]:
    return for_experiment(exp.kind).hook("experiment_config")(spec)


def command_line(exp: Experiment, scale: str, data: str | None, data_format: str, root: str | Path) -> str:
    parts = ["moglm", "experiment", "run", exp.name, "--scale", scale]
    if data:
        parts += ["--data", str(data), "--data-format", data_format]
    if Path(root) != Path("experiments"):
        parts += ["--root", str(root)]
    return shlex.join(parts)


def plan(exp: Experiment, scale: str, data: str | None = None, data_format: str = "char") -> tuple[Experiment, list[RunSpec]]:
    """The experiment whose runs are trained (an analysis's ``uses``) and those runs."""
    trained = load_experiment(exp.uses) if exp.is_analysis else exp
    return trained, runs(trained, scale, data, data_format)


def wanted_evaluations(exp: Experiment, trained: Experiment) -> list[str]:
    """Training's final evaluation, then the experiment's own (an analysis adds only its own to the runs
    it uses)."""
    return list(dict.fromkeys(["static", *exp.evaluations]))


def run_experiment(
    name: str | Path,
    scale: str,
    *,
    root: str | Path = "experiments",
    data: str | None = None,
    data_format: str = "char",
    workers: int = 1,
    only: list[str] | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> Path:
    """Train and evaluate every run of experiment ``name`` at ``scale`` (resuming); returns its folder."""
    exp = load_experiment(name)
    scale_of(exp, scale)
    if workers < 1:
        raise MoglmError(f"--workers must be >= 1, got {workers}")
    trained, specs = plan(exp, scale, data, data_format)
    if only:
        unknown = [o for o in only if o not in {s.name for s in specs}]
        if unknown:
            raise MoglmError(f"no run {unknown[0]!r} in {exp.name}: its runs are {', '.join(s.name for s in specs)}")
        specs = [s for s in specs if s.name in only]
    folder = experiment_dir(root, exp, scale, data)
    evaluations = wanted_evaluations(exp, trained)
    dirs = assign_run_dirs(scale_dir(root, scale, data) / "runs", trained, specs)
    _write_manifest(folder, exp, trained, scale, data, data_format, root, specs, dirs, evaluations)
    threads = max(1, usable_cores() // workers)
    unique = {str(dirs[s.name]): s for s in specs}  # a run shared by two variants trains once
    sizes = scale_of(exp, scale).model_dump()  # an analysis's evaluations are sized by its own scale
    jobs = [(trained.model_dump(), scale, asdict(s), path, evaluations, threads, progress and workers == 1, sizes)
            for path, s in unique.items()]
    log(f"{exp.name} at scale {scale}: {len(jobs)} runs in {folder}, {workers} worker{'s' * (workers > 1)} x "
        f"{threads} thread{'s' * (threads > 1)}; evaluations: {', '.join(evaluations)}")
    failed = []
    if workers == 1:
        for job in jobs:
            outcome = _run_job(*job, log=log)
            if outcome:
                failed.append(outcome)
    else:
        context = multiprocessing.get_context("spawn")
        with context.Pool(workers, maxtasksperchild=1) as pool:
            for outcome in pool.imap_unordered(_run_job_star, jobs):
                if outcome:
                    failed.append(outcome)
                    log(outcome)
    if failed:
        raise MoglmError(f"{len(failed)} of {len(jobs)} runs failed ({failed[0]}); rerun the same command to resume")
    log(f"done: moglm report {folder}")
    return folder


def _write_manifest(folder: Path, exp: Experiment, trained: Experiment, scale: str, data: str | None,
                    data_format: str, root, specs: list[RunSpec], dirs: dict[str, Path],
                    evaluations: list[str]) -> None:
    manifest_path = folder / "experiment.json"
    manifest: dict[str, Any] = {}
    if manifest_path.is_file():
        try:
            manifest = json.loads(manifest_path.read_text())
        except ValueError:
            manifest = {}
    previous = {r["name"]: r for r in manifest.get("runs", [])}
    for s in specs:
        previous[s.name] = asdict(s) | {"label": trained.variants[s.variant].label or s.variant,
                                        "path": os.path.relpath(dirs[s.name], folder)}
    manifest = {"format_version": 1, "experiment": exp.name, "trained": trained.name, "scale": scale, "data": data,
                "data_format": data_format if data else None,
                "command": command_line(exp, scale, data, data_format, root),
                "evaluations": evaluations, "spec": exp.model_dump(mode="json"),
                "corpora": {name: c.label or name for name, c in trained.corpora.items()},
                "runs": list(previous.values())}
    atomic_write_text(manifest_path, json.dumps(manifest, indent=1))


def _run_job_star(args) -> str | None:
    return _run_job(*args, log=lambda s: print(s, flush=True))


def _run_job(exp_data: dict, scale: str, spec_data: dict, run_dir: str, evaluations: list[str], threads: int,
             progress: bool, sizes: dict | None = None, log: Callable[[str], None] = print) -> str | None:
    """One run in this process: train, then each evaluation not yet on disk (``sizes``: the scale of the
    experiment that asked for them, an analysis's own; default the trained experiment's). Returns an error
    line, or None."""
    import torch

    from ..progress import above_bars

    torch.set_num_threads(threads)
    exp = Experiment.model_validate(exp_data)
    spec = RunSpec(**spec_data)
    say = above_bars(lambda s: log(f"[{spec.name}] {s}")) if progress else (lambda s: log(f"[{spec.name}] {s}"))
    started = time.time()
    sized = scale_of(exp, scale) if sizes is None else Scale.model_validate(sizes)
    try:
        run = for_experiment(exp.kind).hook("experiment_run")
        run(exp, scale, spec, Path(run_dir), evaluations, progress, say, sized)
    except MoglmError as e:
        if isinstance(e, TrainingInterrupted):  # Ctrl-C or SIGTERM stops the experiment, not just this run
            raise
        return f"[{spec.name}] failed: {e}"
    except KeyboardInterrupt:
        raise
    except Exception as e:  # a bug in one run must not stop the others; the error names the run
        return f"[{spec.name}] failed: {type(e).__name__}: {e}"
    say(f"finished in {time.time() - started:.0f}s")
    return None


def done_evaluations(run_dir: Path) -> list[str]:
    return [name for name, file in EVALUATION_FILES.items() if (run_dir / "evaluations" / file).is_file()]


def status(name: str | Path, scale: str, root: str | Path = "experiments", data: str | None = None,
           data_format: str = "char") -> list[dict[str, Any]]:
    """Each run's state: not started, training (step k of n), or trained with the evaluations done."""
    from ..runs import RunDirectory

    exp = load_experiment(name)
    trained, specs = plan(exp, scale, data, data_format)
    wanted = wanted_evaluations(exp, trained)
    index = read_index(scale_dir(root, scale, data) / "runs")
    rows = []
    for s in specs:
        name = index.get(config_digest(_resolved(trained, s)), s.name)
        path = scale_dir(root, scale, data) / "runs" / name
        run = RunDirectory(path)
        pointer = run.checkpoints.pointer("last") if path.is_dir() else None
        done = done_evaluations(path)
        if not path.is_dir():
            state = "not started"
        elif all(e in done for e in wanted):
            state = "done"
        elif "static" in done:
            state = "trained; evaluating"
        else:
            state = "training" + (f" (step {pointer['step']})" if pointer else "")
        rows.append({"run": s.name, "state": state, "evaluations": done, "path": str(path)})
    return rows


def save_token_losses(path: Path, static, dynamic, metadata: dict[str, Any]) -> None:
    """Per-token losses ``[L]`` (nats) of one split, static and dynamic, as safetensors."""
    from safetensors.torch import save

    atomic_write_bytes(path, save({"static": static.contiguous(), "dynamic": dynamic.contiguous()},
                                  metadata={k: json.dumps(v) for k, v in metadata.items()}))

