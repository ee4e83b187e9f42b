"""lm-evaluation-harness's wikitext perplexity of a run, static and with dynamic evaluation (``moglm bench
lm-eval``): a local copy of WikiText's test split as lm-eval's ``wikitext`` task
(:func:`moglm.harness.tasks.write_wikitext_task`: one document per article, word perplexity, byte perplexity
and bits per byte), scored by ``--model moglm`` through :func:`lm_eval.simple_evaluate` twice, the second time
with ``dynamic=true``. Each article is read from a zero state (and, dynamic, from the trained weights), so the
scores are lm-eval's, not ``moglm evaluate``'s one stream over the whole split (the report has that one too,
from the run's ``results.json``). Times are wall and CPU seconds of this process.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any

from ..errors import MoglmError

TASK = "wikitext2_local"
METRICS = ("word_perplexity", "byte_perplexity", "bits_per_byte")


def run_wikitext(run: Path, test_file: Path, task_dir: Path, dynamic_args: dict[str, Any], detokenize: bool = False,
                 device: str = "cpu", limit: int | None = None, file_name: str | None = None,
                 log=print) -> dict[str, Any]:
    """The report: the task, the run, and one row per mode (static, dynamic) with lm-eval's three metrics, the
    per-token perplexity they imply, and the time. ``file_name``: how the report names ``test_file``."""
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise MoglmError("moglm bench lm-eval needs lm-evaluation-harness: pip install 'moglm[lm-eval]'") from None
    from lm_eval.tasks.wikitext.preprocess_wikitext import wikitext_detokenizer

    from ..harness import model as _registers  # noqa: F401 - --model moglm
    from ..harness.tasks import wikitext_articles, write_wikitext_task
    from ..provenance import portable
    from ..runs.language_model import LanguageModelRun
    from ..sampling import encode_prompt

    _, count = write_wikitext_task(test_file, task_dir, TASK, detokenize)
    articles = wikitext_articles(test_file.read_text(encoding="utf-8"))[:limit]
    manager = TaskManager(include_path=str(task_dir), include_defaults=False)
    run_dir = LanguageModelRun(run)
    vocab = run_dir.load_vocab()
    scored = [wikitext_detokenizer({"page": a}) if detokenize else a for a in articles]
    tokens = sum(len(encode_prompt(vocab, text)) - 1 for text in scored)  # the tokens the model predicts
    words = sum(len(re.split(r"\s+", a)) for a in articles)  # as lm-eval's wikitext counts them
    rows = []
    for mode, extra in (("static", {}), ("dynamic", {"dynamic": True, **dynamic_args})):
        log(f"{mode}: lm-eval {TASK} ({len(articles)} articles) with --model moglm")
        wall, cpu = time.perf_counter(), time.process_time()
        out = lm_eval.simple_evaluate(model="moglm", model_args={"run": str(run), **extra}, tasks=[TASK],
                                      task_manager=manager, device=device, limit=limit)
        row = {"mode": mode, "seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu,
               "model_args": dict(extra),
               "resolved": {k: v for k, v in out["config"].items() if k in ("logit_factor", "level", "bptt",
                                                                              "checkpoint", "dynamic", "device")}}
        row |= {m: out["results"][TASK][f"{m},none"] for m in METRICS}
        nll = math.log(row["word_perplexity"]) * words  # lm-eval's total over the articles, nats
        row["token_perplexity"] = math.exp(nll / tokens)
        rows.append(row)
        log(f"{mode}: word perplexity {row['word_perplexity']:.2f}, byte perplexity {row['byte_perplexity']:.4f}, "
            f"{row['bits_per_byte']:.4f} bits per byte ({row['seconds']:.0f} s)")
    include = portable(str(task_dir))
    dynamic = ",dynamic=true" + "".join(f",{k}={v}" for k, v in dynamic_args.items())
    commands = {mode: f"moglm lm-eval --model moglm --model_args run={portable(str(run))}{extra} --tasks {TASK} "
                      f"--include_path {include} --device {device}" for mode, extra in (("static", ""),
                                                                                       ("dynamic", dynamic))}
    task = {"name": TASK, "file": file_name or portable(str(test_file)), "articles": len(articles), "of": count,
            "detokenize": detokenize, "words": words, "bytes": sum(len(a.encode()) for a in articles), "tokens": tokens}
    return {"task": task, "run": {"name": run_dir.path.name, "level": vocab.level, "vocabulary": len(vocab),
                                  "moglm_evaluate": _results(run_dir)},
            "rows": rows, "commands": commands, "lm_eval": lm_eval.__version__}


def _results(run) -> dict[str, Any] | None:
    """``moglm evaluate``'s test scores (one stream over the whole split) and logit factor, from ``results.json``."""
    if not run.results_path.is_file():
        return None
    results = json.loads(run.results_path.read_text())
    return {"test": results.get("splits", {}).get("test"), "logit_factor": results.get("temperature")}


def markdown_table(report: dict[str, Any]) -> str:
    task, run = report["task"], report["run"]
    lines = [f"{run['name']} ({run['level']}, vocabulary {run['vocabulary']:,}) on {task['file']}: {task['articles']} "
             f"articles, {task['words']:,} words, {task['bytes']:,} bytes, {task['tokens']:,} tokens", "",
             "| lm-eval --model moglm | word perplexity | byte perplexity | bits per byte | perplexity per token | "
             "CPU seconds |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in report["rows"]:
        lines.append(f"| {r['mode']} | {r['word_perplexity']:.2f} | {r['byte_perplexity']:.4f} | "
                     f"{r['bits_per_byte']:.4f} | {r['token_perplexity']:.2f} | {r['cpu_seconds']:.0f} |")
    return "\n".join(lines)
