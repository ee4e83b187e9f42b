"""The one training engine: any task plugs in; Adam's settings, guards, checkpoints and exact resume are
the engine's, the same for every task."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from moglm.runs import RunDirectory, load_group
from moglm.train.engine import Engine, Settings, StatelessTask, StepLoss, TrainingDiverged


class Regression(StatelessTask):
    """A toy task: fit y = 3x with one weight, a fresh batch per step seeded by the step."""

    def __init__(self, nan_at: int | None = None) -> None:
        self.model = nn.Linear(1, 1, bias=False)
        self.nan_at = nan_at

    def loss(self, step: int) -> StepLoss:
        x = torch.randn(8, 1, generator=torch.Generator().manual_seed(step))  # [B, 1]
        error = (self.model(x) - 3 * x).pow(2)  # [B, 1]
        if step == self.nan_at:
            error = error * float("nan")
        return StepLoss(error.sum(), 8, 8)

    def validate(self, model: nn.Module) -> dict[str, float]:
        return {"xent": float((model.weight.detach() - 3).pow(2))}


def _fit(run_dir, on_step=None, task=None, **settings):
    torch.manual_seed(0)
    task = task or Regression()
    options = dict(steps=16, learning_rate=0.4, eval_every=4) | settings
    engine = Engine(task, Settings(**options), RunDirectory(run_dir), progress=False, log=lambda s: None,
                    on_step=on_step)
    return engine, engine.fit()


class Killed(Exception):
    pass


def straight_and_resumed(tmp_path, **settings):
    """A run straight through (``a``) and one killed after step 6 and resumed (``b``): their final progress and
    metric records."""
    _, straight = _fit(tmp_path / "a", **settings)

    def kill(step):
        if step == 6:
            raise Killed

    with pytest.raises(Killed):
        _fit(tmp_path / "b", on_step=kill, **settings)
    _, resumed = _fit(tmp_path / "b", **settings)
    records = [RunDirectory(tmp_path / d).read_metrics() for d in ("a", "b")]
    return straight, resumed, records


def test_any_task_trains_and_resumes_exactly_after_a_kill(tmp_path):
    straight, resumed, records = straight_and_resumed(tmp_path)
    assert [(r["kind"], r["step"], r["xent"]) for r in records[0]] == [(r["kind"], r["step"], r["xent"]) for r in records[1]]
    assert resumed.best_xent == straight.best_xent < 0.1  # it learned w = 3
    assert {"grad_norm", "tokens_per_s", "learning_rate"} <= set(records[0][0])


def test_adam_takes_beta2_and_eps_from_the_settings_for_every_task(tmp_path):
    engine, _ = _fit(tmp_path / "run", adam_beta2=0.9, adam_eps=1e-3, steps=1, eval_every=1)
    group = engine.optimizer.param_groups[0]
    assert group["betas"] == (0.0, 0.9) and group["eps"] == 1e-3


def test_the_linear_schedule_decays_to_the_minimum_and_resumes_exactly(tmp_path):
    """Thesis 3.5.1's recipe: Adam (beta1 0.9) from learning_rate at step 1 down to min_learning_rate at the
    last step, each step's rate a function of the step, so a killed run resumes on the same schedule."""
    settings = dict(schedule="linear", learning_rate=0.4, min_learning_rate=0.1, adam_beta1=0.9)
    engine, _ = _fit(tmp_path / "full", **settings)
    assert [engine.settings.learning_rate_at(s) for s in (1, 6, 11, 16)] == pytest.approx([0.4, 0.3, 0.2, 0.1])
    assert engine.optimizer.param_groups[0]["betas"] == (0.9, 0.999)
    assert engine.optimizer.param_groups[0]["lr"] == pytest.approx(0.1)  # the last step's
    straight, resumed, records = straight_and_resumed(tmp_path, **settings)
    assert [(r["step"], r["xent"], r.get("learning_rate")) for r in records[0]] == [
        (r["step"], r["xent"], r.get("learning_rate")) for r in records[1]]
    assert resumed.best_xent == straight.best_xent
    constant = _fit(tmp_path / "c")[0]
    assert constant.settings.learning_rate_at(16) == 0.4


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sgd_with_clipping_trains_and_resumes_exactly_with_its_momentum_buffer(tmp_path, momentum):
    """The thesis's music recipe (4.8): SGD with gradient-norm clipping, optionally with momentum, whose buffer
    is checkpointed so a killed run resumes exactly."""
    settings = dict(optimizer="sgd", momentum=momentum, learning_rate=0.1)
    straight, resumed, records = straight_and_resumed(tmp_path, **settings)
    engine, _ = _fit(tmp_path / "c", steps=1, eval_every=1, **settings)
    assert isinstance(engine.optimizer, torch.optim.SGD) and engine.optimizer.param_groups[0]["momentum"] == momentum
    assert [(r["step"], r["xent"]) for r in records[0]] == [(r["step"], r["xent"]) for r in records[1]]
    assert resumed.best_xent == straight.best_xent < 0.5
    training = load_group(RunDirectory(tmp_path / "a").checkpoints.pointer("last")["path"], "training")
    assert ("adam.weight.momentum_buffer" in training) == (momentum > 0)


def test_an_unknown_optimizer_is_a_one_line_error():
    from moglm.errors import MoglmError

    with pytest.raises(MoglmError, match="optimizer must be one of"):
        Settings(steps=1, learning_rate=0.1, eval_every=1, optimizer="lbfgs")


def test_the_checkpoint_stores_adam_state_by_parameter_name(tmp_path):
    _fit(tmp_path / "run", steps=4)
    pointer = RunDirectory(tmp_path / "run").checkpoints.pointer("last")
    training = load_group(pointer["path"], "training")
    assert {"adam.weight.exp_avg", "adam.weight.exp_avg_sq", "adam.weight.step"} <= set(training)
    assert json.loads((pointer["path"] / "state.json").read_text())["progress"]["step"] == 4


def test_a_non_finite_loss_stops_any_task_and_keeps_the_last_good_checkpoint(tmp_path):
    with pytest.raises(TrainingDiverged, match=r"non-finite loss at step 6.*\(step 4\) is kept"):
        _fit(tmp_path / "run", task=Regression(nan_at=6))
    assert RunDirectory(tmp_path / "run").checkpoints.pointer("last")["step"] == 4


def test_best_weights_are_the_checkpoint_that_scored_best(tmp_path):
    engine, progress = _fit(tmp_path / "run")
    weights = engine.best_weights()
    assert progress.best_step == RunDirectory(tmp_path / "run").checkpoints.pointer("best")["step"]
    assert float((weights["weight"] - 3).pow(2)) == pytest.approx(progress.best_xent)


def test_bad_settings_are_one_line_errors():
    from moglm.errors import MoglmError

    with pytest.raises(MoglmError, match="eval_every must be >= 1"):
        Settings(steps=3, learning_rate=0.1, eval_every=0)
    with pytest.raises(MoglmError, match="schedule must be one of"):
        Settings(steps=3, learning_rate=0.1, eval_every=1, schedule="cosine")
    with pytest.raises(MoglmError, match=r"min_learning_rate must be in \[0, learning_rate\]"):
        Settings(steps=3, learning_rate=0.1, eval_every=1, schedule="linear", min_learning_rate=0.2)
