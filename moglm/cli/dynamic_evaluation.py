"""``moglm dyneval``: dynamic evaluation (Krause thesis ch. 4-6) of a run, or of a Hugging Face causal LM
(``--hf``). The defaults that differ between the two live in :mod:`moglm.dynamic_evaluation`
(``Hyperparameters.for_hf`` and its twins); this module only reads the options."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from ..errors import MoglmError
from .common import DEVICE_HELP, Checkpoint, Split, UpdateRule, deprecated, renamed, values

O = typer.Option
# the options, one per line below; --hf's own and the run's own are said in their help
SPLIT = O([], help="Split(s) to evaluate (default: test).")
RULE = O(None, help="Update rule (Krause thesis 4.5 and 5.4; default: rms-rmsdecay, with --hf sgd).")
LEARNING_RATE = O(None, help="Learning rate (default: 1e-3; SGD rules 0.03; rmsprop 1e-4).")
DECAY = O(None, help="Decay towards the trained weights (default: 1e-2).")
EPS = O(None, help="RMS stabiliser epsilon (default: 1e-3).")
MOMENTUM = O(None, help="sgd-momentum: the momentum mu, in [0, 1) (thesis eq. 5.10; default: 0.5).")
ALPHA = O(None, help="rmsprop: weight of the running mean square, in (0, 1) (thesis eq. 5.12; default: 0.99).")
SEGMENT = O(None, "--segment-length", "-n", help="Tokens per update (default: 20; with --hf 32).")
SEARCH = O(False, help="Search the learning rate, decay, eps and segment length on a validation prefix.")
SEARCH_TOKENS = O(None, min=1, help="Validation tokens the search scores each setting on (default: 10,000).")
MAX_COST = O(None, help="Search: at most this x the static CPU time.")
SPARSE = O(False, help="Sparse dynamic evaluation: adapt only an H x H matrix per layer.")
SPARSE_UNITS = O(None, min=1, help="Sparse: hidden units H each matrix transforms (default: 100).")
SPARSE_LAYER = O([], help="Sparse: adapted layer(s) (default: all).")
STREAMS = O(None, min=1, help="Streams side by side (full: shared weights; default: 1).")
MC_SAMPLES = O(0, min=0, help="MC dropout with dynamic evaluation: score and adapt on the mean of this many "
               "dropout samples (0: dropout off).")
EPISODIC = O(None, "--episodic/--stream", help="Reset weights and state at every boundary token, decay 0 "
             "(default: as the run was trained).")
BOUNDARY = O(None, help="Episodic: the boundary token (default: <eos> or newline).")
STATS_FRACTION = O(None, help="RMS statistics: fraction of the training split (default 0.01; with --hf of "
                   "--stats-text, default 1).")
STATS_BATCH = O(None, help="RMS statistics: streams per batch (default 8; with --hf 1).")
ADAPT = O([], help="Adapt only the parameters whose names match this glob (repeatable; default: all).")
FREEZE = O([], help="Do not adapt the parameters whose names match this glob (repeatable).")
FREEZE_EMBEDDINGS = O(None, "--freeze-embeddings/--adapt-embeddings", help="Leave the embedding matrices (input, "
                      "output, tied) out of the adaptation (default: adapt them; with --hf freeze them, the "
                      "thesis's GPT-2 choice).")
CACHE = O(False, help="Also score with the neural cache (Grave et al. 2017, thesis 2.2.1): static + cache and "
          "dynamic + cache, theta and lambda searched on validation.")
CACHE_SIZE = O(500, min=1, help="Neural cache: positions it holds.")
HF = O(None, help="A Hugging Face causal LM (a local directory, or a name in the local cache) instead of a run: "
       "needs the hf extra and --text.")
TEXT = O(None, help="--hf: the UTF-8 text file to score.")
STATS_TEXT = O(None, help="--hf: held-out text of the model's domain for the RMS statistics (the rms rules need "
               "it).")
SEARCH_TEXT = O(None, help="--hf: held-out text of the model's domain that --search and --cache tune on.")
CONTEXT = O(None, min=0, help="--hf: tokens of context before each segment (default: the model's positions minus "
            "the segment length).")
OUT = O(None, help="--hf: write the report (JSON) here.")
EVAL_TOKENS = O(None, min=1, help="Evaluate only the first N tokens of each split.")
LOGIT_FACTOR = O(None, help="Multiply the logits by this factor, the inverse of a softmax temperature (default: "
                 "results.json's, else 1).")
MARGIN = O(None, help="Divergence guard: nats/token over static, > 0 (default: 3).")
CHECKPOINT = O(None, help="The best or the last checkpoint (default: best).")
DEVICE = O(None, help=f"{DEVICE_HELP} (default: the run's).")
THREADS = O(None, min=1, help="CPU threads for torch.")
CUDA_GRAPHS = O(None, "--cuda-graphs/--no-cuda-graphs", help="Replay the recurrent layers' fused windows as CUDA "
                "graphs (default: on a CUDA device; on an H200 5-6x faster). --cuda-graphs on CPU is an error.")
PROGRESS = O(True, help="Show progress bars.")


def dyneval(
    run_dir: Optional[Path] = typer.Argument(None, help="A run directory made by `moglm train` (or --hf)."),
    split: list[Split] = SPLIT, rule: Optional[UpdateRule] = RULE, learning_rate: Optional[float] = LEARNING_RATE,
    lr: Optional[float] = deprecated("--lr"), decay: Optional[float] = DECAY, eps: Optional[float] = EPS,
    momentum: Optional[float] = MOMENTUM, alpha: Optional[float] = ALPHA, segment_length: Optional[int] = SEGMENT,
    search: bool = SEARCH, search_tokens: Optional[int] = SEARCH_TOKENS, max_cost: Optional[float] = MAX_COST,
    sparse: bool = SPARSE, sparse_units: Optional[int] = SPARSE_UNITS, sparse_layer: list[int] = SPARSE_LAYER,
    streams: Optional[int] = STREAMS, mc_samples: int = MC_SAMPLES, episodic: Optional[bool] = EPISODIC,
    boundary: Optional[str] = BOUNDARY, stats_fraction: Optional[float] = STATS_FRACTION,
    stats_batch_size: Optional[int] = STATS_BATCH, adapt: list[str] = ADAPT, freeze: list[str] = FREEZE,
    freeze_embeddings: Optional[bool] = FREEZE_EMBEDDINGS, cache: bool = CACHE, cache_size: int = CACHE_SIZE,
    hf: Optional[str] = HF, text: Optional[Path] = TEXT, stats_text: Optional[Path] = STATS_TEXT,
    search_text: Optional[Path] = SEARCH_TEXT, context: Optional[int] = CONTEXT, out: Optional[Path] = OUT,
    eval_tokens: Optional[int] = EVAL_TOKENS, max_tokens: Optional[int] = deprecated("--max-tokens", min=1),
    logit_factor: Optional[float] = LOGIT_FACTOR, temperature: Optional[float] = deprecated("--temperature"),
    margin: Optional[float] = MARGIN, checkpoint: Optional[Checkpoint] = CHECKPOINT, device: Optional[str] = DEVICE,
    threads: Optional[int] = THREADS, cuda_graphs: Optional[bool] = CUDA_GRAPHS, progress: bool = PROGRESS,
) -> None:
    """Dynamic evaluation: adapt the weights to the text while scoring it (Krause thesis ch. 4-6), of a run or
    of a Hugging Face causal LM (--hf)."""
    import torch

    from ..dynamic_evaluation import Hyperparameters, ParameterSelection, SparseSpec, StatisticsSettings

    given = {"rule": rule, "lr": renamed(learning_rate, lr, "--lr", "--learning-rate"), "decay": decay, "eps": eps,
             "segment_length": segment_length, "momentum": momentum, "alpha": alpha}
    given = {k: v for k, v in given.items() if v is not None}
    stats = {k: v for k, v in (("fraction", stats_fraction), ("batch_size", stats_batch_size)) if v is not None}
    embeddings = {} if freeze_embeddings is None else {"embeddings": not freeze_embeddings}
    if (hf is None) == (run_dir is None):
        raise MoglmError("give either a run directory or --hf PATH_OR_NAME")
    if threads is not None:
        torch.set_num_threads(max(1, threads))
    if margin is not None and not margin > 0:
        raise MoglmError(f"--margin must be > 0 nats per token, got {margin}")
    common: dict[str, Any] = dict(search=search, max_cost=max_cost, cache=cache, cache_size=cache_size,
                                  eval_tokens=renamed(eval_tokens, max_tokens, "--max-tokens", "--eval-tokens"),
                                  progress=progress, log=typer.echo, **({} if margin is None else {"margin": margin}))
    factor = renamed(logit_factor, temperature, "--temperature", "--logit-factor")
    if hf is not None:
        refuse_run_options({"--search-tokens": search_tokens, "--sparse": sparse or None, "--sparse-units":
                            sparse_units, "--sparse-layer": sparse_layer or None, "--streams": streams, "--split":
                            split or None, "--mc-samples": mc_samples or None, "--episodic/--stream": episodic,
                            "--boundary": boundary, "--checkpoint": checkpoint,
                            "--cuda-graphs/--no-cuda-graphs": cuda_graphs})
        _dyneval_hf(hf, text, stats_text, search_text, context, out, Hyperparameters.for_hf(**given),
                    ParameterSelection.for_hf(tuple(adapt) or ("*",), tuple(freeze), **embeddings),
                    StatisticsSettings.for_hf(**stats), factor, device, common)
        return
    if any(v is not None for v in (text, stats_text, search_text, context, out)):
        raise MoglmError("--text, --stats-text, --search-text, --context and --out go with --hf")
    from ..dynamic_evaluation.run import dyneval_run
    from ..runs.language_model import LanguageModelRun

    dyneval_run(LanguageModelRun(run_dir), tuple(values(split)) or ("test",), Hyperparameters(**given),
                search_tokens=search_tokens or 10_000, streams=streams or 1, episodic=episodic,
                sparse=SparseSpec(sparse_units or 100, tuple(sparse_layer) or None) if sparse else None,
                boundary=boundary, statistics=StatisticsSettings(**stats), temperature=factor,
                mc_samples=mc_samples, selection=ParameterSelection(tuple(adapt) or ("*",), tuple(freeze),
                                                                    **embeddings),
                which=checkpoint or "best", device=device, cuda_graphs=cuda_graphs, **common)


def refuse_run_options(run_only: dict[str, Any]) -> None:
    """A one-line error naming the run-only options given with ``--hf`` (``None``: not given)."""
    if given := [name for name, value in run_only.items() if value is not None]:
        raise MoglmError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to a run, not to --hf (its "
                         "text is --text; --search tunes on --search-text)")


def _dyneval_hf(hf: str, text: Optional[Path], stats_text: Optional[Path], search_text: Optional[Path],
                context: Optional[int], out: Optional[Path], hp, selection, statistics, factor: Optional[float],
                device: Optional[str], common: dict[str, Any]) -> None:
    """``moglm dyneval --hf``: check the paths, then :func:`moglm.dynamic_evaluation.huggingface.dyneval_hf`."""
    from ..dynamic_evaluation.huggingface import dyneval_hf, read_text

    if hf.startswith((".", "/", "~")) and not Path(hf).expanduser().is_dir():
        raise MoglmError(f"--hf {hf}: no such directory")
    if text is None:
        raise MoglmError("--hf needs --text FILE, the text to score")
    if out is not None:
        from ..atomic import check_free

        check_free(out, True)  # a folder, or a path through a file, is refused before the work
    dyneval_hf(hf, read_text(text, "text"), hp, context=context, selection=selection,
               stats_text=None if stats_text is None else read_text(stats_text, "statistics text"),
               statistics=statistics, search_text=None if search_text is None else read_text(search_text,
                                                                                             "search text"),
               factor=1.0 if factor is None else factor, device=device or "cpu", out=out, **common)
