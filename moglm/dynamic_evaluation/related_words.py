"""Which words dynamic evaluation makes more likely (Krause thesis 5.3, table 5.2).

The thesis adapts a word model to the WikiText-2 test text up to the segment holding one occurrence of a
target word ("production"), applies the dynamic-evaluation update of that segment, and recomputes the
output distribution *at the target's time step* with the updated weights. It then lists the words nearest
to the target by cosine similarity of the (tied) embeddings, with the change of their log-probability, and
the median change over the vocabulary: related words rise ("development" +1.14, "construction" +1.29), the
median word falls (-0.66). That is how dynamic evaluation generalises to words it has not yet seen.

:func:`related_words` does the same with any run's model: the text before the target's segment is read by
dynamic evaluation (segment by segment, updating), then the target's segment is scored, updated on, and
scored again from the same state.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import MoglmError
from .evaluate import DynamicEvaluator


def _log_probs(evaluator: DynamicEvaluator, inputs: torch.Tensor, state, row: int) -> torch.Tensor:
    with torch.no_grad():
        log_probs, _ = evaluator.model.log_probs(inputs, state, evaluator.factor)  # [T, 1, V]
    return log_probs[row, 0].double()  # [V]


def related_words(evaluator: DynamicEvaluator, ids: np.ndarray, position: int, embeddings: torch.Tensor,
                  itos: list[str], top: int = 10) -> dict[str, Any]:
    """Table 5.2 for the token ``ids[position]`` of the stream ``ids`` (``position >= 1``).

    ``evaluator``: a fresh :class:`DynamicEvaluator` of the model (its settings are the adaptation's);
    ``embeddings`` ``[V, E]``: the embeddings whose cosine similarity defines "related" (the tied ones);
    ``itos``: the vocabulary. Returns the target, its segment, and for the ``top`` words nearest to it (itself
    first) and the vocabulary's median, the cosine similarity and the change in log-probability."""
    ids = np.asarray(ids, dtype=np.int64)
    if not 1 <= position < len(ids):
        raise MoglmError(f"the target's position must be in [1, {len(ids) - 1}], got {position}")
    n = evaluator.hp.segment_length
    stream = torch.as_tensor(ids)
    inputs, targets = stream[:-1, None], stream[1:, None]  # [N-1, 1]: targets[t] = ids[t + 1]
    device = evaluator.params[0].device
    inputs, targets = inputs.to(device), targets.to(device)
    segment = (position - 1) // n * n  # the segment whose targets hold ids[position]
    state = evaluator.adapt_to(inputs[:segment], targets[:segment]) if segment else None
    seg_in, seg_out = inputs[segment : segment + n], targets[segment : segment + n]
    row = position - 1 - segment
    before = _log_probs(evaluator, seg_in, state, row)  # [V]
    evaluator.step(seg_in, seg_out, state)  # the update on the target's segment
    after = _log_probs(evaluator, seg_in, state, row)  # [V], the same time step, the updated weights
    change = after - before  # [V]
    e = embeddings.detach().double()
    target = int(ids[position])
    cosine = (e @ e[target]) / (e.norm(dim=1) * e[target].norm()).clamp_min(1e-12)  # [V]
    nearest = torch.argsort(cosine, descending=True)[:top].tolist()
    return {"word": itos[target], "position": position, "segment": [segment + 1, segment + seg_in.shape[0]],
            "segment_length": n, "hyperparameters": asdict(evaluator.hp),
            "rows": [{"word": itos[i], "cosine": float(cosine[i]), "change": float(change[i])} for i in nearest],
            "median": {"cosine": float(cosine.median()), "change": float(change.median())},
            "target_change": float(change[target])}


def related_words_of_run(run_dir: str | Path, word: str, split: str = "test", occurrence: int = 1, top: int = 10,
                         checkpoint: str = "best", write: bool = True) -> dict[str, Any]:
    """Table 5.2 for a word-level run: the ``occurrence``-th occurrence of ``word`` in ``split``, adapted with the
    settings of the run's ``dyneval/full.json`` (else moglm dyneval's defaults); written to
    ``dyneval/related-<word>.json`` with its provenance."""
    from ..provenance import write_result
    from ..runs.language_model import LanguageModelRun
    from .run import load_corpus_for, run_adapter, saved_settings
    from .statistics import StatisticsSettings
    from .update_rules import Hyperparameters

    run = LanguageModelRun(run_dir)
    config = run.load_config()
    if config.data.format != "word":
        raise MoglmError(f"{run_dir}: related words compare word embeddings; this is a {config.data.format}-level run")
    if occurrence < 1 or top < 1:
        raise MoglmError("--occurrence and --top must be >= 1")
    model, _, vocab = run.load_model(checkpoint)
    if word not in vocab.stoi:
        raise MoglmError(f"{word!r} is not in the run's vocabulary")
    ids = np.asarray(load_corpus_for(run, "finding the word")[split])
    where = np.flatnonzero(ids == vocab.stoi[word])
    where = where[where >= 1]
    if len(where) < occurrence:
        raise MoglmError(f"{word!r} occurs {len(where)} times in {split} (after its first token), not {occurrence}")
    hp, statistics = saved_settings(run) or (Hyperparameters(), StatisticsSettings())
    evaluator = run_adapter(run, model, hp, statistics, checkpoint, purpose="related words")
    result = related_words(evaluator, ids[: int(where[occurrence - 1]) + 1], int(where[occurrence - 1]),
                           model.decoder_weight, vocab.itos, top)
    result |= {"split": split, "occurrence": occurrence, "checkpoint": checkpoint}
    if write:
        write_result(run.path / "dyneval" / f"related-{word}.json", result, config.train.seed)
    return result


def markdown_lines(result: dict[str, Any]) -> list[str]:
    """The table in the thesis's layout."""
    lines = ["| word | embedding cosine | change in log probability |", "| --- | ---: | ---: |"]
    lines += [f"| {r['word']} | {r['cosine']:.2f} | {r['change']:+.2f} |" for r in result["rows"]]
    lines.append(f"| median over the vocabulary | {result['median']['cosine']:.2f} | {result['median']['change']:+.2f} |")
    return lines
