"""``moglm bench ...``: the benchmarks from the command line (a typer sub-app that moglm.cli mounts).

``moglm bench throughput`` is ``benchmarks/throughput.py`` (the recurrences' speed table); ``moglm bench
end-to-end`` is ``benchmarks/end_to_end.py`` (training tokens/s and ``moglm train``'s time, Python fused
against compiled); ``moglm bench budget`` is ``benchmarks/ptb_cpu_budget.py`` (LSTM vs Mogrifier at equal
parameters and tokens). Each writes JSON and prints the markdown table the README shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import MoglmError


def bench_app() -> typer.Typer:
    app = typer.Typer(help="Benchmarks: recurrent-layer throughput against torch.nn.LSTM; equal-budget comparisons.",
                      no_args_is_help=True)

    @app.command()
    def throughput(
        hidden: list[int] = typer.Option([256, 650, 1024], "--hidden", help="Hidden sizes (input size = hidden)."),
        batch: int = typer.Option(64, help="Batch size B."),
        bptt: int = typer.Option(70, help="Window T."),
        repeats: int = typer.Option(5, help="Interleaved repeats per model; the median is reported."),
        memory_bptt: int = typer.Option(500, help="Window of the memory measurement (0: skip it)."),
        model: list[str] = typer.Option([], "--model", help="Only these models (default: all; see --help)."),
        device: str = typer.Option("cpu", help="cpu, cuda, ..."),
        threads: Optional[int] = typer.Option(None, help="CPU threads for torch (default: torch's)."),
        out: Path = typer.Option(Path("benchmarks/results/throughput.json"), help="Where the JSON report goes."),
    ) -> None:
        """Tokens/s of nn.LSTM and moglm's LSTM, Mogrifier and multiplicative LSTM; ratios, % of GEMM peak, memory."""
        import torch

        from .throughput import MODELS, markdown_table, run_throughput

        unknown = [m for m in model if m not in MODELS]
        if unknown:
            raise MoglmError(f"unknown --model {unknown[0]!r}; choose from: {', '.join(MODELS)}")
        if min(hidden, default=1) < 1 or batch < 1 or bptt < 1 or repeats < 1 or memory_bptt < 0:
            raise MoglmError("--hidden, --batch, --bptt and --repeats must be positive, --memory-bptt >= 0")
        if threads is not None:
            torch.set_num_threads(max(1, threads))
        report = run_throughput(tuple(hidden), batch, bptt, repeats, memory_bptt, tuple(model) or MODELS, device, out,
                                log=typer.echo)
        typer.echo(markdown_table(report))
        typer.echo(f"written to {out}")

    @app.command("gemm-routes")
    def gemm_routes(
        hidden: list[int] = typer.Option([256, 650, 1024], "--hidden", help="Hidden sizes (input size = hidden)."),
        batch: int = typer.Option(64, help="Batch size B, split over the threads."),
        out: Path = typer.Option(Path("benchmarks/results/gemm_routes.json"), help="Where the JSON report goes."),
    ) -> None:
        """GFLOP/s of the compiled recurrence's GEMM routes at the products a window runs per step."""
        from .gemm_routes import markdown_table, run_gemm_routes

        if min(hidden, default=1) < 1 or batch < 1:
            raise MoglmError("--hidden and --batch must be positive")
        try:
            report = run_gemm_routes(tuple(hidden), batch, out_path=out, log=typer.echo)
        except RuntimeError as error:
            raise MoglmError(str(error)) from None
        typer.echo(markdown_table(report))
        typer.echo(f"written to {out}")

    @app.command("end-to-end")
    def end_to_end(
        configs: list[str] = typer.Argument(None, help="Shipped config names or files [ptb-word-lstm-cpu "
                                                         "ptb-word-mogrifier-cpu]."),
        steps: int = typer.Option(60, help="Optimizer steps per config and backend."),
        default_command: bool = typer.Option(True, help="Also time `moglm train` with no arguments."),
        out: Path = typer.Option(Path("benchmarks/results/end_to_end.json"), help="Where the JSON report goes."),
    ) -> None:
        """Training tokens/s of configs and the time of `moglm train`, Python fused (before) vs compiled (after)."""
        from .end_to_end import markdown_table, run_end_to_end

        if steps < 2:
            raise MoglmError("--steps must be at least 2")
        report = run_end_to_end(tuple(configs or ["ptb-word-lstm-cpu", "ptb-word-mogrifier-cpu"]), steps,
                                default_command, out, log=typer.echo)
        typer.echo(markdown_table(report))
        typer.echo(f"written to {out}")

    @app.command()
    def budget(
        configs: list[str] = typer.Argument(None, help="Shipped config names or files [ptb-word-lstm-cpu "
                                                         "ptb-word-mogrifier-cpu]."),
        runs: Path = typer.Option(Path("benchmarks/runs"), help="Where the run directories go (resumed if present)."),
        out: Path = typer.Option(Path("benchmarks/results/ptb_cpu_budget.json"), help="Where the JSON report goes."),
        set_: list[str] = typer.Option([], "--set", "-s", help="Config override for every run: section.key=value."),
        sequential: bool = typer.Option(False, help="One run after another with all threads (default: side by "
                                                    "side, one thread each)."),
    ) -> None:
        """Train configs at equal parameter count and tokens, evaluate the paper's way, tabulate beside the paper."""
        from .budget_comparison import compare, markdown_table

        names = list(configs or ["ptb-word-lstm-cpu", "ptb-word-mogrifier-cpu"])
        report = compare(names, runs, out, list(set_), parallel=not sequential)
        typer.echo(markdown_table(report))
        typer.echo(f"written to {out}")

    return app
