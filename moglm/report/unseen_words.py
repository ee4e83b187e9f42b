"""Generalising to unseen words (Krause thesis, section 5.3, table 5.1).

The thesis asks whether dynamic evaluation helps only with words that recur in a text, as a neural cache
does, or also with words it has not yet seen: on WikiText-2 it scores words occurring for the first time
in a sequence (table 5.1) and finds dynamic evaluation below static evaluation on 42.6% of them, where the
cache never is. Here the same per-token test losses, static and dynamic (``token_losses.safetensors``),
are read word by word:

* Each complete word of the scored test text gets its occurrence index in that text (1st, 2nd, 3rd, ...;
  5 and later pooled as ``5+``) and a loss, static and dynamic, in nats per word.
* Character models (``ptb_char``, ``char``, ``byte`` corpora): a word is the characters between
  separators (whitespace; in ``ptb_char`` the ``_`` token and ``<eos>``). Its loss is the sum of its
  characters' losses and of the separator that ends it, so that the words' losses add up to the text's
  (as in bits per word). It is *unseen* when its string never occurs as a word in the training split: a
  character model can spell it, and dynamic evaluation can learn it after its 1st occurrence. Words seen
  in training are the baseline row.
* Word models (``word`` corpora): the vocabulary is the training split's, so a test word never seen in
  training is ``<unk>``; no word is unseen by construction. The closest analogue is words *rare* in
  training (at most :data:`RARE` occurrences) against frequent ones (``<unk>`` and ``<eos>`` left out).
* Table 5.1's own split comes first (:func:`table_5_1`): the scored text is cut into sequences of
  :data:`SEQUENCE_LENGTH` (2,000) tokens; in each, the first :data:`CONDITIONING` (1,000) tokens are only
  conditioning, and a word of the second half is *unseen* when it has not occurred earlier in that
  sequence (conditioning included), *seen* otherwise. One departure remains: the dynamic losses come from
  one adaptation pass over the whole scored text, where the thesis adapts within each sequence, so a word
  unseen in its sequence may have been adapted to in an earlier one.
* The training-frequency groups above are a separate, labelled table, as is the split over all words by
  occurrence index in the whole scored text (1st against later).

The thesis's finding reproduces in a row when dynamic evaluation's gain over static evaluation is larger
from the 2nd occurrence on than at the 1st (its loss falls with the occurrence index faster than
static's), and, for unseen words and for 1st occurrences, when dynamic evaluation is below static
evaluation on a nonzero fraction of 1st occurrences (before it has seen the word in the text).

The token losses are of the first ``L`` targets of test, ``test[1 : L + 1]`` (one stream): ``test[0]`` is
only context, so a word touching position 0 (possibly cut) or not ended by a separator within the prefix
is left out.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_write_text
from ..figures import new_figure, save_figure

MAX_OCCURRENCE = 5  #: occurrences 5, 6, ... are pooled as "5+"
SEQUENCE_LENGTH = 2000  #: thesis 5.3: held-out sequences of 2,000 tokens ...
CONDITIONING = 1000  #: ... whose first 1,000 tokens are only conditioning text
RARE = 2  #: word level: a word seen at most this many times in training is rare
THESIS_FIRST_OCCURRENCE_BETTER = 0.426  #: thesis 5.3: dynamic < static on 42.6% of first occurrences
WHITESPACE = " \t\n\r\x0b\x0c"
NO_UNSEEN_AT_WORD_LEVEL = ("no word of the test text is unseen at word level: the vocabulary is the training "
                           "split's; unseen words are <unk>")
GROUP_LABELS = {"unseen": "unseen in training", "seen": "seen in training", "rare": f"rare in training (<= {RARE})",
                "frequent": f"frequent in training (> {RARE})", "all": "all words (thesis table 5.1's split)"}


def separator_ids(vocab, fmt: str) -> list[int]:
    """Ids of the tokens that end a word in a character-level vocabulary."""
    tokens = ("_", vocab.eos or "<eos>") if fmt == "ptb_char" else tuple(WHITESPACE)
    return sorted({vocab.stoi[t] for t in tokens if t in vocab.stoi})


def _encode(ids: np.ndarray, separators: list[int]) -> str:
    """``ids`` as one string, a code point per token (separators as spaces), so that words split and
    compare as strings."""
    codes = ids.astype(np.int64) + 0x100
    codes = np.where(codes >= 0xD800, codes + 0x800, codes)  # past the surrogates
    codes = np.where(np.isin(ids, separators), 0x20, codes)
    return codes.astype("<u4").tobytes().decode("utf-32-le")


def _spell(vocab, fmt: str, ids) -> str:
    tokens = [vocab.itos[int(i)] for i in ids]
    if fmt == "byte":
        return "".join(tokens).encode("latin-1").decode("utf-8", errors="replace")
    return "".join(tokens)


def _test_words(fmt: str, vocab, train: np.ndarray, ids: np.ndarray, token_static: np.ndarray,
                token_dynamic: np.ndarray) -> tuple[list[tuple[Any, str, float, float, int, int, int]], dict[Any, int]]:
    """The scored test words in order, each ``(key, group, static, dynamic, characters, start, end)`` (``end``
    exclusive, token positions in ``ids``), and the training count of each key. ``token_*[p]``: the loss of
    ``ids[p]`` (0 at p = 0)."""
    out = []
    if fmt == "word":
        counts = np.bincount(train, minlength=len(vocab))
        skip = {vocab.stoi[t] for t in (vocab.unk, vocab.eos) if t is not None and t in vocab.stoi}
        for p in range(1, len(ids)):
            key = int(ids[p])
            if key in skip:
                continue
            group = "rare" if counts[key] <= RARE else "frequent"
            out.append((key, group, float(token_static[p]), float(token_dynamic[p]), 1, p, p + 1))
        return out, {k: int(counts[k]) for k in {w[0] for w in out}}
    separators = separator_ids(vocab, fmt)
    train_counts = Counter(w for w in _encode(train, separators).split(" ") if w)
    text = _encode(ids, separators)
    is_sep = np.isin(ids, separators)
    starts = np.flatnonzero(~is_sep & np.r_[True, is_sep[:-1]])
    ends = np.flatnonzero(~is_sep & np.r_[is_sep[1:], True]) + 1  # exclusive; the separator is at ends
    cum_static, cum_dynamic = np.cumsum(token_static), np.cumsum(token_dynamic)
    last = len(ids) - 1
    for s, e in zip(starts.tolist(), ends.tolist()):
        if s < 1 or e > last:  # touches the unscored first token, or not ended within the prefix
            continue
        key = text[s:e]
        group = "seen" if train_counts.get(key, 0) else "unseen"
        out.append((key, group, float(cum_static[e] - cum_static[s - 1]), float(cum_dynamic[e] - cum_dynamic[s - 1]),
                    e - s + 1, s, e + 1))
    return out, {k: train_counts.get(k, 0) for k in {w[0] for w in out}}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _fraction(pairs: list[tuple[float, float]]) -> float | None:
    return sum(d < s for s, d in pairs) / len(pairs) if pairs else None


def _group(rows: list[tuple[Any, str, float, float, int, int]], level: str, kind: str) -> dict[str, Any]:
    """Means by occurrence index, the fractions where dynamic < static, and whether the thesis's finding
    reproduces, for ``rows`` ``(key, group, static, dynamic, characters, occurrence)``."""
    bins = [[r for r in rows if min(r[5], MAX_OCCURRENCE) == k] for k in range(1, MAX_OCCURRENCE + 1)]
    first = bins[0]
    later = [r for r in rows if r[5] > 1]
    gain_first = _mean([r[2] - r[3] for r in first])
    gain_later = _mean([r[2] - r[3] for r in later])
    out: dict[str, Any] = {
        "label": GROUP_LABELS[kind], "distinct": len({r[0] for r in rows}), "occurrences": len(rows),
        "counts": [len(b) for b in bins], "static": [_mean([r[2] for r in b]) for b in bins],
        "dynamic": [_mean([r[3] for r in b]) for b in bins],
        "dynamic_better": {"first": _fraction([(r[2], r[3]) for r in first]),
                           "all": _fraction([(r[2], r[3]) for r in rows])},
        "gain": {"first": gain_first, "later": gain_later},
    }
    if level == "character" and rows:
        characters = sum(r[4] for r in rows)
        out["bits_per_character"] = {mode: sum(r[i] for r in rows) / characters / math.log(2)
                                     for mode, i in (("static", 2), ("dynamic", 3))}
    checks: dict[str, bool | None] = {
        "falls_faster": None if gain_first is None or gain_later is None else gain_later > gain_first}
    if kind in ("unseen", "all"):
        better = out["dynamic_better"]["first"]
        checks["beats_static_on_first"] = None if better is None else better > 0
    out["checks"] = checks
    out["reproduces"] = None if None in checks.values() else all(checks.values())
    return out


def analyse(train: np.ndarray, test: np.ndarray, vocab, fmt: str, static, dynamic) -> dict[str, Any]:
    """The unseen-word analysis of one model's per-token test losses (module docstring).

    ``train``: the training split's ids; ``test``: the test split's ids (its first ``L + 1`` are read);
    ``static``, ``dynamic``: ``[L]`` losses (nats) of the targets ``test[1 : L + 1]``."""
    static = np.asarray(static, dtype=np.float64).reshape(-1)
    dynamic = np.asarray(dynamic, dtype=np.float64).reshape(-1)
    if static.shape != dynamic.shape:
        raise ValueError(f"static and dynamic losses differ in length: {static.size} and {dynamic.size}")
    length = static.size
    if length + 1 > len(test):
        raise ValueError(f"{length} token losses but the test split has only {len(test)} tokens")
    ids = np.asarray(test[: length + 1], dtype=np.int64)
    token_static, token_dynamic = np.r_[0.0, static], np.r_[0.0, dynamic]  # [L + 1]: the loss of ids[p]
    words, train_counts = _test_words(fmt, vocab, np.asarray(train, dtype=np.int64), ids, token_static, token_dynamic)
    seen_so_far: Counter = Counter()
    rows = []
    for key, group, s, d, chars, _, _ in words:
        seen_so_far[key] += 1
        rows.append((key, group, s, d, chars, seen_so_far[key]))
    level = "word" if fmt == "word" else "character"
    kinds = ("rare", "frequent") if level == "word" else ("unseen", "seen")
    groups = {k: _group([r for r in rows if r[1] == k], level, k) for k in kinds}
    groups["all"] = _group(rows, level, "all")
    repeated = sorted(((n, key) for key, n in seen_so_far.items() if train_counts[key] == 0 and level == "character"),
                      key=lambda t: (-t[0], str(t[1])))
    out: dict[str, Any] = {
        "format": fmt, "level": level, "tokens": int(length), "words": len(rows), "unit": "nats per word",
        "max_occurrence": MAX_OCCURRENCE, "table_5_1": table_5_1(words, length), "groups": groups,
        "repeated_unseen": [[_spell(vocab, fmt, _decode(key)), n] for n, key in repeated[:8]],
    }
    if level == "word":
        unk = vocab.stoi.get(vocab.unk) if vocab.unk else None
        out["unk"] = int((ids[1:] == unk).sum()) if unk is not None else 0
        out["note"] = NO_UNSEEN_AT_WORD_LEVEL
    else:  # Mikolov's PTB char spells the word-level corpus's <unk> out: a word seen in training, never unseen
        out["spelled_unk"] = sum(n for key, n in seen_so_far.items() if _spell(vocab, fmt, _decode(key)) == "<unk>")
    return out


def table_5_1(words: list[tuple], length: int, sequence_length: int = SEQUENCE_LENGTH,
              conditioning: int = CONDITIONING) -> dict[str, Any]:
    """Thesis table 5.1's split of ``words`` (``(key, group, static, dynamic, characters, start, end)``, positions
    1..``length`` scored): sequences of ``sequence_length`` tokens, the first ``conditioning`` of each only read;
    a word of the rest is unseen when it did not occur earlier in its sequence. A text shorter than one sequence
    is one sequence with half of it as conditioning."""
    if length < sequence_length:
        sequence_length, conditioning = length, length // 2
    bounds = [(1 + k * sequence_length, 1 + (k + 1) * sequence_length) for k in range(length // max(1, sequence_length))]
    groups: dict[str, list[tuple[float, float]]] = {"unseen": [], "seen": []}
    k = 0
    seen: set = set()
    for key, _, s, d, _, start, end in words:
        while k < len(bounds) and start >= bounds[k][1]:
            k, seen = k + 1, set()
        if k == len(bounds):
            break
        lo, hi = bounds[k]
        if start < lo or end > hi:  # a word across two sequences belongs to neither
            continue
        if start >= lo + conditioning:
            groups["seen" if key in seen else "unseen"].append((s, d))
        seen.add(key)
    return {"sequence_length": sequence_length, "conditioning": conditioning, "sequences": len(bounds),
            "groups": {name: {"count": len(pairs), "static": _mean([p[0] for p in pairs]),
                              "dynamic": _mean([p[1] for p in pairs]), "dynamic_better": _fraction(pairs)}
                       for name, pairs in groups.items()}}


def _decode(key: str) -> list[int]:
    """Token ids of an encoded word (:func:`_encode`)."""
    out = []
    for c in key:
        code = ord(c)
        code = code - 0x800 if code >= 0xD800 + 0x800 else code
        out.append(code - 0x100)
    return out


# -- reading runs ------------------------------------------------------------------------------------
def _corpus_of(run, cache: dict) -> Any:
    """The run's corpus, read through its config; a :class:`MoglmError` (one line) when it cannot be."""
    from ..errors import MoglmError
    from ..runs.build import load_data
    from ..runs.language_model import LanguageModelRun

    try:
        cfg = LanguageModelRun(run.path).load_config()
        key = cfg.data.model_dump_json()
        if key not in cache:
            cache[key] = load_data(cfg.data)
        corpus = cache[key]
    except MoglmError as e:
        raise MoglmError(f"its corpus cannot be read: {e}") from None
    except (OSError, ValueError) as e:
        raise MoglmError(f"its corpus cannot be read: {type(e).__name__}: {e}") from None
    trained_on = run.info.get("corpus_digest")
    if trained_on is not None and trained_on != corpus.digest():
        raise MoglmError(f"its corpus ({cfg.data.path or 'the default'}) changed since the run trained on it")
    return corpus


def analyse_runs(runs: list) -> dict[str, Any]:
    """``{model label: analysis, or {"error": one line}}`` for the runs with token losses."""
    from ..errors import MoglmError

    cache: dict = {}
    out: dict[str, Any] = {}
    for run in runs:
        losses = run.token_losses()
        if losses is None:
            continue
        try:
            corpus = _corpus_of(run, cache)
            out[run.label] = analyse(corpus["train"], corpus["test"], corpus.vocab, corpus.format,
                                     losses["static"].double().numpy(), losses["dynamic"].double().numpy())
        except (MoglmError, ValueError) as e:
            out[run.label] = {"error": f"{run.name}: {e}"}
    return out


def figure(runs: list, path: Path, corpus_label: str) -> Path | None:
    """The analysis of ``runs`` (one corpus) to a JSON file beside ``path``, and its figure: mean loss
    per word against the occurrence index, static dashed and dynamic solid, one colour per model, unseen
    (or rare) words left and seen (or frequent) words right. None when there is nothing to draw."""
    results = analyse_runs(runs)
    if not results:
        path.with_suffix(".json").unlink(missing_ok=True)  # no stale table
        return None
    atomic_write_text(path.with_suffix(".json"), json.dumps({"corpus": corpus_label, "models": results}, indent=1))
    drawn = {name: r for name, r in results.items() if "groups" in r and r["words"]}
    if not drawn:
        return None
    fig = new_figure((10, 4.2))
    if fig is None:
        return None
    kinds = [k for k in next(iter(drawn.values()))["groups"] if k != "all"]
    axes = fig.subplots(1, len(kinds), sharey=True)
    xs = list(range(1, MAX_OCCURRENCE + 1))
    colours: dict[str, Any] = {}
    for ax, kind in zip(axes, kinds):
        for name, r in drawn.items():
            g = r["groups"][kind]
            for mode, style in (("dynamic", "-"), ("static", "--")):
                points = [(x, y) for x, y in zip(xs, g[mode]) if y is not None]
                if not points:
                    continue
                line, = ax.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", ms=3,
                                color=colours.get(name), label=f"{name} ({mode})")
                colours[name] = line.get_color()
        ax.set_xticks(xs, [str(x) if x < MAX_OCCURRENCE else f"{x}+" for x in xs])
        ax.set_xlabel("occurrence in the test text")
        count = next(iter(drawn.values()))["groups"][kind]["occurrences"]
        ax.set_title(f"{GROUP_LABELS[kind]} ({count:,} occurrences)", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean loss (nats per word)")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{corpus_label}: loss by occurrence (static dashed, dynamic solid)", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


# -- markdown ---------------------------------------------------------------------------------------
def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _pair(static: float | None, dynamic: float | None) -> str:
    return "-" if static is None or dynamic is None else f"{static:.2f} / {dynamic:.2f}"


def _verdict(g: dict[str, Any]) -> str:
    if g["reproduces"] is None:
        return "- (no word re-occurs)" if g["occurrences"] else "- (no words)"
    if g["reproduces"]:
        return "yes"
    why = []
    if g["checks"].get("falls_faster") is False:
        why.append(f"gain at 2+ {g['gain']['later']:.2f} <= at 1st {g['gain']['first']:.2f}")
    if g["checks"].get("beats_static_on_first") is False:
        why.append("dynamic never below static at a 1st occurrence")
    return "no: " + "; ".join(why)


def markdown_lines(path: Path, corpus_label: str) -> list[str]:
    """The table of the analysis in ``path`` (written by :func:`figure`), one row per model and group."""
    if not path.is_file():
        return []
    results = json.loads(path.read_text())["models"]
    lines = [f"#### Unseen words ({corpus_label}): mean loss in nats per word, static / dynamic, by occurrence "
             "in the test text", ""]
    done = {name: r for name, r in results.items() if "groups" in r}
    for name, r in results.items():
        if "error" in r:
            lines += [f"{name}: no unseen-word analysis: {r['error']}.", ""]
    if not done:
        return lines
    first = next(iter(done.values()))
    split = first.get("table_5_1")
    if split:
        lines += [f"Table 5.1's split: {split['sequences']} sequences of {split['sequence_length']:,} tokens, each "
                  f"read from its start and scored after its first {split['conditioning']:,}; *unseen*: a word's "
                  "first occurrence in its sequence. The dynamic losses are of one adaptation pass over the whole "
                  "text (the thesis adapts within each sequence).", "",
                  "| model | seen words: static / dynamic | unseen words: static / dynamic | words (seen / unseen) | "
                  "dynamic < static on unseen words (thesis: 42.6%) |", "| --- | --- | --- | --- | --- |"]
        for name, r in done.items():
            g = r["table_5_1"]["groups"]
            lines.append(f"| {name} | {_pair(g['seen']['static'], g['seen']['dynamic'])} | "
                         f"{_pair(g['unseen']['static'], g['unseen']['dynamic'])} | "
                         f"{g['seen']['count']:,} / {g['unseen']['count']:,} | {_pct(g['unseen']['dynamic_better'])} |")
        lines += ["", "Groups by frequency in training and by occurrence in the whole scored text (not table 5.1's "
                  "definition):", ""]
    if first["level"] == "word":
        lines += [f"Word level: {NO_UNSEEN_AT_WORD_LEVEL} ({first['unk']:,} of the {first['tokens']:,} scored test "
                  f"tokens). In their place, words rare in training (seen at most {RARE} times) against frequent "
                  "ones; <unk> and <eos> are left out.", ""]
    else:
        lines += ["Character level: a word is the characters between separators (spaces; `_` and <eos> in PTB "
                  "char); its loss is the sum of its characters' losses and of the separator that ends it. Unseen: "
                  "its string never occurs as a word in the training split.", ""]
    m = MAX_OCCURRENCE
    head = (["model", "kind"] + [f"occurrence {k}" for k in range(1, m)] + [f"occurrence {m}+",
            "words counted (distinct / occurrences)", "dynamic < static: 1st occurrences",
            "dynamic < static: all occurrences", "thesis finding reproduces"])
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, r in done.items():
        for kind, g in r["groups"].items():
            cells = [name, g["label"]] + [_pair(s, d) for s, d in zip(g["static"], g["dynamic"])]
            cells += [f"{g['distinct']:,} / {g['occurrences']:,}", _pct(g["dynamic_better"]["first"]),
                      _pct(g["dynamic_better"]["all"]), _verdict(g)]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"{first['words']:,} complete words in the first {first['tokens']:,} scored test tokens. The "
              "finding reproduces when dynamic evaluation's gain over static is larger from the 2nd occurrence on "
              "than at the 1st, and (unseen words, all words) when dynamic is below static on a nonzero fraction "
              "of 1st occurrences (Krause thesis, section 5.3, table 5.1: 42.6% of the words occurring for the "
              "first time in a WikiText-2 sequence).", ""]
    if first.get("repeated_unseen"):
        lines += ["Unseen words that recur most: " + ", ".join(f"`{w}` ({n})" for w, n in first["repeated_unseen"])
                  + ".", ""]
    elif first["level"] == "character":
        why = (f": its unknown words are spelled out as the word `<unk>` ({first['spelled_unk']:,} occurrences), which "
               "training has too" if first.get("spelled_unk") else "")
        lines += [f"No word of the scored test text is unseen in training{why}.", ""]
    return lines
