"""End-to-end training speed, before and after the compiled recurrence, in one run.

Two measurements, each with ``model.backend = "fused"`` (the Python fused recurrence: what ran before the
compiled one) and with the default ``"auto"`` (the compiled recurrence where it is built), interleaved:

* ``configs``: tokens/s of real training steps (embedding, dropout, softmax, optimizer and all) of
  shipped configs, by default the CPU-budget PTB LSTM and Mogrifier, over ``steps`` optimizer steps:
  the median of the trainer's own ``tokens_per_s`` records (every 10 steps), the first record dropped
  as warm-up. Needs the corpus (``$MOGLM_DATA`` or ``../shared/data``); configs whose corpus is absent
  are skipped with their reason.
* ``default``: the wall time of the whole ``moglm train`` command with no arguments (train, final
  evaluation, sample), in a fresh process and run directory.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from . import command_line, write_report

BACKENDS = ("fused", "auto")


def _tokens_per_s(config: str, backend: str, steps: int, run_dir: Path,
                  device: str | None = None, cuda_graphs: bool | None = None) -> dict[str, Any]:
    from ..runs.config import load_config
    from ..runs import RunDirectory
    from ..train.trainer import Trainer

    cfg = load_config(config, [f"train.max_steps={steps}", f"train.eval_every={steps + 1}",
                               f"model.backend={backend}", *([f"train.device={device}"] if device else []),
                               *([] if cuda_graphs is None else [f"train.cuda_graphs={str(cuda_graphs).lower()}"])])
    start = time.perf_counter()
    Trainer(cfg, run_dir, progress=False, log=lambda s: None).train()
    seconds = time.perf_counter() - start
    rates = [r["tokens_per_s"] for r in RunDirectory(run_dir).read_metrics() if r["kind"] == "train"][1:]
    return {"tokens_per_s": statistics.median(rates) if rates else None, "records": len(rates),
            "seconds": seconds, "tokens": steps * cfg.train.batch_size * cfg.train.bptt}


def _default_command_seconds(backend: str, run_dir: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "moglm.cli", "train", "--run-dir", str(run_dir), "--set",
               f"model.backend={backend}"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    out: dict[str, Any] = {"seconds": seconds, "exit_code": done.returncode}
    if done.returncode != 0:
        out["error"] = done.stderr.strip()[-300:]
    return out


def run_end_to_end(
    configs=("ptb-word-lstm-cpu", "ptb-word-mogrifier-cpu"),
    steps: int = 60,
    default_command: bool = True,
    out_path: str | Path | None = "benchmarks/results/end_to_end.json",
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    import torch

    from ..recurrence import compiled

    report: dict[str, Any] = {
        "command": command_line(),
        "machine": dict(platform=platform.platform(), processor=platform.processor(), torch=torch.__version__,
                        threads=torch.get_num_threads(), cpus=os.cpu_count()),
        "recurrence": compiled.info(paths=False),
        "steps": steps,
        "configs": {},
    }
    with tempfile.TemporaryDirectory(prefix="moglm-e2e-") as tmp:
        for config in configs:
            row: dict[str, Any] = {}
            for backend in BACKENDS:
                log(f"{config}: {steps} steps with backend={backend} ...")
                try:
                    row[backend] = _tokens_per_s(config, backend, steps, Path(tmp) / f"{config}-{backend}")
                except Exception as error:  # noqa: BLE001 - a missing corpus skips the config, with its reason
                    row = {"skipped": f"{type(error).__name__}: {error}"}
                    log(f"  skipped: {row['skipped']}")
                    break
                log(f"  {row[backend]['tokens_per_s']:,.0f} tokens/s")
            if "skipped" not in row:
                row["speedup"] = row["auto"]["tokens_per_s"] / row["fused"]["tokens_per_s"]
            report["configs"][config] = row
            write_report(report, out_path)
        if default_command:
            report["default"] = {}
            for backend in BACKENDS:
                log(f"moglm train (no arguments) with backend={backend} ...")
                report["default"][backend] = _default_command_seconds(backend, Path(tmp) / f"default-{backend}")
                log(f"  {report['default'][backend]['seconds']:.1f} s")
                write_report(report, out_path)
    return report



def markdown_table(report: dict[str, Any]) -> str:
    rec = report["recurrence"]
    path = f"compiled, GEMM route {rec.get('gemm_route')}" if rec.get("compiled") else f"not compiled: {rec.get('reason')}"
    lines = [f"{report['machine']['threads']} threads, {rec.get('cpu')}; auto = {path}.", "",
             "| what | Python fused (before) | auto (after) | speed-up |", "| --- | ---: | ---: | ---: |"]
    for config, row in report["configs"].items():
        if "skipped" in row:
            lines.append(f"| {config} tokens/s | skipped: {row['skipped']} | | |")
            continue
        lines.append(f"| {config} tokens/s ({report['steps']} steps) | {row['fused']['tokens_per_s']:,.0f} | "
                     f"{row['auto']['tokens_per_s']:,.0f} | {row['speedup']:.2f}x |")
    default = report.get("default")
    if default:
        before, after = default["fused"]["seconds"], default["auto"]["seconds"]
        lines.append(f"| `moglm train` (no arguments), seconds | {before:.0f} | {after:.0f} | {before / after:.2f}x |")
    return "\n".join(lines)


def epoch_seconds(config: str = "ptb-word-mogrifier-paper", device: str = "cpu", steps: int = 30,
                  out_path: str | Path | None = None, log: Callable[[str], None] = print,
                  cuda_graphs: bool | None = None) -> dict[str, Any]:
    """Training tokens/s of ``config`` on ``device`` (the median of the trainer's records after the first,
    over ``steps`` optimizer steps) and the seconds one epoch of its training split takes at that rate;
    written as JSON to ``out_path`` (if given) and returned. ``cuda_graphs``: ``train.cuda_graphs`` set to it
    (``None``: the config's); the report's ``cuda_graphs`` says whether the steps ran graphed."""
    import torch

    from ..device import resolve_device, usable_cores
    from ..recurrence.cuda_graphs import resolve
    from ..runs.build import load_data
    from ..runs.config import load_config

    where = resolve_device(device)
    cfg = load_config(config, [])
    setting = cfg.train.cuda_graphs if cuda_graphs is None else cuda_graphs
    graphed = resolve(setting, where, name="train.cuda_graphs")[0]
    train_tokens = len(load_data(cfg.data)["train"])
    log(f"{config} on {device}{' with CUDA graphs' if graphed else ''}: {steps} steps ...")
    with tempfile.TemporaryDirectory(prefix="moglm-epoch-") as tmp:
        measured = _tokens_per_s(config, "auto", steps, Path(tmp) / "run", device=device, cuda_graphs=cuda_graphs)
    rate = measured["tokens_per_s"]
    machine = dict(platform=platform.platform(), processor=platform.processor(), torch=torch.__version__,
                   threads=torch.get_num_threads(), usable_cores=usable_cores())
    if where.type == "cuda":
        machine["gpu"] = torch.cuda.get_device_name(where)
    report = {"command": command_line(), "config": config, "device": device, "cuda_graphs": graphed,
              "machine": machine, "steps": steps,
              "train_tokens": train_tokens, **measured, "epoch_seconds": train_tokens / rate if rate else None}
    log(f"  {rate:,.0f} tokens/s: an epoch of {train_tokens:,} tokens takes {report['epoch_seconds'] / 60:.1f} min"
        if rate else "  too few steps for a rate (use --steps >= 20)")
    write_report(report, out_path)
    return report
