"""Dynamic evaluation while coding, for a run directory: the settings a compressed file records and the
adapter they rebuild on either side (the same code for ``moglm compress``, ``decompress`` and the benchmark).

``--from-scratch SEED`` codes with the run's architecture and vocabulary but freshly initialised weights,
learning the file while coding it as NNCP does: the seed goes in the header, so the decoder draws the same
weights (and checks them against the header's digest) and replays the same updates."""

from __future__ import annotations

import math
from pathlib import Path

from ..errors import MoglmError
from ..evaluation.neural_cache import StepCacheSettings
from .context_mixing import ContextSettings
from .match import MatchSettings


#: ``moglm compress --dynamic``'s learning rate and decay (rule rms-rmsdecay) where the run has no
#: dynamic-evaluation settings of its own, searched on held-out English (chapters 6-8 of the Vim user manual;
#: docs/guides/compression.md): decay 0 and segments of 20 for a 400-step WikiText-2 byte model (lr 3e-4 .. 1e-2,
#: decay 0 .. 1e-2, segments 10 .. 40), then the step for the shipped ``wikitext-2-byte-mogrifier-cpu`` trained
#: to its 3000 steps (lr 2e-3 .. 1.5e-2 at decay 0, segments of 20; with the context mixer, 3e-3 .. 7e-3 again).
#: Text unlike the training data wants 5x dynamic evaluation's default step and no pull back towards the trained
#: weights.
COMPRESSION_LR = 5e-3
COMPRESSION_DECAY = 0.0
#: The blocks share one set of weights, so one update reads a segment of every block: n steps x B streams
#: tokens. What the search on chapters 6-8 found good is a number of tokens per update, not a segment length
#: (the 413K-parameter model at lr 5e-3: n 20 best at 12 streams, where n 5 ran away; n 3-5 at 90, where n 20
#: was 14% larger; n 2-3 at 180): about 240. Segments are sized to it, between 2 and 20 steps.
UPDATE_TOKENS = 240
SEGMENT_RANGE = (2, 20)
#: With adaptation (``--dynamic``, ``--from-scratch``) ``moglm compress`` cuts a file into at most this many blocks
#: (of at least ``container.BLOCK_SIZE`` bytes; ``container.default_block_size``) unless ``--block-size`` says
#: otherwise. Here the segments reach their full 20 steps. More blocks shorten them, and each update's gradient
#: then reaches fewer steps back: the larger held-out text's 121 blocks of 4096 bytes (segments of 2) coded 4.4%
#: larger than 12 blocks (docs/guides/compression.md).
ADAPTING_BLOCKS = UPDATE_TOKENS // SEGMENT_RANGE[1]
#: ``moglm compress --dynamic``'s divergence guard (recorded in the header as ``guard``): after every update the
#: adapted model's code of the segment is compared with the trained model's code of the same tokens, and where
#: the adapted one has been longer by more than this many nats per token over the recent text (dynamic
#: evaluation's exponential window of 200 positions per block), the weights roll back and the step halves. Few
#: blocks mean few tokens per update, and on a file of 3-8 KB (one or two blocks) the adaptation ran away
#: without it, to twice the static code; 0.1 was the best of 0.05-1 there, and never fired on 4-25 healthy blocks
#: (docs/guides/compression.md).
GUARD_MARGIN = 0.1
#: the most tokens a recorded warm-up of the step may span (the settings' ``warmup``: the step grows linearly from
#: 0 over that many tokens; none by default: over 10,000 tokens it made a 3 KB file's code 3% smaller and the
#: test text's 1.9% larger, docs/guides/compression.md)
MAX_WARMUP = 1 << 40


#: ``moglm compress``'s neural cache (on unless ``--no-cache``): each block's last ``size`` positions, their
#: features and the tokens that followed them, predict the next token beside the model (Krause thesis 2.2.1),
#: with a weight lambda learnt from the block as it is coded (a Bayesian mixture over ``lams``). Searched on
#: chapters 6-8 of the Vim user manual for the shipped byte model (benchmarks/compression_cache_search.py;
#: docs/guides/compression.md): theta 0.5 was best static and adapting at 2000 positions; the best lambda was
#: 0.6 static and 0.2 adapting there, but 0.2 and 0.1 on WikiText-2's own test text, where 0.6 made the static
#: code 3% longer than no cache, hence the weight is learnt, from 0 (no cache) to 0.7. 2000 positions: 4000
#: gained 0.1-0.8% more at twice the cost per step, 1000 lost 0.3-2.5%.
CACHE = StepCacheSettings(theta=0.5, size=2000, lams=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7))

#: ``moglm compress``'s match model (on unless ``--no-match``): what followed the last occurrence, in any block,
#: of a block's last ``min_length`` tokens (:mod:`.match`). Searched on chapters 6-8 of the Vim user manual
#: for the shipped byte model, static and adapting (docs/guides/compression.md).
MATCH = MatchSettings(min_length=5)

#: ``moglm compress``'s context mixer (on unless ``--no-contexts``): the file's own statistics of orders 1, 2, 3,
#: 4 and 6 and of two word contexts, each smoothed towards the model's distribution by alpha counts, mixed
#: geometrically with it by weights learnt while coding, by five sets of weights (each chosen by its own context)
#: and a second layer, then refined by an adaptive probability map (:mod:`.context_mixing`). Searched on chapters
#: 6-8 of the Vim user manual with the 413K-parameter byte model, static and adapting; the further sets and their
#: step on saved predictions of the longer-trained 3M model there, adapting, and so were the sparse contexts (the
#: token above with the column, the two above with the token just read, the second and third back; 0.7% smaller
#: there; docs/guides/compression.md). Its arithmetic is the compiled kernel's (:mod:`.compiled_mixing`), numpy's
#: where the compiled library cannot be built (``moglm compress`` then says so once).
CONTEXTS = ContextSettings(orders=(1, 2, 3, 4, 6), words=2, alpha=0.25, lr=4e-3, apm_lr=0.02,
                           mixers=("token", "order2", "kinds", "word"), final_lr=5e-3,
                           sparse=("above", "above_pair", "skip"), kernel="compiled")

#: ``moglm compress --fast``'s context mixer: orders 1-4 and the current word's letters, no sparse contexts, one set of
#: weights and no second layer, with the map. On two cores of a Zen 4 the small byte models coded the test text 1.2-1.8
#: times as fast static, 3% larger (docs/guides/compression.md, "A lighter mixer: --fast"). Its step was searched on
#: chapters 6-8 of the Vim user manual with the 141K- and 87K-parameter models, static: 1e-3 was best of 1e-4, 3e-4,
#: 1e-3 and 3e-3 for both (benchmarks/results/compression_search_fast*.json).
FAST_CONTEXTS = ContextSettings(orders=(1, 2, 3, 4), words=1, alpha=0.25, lr=1e-3, apm_lr=0.02, kernel="compiled")


def context_settings(contexts: bool, fast: bool) -> ContextSettings | None:
    """The context mixer that ``moglm compress`` codes with: :data:`CONTEXTS`, :data:`FAST_CONTEXTS` with ``fast``, or
    none (``contexts`` false); ``fast`` without ``contexts`` is a one-line error."""
    if fast and not contexts:
        raise MoglmError("--fast picks a lighter context mixer, so it cannot go with --no-contexts")
    return (FAST_CONTEXTS if fast else CONTEXTS) if contexts else None


def step_scale(streams: int) -> float:
    """The factor on :data:`COMPRESSION_LR` for ``streams`` blocks: an update of fewer tokens than
    :data:`UPDATE_TOKENS` (fewer than 12 blocks, whose segments are 20 steps at most) is noisier, and its step
    shrinks as the square root of its tokens (as an RMS-normalised step's noise grows): 0.29 for one block, 0.58
    for four."""
    n = segment_length(streams)
    if n < SEGMENT_RANGE[1]:
        return 1.0  # the segments themselves were sized to about UPDATE_TOKENS
    return min(1.0, math.sqrt(n * max(1, streams) / UPDATE_TOKENS))


def segment_length(streams: int) -> int:
    """Steps per segment of compression's adaptation when ``streams`` blocks are coded side by side: about
    :data:`UPDATE_TOKENS` tokens per update, within :data:`SEGMENT_RANGE`."""
    low, high = SEGMENT_RANGE
    return max(low, min(high, round(UPDATE_TOKENS / max(1, streams))))


def dynamic_settings(run_dir: Path, rule: str | None = None, lr: float | None = None, streams: int = 1) -> dict:
    """The settings of ``moglm compress --dynamic``: the run's ``dyneval/full.json`` when a previous
    ``moglm dyneval`` wrote one, else rms-rmsdecay at :data:`COMPRESSION_LR` (times :func:`step_scale`) and
    :data:`COMPRESSION_DECAY` with segments sized by :func:`segment_length` for ``streams`` blocks; ``rule``
    (with its own defaults but the same segments) and ``lr`` override. Both carry the divergence guard's
    :data:`GUARD_MARGIN`."""
    from ..dynamic_evaluation import Hyperparameters, StatisticsSettings
    from ..dynamic_evaluation.run import saved_settings
    from ..runs.language_model import LanguageModelRun

    hp, statistics = saved_settings(LanguageModelRun(run_dir)) or (
        Hyperparameters(lr=float(f"{COMPRESSION_LR * step_scale(streams):.3g}"), decay=COMPRESSION_DECAY,
                        segment_length=segment_length(streams)),
        StatisticsSettings())
    if rule is not None and rule != hp.rule:
        hp = Hyperparameters(rule=rule, segment_length=hp.segment_length)
    if lr is not None:
        hp = hp.with_(lr=lr)
    return {"hyperparameters": hp.as_dict(), "statistics": vars(statistics), "guard": GUARD_MARGIN}


def warmup_tokens(settings: dict | None) -> int:
    """The tokens over which the adaptation's step grows to its full size that ``settings`` record (0: none, as
    in files written before it), or a one-line error for one that is not a count."""
    tokens = (settings or {}).get("warmup", 0)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 0 <= tokens <= MAX_WARMUP:
        raise MoglmError(f"unreadable dynamic-evaluation settings (warmup {tokens!r} is not a number of tokens)")
    return tokens


def guard_margin(settings: dict | None) -> float | None:
    """The divergence guard's margin that ``settings`` record (nats per token; ``None``: no guard against the
    trained model, as in files written before it), or a one-line error for one that is not a positive number."""
    margin = (settings or {}).get("guard")
    if margin is None:
        return None
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 < margin < float("inf"):
        raise MoglmError(f"unreadable dynamic-evaluation settings (guard {margin!r} is not a positive number)")
    return float(margin)


def adapter_from_settings(run_dir: Path, model, checkpoint: str, factor: float, settings: dict):
    """The :class:`~moglm.dynamic_evaluation.DynamicEvaluator` that ``settings`` describe, on ``model`` (its RMS
    statistics from the run's cache in ``dyneval/``, else collected from its training data; the coder sets its
    divergence margin from the settings' ``guard``, :func:`guard_margin`)."""
    from ..dynamic_evaluation import Hyperparameters, StatisticsSettings
    from ..dynamic_evaluation.run import run_adapter
    from ..runs.language_model import LanguageModelRun

    try:
        hp = Hyperparameters(**settings["hyperparameters"])
        statistics = StatisticsSettings(**settings["statistics"])
    except (KeyError, TypeError) as e:
        raise MoglmError(f"unreadable dynamic-evaluation settings ({e})") from None
    return run_adapter(LanguageModelRun(run_dir), model, hp, statistics, checkpoint, factor,
                       purpose="compression with dynamic evaluation")


#: ``--from-scratch``'s rule unless one is given: RMSprop's running mean square needs no training statistics,
#: and it has no decay pulling the weights back to random ones
SCRATCH_RULE = "rmsprop"
#: and its learning rate: the best of 1e-3 .. 3e-2 coding held-out English from fresh weights (3e-2 diverged;
#: docs/guides/compression.md), 100x the rule's default for trained weights, which are close to good ones
SCRATCH_LR = 1e-2


def scratch_settings(seed: int, rule: str | None = None, lr: float | None = None) -> dict:
    """The settings of ``moglm compress --from-scratch SEED`` (recorded in the header, ``from_scratch``:
    the seed): :data:`SCRATCH_RULE` at :data:`SCRATCH_LR` unless ``rule`` / ``lr`` are given; the run's own
    dynamic-evaluation settings are for its trained weights and are not read."""
    from ..dynamic_evaluation import Hyperparameters, StatisticsSettings
    from ..dynamic_evaluation.update_rules import uses_rms

    if rule is not None and uses_rms(rule):
        raise MoglmError(f"--from-scratch learns without training statistics, which --rule {rule} divides by: "
                         "use rmsprop, sgd or sgd-momentum")
    chosen = rule or SCRATCH_RULE
    hp = Hyperparameters(rule=chosen, lr=lr if lr is not None else SCRATCH_LR if chosen == SCRATCH_RULE else None)
    return {"hyperparameters": hp.as_dict(), "statistics": vars(StatisticsSettings()), "from_scratch": seed}


def coding_model(run_dir: Path, checkpoint: str, seed: int | None):
    """``(model, vocab, logit factor)`` that codes a file: the run's checkpoint, or with ``seed`` the run's
    architecture initialised afresh (factor 1)."""
    from ..runs.language_model import LanguageModelRun, load_run

    if seed is None:
        run = load_run(run_dir, checkpoint, "cpu")
        return run.model, run.vocab, run.temperature
    model, vocab = LanguageModelRun(run_dir).fresh_model(seed)
    return model, vocab, 1.0


def check_ensemble(runs, from_scratch: int | None) -> None:
    """A one-line error for more ``--ensemble`` runs than a file may mix, or for any with ``--from-scratch``: the
    ensemble mixes trained runs."""
    from .ensemble import check_runs

    check_runs(1 + len(runs))
    if runs and from_scratch is not None:
        raise MoglmError("--from-scratch codes with weights drawn afresh and --ensemble mixes trained runs: use one")


def ensemble_member(run_dir: Path, checkpoint: str, vocab, settings: dict | None, factor: float | None = None):
    """A further run of an ensemble (``moglm compress --ensemble``; :class:`~.ensemble.Member`): the run's
    checkpoint, which must read ``vocab`` (the first run's), adapting as ``settings`` say (``None``: static), with
    ``factor`` (default: the run's own; a decoder passes the header's)."""
    from .ensemble import Member

    model, own, temperature = coding_model(run_dir, checkpoint, None)
    if own.to_json() != vocab.to_json():
        raise MoglmError(f"{run_dir}: its vocabulary is not the first run's, and runs mixed by --ensemble must read "
                         "the same tokens")
    factor = temperature if factor is None else float(factor)
    adapter = None if settings is None else adapter_from_settings(run_dir, model, checkpoint, factor, settings)
    return Member(model, own, factor, adapter, settings)
