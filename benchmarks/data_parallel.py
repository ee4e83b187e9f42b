"""Data-parallel training throughput: tokens/s of one process against two (torchrun, gloo on CPU) at the same
global batch, the scaling efficiency, the all-reduce time of a step's gradient, and the communication volume
of a step for the PTB paper config (the 24M Mogrifier). Writes benchmarks/results/data_parallel.json.

    python benchmarks/data_parallel.py                 # ~3 minutes on two cores
    python benchmarks/data_parallel.py --steps 100 --config default

Runs (each a fresh run directory, checkpoint and evaluation only at the end, outside the timed windows):
one process with one thread (the baseline: one core), one process with two threads, and two processes
with one thread each, all on the same config and global batch. Tokens/s is the median of the training
log's 10-step windows after the first (warm-up) one; the rounds run the three in turn, and the best
round of each is reported (the least disturbed by other jobs on a shared machine; every round and the
load average are kept too).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results" / "data_parallel.json"
PAPER_CONFIG, PTB_VOCABULARY = "ptb-word-mogrifier-paper", 10_000
# bandwidths (GB/s, one direction) for the expectations below: typical, not measured here
LINKS = {"NVLink 4 (H100 SXM)": 450.0, "PCIe 4.0 x16": 25.0, "InfiniBand / Ethernet 100 Gb/s": 12.5,
         "Ethernet 10 Gb/s": 1.25}


def worker(config: str, run_dir: str, steps: int, threads: int, allreduce_floats: list[int]) -> None:
    """One process of a run (under torchrun when there are several): train, then time all-reduces."""
    from moglm.train import Trainer
    from moglm.runs.config import load_config

    torch.set_num_threads(threads)
    cfg = load_config(config, [f"train.max_steps={steps}", f"train.eval_every={steps}", "train.eval_tokens=2000",
                               f"train.threads={threads}", "train.averaging_patience=null",
                               "train.averaging_start=null", "sample.num_tokens=0"])
    trainer = Trainer(cfg, run_dir, progress=False, log=lambda line: None)
    trainer.train()
    if trainer.group.distributed:
        import torch.distributed as dist

        times = {}
        for n in allreduce_floats:
            buffer = torch.ones(n)
            seconds = []
            for _ in range(5):
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(buffer)
                seconds.append(time.perf_counter() - start)
            times[str(n)] = statistics.median(seconds[1:])
        if trainer.group.is_main:
            (Path(run_dir) / "allreduce.json").write_text(json.dumps(times))
        dist.barrier()
        sys.stdout.flush()
        os._exit(0)  # after a 96 MB gloo all-reduce, interpreter teardown can abort in a gloo thread


def tokens_per_second(run_dir: Path) -> float:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rates = [r["tokens_per_s"] for r in records if r["kind"] == "train"][1:]  # the first window warms up
    return statistics.median(rates)


def paper_parameters() -> int:
    from moglm.model.language_model import count_parameters
    from moglm.runs.build import build_model, resolve_hidden_size
    from moglm.runs.config import load_config

    model_cfg = load_config(PAPER_CONFIG).model
    with torch.device("meta"):
        model = build_model(model_cfg, PTB_VOCABULARY, resolve_hidden_size(model_cfg, PTB_VOCABULARY))
    return count_parameters(model)


def ring_bytes(parameters: int, processes: int) -> float:
    """Bytes each process sends (and receives) in a ring all-reduce of float32 gradients."""
    return parameters * 4 * 2 * (processes - 1) / processes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="default")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--worker", nargs=3, metavar=("RUN_DIR", "THREADS", "FLOATS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_dir, threads, floats = args.worker
        worker(args.config, run_dir, args.steps, int(threads), [int(n) for n in floats.split(",") if n])
        return

    from moglm.model.language_model import count_parameters
    from moglm.runs.build import build_model, load_data, resolve_hidden_size
    from moglm.runs.config import load_config

    cfg = load_config(args.config)
    vocab = len(load_data(cfg.data).vocab)
    model_parameters = count_parameters(build_model(cfg.model, vocab, resolve_hidden_size(cfg.model, vocab)))
    paper = paper_parameters()
    script = str(Path(__file__).resolve())
    runs = {"1 process x 1 thread": (1, 1), "1 process x 2 threads": (1, 2), "2 processes x 1 thread": (2, 1)}
    results: dict[str, dict] = {}
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        for round_, (name, (processes, threads)) in [(r, item) for r in range(args.rounds) for item in runs.items()]:
            run_dir = Path(tmp) / f"{name.replace(' ', '-')}-{round_}"
            floats = f"{model_parameters},{paper}" if processes > 1 else ""
            launcher = [sys.executable] if processes == 1 else [
                sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
            command = [*launcher, script, "--config", args.config, "--steps", str(args.steps),
                       "--worker", str(run_dir), str(threads), floats]
            env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
            print(f"round {round_ + 1}, {name}: training {args.steps} steps ...", flush=True)
            subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
            entry = results.setdefault(name, {"processes": processes, "threads_per_process": threads, "rounds": []})
            entry["rounds"].append(round(tokens_per_second(run_dir), 1))
            entry["tokens_per_s"] = max(entry["rounds"])
            if processes > 1:
                allreduce = json.loads((run_dir / "allreduce.json").read_text())
    load.append(os.getloadavg()[0])
    base = results["1 process x 1 thread"]["tokens_per_s"]
    two = results["2 processes x 1 thread"]["tokens_per_s"]
    gradient_seconds, paper_seconds = allreduce[str(model_parameters)], allreduce[str(paper)]
    step_seconds = cfg.train.batch_size * cfg.train.bptt / two
    report = {
        "machine": {"cpu": _cpu(), "cores": len(os.sched_getaffinity(0)), "torch": torch.__version__,
                    "python": platform.python_version(), "backend": "gloo (CPU)",
                    "load_average_1min_before_after": [round(x, 2) for x in load]},
        "config": {"name": args.config, "parameters": model_parameters, "batch_size": cfg.train.batch_size,
                   "bptt": cfg.train.bptt, "steps": args.steps},
        "runs": results,
        "speedup_2_processes_over_1_thread": round(two / base, 3),
        "scaling_efficiency": round(two / (2 * base), 3),
        "speedup_2_processes_over_1_process_2_threads": round(two / results["1 process x 2 threads"]["tokens_per_s"], 3),
        "allreduce_gloo_2_processes": {
            "this_config_gradient_seconds": round(gradient_seconds, 5),
            "this_config_share_of_a_step": round(gradient_seconds / step_seconds, 4),
            "paper_config_gradient_seconds": round(paper_seconds, 4),
        },
        "paper_config": {
            "name": PAPER_CONFIG, "parameters": paper, "gradient_mb": round(paper * 4 / 1e6, 1),
            "ring_allreduce_mb_per_process_per_step": {str(n): round(ring_bytes(paper, n) / 1e6, 1) for n in (2, 4, 8, 16)},
            "seconds_per_step_at_8_processes": {link: round(ring_bytes(paper, 8) / (gbs * 1e9), 4)
                                                for link, gbs in LINKS.items()},
            "bandwidths_gb_per_s_assumed": LINKS,
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


if __name__ == "__main__":
    main()
