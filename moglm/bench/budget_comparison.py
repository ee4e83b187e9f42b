"""Train several configs at the same parameter budget and token count, evaluate each the paper's way,
and report validation/test scores and throughput side by side (JSON + a markdown table).

Used by ``benchmarks/ptb_cpu_budget.py`` (LSTM vs Mogrifier on PTB at a CPU budget). The runs go
to ordinary run directories, so an interrupted comparison resumes where it stopped.
"""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_text

# The paper's numbers (docs/method.md, "Headline numbers"), shown beside ours.
PAPER = {
    "ptb-word": {"lstm": (55.8, 54.6), "mogrifier": (52.1, 51.0), "unit": "perplexity", "budget": "24M"},
    "ptb-char": {"lstm": (1.163, 1.143), "mogrifier": (1.149, 1.131), "unit": "bpc", "budget": "24M"},
    "wikitext-2": {"lstm": (62.6, 60.1), "mogrifier": (58.7, 56.6), "unit": "perplexity", "budget": "35M"},
}


def _train_one(config: str, run_dir: str, overrides: list[str], threads: int | None) -> dict[str, Any]:
    import torch

    from ..runs import RunDirectory
    from ..train.config import load_config
    from ..train.trainer import train_and_evaluate

    if threads:
        torch.set_num_threads(threads)
    cfg = load_config(config, overrides)
    trained, results = train_and_evaluate(cfg, run_dir, progress=threads is None,
                                          log=lambda s: print(f"[{config}] {s}", flush=True))
    run = RunDirectory(run_dir)
    metrics = run.read_metrics()
    rates = [r["tokens_per_s"] for r in metrics if r["kind"] == "train"]
    info = run.model_info()
    last = [r for r in metrics if r["kind"] == "train"][-1]
    return {
        "config": config,
        "run_dir": str(run_dir),
        "architecture": cfg.model.architecture,
        "num_params": info["num_params"],
        "hidden_size": info["hidden_size"],
        "training_tokens": last["tokens"],
        "tokens_per_s_median": sorted(rates)[len(rates) // 2] if rates else None,
        "train_seconds": trained.seconds,  # training and validation over every invocation
        "temperature": results["temperature"],
        "splits": results["splits"],
        "level": results["level"],
    }


def compare(
    configs: list[str],
    runs_root: str | Path,
    out_path: str | Path,
    overrides: list[str] | None = None,
    parallel: bool = True,
) -> dict[str, Any]:
    """Train and evaluate ``configs``; with ``parallel`` they run at once, one CPU thread each (fair: each
    sees the same machine), else one after another with torch's default threads."""
    runs_root = Path(runs_root)
    # a run directory per config, named after the shipped config or the file's stem
    jobs = [(c, str(runs_root / Path(c).stem), list(overrides or []), 1 if parallel else None) for c in configs]
    if parallel:
        with mp.get_context("spawn").Pool(len(jobs)) as pool:
            rows = pool.starmap(_train_one, jobs)
    else:
        rows = [_train_one(*job) for job in jobs]
    report = {"configs": configs, "overrides": list(overrides or []), "parallel": parallel, "results": rows}
    out_path = Path(out_path)
    atomic_write_text(out_path, json.dumps(report, indent=1))
    plot_comparison(report, out_path.with_suffix(".png"))
    return report


def plot_comparison(report: dict[str, Any], path: Path) -> Path | None:
    """Validation score against training tokens for every run of ``report`` on one axis (PNG), read back
    from the runs' ``metrics.jsonl``; ``None`` when matplotlib is missing."""
    from ..figures import new_figure, save_figure
    from ..runs import RunDirectory

    fig = new_figure((7, 4.2))
    if fig is None:
        return None

    word = report["results"][0]["level"] == "word"
    ax = fig.subplots()
    for row in report["results"]:
        valid = [r for r in RunDirectory(row["run_dir"]).read_metrics() if r["kind"] == "valid"]
        score = [r["perplexity"] if word else r["bits_per_token"] for r in valid]
        ax.plot([r["tokens"] for r in valid], score, "o-", ms=3,
                label=f"{row['architecture']} ({row['num_params']:,} parameters, H={row['hidden_size']})")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("validation perplexity" if word else "validation bits per token")
    if word:
        ax.set_yscale("log")
    ax.set_title(" vs ".join(report["configs"]))
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    return save_figure(fig, path)


def markdown_table(report: dict[str, Any]) -> str:
    rows = report["results"]
    word = rows[0]["level"] == "word"
    unit = "perplexity" if word else "bpc"
    lines = [f"| model | parameters | hidden | training tokens | tokens/s | valid {unit} | test {unit} | paper valid / test |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        corpus = next((k for k in PAPER if r["config"].startswith(k)), None)
        paper = PAPER.get(corpus, {}).get(r["architecture"])
        key = "perplexity" if word else "bits_per_token"
        fmt = "{:.2f}" if word else "{:.3f}"
        paper_text = f"{fmt.format(paper[0])} / {fmt.format(paper[1])} ({PAPER[corpus]['budget']})" if paper else "-"
        lines.append(
            f"| {r['architecture']} | {r['num_params']:,} | {r['hidden_size']} | {r['training_tokens']:,} | "
            f"{r['tokens_per_s_median']:,.0f} | {fmt.format(r['splits']['valid'][key])} | "
            f"{fmt.format(r['splits']['test'][key])} | {paper_text} |"
        )
    return "\n".join(lines)
