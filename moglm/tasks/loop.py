"""The small training loop of the synthetic tasks that are not plain language models (the reverse-copy
encoder-decoder, the report's closing-bracket objective for Dyck-k).

The Mogrifier paper's recipe (docs/method.md, "Training recipe"): Adam with beta1 = 0 and a constant learning
rate, the loss summed over the sequence and averaged over the batch plus ``l2_penalty * 0.5 * sum(w^2)``,
global-norm clipping. Every ``eval_every`` steps: validation, a line in ``metrics.jsonl`` and an atomic
checkpoint (:mod:`moglm.train.checkpoint`: weights and Adam state), the best on validation kept. A task
draws the batch of step s as a function of s, so rerunning the same command resumes exactly.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import MoglmError
from ..progress import progress_bar
from ..train.checkpoint import atomic_write_text, load_group
from ..train.run_directory import RunDirectory


@dataclass
class LoopSettings:
    steps: int
    learning_rate: float
    eval_every: int
    clip_norm: float = 10.0
    l2_penalty: float = 0.0


def prepare_run(run: RunDirectory, config: dict[str, Any], what: str) -> None:
    """Write ``config.json``, or check that the run directory holds a run of the same config."""
    run.path.mkdir(parents=True, exist_ok=True)
    path = run.path / "config.json"
    current = json.loads(json.dumps(config))
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved != current:
            key = next(k for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k))
            raise MoglmError(f"{run.path} holds a {what} run with a different config ({key}: {saved.get(key)!r} saved "
                             f"vs {current.get(key)!r} now); choose another --run-dir or pass --restart")
    atomic_write_text(path, json.dumps(current, indent=1))


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, Tensor], list[dict]]:
    """Adam's state as flat tensors (``"<parameter index>.<key>"``) and its JSON-able parameter groups."""
    state = optimizer.state_dict()
    tensors = {f"{i}.{k}": torch.as_tensor(v) for i, s in state["state"].items() for k, v in s.items()}
    return tensors, state["param_groups"]


def _load_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, Tensor], groups: list[dict]) -> None:
    state: dict[int, dict[str, Tensor]] = {}
    for name, value in tensors.items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def train_loop(
    model: nn.Module,
    settings: LoopSettings,
    run: RunDirectory,
    step_loss: Callable[[int], Tensor],
    validate: Callable[[], dict[str, float]],
    progress: bool = True,
    log: Callable[[str], None] = print,
    desc: str = "train",
    tokens_per_step: int = 1,
) -> dict[str, Any]:
    """Train ``model`` for ``settings.steps`` steps (resuming from the run's last checkpoint), then load the
    weights that scored best on validation. ``step_loss(step)`` is the loss of step ``step`` (summed over the
    sequence, averaged over the batch); ``validate()`` returns scores whose ``xent`` (lower is better) picks
    the best checkpoint. Returns the progress: step, best step and score, training seconds."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(parameters, lr=settings.learning_rate, betas=(0.0, 0.999), eps=1e-8)
    state: dict[str, Any] = {"step": 0, "best_xent": None, "best_step": None, "seconds": 0.0}
    last = run.checkpoints.pointer("last")
    if last is not None:
        model.load_state_dict(load_group(last["path"], "model"))
        saved = json.loads((last["path"] / "state.json").read_text())
        _load_optimizer(optimizer, load_group(last["path"], "optimizer"), saved["param_groups"])
        state = saved["progress"]
        run.truncate_metrics(state["step"])
        log(f"resuming {run.path} from step {state['step']}")
    bar = progress_bar(settings.steps, desc, tokens_per_step, progress, initial=state["step"])
    started = time.perf_counter() - state["seconds"]
    try:
        for step in range(state["step"] + 1, settings.steps + 1):
            model.train()
            loss = step_loss(step)
            train_loss = float(loss.detach())
            if settings.l2_penalty:
                loss = loss + settings.l2_penalty * 0.5 * sum(p.pow(2).sum() for p in parameters)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(parameters, settings.clip_norm)
            optimizer.step()
            bar.update(1)
            if step % settings.eval_every and step != settings.steps:
                continue
            scores = validate()
            best = state["best_xent"] is None or scores["xent"] < state["best_xent"]
            if best:
                state.update(best_xent=scores["xent"], best_step=step)
            state.update(step=step, seconds=time.perf_counter() - started)
            run.append_metrics({"kind": "valid", "step": step, "train_loss": train_loss, **scores,
                                "seconds": state["seconds"], "best": best})
            bar.set_postfix_str(f"valid xent {scores['xent']:.3f}")
            shown = ", ".join(f"{k} {v:.4g}" for k, v in scores.items() if isinstance(v, float))
            log(f"step {step}: valid {shown}{' *' if best else ''}")
            tensors, groups = _optimizer_tensors(optimizer)
            directory = run.checkpoints.write(step, {"model": model.state_dict(), "optimizer": tensors},
                                              {"progress": state, "param_groups": groups})
            run.checkpoints.point("last", directory, step=step)
            if best:
                run.checkpoints.point("best", directory, step=step, valid_xent=scores["xent"])
            run.checkpoints.prune()
    finally:
        bar.close()
    model.load_state_dict(load_group(run.checkpoints.pointer("best")["path"], "model"))
    return state
