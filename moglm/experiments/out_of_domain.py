"""Out-of-domain dynamic evaluation (Krause thesis 6.3.2, table 6.4): a model trained on one corpus scores the
text of another, statically and dynamically, with the dynamic-evaluation settings tuned on held-out text of
the *training* domain only (the thesis tuned GPT-2's on held-out WebText and scored WikiText-2, enwik8 and
text8 with them), so the target text is never used to choose anything.

The target text is read into the run's vocabulary (:func:`to_vocabulary`): at the level of Mikolov's PTB
characters, the tokenised WikiText-2 becomes lower case, numbers become ``N``, ``@-@`` and its kin become the
character they escape, ``<unk>`` stays ``<unk>`` (spelled as PTB spells it), and characters PTB's alphabet
lacks (commas, brackets, quotes ...) are dropped and counted; at word level, words outside the training
vocabulary become ``<unk>`` and are counted. The report states both.

The in-domain test split is scored with the same settings beside it, so each row says whether adaptation
gains more out of domain than in domain, as the thesis reports.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np

from ..data.corpus import find_split_files, resolve_path
from ..data.vocabulary import EOS, UNK
from ..dynamic_evaluation.across_processes import evaluate_streams
from ..dynamic_evaluation.run import dyneval_run, load_corpus_for, run_statistics
from ..dynamic_evaluation.statistics import StatisticsSettings
from ..dynamic_evaluation.update_rules import Hyperparameters, uses_rms
from ..errors import MoglmError
from ..evaluation.stream_model import static_window

ESCAPES = {"@-@": "-", "@,@": ",", "@.@": "."}  # WikiText's tokenised hyphens and number separators
NUMBER = re.compile(r"^[\d.,]*\d[\d.,]*$")


def to_vocabulary(text: str, vocab, level: str) -> tuple[np.ndarray, dict[str, int]]:
    """``text`` (word-tokenised lines, as WikiText-2's) as ids of ``vocab`` at ``level`` (``word``, ``ptb_char``
    or ``char``); returns the ids and counts of what had to change (``dropped`` characters, ``unknown``
    words, ``tokens``)."""
    ids: list[int] = []
    dropped = unknown = 0
    stoi = vocab.stoi
    if level == "char":  # plain characters: those outside the alphabet are dropped
        ids = [stoi[c] for c in text if c in stoi]
        return np.asarray(ids, dtype=np.int64), {"dropped_characters": len(text) - len(ids), "unknown_words": 0,
                                                 "tokens": len(ids)}
    for line in text.splitlines():
        words = [ESCAPES.get(w, w) for w in line.split()]
        if level == "word":
            for w in words:
                if w not in stoi:
                    unknown += 1
                ids.append(stoi.get(w, stoi.get(UNK, -1)))
            ids.append(stoi[EOS])
            continue
        if level != "ptb_char":
            raise MoglmError(f"out-of-domain text can be read into word, ptb_char or char vocabularies, not {level}")
        first = True
        for w in words:
            if w == UNK:
                symbols = list("<unk>")
            else:
                w = "N" if NUMBER.match(w) else w.lower()
                symbols = [c for c in w if c in stoi]
                dropped += len(w) - len(symbols)
            if not symbols:
                continue
            if not first:
                ids.append(stoi["_"])
            ids.extend(stoi[c] for c in symbols)
            first = False
        if not first:
            ids.append(stoi[EOS])
    if any(i < 0 for i in ids):
        raise MoglmError("the run's vocabulary has no <unk> for the target text's unknown words")
    return np.asarray(ids, dtype=np.int64), {"dropped_characters": dropped, "unknown_words": unknown,
                                             "tokens": len(ids)}


def target_text(target: str, split: str = "test") -> str:
    """The ``split`` file of the corpus directory ``target`` (a path, or a name under ``$MOGLM_DATA``)."""
    path = resolve_path(target)
    files = find_split_files(path) if path.is_dir() else {split: path}
    if split not in files:
        raise MoglmError(f"{path}: no {split} file")
    return files[split].read_text(encoding="utf-8")


def out_of_domain(run, target: str, tokens: int | None, search_tokens: int, progress: bool,
                  log: Callable[[str], None]) -> dict[str, Any]:
    """Search dynamic evaluation's settings on the run's own validation split, then score the run's test split
    and ``target``'s test text (the first ``tokens`` of each) statically and dynamically with them."""
    cfg = run.load_config()
    report = dyneval_run(run, ("test",), Hyperparameters(), search=True, search_tokens=search_tokens,
                         eval_tokens=tokens, progress=progress, log=log, write=False)
    hp = Hyperparameters(**report["hyperparameters"])
    model, _, vocab = run.load_model("best")
    ids, changed = to_vocabulary(target_text(target), vocab, cfg.data.format)
    if tokens is not None:
        ids = ids[: tokens + 1]
    rms = None
    if uses_rms(hp.rule):
        rms = run_statistics(run, "best", model, load_corpus_for(run, "statistics")["train"], None,
                             StatisticsSettings(**(report["statistics"] or {})), progress, log)
    result = evaluate_streams(model, ids, hp, rms, streams=1, bptt=static_window(model, cfg.train.bptt,
                                                                                  hp.segment_length),
                              factor=run.logit_factor(), progress=progress, desc="out of domain")
    in_domain = report["splits"]["test"]
    out = {"target": target, "level": cfg.data.format, "hyperparameters": report["hyperparameters"],
           "search": {k: v for k, v in (report["search"] or {}).items() if k != "trials"},
           "changed": changed, "in_domain": {"static": in_domain["static"], "dynamic": in_domain["dynamic"],
                                             "gain": in_domain["perplexity_reduction"]},
           "out_of_domain": {"static": result.static.as_dict(), "dynamic": result.scores.as_dict(),
                             "gain": result.gain, "rollbacks": result.rollbacks}}
    log(f"out of domain ({target}): static {result.static.headline(cfg.data.format)} -> dynamic "
        f"{result.scores.headline(cfg.data.format)} ({-result.gain:+.1%} perplexity); in domain "
        f"{-in_domain['perplexity_reduction']:+.1%}")
    return out
