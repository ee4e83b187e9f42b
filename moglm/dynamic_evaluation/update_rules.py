"""Update rules of dynamic evaluation (Krause thesis 4.5, eq. 4.3-4.7; docs/method.md "Update rules").

Every rule is one step ``th <- th - s * g + w * (th0 - th)`` from the current weights ``th``, the
gradient ``g`` of a segment's loss and the trained weights ``th0``, with a per-rule step scale ``s`` and
decay weight ``w``:

=================  ==========================  ==========================================
rule               step scale ``s``            decay weight ``w``
=================  ==========================  ==========================================
``sgd``            ``lr``                      0
``sgd-decay``      ``lr``                      ``lam``                      (eq. 4.3)
``rms``            ``lr / (rms + eps)``        0
``rms-decay``      ``lr / (rms + eps)``        ``lam``                      (eq. 4.5)
``rms-rmsdecay``   ``lr / (rms + eps)``        ``lam * min(1/lam, rms / mean(rms))``  (eq. 4.6-4.7)
=================  ==========================  ==========================================

``rms`` is the root mean squared gradient of the training loss ("global RMS", eq. 4.4; see
:mod:`.statistics`), elementwise; ``mean(rms)`` is its mean over every adapted scalar (eq. 4.6), and
the clip at ``1/lam`` keeps every parameter's decay weight at most 1. ``rms-rmsdecay`` is the thesis'
final rule and the default.

Two more rules carry a running state, the deep-learning optimisers the thesis compares with (Krause
thesis, section 5.4, eq. 5.10-5.12, tables 5.3-5.7; no decay term):

* ``sgd-momentum`` (eq. 5.10-5.11): ``v <- mu * v - lr * g``, then ``th <- th + v``
* ``rmsprop`` (eq. 5.12): ``MS <- alpha * MS + (1 - alpha) * g^2``, then ``th <- th - lr * g / (sqrt(MS) + eps)``

``mu`` is :attr:`Hyperparameters.momentum` (``mu = 0`` is ``sgd``), ``alpha``
:attr:`Hyperparameters.alpha`. ``rmsprop`` is PyTorch's RMSprop (no bias correction, eps outside the
square root): its statistics are *local*, from the gradients of the text being scored, so it needs no
training statistics. Its ``eps`` decides how SGD-like it is: with ``eps`` far above ``sqrt(MS)`` the step
is ``(lr / eps) * g``, SGD at learning rate ``lr / eps``; the thesis's "hybrid" of RMSprop and SGD (5.4.3)
is ``rmsprop`` with a tuned, large ``eps`` (0.01 there), against the frameworks' ``1e-8``. The state
``v`` / ``MS`` is kept for the adapted tensors only, starts at zero, and goes back to zero whenever the
weights do (:meth:`UpdateRule.reset_state`: the divergence guard's rollback, a reset, every episode).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

import torch
from torch import Tensor

from ..data.batching import StreamBatches
from ..errors import MoglmError
from ..evaluation.stream_model import detach_state

if TYPE_CHECKING:
    from .evaluate import DynamicEvaluator

RULES = ("sgd", "sgd-decay", "rms", "rms-decay", "rms-rmsdecay", "sgd-momentum", "rmsprop")
DEFAULT_RULE = "rms-rmsdecay"
#: default learning rates: the RMS rules' steps are in units of the RMS gradient, SGD's in the gradient's,
#: RMSprop's in units of its own running RMS (about 10x the first step with alpha 0.99)
DEFAULT_LR = {"rms": 1e-3, "sgd": 0.03, "rmsprop": 1e-4}


def uses_rms(rule: str) -> bool:
    """Whether ``rule`` divides by the *global* RMS gradient (and so needs training statistics): the
    ``rms*`` rules, not ``rmsprop``, whose statistics come from the text being scored."""
    return rule in ("rms", "rms-decay", "rms-rmsdecay")


def uses_eps(rule: str) -> bool:
    """Whether ``rule`` has the stabiliser ``eps`` (it divides by an RMS gradient, global or running)."""
    return uses_rms(rule) or rule == "rmsprop"


def uses_momentum(rule: str) -> bool:
    return rule == "sgd-momentum"


def uses_alpha(rule: str) -> bool:
    return rule == "rmsprop"


def lr_family(rule: str) -> str:
    """The units of ``rule``'s learning rate, a key of :data:`DEFAULT_LR`: ``rms``, ``sgd`` or ``rmsprop``."""
    return "rms" if uses_rms(rule) else "rmsprop" if rule == "rmsprop" else "sgd"


def uses_decay(rule: str) -> bool:
    """Whether ``rule`` has a decay term towards the trained weights."""
    return rule.endswith("decay")


@dataclass(frozen=True)
class Hyperparameters:
    """One dynamic-evaluation setting. ``lr``: learning rate eta; ``decay``: lambda (ignored by the
    rules without decay); ``eps``: the RMS stabiliser (ignored by the SGD rules); ``segment_length``: n,
    the tokens per segment (eq. 4.2); ``momentum``: mu of ``sgd-momentum``, in [0, 1); ``alpha``: the
    running average's weight of ``rmsprop``, in (0, 1) (PyTorch's default 0.99). The defaults are the best
    setting a search found for a CPU-budget PTB word model among those costing at most 3x static
    evaluation (docs/guides/dynamic-evaluation.md); shorter segments want a smaller lr (3e-4 at n = 5 there). Search
    (:mod:`.search`) for another model."""

    rule: str = DEFAULT_RULE
    lr: float | None = None  # None: DEFAULT_LR of the rule's family
    decay: float = 1e-2
    eps: float = 1e-3
    segment_length: int = 20
    momentum: float = 0.5
    alpha: float = 0.99

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise MoglmError(f"unknown dynamic-evaluation rule {self.rule!r} (choose from {', '.join(RULES)})")
        if self.lr is None:
            object.__setattr__(self, "lr", DEFAULT_LR[lr_family(self.rule)])
        if isinstance(self.segment_length, bool) or not isinstance(self.segment_length, int) or self.segment_length < 1:
            raise MoglmError(f"segment length must be an integer >= 1, got {self.segment_length!r}")
        for name in ("lr", "decay", "eps"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise MoglmError(f"dynamic-evaluation {name} must be a finite number >= 0, got {value!r}")
        if uses_decay(self.rule) and self.decay > 1:
            raise MoglmError(f"dynamic-evaluation decay must be <= 1, got {self.decay}")
        if uses_eps(self.rule) and self.eps <= 0:  # a weight whose (training) gradient is 0 would step by lr/0
            raise MoglmError(f"dynamic-evaluation eps must be > 0 for rule {self.rule}, got {self.eps}")
        for name, low, high, closed in (("momentum", 0.0, 1.0, True), ("alpha", 0.0, 1.0, False)):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                    or not (low <= value < high if closed else low < value < high)):
                interval = f"[{low:g}, {high:g})" if closed else f"({low:g}, {high:g})"
                raise MoglmError(f"dynamic-evaluation {name} must be in {interval}, got {value!r}")

    @classmethod
    def for_hf(cls, **given) -> "Hyperparameters":
        """The defaults for a Hugging Face causal LM, where ``given`` leaves them open: plain SGD (no training
        statistics to hand) on segments of 32 tokens, the thesis's GPT-2 setting (6.3.2)."""
        return cls(**({"rule": "sgd", "segment_length": 32} | given))

    def with_(self, **changes) -> "Hyperparameters":
        return replace(self, **changes)

    def as_dict(self) -> dict:
        d = asdict(self)
        if not uses_decay(self.rule):
            d.pop("decay")
        if not uses_eps(self.rule):
            d.pop("eps")
        if not uses_momentum(self.rule):
            d.pop("momentum")
        if not uses_alpha(self.rule):
            d.pop("alpha")
        return d

    def label(self) -> str:
        return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.as_dict().items())


class UpdateRule:
    """The per-parameter coefficients of one rule, precomputed once, and the in-place step.

    ``initial``: the trained values th0 of the adapted tensors; ``rms``: their global RMS gradients
    (same shapes; required by the ``rms*`` rules). ``lr_scale`` multiplies the step size; the divergence
    guard halves it after a rollback. The running state of ``sgd-momentum`` (:attr:`velocity`) and
    ``rmsprop`` (:attr:`mean_square`), one tensor per adapted tensor, starts at zero; the evaluator zeroes
    it (:meth:`reset_state`) whenever it puts the weights back (rollback, reset).
    """

    def __init__(self, hp: Hyperparameters, initial: list[Tensor], rms: list[Tensor] | None = None) -> None:
        self.hp = hp
        self.initial = initial
        self.lr_scale = 1.0
        self.step_scale: list[Tensor] | None = None  # per parameter: 1 / (rms + eps); None: 1 (SGD)
        self.decay_weight: list[Tensor] | float = hp.decay if uses_decay(hp.rule) else 0.0
        if uses_rms(hp.rule):
            if rms is None:
                raise MoglmError(
                    f"rule {hp.rule} needs the global RMS gradient statistics of the training split "
                    "(collect them with moglm.dynamic_evaluation.gradient_rms, or use rule sgd / sgd-decay)"
                )
            if len(rms) != len(initial) or any(r.shape != p.shape for r, p in zip(rms, initial)):
                raise MoglmError("RMS statistics do not match the adapted parameters (collected for another model?)")
            self.step_scale = [1.0 / (r.to(p) + hp.eps) for r, p in zip(rms, initial)]  # each like its parameter
            if hp.rule == "rms-rmsdecay" and hp.decay > 0:
                count = sum(r.numel() for r in rms)
                mean = sum(float(r.double().sum()) for r in rms) / max(count, 1)  # avg(sqrt(MS_g)), eq. 4.6
                # lam * min(1/lam, rms_norm) == min(1, lam * rms_norm) (eq. 4.7): each weight in [0, 1]
                scale = hp.decay / max(mean, 1e-30)
                self.decay_weight = [(r.to(p) * scale).clamp_(max=1.0) for r, p in zip(rms, initial)]
        self.velocity = [torch.zeros_like(p) for p in initial] if uses_momentum(hp.rule) else None  # v, eq. 5.10
        self.mean_square = [torch.zeros_like(p) for p in initial] if hp.rule == "rmsprop" else None  # MS, eq. 5.12

    @torch.no_grad()
    def reset_state(self) -> None:
        """Zero the running state (momentum's velocity, RMSprop's mean square); nothing for the other rules."""
        for state in (self.velocity, self.mean_square):
            if state is not None:
                torch._foreach_zero_(state)

    @torch.no_grad()
    def apply(self, params: list[Tensor], grads: list[Tensor], statistics_grads: list[Tensor] | None = None) -> None:
        """``th <- th - lr_scale * lr * s * g + w * (th0 - th)``, in place, both terms from the old ``th``;
        ``sgd-momentum`` and ``rmsprop`` update their state first (eq. 5.10-5.12). ``statistics_grads``:
        the gradients RMSprop's mean square is updated from (default ``grads``; the optimisers experiment's
        non-local RMSprop passes those of another text)."""
        if isinstance(self.decay_weight, list):
            torch._foreach_lerp_(params, self.initial, self.decay_weight)  # th + w * (th0 - th)
        elif self.decay_weight > 0:
            torch._foreach_lerp_(params, self.initial, self.decay_weight)
        lr = self.hp.lr * self.lr_scale
        if self.mean_square is not None:  # MS <- alpha MS + (1 - alpha) g^2, whatever the lr
            seen = grads if statistics_grads is None else statistics_grads
            torch._foreach_mul_(self.mean_square, self.hp.alpha)
            torch._foreach_addcmul_(self.mean_square, seen, seen, value=1.0 - self.hp.alpha)
        if lr == 0:
            return
        if self.velocity is not None:  # v <- mu v - lr g; th <- th + v, as th - lr g + mu v_old: mu = 0 is SGD's
            torch._foreach_add_(params, grads, alpha=-lr)  # arithmetic to the bit
            torch._foreach_add_(params, self.velocity, alpha=self.hp.momentum)
            torch._foreach_mul_(self.velocity, self.hp.momentum)
            torch._foreach_add_(self.velocity, grads, alpha=-lr)
        elif self.mean_square is not None:  # th <- th - lr g / (sqrt(MS) + eps)
            denominator = torch._foreach_sqrt(self.mean_square)
            torch._foreach_add_(denominator, self.hp.eps)
            torch._foreach_addcdiv_(params, grads, denominator, value=-lr)
        elif self.step_scale is None:
            torch._foreach_add_(params, grads, alpha=-lr)
        else:
            torch._foreach_addcmul_(params, grads, self.step_scale, value=-lr)


class NonLocalStatistics:
    """An ``rmsprop`` :class:`~moglm.dynamic_evaluation.update_rules.UpdateRule` whose mean square is updated
    from the gradients of another stream (``ids``, read in segments of the evaluator's length with its own
    carried state, under the evaluator's current weights) instead of the scored segment's: non-local
    RMSprop (Krause thesis 5.4.4.2). The scored segment's gradient still makes the step. Put in place of
    ``evaluator.rule``; a rollback or reset zeroes the mean square, and the other stream reads on (it wraps
    around at its end, from a fresh state)."""

    def __init__(self, evaluator: DynamicEvaluator, ids: np.ndarray) -> None:
        if evaluator.hp.rule != "rmsprop":
            raise MoglmError(f"non-local statistics feed RMSprop's mean square, not rule {evaluator.hp.rule}")
        if evaluator.per_stream or evaluator.mc_samples:
            raise MoglmError("non-local RMSprop reads one deterministic stream beside the scored one")
        self.rule, self.evaluator = evaluator.rule, evaluator
        self.batches = StreamBatches(ids, 1, evaluator.hp.segment_length)
        if len(self.batches) == 0:
            raise MoglmError("non-local RMSprop: the statistics stream is empty")
        self.position, self.state = 0, None

    @property
    def lr_scale(self) -> float:
        return self.rule.lr_scale

    @lr_scale.setter
    def lr_scale(self, value: float) -> None:
        self.rule.lr_scale = value

    def reset_state(self) -> None:
        self.rule.reset_state()

    def apply(self, params: list[Tensor], grads: list[Tensor]) -> None:
        if self.position == len(self.batches):
            self.position, self.state = 0, None
        batch = self.batches[self.position]
        self.position += 1
        device = params[0].device
        with torch.enable_grad():
            nll, state = self.evaluator.nll(batch.inputs.to(device), batch.targets.to(device), self.state)
            seen = torch.autograd.grad(self.evaluator.loss(nll), params)
        self.state = detach_state(state)
        self.rule.apply(params, grads, statistics_grads=list(seen))
