"""What ``moglm export`` gives: the exported model against the run it came from (``moglm bench export RUN``).

The run is exported to a temporary folder and loaded back with ``AutoModelForCausalLM.from_pretrained``. On the
first ``tokens`` tokens of the run's test split it reports the largest difference between the export's logits
and moglm's log-probabilities (one pass, and in windows of the run's ``bptt`` that carry the cache), and on a
prompt the tokens per second of greedy ``generate()`` against ``moglm sample`` at temperature 0 (top 1), with
whether the two continuations are the same tokens. Each generation is timed ``repeats`` times, interleaved; the
median is reported.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from ..errors import MoglmError
from . import timed


def _max_difference(model, run, ids: torch.Tensor, window: int) -> float:
    """The largest |export logit - moglm log-probability| over ``ids`` ``[N]`` read in windows of ``window``."""
    worst, cache, state = 0.0, None, None
    with torch.no_grad():
        for start in range(0, len(ids), window):
            chunk = ids[start:start + window]
            out = model(chunk.view(1, -1), cache=cache, use_cache=True)
            expected, state = run.model.log_probs(chunk.view(-1, 1), state, run.temperature)  # [n, 1, V]
            worst = max(worst, float((out.logits[0] - expected[:, 0]).abs().max()))
            cache = out.cache
    return worst


def run_export_check(run_dir: str | Path, tokens: int = 2000, new_tokens: int = 200, prompt: str = "",
                     repeats: int = 3, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The report of the module docstring for the run ``run_dir``."""
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise MoglmError("moglm bench export needs the transformers package: pip install 'moglm[hf]'") from None
    from ..export.card import read_report
    from ..export.run import export_run
    from ..runs.build import load_data
    from ..runs.language_model import load_run
    from ..sampling import sample

    run = load_run(run_dir)
    test = torch.as_tensor(load_data(run.config.data)["test"][:tokens], dtype=torch.long)  # [N]
    with tempfile.TemporaryDirectory(prefix="moglm-export-") as folder:
        export_seconds, _ = timed(lambda: export_run(run_dir, Path(folder) / "export"))
        size = sum(p.stat().st_size for p in (Path(folder) / "export").iterdir())
        model = AutoModelForCausalLM.from_pretrained(Path(folder) / "export").eval()
        tokenizer = AutoTokenizer.from_pretrained(Path(folder) / "export")
    ids = tokenizer(prompt, return_tensors="pt").input_ids  # [1, P]
    if ids[0].tolist() != run.encode(prompt).tolist():
        raise MoglmError("the exported tokenizer encodes the prompt differently from moglm")
    one_pass = _max_difference(model, run, test, len(test))
    windows = _max_difference(model, run, test, run.config.train.bptt)
    log(f"max |logit difference| over {len(test):,} test tokens: {one_pass:.3g} in one pass, {windows:.3g} in windows "
        f"of {run.config.train.bptt}")
    hf_seconds, hf_ids, moglm_seconds, moglm_text = [], None, [], None
    for _ in range(repeats):  # interleaved, so that a slower moment of a shared machine falls on both
        seconds, generated = timed(lambda: model.generate(ids, max_new_tokens=new_tokens, do_sample=False))
        hf_seconds.append(seconds)
        hf_ids = generated[0, ids.shape[1]:].tolist()
        seconds, moglm_text = timed(lambda: sample(run.model, run.vocab, prompt, new_tokens, 1.0, 1))
        moglm_seconds.append(seconds)
    hf_text = run.vocab.decode(hf_ids)  # joined to the prompt as moglm sample joins its continuation
    same = moglm_text == ((prompt + " " + hf_text).strip() if run.vocab.level == "word" else prompt + hf_text)
    report = {
        "run": {"name": run.config.name, "architecture": run.config.model.architecture, "level": run.vocab.level,
                "vocabulary": len(run.vocab), "parameters": sum(p.numel() for p in run.model.parameters()),
                "logit_factor": run.temperature,
                "test": ((read_report(run.path / "results.json") or {}).get("splits") or {}).get("test")},
        "export": {"seconds": export_seconds, "bytes": size},
        "logits": {"tokens": len(test), "window": run.config.train.bptt, "max_abs_difference_one_pass": one_pass,
                   "max_abs_difference_windows": windows},
        "generation": {"prompt_tokens": ids.shape[1], "new_tokens": new_tokens, "repeats": repeats,
                       "generate_tokens_per_second": new_tokens / statistics.median(hf_seconds),
                       "sample_tokens_per_second": new_tokens / statistics.median(moglm_seconds),
                       "same_tokens": same},
        "threads": torch.get_num_threads(), "torch": torch.__version__,
    }
    log(f"greedy generation of {new_tokens} tokens: generate() "
        f"{report['generation']['generate_tokens_per_second']:.0f} tokens/s, moglm sample "
        f"{report['generation']['sample_tokens_per_second']:.0f} tokens/s; same tokens: {same}")
    return report


def markdown_table(report: dict[str, Any]) -> str:
    r, lg, g = report["run"], report["logits"], report["generation"]
    return "\n".join([
        f"{r['name']}: {r['architecture']}, {r['level']} level, {r['parameters']:,} parameters, "
        f"{report['threads']} thread(s)", "",
        "| measure | value |", "| --- | ---: |",
        f"| max abs logit difference, {lg['tokens']:,} test tokens in one pass | {lg['max_abs_difference_one_pass']:.3g} |",
        f"| max abs logit difference, in windows of {lg['window']} carrying the cache | "
        f"{lg['max_abs_difference_windows']:.3g} |",
        f"| greedy generate(), tokens/s ({g['new_tokens']} new tokens) | {g['generate_tokens_per_second']:.0f} |",
        f"| moglm sample at temperature 0, tokens/s | {g['sample_tokens_per_second']:.0f} |",
        f"| the same tokens | {'yes' if g['same_tokens'] else 'no'} |",
        f"| export: seconds, bytes | {report['export']['seconds']:.1f}, {report['export']['bytes']:,} |",
    ])
