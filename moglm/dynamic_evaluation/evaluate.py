"""Dynamic evaluation of a stream (Krause thesis 4.3, eq. 4.2, algorithm 1; docs/method.md).

The stream is cut into segments of ``n`` tokens. Each segment is scored with the current weights,
then one update step (:mod:`.update_rules`) is taken on its loss, the mean per-token cross-entropy;
gradients stop at the segment's start while the hidden state is carried across segments. The
reported score is the sum of the scores each segment got *before* its own update, so it is a valid
log-likelihood of the stream.

Several streams (``streams=B``): the stream is cut into B contiguous stripes read side by side.
Full dynamic evaluation adapts one set of weights shared by the stripes (one step per segment on
the mean loss of all B x n tokens); every token is still predicted only from tokens read before it
(in stripe-interleaved order), so the score stays a valid likelihood, but the adaptation mixes B
places of the text. Sparse dynamic evaluation gives every stripe its own matrix (thesis 4.6's reason
for the sparse variant): the loss is the sum over stripes of each stripe's mean, so stripe b's matrix
moves exactly as it would alone.

Episodic mode (``boundary`` token): the weights and the state are reset at every boundary (thesis 4.8:
each song, "decay rate to zero"); every sequence is predicted from a leading boundary token, like
:func:`moglm.evaluation.stream.evaluate_episodes`.

Divergence guard: a segment with a non-finite loss, or after which the dynamic loss has exceeded the
static model's loss on the same tokens by more than ``margin`` = 3 nats per token over the recent text
(an exponential window of ``WINDOW`` = 200 positions), rolls the weights back to a snapshot at least
``SNAPSHOT_EVERY`` good updates old, halves the step size for the rest of the pass, zeroes the update
rule's running state (momentum, RMSprop), and skips that segment's update; the carried state is
recomputed with the restored weights. The static losses come from the static pass the result is
compared with anyway (no extra forward pass). Why these numbers:
healthy runs have sharp transients. On the PTB test set a well-tuned run (lr 1e-3, n 20) that adapted
to the money-market tables ("N days N N N to N days ...") paid up to 24 nats more than static on
single tokens and 5.5 nats per token over a 20-token segment, and recovered; its excess reached 3.0
nats over a 50-position window (a 1-nat margin there rolled back twice and cost 2 points of
perplexity) but 1.5 over 200 positions. A diverging run's losses grow by orders of magnitude and pass
the margin within a few segments. A finite bad score is kept (it is what the model predicted); a
non-finite one is replaced by the rescore under the restored weights (counted as ``rescored``), so
the result is never NaN.

MC dropout with dynamic evaluation (``mc_samples=S``; the Mogrifier paper's "MC" rows with dynamic
evaluation, tables 1-2): every segment is read by S dropout samples at once (S rows per stream, each
with its own masks and carried state; every rate times ``mc_multiplier``), a token's probability is
the mean of the S samples' probabilities, as in :mod:`moglm.evaluation.mc_dropout`, and the update
step is taken on the loss of that mixture, the quantity that is scored. The divergence guard compares
the mixture with the deterministic static losses.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..data.batching import StreamBatches, split_sequences
from ..data.corpus import TextSize
from ..errors import MoglmError
from ..evaluation.scores import Scores
from ..evaluation.stream import evaluate_stream
from ..evaluation.stream_model import StreamModel, detach_state, dropout_scaled, static_window
from ..progress import progress_bar
from ..recurrence import gemm
from .adapted import ALL, ParameterSelection, adapted_tensors
from .sparse import SparseSpec
from .update_rules import Hyperparameters, NonLocalStatistics, UpdateRule, uses_rms

DEFAULT_MARGIN = 3.0  # nats per token above the static loss, over the recent WINDOW positions
WINDOW = 200  # positions (tokens per stream) of the divergence guard's exponential window
SNAPSHOT_EVERY = 100  # good updates between snapshots


@contextmanager
def _plain_gemm():
    """The fused recurrences' ``torch.mm`` path (:data:`moglm.recurrence.gemm.ONEDNN` off): oneDNN
    reorders every weight once per call, which pays off over a 70-step window of fixed weights but
    dominates a 5-step segment whose weights change every time (measured 2x slower per segment)."""
    saved = gemm.ONEDNN
    gemm.ONEDNN = False
    try:
        yield
    finally:
        gemm.ONEDNN = saved


class DynamicEvaluator:
    """Online adaptation of a private copy of ``model`` (any :class:`~moglm.evaluation.stream_model.StreamModel`:
    a recurrent or Transformer language model, or a causal LM read through a context window): :meth:`step`
    scores one segment with the current weights, then updates them on its loss. ``model`` itself never changes.

    ``rms``: global RMS statistics by name (:mod:`.statistics`; needed by the ``rms*`` rules);
    ``sparse``: adapt only the sparse matrices (one per stream); ``selection``: which parameters adapt
    (:class:`~.adapted.ParameterSelection`; default all); ``factor``: the logit factor (softmax
    temperature) applied when scoring; ``mc_samples``: score and adapt on the mean of that many dropout
    samples' probabilities (0: dropout off), with every dropout rate times ``mc_multiplier``;
    ``keep_features``: keep the features of the last segment in :attr:`features` (for the neural cache).
    """

    def __init__(
        self,
        model: StreamModel,
        hp: Hyperparameters = Hyperparameters(),
        rms: dict[str, Tensor] | None = None,
        sparse: SparseSpec | None = None,
        streams: int = 1,
        factor: float = 1.0,
        margin: float = DEFAULT_MARGIN,
        snapshot_every: int = SNAPSHOT_EVERY,
        mc_samples: int = 0,
        mc_multiplier: float = 1.0,
        selection: ParameterSelection = ALL,
        keep_features: bool = False,
    ) -> None:
        if streams < 1:
            raise MoglmError(f"streams must be >= 1, got {streams}")
        _check_mc(mc_samples, mc_multiplier, sparse)
        self.hp, self.factor, self.margin, self.snapshot_every = hp, factor, margin, snapshot_every
        self.mc_samples, self.mc_multiplier = mc_samples, mc_multiplier
        if keep_features and mc_samples:
            raise MoglmError("the neural cache reads one deterministic pass: it does not combine with MC dropout")
        self.keep_features, self.features = keep_features, None
        self.adapted = adapted_tensors(model, sparse, streams if sparse is not None else None, selection)
        self.model = self.adapted.model
        self.params = self.adapted.params
        self.per_stream = sparse is not None
        rms_list = None
        if rms is not None and uses_rms(hp.rule):
            missing = [n for n in self.adapted.names if n not in rms]
            if missing:
                raise MoglmError(f"RMS statistics lack {missing[0]} (collected for another model or mode?)")
            rms_list = [rms[n].to(p.device) for n, p in zip(self.adapted.names, self.params)]
            if self.per_stream:  # [H, H] statistics serve every stream's [B, H, H] matrix
                rms_list = [r.expand_as(p).contiguous() for r, p in zip(rms_list, self.params)]
        self.rule = UpdateRule(hp, self.adapted.initial, rms_list)
        self.rollbacks = self.rescored = self.updates = 0
        self._excess = 0.0  # recent mean excess of the dynamic over the static loss (nats / token)
        self._snapshots = [self.adapted.initial]  # [older, newer]: rollbacks go to the older

    # -- one segment ---------------------------------------------------------------------------------
    def loss(self, nll: Tensor) -> Tensor:
        """The segment loss: mean per-token nll (shared weights), or per stream (sparse matrices)."""
        return nll.mean(0).sum() if self.per_stream else nll.mean()

    def nll(self, inputs: Tensor, targets: Tensor, state=None) -> tuple[Tensor, object]:
        """Per-token nll ``[T, B]`` under the current weights: deterministic, or of the mean probability of
        ``mc_samples`` dropout samples (the state then has ``B * S`` rows, sample-major within a stream)."""
        if not self.mc_samples:
            if not self.keep_features:
                return self.model.nll(inputs, targets, state, self.factor)
            nll, features, state = self.model.nll_features(inputs, targets, state, self.factor)  # [T, B], [T, B, H]
            self.features = features.detach()
            return nll, state
        samples = self.mc_samples
        self.model.train()
        try:
            with dropout_scaled(self.model, self.mc_multiplier):
                nll, state = self.model.nll(inputs.repeat_interleave(samples, 1), targets.repeat_interleave(samples, 1),
                                            state, self.factor)  # [T, B*S]
        finally:
            self.model.eval()
        log_mean = torch.logsumexp(-nll.view(*targets.shape, samples), dim=2) - math.log(samples)  # [T, B]
        return -log_mean, state

    def step(self, inputs: Tensor, targets: Tensor, state=None, static_nll: Tensor | None = None):
        """Score ``targets`` ``[T, B]`` given ``inputs`` ``[T, B]`` and ``state``, then update. Returns the
        per-token nll ``[T, B]`` (detached) and the final state. ``static_nll`` ``[T, B]``: the static
        model's losses on the same tokens, for the divergence guard (``None``: non-finite check only)."""
        with torch.enable_grad(), _plain_gemm():
            nll, new_state = self.nll(inputs, targets, state)  # [T, B]
            scored = nll.detach()
            if not self._diverged(scored, static_nll):
                grads = torch.autograd.grad(self.loss(nll), self.params)
                self.rule.apply(self.params, grads)
                self._after_update()
                return scored, detach_state(new_state)
        self.rollback()
        with torch.no_grad():
            rescored, new_state = self.nll(inputs, targets, state)  # [T, B]
            if not torch.isfinite(scored).all():
                self.rescored += 1
                if not torch.isfinite(rescored).all():  # even the snapshot fails: back to the trained weights
                    self.reset(keep_lr_scale=True)
                    rescored, new_state = self.nll(inputs, targets, state)
                    if not torch.isfinite(rescored).all():
                        raise MoglmError("the trained weights themselves give a non-finite loss on this text")
                scored = rescored
        return scored, detach_state(new_state)

    def adapt_to(self, inputs: Tensor, targets: Tensor, state=None):
        """Read ``inputs`` ``[T, B]`` segment by segment, updating after each; returns the final state."""
        n = self.hp.segment_length
        for start in range(0, inputs.shape[0], n):
            _, state = self.step(inputs[start : start + n], targets[start : start + n], state)
        return state

    def describe(self) -> dict:
        """What adapts: tensors, scalars, and their names (a summary when there are many)."""
        names = self.adapted.names
        return {"tensors": len(names), "parameters": sum(p.numel() for p in self.params),
                "names": names if len(names) <= 12 else names[:6] + ["..."] + names[-6:]}

    def _diverged(self, nll: Tensor, static_nll: Tensor | None) -> bool:
        """Non-finite, or the recent excess over the static loss is above the margin."""
        total = float(nll.double().mean())
        if not math.isfinite(total):
            return True
        if static_nll is None:
            return False
        keep = (1.0 - 1.0 / WINDOW) ** nll.shape[0]  # an exponential window of WINDOW positions
        self._excess = keep * self._excess + (1.0 - keep) * (total - float(static_nll.double().mean()))
        return self._excess > self.margin

    def _after_update(self) -> None:
        self.updates += 1
        if self.updates % self.snapshot_every == 0:
            with torch.no_grad():
                self._snapshots = [self._snapshots[-1], [p.detach().clone() for p in self.params]]

    @torch.no_grad()
    def rollback(self) -> None:
        """Restore the older snapshot, halve the step size and zero the rule's running state (momentum's
        velocity, RMSprop's mean square: they were built on the discarded path)."""
        self.rollbacks += 1
        self.rule.lr_scale *= 0.5
        self.rule.reset_state()
        self._excess = 0.0
        torch._foreach_copy_(self.params, self._snapshots[0])
        self._snapshots = self._snapshots[:1]

    @torch.no_grad()
    def reset(self, keep_lr_scale: bool = False) -> None:
        """Back to the starting weights (the trained ones, or zero matrices), the rule's state zeroed."""
        torch._foreach_copy_(self.params, self.adapted.initial)
        self.rule.reset_state()
        self._snapshots = [self.adapted.initial]
        self._excess = 0.0
        if not keep_lr_scale:
            self.rule.lr_scale = 1.0


@dataclass
class Timing:
    """Wall-clock seconds, and this process's CPU seconds: the cost measure, since on a shared machine
    other jobs change the wall clock of one pass and not of the next."""

    seconds: float = 0.0
    cpu_seconds: float = 0.0

    @contextmanager
    def measure(self):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield self
        finally:
            self.seconds += time.perf_counter() - wall
            self.cpu_seconds += time.process_time() - cpu


@dataclass
class StaticPass:
    """The static evaluation a dynamic one is compared with: scores, per-token losses ``[L, B]``, time."""

    scores: Scores
    losses: Tensor
    timing: Timing
    features: Tensor | None = None


@dataclass
class DynamicResult:
    """Dynamic and static scores of one pass; per-token losses ``[L, B]`` (stream order per stripe;
    episodic: ``[N, 1]`` with ``episodes`` the sequence lengths)."""

    scores: Scores
    static: Scores
    losses: Tensor
    static_losses: Tensor
    hyperparameters: Hyperparameters
    timing: Timing
    static_timing: Timing
    rollbacks: int = 0
    rescored: int = 0
    lr_scale: float = 1.0
    episodes: list[int] | None = None
    features: Tensor | None = None  # [L, B, H] of the adapted model, when asked for (the neural cache)
    static_features: Tensor | None = None
    adapted: dict | None = None  # what adapted: parameters and tensors counted, the selection

    @property
    def gain(self) -> float:
        """Relative perplexity reduction, ``1 - ppl_dynamic / ppl_static``."""
        return 1.0 - math.exp(min(self.scores.xent - self.static.xent, 700.0))

    @property
    def cost(self) -> float:
        """CPU time of the dynamic pass over that of the static pass."""
        return self.timing.cpu_seconds / max(self.static_timing.cpu_seconds, 1e-9)

    def as_dict(self) -> dict:
        return {
            "hyperparameters": self.hyperparameters.as_dict(),
            "static": self.static.as_dict(),
            "dynamic": self.scores.as_dict(),
            "perplexity_reduction": self.gain,
            "rollbacks": self.rollbacks,
            "rescored_segments": self.rescored,
            "final_lr_scale": self.lr_scale,
            "seconds": self.timing.seconds,
            "cpu_seconds": self.timing.cpu_seconds,
            "static_seconds": self.static_timing.seconds,
            "static_cpu_seconds": self.static_timing.cpu_seconds,
            "cost": self.cost,
            "adapted": self.adapted,
        }


def static_pass(model: StreamModel, ids: np.ndarray, streams: int = 1, bptt: int = 70, factor: float = 1.0,
                text: TextSize | None = None, progress: bool = False, features: bool = False) -> StaticPass:
    """The static evaluation (:func:`moglm.evaluation.stream.evaluate_stream`), timed, per token; with
    ``features`` also the output layer's features ``[L, B, H]`` (for the neural cache)."""
    timing = Timing()
    with timing.measure():
        out = evaluate_stream(model, ids, streams, bptt, factor, text=text, progress=progress, desc="static",
                              per_token=True, features=features)
    return StaticPass(*out[:2], timing, out[2] if features else None)


def dynamic_evaluate(
    model: StreamModel,
    ids: np.ndarray,
    hp: Hyperparameters = Hyperparameters(),
    rms: dict[str, Tensor] | None = None,
    *,
    sparse: SparseSpec | None = None,
    streams: int = 1,
    boundary: int | None = None,
    factor: float = 1.0,
    max_tokens: int | None = None,
    words: int | None = None,
    static: StaticPass | None = None,
    static_bptt: int = 70,
    margin: float = DEFAULT_MARGIN,
    mc_samples: int = 0,
    mc_multiplier: float = 1.0,
    selection: ParameterSelection = ALL,
    features: bool = False,
    progress: bool = False,
    desc: str = "dyneval",
) -> DynamicResult:
    """Dynamic evaluation of ``model`` (any :class:`~moglm.evaluation.stream_model.StreamModel`) on ``ids`` (a
    1-D token stream); ``model`` is left unchanged.

    ``static``: a :func:`static_pass` result of the same ids and streams to reuse (e.g. across a
    search); otherwise it is computed here (bptt ``static_bptt``, or the segment length for a model that
    reads in segments, :func:`~moglm.evaluation.stream_model.static_window`). ``boundary``: a token id that
    ends every sequence for episodic mode (one stream, weights and state reset after each).
    ``mc_samples``: MC dropout with dynamic evaluation (module docstring). ``selection``: which parameters
    adapt. ``features``: keep the output layer's features of both passes (the neural cache reads them).
    """
    ids = np.asarray(ids)
    if boundary is not None:
        if streams != 1:
            raise MoglmError("episodic dynamic evaluation reads one stream (streams must be 1)")
        if mc_samples:
            raise MoglmError("MC dropout with episodic dynamic evaluation is not supported: evaluate a stream")
        if features:
            raise MoglmError("the neural cache reads a stream: it does not combine with episodic evaluation")
        return _episodic(model, ids if max_tokens is None else ids[:max_tokens], hp, rms, sparse, boundary,
                         factor, margin, progress, desc, selection)
    if max_tokens is not None:
        ids = ids[: max_tokens + streams]  # as evaluate_stream: each stripe's last token is only a target
    if static is None or (features and static.features is None):
        static = static_pass(model, ids, streams, static_window(model, static_bptt, hp.segment_length), factor,
                             words, progress, features)
    batches = StreamBatches(ids, streams, hp.segment_length)
    if static.losses.shape != (batches.data.shape[0] - 1, streams):
        raise MoglmError("the static losses given do not belong to this stream")
    timing = Timing()
    out, kept, state = [], [], None
    bar = progress_bar(len(batches), desc, hp.segment_length * streams, enabled=progress)
    try:
        with timing.measure():
            evaluator = DynamicEvaluator(model, hp, rms, sparse, streams, factor, margin, mc_samples=mc_samples,
                                         mc_multiplier=mc_multiplier, selection=selection, keep_features=features)
            device = evaluator.params[0].device
            for i, batch in enumerate(batches):
                start = i * hp.segment_length
                reference = static.losses[start : start + batch.targets.shape[0]].to(device)  # [T, B]
                nll, state = evaluator.step(batch.inputs.to(device), batch.targets.to(device), state, reference)
                out.append(nll.cpu())  # [T, B]
                if features:
                    kept.append(evaluator.features.cpu())  # [T, B, H]
                bar.update(1)
    finally:
        bar.close()
    losses = torch.cat(out)  # [L, B]
    scores = Scores(float(losses.double().sum()), losses.numel(), static.scores.words, bytes=static.scores.bytes)
    return DynamicResult(scores, static.scores, losses, static.losses, hp, timing, static.timing, evaluator.rollbacks,
                         evaluator.rescored, evaluator.rule.lr_scale, features=torch.cat(kept) if features else None,
                         static_features=static.features if features else None, adapted=evaluator.describe())


def _check_mc(samples: int, multiplier: float, sparse: SparseSpec | None) -> None:
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
        raise MoglmError(f"MC-dropout samples must be an integer >= 0, got {samples!r}")
    if not (math.isfinite(multiplier) and 0 < multiplier <= 1):
        raise MoglmError(f"the MC-dropout multiplier must be in (0, 1], got {multiplier}")
    if samples and sparse is not None:
        raise MoglmError("MC dropout with sparse dynamic evaluation is not supported (one matrix per stream, "
                         "not per dropout sample): use full dynamic evaluation")


def _episodic(model, ids, hp, rms, sparse, boundary, factor, margin, progress, desc, selection) -> DynamicResult:
    """One sequence at a time from a zero state and the trained weights (thesis 4.8)."""
    sequences = split_sequences(ids, boundary)
    hp = hp.with_(decay=0.0)  # the weights restart at every boundary: no decay (thesis 4.8)
    if not sequences:
        raise MoglmError("episodic dynamic evaluation: no sequences in the stream")
    timing, static_timing = Timing(), Timing()
    with timing.measure():
        evaluator = DynamicEvaluator(model, hp, rms, sparse, 1, factor, margin, selection=selection)
    device = evaluator.params[0].device
    dyn, stat = [], []
    bar = progress_bar(len(sequences), desc, 1, enabled=progress)
    was_training = model.training
    model.eval()
    try:
        for seq in sequences:
            targets = torch.as_tensor(seq, dtype=torch.long, device=device).view(-1, 1)  # [N, 1]
            inputs = torch.cat([targets.new_full((1, 1), boundary), targets[:-1]])  # [N, 1]
            with static_timing.measure(), torch.no_grad():
                static_nll, _ = model.nll(inputs, targets, None, factor)  # [N, 1]
            with timing.measure():
                evaluator.reset()
                state = None
                for s in range(0, len(seq), hp.segment_length):
                    e = min(s + hp.segment_length, len(seq))
                    nll, state = evaluator.step(inputs[s:e], targets[s:e], state, static_nll[s:e])
                    dyn.append(nll.cpu())
            stat.append(static_nll.cpu())
            bar.update(1)
    finally:
        bar.close()
        model.train(was_training)
    losses, static_losses = torch.cat(dyn), torch.cat(stat)  # [N, 1] each
    return DynamicResult(Scores(float(losses.double().sum()), losses.numel()),
                         Scores(float(static_losses.double().sum()), static_losses.numel()), losses, static_losses,
                         hp, timing, static_timing, evaluator.rollbacks, evaluator.rescored, evaluator.rule.lr_scale,
                         episodes=[len(s) for s in sequences], adapted=evaluator.describe())


def nonlocal_rmsprop(model, ids: np.ndarray, hp: Hyperparameters, statistics_ids: np.ndarray, static: StaticPass,
                     factor: float = 1.0, margin: float = DEFAULT_MARGIN) -> DynamicResult:
    """Dynamic evaluation of ``ids`` (one stream) with non-local RMSprop fed by ``statistics_ids``
    (:class:`NonLocalStatistics`); ``static``: the static pass of ``ids`` it is compared with. With
    ``statistics_ids`` equal to ``ids`` it is ordinary (local) RMSprop."""
    ids = np.asarray(ids)
    batches = StreamBatches(ids, 1, hp.segment_length)
    if static.losses.shape != (batches.data.shape[0] - 1, 1):
        raise MoglmError("the static losses given do not belong to this stream")
    timing = Timing()
    out, state = [], None
    with timing.measure():
        evaluator = DynamicEvaluator(model, hp, factor=factor, margin=margin)
        evaluator.rule = NonLocalStatistics(evaluator, np.asarray(statistics_ids))
        device = evaluator.params[0].device
        for i, batch in enumerate(batches):
            start = i * hp.segment_length
            reference = static.losses[start : start + batch.targets.shape[0]].to(device)  # [T, 1]
            nll, state = evaluator.step(batch.inputs.to(device), batch.targets.to(device), state, reference)
            out.append(nll.cpu())  # [T, 1]
    losses = torch.cat(out)  # [L, 1]
    return DynamicResult(Scores(float(losses.double().sum()), losses.numel()), static.scores, losses, static.losses,
                         hp, timing, static.timing, evaluator.rollbacks, evaluator.rescored, evaluator.rule.lr_scale,
                         adapted=evaluator.describe())
