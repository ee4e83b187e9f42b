"""What dynamic evaluation of a Hugging Face causal LM costs against a static pass over the same tokens
(``moglm bench hf-dyneval``; Krause thesis 6.3.2's setting: segments of 32 tokens after up to 992 of context).

A GPT-2 of the given shape is built from a config with random weights (nothing is downloaded; the cost does
not depend on the weights' values) and read through :class:`~moglm.evaluation.context_window.ContextWindowLM`
exactly as ``moglm dyneval --hf`` reads a model: the static pass, then dynamic evaluation with SGD adapting
every parameter but the embeddings. Cost is CPU seconds of this process (and wall seconds beside them).
"""

from __future__ import annotations

import platform
from typing import Any

import numpy as np
import torch

from ..errors import MoglmError


def run_hf_cost(layers: int = 6, width: int = 512, heads: int = 8, vocab: int = 50257, contexts: tuple[int, ...] = (224, 992),
                segment: int = 32, tokens: int = 1024, seed: int = 0, log=print) -> dict[str, Any]:
    """Static and dynamic CPU time over ``tokens`` tokens at each context length; returns the report."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        raise MoglmError("moglm bench hf-dyneval needs the transformers package: pip install 'moglm[hf]'") from None
    from ..dynamic_evaluation import Hyperparameters
    from ..dynamic_evaluation.evaluate import dynamic_evaluate, static_pass
    from ..dynamic_evaluation.huggingface import NO_EMBEDDINGS
    from ..evaluation.context_window import ContextWindowLM

    torch.manual_seed(seed)
    positions = max(contexts) + segment
    config = GPT2Config(vocab_size=vocab, n_positions=positions, n_embd=width, n_layer=layers, n_head=heads)
    model = GPT2LMHeadModel(config).eval()
    ids = np.random.default_rng(seed).integers(0, vocab, tokens + 1)
    hp = Hyperparameters(rule="sgd", lr=1e-4, segment_length=segment)
    rows = []
    for context in contexts:
        window = ContextWindowLM(model, context)
        static = static_pass(window, ids, 1, segment)
        result = dynamic_evaluate(window, ids, hp, static=static, selection=NO_EMBEDDINGS)
        row = {"context": context, "segment": segment, "window": context + segment, "tokens": tokens,
               "static_cpu_seconds": static.timing.cpu_seconds, "dynamic_cpu_seconds": result.timing.cpu_seconds,
               "static_seconds": static.timing.seconds, "dynamic_seconds": result.timing.seconds,
               "cost": result.cost, "adapted_parameters": result.adapted["parameters"]}
        log(f"context {context} + segment {segment}: static {row['static_cpu_seconds']:.1f} CPU s, dynamic "
            f"{row['dynamic_cpu_seconds']:.1f} CPU s: {row['cost']:.2f}x")
        rows.append(row)
    return {"model": {"layers": layers, "width": width, "heads": heads, "vocab": vocab,
                      "parameters": sum(p.numel() for p in model.parameters())},
            "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
            "torch": torch.__version__, "rows": rows}


def markdown_table(report: dict[str, Any]) -> str:
    m = report["model"]
    lines = [f"GPT-2 shape: {m['layers']} layers x {m['width']}, {m['parameters']:,} parameters (random weights), "
             f"{report['threads']} threads; SGD adapting all but the embeddings", "",
             "| context + segment | tokens | static CPU s | dynamic CPU s | dynamic / static |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for r in report["rows"]:
        lines.append(f"| {r['context']} + {r['segment']} | {r['tokens']:,} | {r['static_cpu_seconds']:.1f} | "
                     f"{r['dynamic_cpu_seconds']:.1f} | {r['cost']:.2f}x |")
    return "\n".join(lines)
