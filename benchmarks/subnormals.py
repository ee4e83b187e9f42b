"""What flushing subnormal floats to zero in the compiled windows saves on a trained run's forward passes.

    python benchmarks/subnormals.py RUN TEXT --out benchmarks/results/subnormals.json

A trained model's steps make subnormal floats (below 1.2e-38 in float32), and on x86 every multiply-add that
reads or makes one takes a microcode assist; the compiled windows flush them to zero
(``moglm.recurrence.compiled.flush_denormals``, on by default; docs/fused-recurrence.md, "Subnormals"). This
times the run's model (eval mode, no gradient, ``--threads`` threads) on ``TEXT`` cut into ``B`` streams, two
ways each, with the flush on and off, interleaved ``--repeats`` times (the median is kept; the machine is
shared, so the ratio of the two, measured in one run, is what to read):

* ``window``: one forward window of ``--bptt`` steps over all the streams (evaluation's pass);
* ``step``: ``--steps`` forward calls of one step each, the state carried, with the output layer's log
  probabilities (what ``moglm compress`` and generation run per token).

Per row it also reports how many of the embedding's entries are subnormal (rows of tokens the training
never saw decay there under the L2 penalty) and the largest difference between the two ways' log
probabilities. Writes JSON and prints a line per row.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import torch

from moglm.bench import command_line, write_report
from moglm.recurrence import compiled
from moglm.runs.language_model import load_run


def _streams(ids: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """``[length, batch]``: the text's token ids cut into ``batch`` side-by-side streams (repeated if short)."""
    need = batch * length
    reps = -(-need // max(len(ids), 1))
    return ids.repeat(reps)[:need].view(batch, length).t().contiguous()  # [L, B]


def _window(model, tokens: torch.Tensor) -> torch.Tensor:
    h, _ = model(tokens, None)  # [T, B, H]
    return model.output_log_probs(h[-1:], 1.0)[0]  # [B, V]


def _steps(model, tokens: torch.Tensor) -> torch.Tensor:
    state, log_p = None, None
    for t in range(tokens.shape[0]):
        h, state = model(tokens[t : t + 1], state)  # [1, B, H]
        log_p = model.output_log_probs(h, 1.0)[0]  # [B, V]
    return log_p


def _timed(run, model, tokens, flush: bool) -> tuple[float, torch.Tensor]:
    with compiled.flush_denormals(flush):
        start = time.perf_counter()
        out = run(model, tokens)
        return time.perf_counter() - start, out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a trained language-model run directory")
    parser.add_argument("text", help="a text file to read (as the run's tokens)")
    parser.add_argument("--batch", type=int, action="append", help="streams side by side (repeatable; default 25, 256)")
    parser.add_argument("--bptt", type=int, default=40, help="steps of the window pass")
    parser.add_argument("--steps", type=int, default=20, help="one-step calls of the step pass")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/subnormals.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    trained = load_run(args.run)
    model = trained.model.eval()
    ids = trained.encode(Path(args.text).read_text(encoding="utf-8"))  # [N]
    tiny = torch.finfo(torch.float32).tiny
    weights = dict(model.named_parameters())
    embedding = weights.get("embedding.weight", next(iter(weights.values())))  # the input embedding [V, E]
    subnormal = int(((embedding != 0) & (embedding.abs() < tiny)).sum())
    rows = []
    with torch.no_grad():
        for batch in args.batch or [25, 256]:
            for name, run, length in (("window", _window, args.bptt), ("step", _steps, args.steps)):
                tokens = _streams(ids, batch, length)  # [L, B]
                for flush in (True, False):  # warm-up: auto's probes and the route choices happen here
                    _timed(run, model, tokens, flush)
                times: dict[bool, list[float]] = {True: [], False: []}
                outs = {}
                for _ in range(args.repeats):
                    for flush in (True, False):
                        seconds, outs[flush] = _timed(run, model, tokens, flush)
                        times[flush].append(seconds)
                on, off = statistics.median(times[True]), statistics.median(times[False])
                row = {"pass": name, "batch": batch, "steps": length, "ms_per_step_flushed": on / length * 1e3,
                       "ms_per_step_kept": off / length * 1e3, "kept_over_flushed": off / on,
                       "max_abs_log_prob_difference": float((outs[True] - outs[False]).abs().max())}
                rows.append(row)
                print(f"{name:6s} B={batch:4d}: {row['ms_per_step_flushed']:.3f} ms a step flushed, "
                      f"{row['ms_per_step_kept']:.3f} kept ({row['kept_over_flushed']:.2f}x); largest log-prob "
                      f"difference {row['max_abs_log_prob_difference']:.2e}", flush=True)
    report = {"command": command_line(),
              "run": Path(args.run).name, "text": Path(args.text).name, "threads": args.threads,
              "cpu": compiled.info(paths=False)["cpu"], "machine": platform.machine(), "torch": torch.__version__,
              "compiled": compiled.available(), "embedding_subnormal_entries": subnormal,
              "embedding_entries": embedding.numel(), "results": rows}
    write_report(report, args.out)
    return report


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
