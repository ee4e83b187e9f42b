"""The one-token step's fixed cost: a language model's step at T = 1, against its recurrent ops alone.

    python benchmarks/one_token_step.py --hidden-size 64 --hidden-size 256 --batch 1 --batch 198 \\
        --out benchmarks/results/one_token_step.json

Sampling, batch-1 dynamic evaluation and compression's decoder run a model one token at a time, so whatever a
step costs beyond its products (checks, dispatch, allocations) is paid at every token. For the shipped
``wikitext-2-byte-mogrifier-cpu`` architecture (bytes, two Mogrifier layers, r = 5, k = min(32, H), skip-sum)
at hidden size H (64 is the compression guide's small model), in eval mode without gradients, on the compiled
path: the microseconds of

* ``step``: embedding, both layers and the output head's log-probabilities (``model(tokens, state)`` then
  ``output_log_probs``), as a sampler runs it;
* ``layers``: the stack alone (``forward_layers``);
* ``ops``: the two layers' compiled ops called directly, with their arguments made once: the floor.

``overhead`` is 1 - ops / step. Each figure is the best of ``--repeats`` timings of ``--steps`` steps (the
machine's other work only adds). Writes JSON and prints a markdown table.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from moglm.bench import command_line, write_report
from moglm.errors import MoglmError

CONFIG = "wikitext-2-byte-mogrifier-cpu"


def _model(hidden: int):
    """The shipped ``wikitext-2-byte-mogrifier-cpu`` model's architecture at hidden size ``hidden`` (rank at most
    ``hidden``), in eval mode."""
    from moglm.runs.build import build_model
    from moglm.runs.config import load_config

    config = load_config(CONFIG, overrides=[f"model.cell.rank={min(32, hidden)}"])
    return build_model(config.model, 256, hidden_size=hidden).eval()


def _best(run, steps: int, repeats: int) -> float:
    """Microseconds a call of ``run``: the best of ``repeats`` timings of ``steps`` calls."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            run()
        best = min(best, (time.perf_counter() - start) / steps)
    return best * 1e6


def measure(hidden: int, batch: int, steps: int, repeats: int) -> dict:
    """One row: the step, the stack and the ops alone, for H = ``hidden`` and ``batch`` streams."""
    from moglm.recurrence import AUTO_RUNNERS, _class_route, auto, compiled
    from moglm.recurrence.compiled import functions, routes
    from moglm.recurrence.fused_lstm import layer_spec

    if not compiled.available():
        raise MoglmError(f"the compiled recurrence is unavailable ({compiled.unavailable_reason()})")
    model = _model(hidden)
    tokens = torch.randint(0, 256, (1, batch), generator=torch.Generator().manual_seed(0))  # [1, B]
    with torch.no_grad():
        _, state = model(tokens, None)
        x = model.embedding(tokens)  # [1, B, H]
        rnn = model.rnn
        outputs = rnn.forward_layers(x, state)[0]  # each layer's output: the next layer's input
        calls = []
        for k, cell in enumerate(rnn.cells):
            p = rnn.layer_parameters(k)
            spec = layer_spec(cell, p)
            mats, lefts, biases = functions._round_lists(spec, p)
            # the route the stack's window takes: its shape class's (auto's choice), else the machine's
            choice = auto.choose(cell, p, x if k == 0 else outputs[k - 1], AUTO_RUNNERS, _class_route)
            route = routes.stored_route(choice.get("route"))
            with routes.using_route(route):
                route = routes.step_route(x.dtype)
            calls.append((p["weight_ih"], p["weight_hh"], functions._bias(p), mats, lefts, biases, spec.rounds,
                          spec.rank, spec.zigzag, spec.capped, False, route))

        def ops() -> None:
            xs = x
            for k, c in enumerate(calls):
                xs = torch.ops.moglm.mogrifier_lstm_forward(xs, state[0][k], state[1][k], None, *c,
                                                            functions.MIN_ROWS, None)[0]

        def step() -> None:
            h, _ = model(tokens, state)
            model.output_log_probs(h)

        timings = {}
        for name, run in (("step", step), ("layers", lambda: rnn.forward_layers(x, state)), ("ops", ops)):
            run()  # warm: the first call may time the paths for this shape class (once per machine)
            timings[name] = _best(run, steps, repeats)
    return {"hidden": hidden, "batch": batch, "step_us": timings["step"], "layers_us": timings["layers"],
            "ops_us": timings["ops"], "overhead": 1.0 - timings["ops"] / timings["step"]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden-size", type=int, action="append", help="H (repeatable; default 64)")
    parser.add_argument("--batch", type=int, action="append", help="streams B (repeatable; default 1)")
    parser.add_argument("--steps", type=int, default=500, help="steps a timing")
    parser.add_argument("--repeats", type=int, default=7, help="timings, of which the best is kept")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    sizes, batches = args.hidden_size or [64], args.batch or [1]
    if min(*sizes, *batches, args.steps, args.repeats, args.threads) < 1:
        raise SystemExit("one_token_step: sizes, batches, --steps, --repeats and --threads must be at least 1")
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        rows = [measure(h, b, args.steps, args.repeats) for h in sizes for b in batches]
    except MoglmError as error:
        raise SystemExit(f"one_token_step: {error}") from None
    finally:
        torch.set_num_threads(threads)
    report = {"command": command_line(), "threads": args.threads, "steps": args.steps, "repeats": args.repeats,
              "results": rows}
    write_report(report, args.out)
    print(f"two-layer Mogrifier (r = 5), one token a step, {args.threads} thread(s), best of {args.repeats}\n")
    print("| H | B | step (us) | stack (us) | ops alone (us) | overhead |\n| ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['hidden']} | {r['batch']} | {r['step_us']:.1f} | {r['layers_us']:.1f} | {r['ops_us']:.1f} | "
              f"{r['overhead']:.0%} |")
    if args.out:
        print(f"written to {args.out}")
    return report


if __name__ == "__main__":
    main()
