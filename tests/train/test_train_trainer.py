"""Training: the loss drops; killed runs resume bit for bit; checkpoints are atomic; NaN stops cleanly;
weight averaging averages."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from safetensors.torch import load_file

from conftest import refuse_capture, tiny_config
from moglm.errors import MoglmError
from moglm.runs.language_model import LanguageModelRun
from moglm.train import Trainer, TrainingDiverged, TrainingInterrupted
from moglm.runs import checkpoints as checkpoint_module
from moglm.train.engine import Engine


class Killed(Exception):
    """Stands in for SIGKILL: nothing is saved on the way out."""


def _train(cfg, run_dir, on_step=None):
    return Trainer(cfg, run_dir, progress=False, log=lambda s: None, on_step=on_step).train()


def _losses(run_dir):
    return [(r["step"], r["xent"]) for r in LanguageModelRun(run_dir).read_metrics() if r["kind"] in ("train", "valid")]


def _weights(run_dir, which="last"):
    pointer = LanguageModelRun(run_dir).checkpoints.pointer(which)
    return load_file(str(pointer["path"] / f"{pointer.get('weights', 'model')}.safetensors"))


def test_a_tiny_model_lowers_its_loss_by_a_clear_margin(tiny_corpus, tmp_path):
    cfg = tiny_config(tiny_corpus, train={"max_steps": 60, "eval_every": 10, "averaging_patience": None,
                                         "averaging_start": None})
    _train(cfg, tmp_path / "run")
    valid = [r["xent"] for r in LanguageModelRun(tmp_path / "run").read_metrics() if r["kind"] == "valid"]
    # log(13) = 2.56 is a uniform guess; the corpus' own entropy is (2 log 6 + log 4) / 7 = 0.71 nats/token
    assert valid[0] > valid[-1] + 0.5  # from step 10 to step 60
    assert valid[-1] < 0.9


def _kill_at_7_and_resume(cfg, tmp_path):
    """Train ``cfg`` straight through, and again killed at step 7 then rerun: the losses, last and best weights
    must be the straight run's bit for bit."""
    _train(cfg, tmp_path / "straight")

    def kill_at_7(step):
        if step == 7:
            raise Killed

    with pytest.raises(Killed):
        _train(cfg, tmp_path / "killed", on_step=kill_at_7)
    assert LanguageModelRun(tmp_path / "killed").checkpoints.pointer("last")["step"] == 4
    _train(cfg, tmp_path / "killed")  # the same command again: resumes from step 4
    assert _losses(tmp_path / "killed") == _losses(tmp_path / "straight")
    for which in ("last", "best"):
        a, b = _weights(tmp_path / "straight", which), _weights(tmp_path / "killed", which)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("episodic", [False, True])
def test_kill_and_rerun_continues_exactly_like_an_uninterrupted_run(tiny_corpus, tmp_path, episodic):
    cfg = tiny_config(tiny_corpus, data={"episodic": episodic}, train={"max_steps": 14, "eval_every": 4,
                                                                        "averaging_patience": 1})
    _kill_at_7_and_resume(cfg, tmp_path)


@pytest.mark.sends_signals
@pytest.mark.parametrize("signum, said", [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "terminated")])
def test_ctrl_c_or_sigterm_saves_a_checkpoint_at_the_current_step_and_resume_is_exact(tiny_corpus, tmp_path,
                                                                                       signum, said):
    cfg = tiny_config(tiny_corpus)
    _train(cfg, tmp_path / "straight")

    def signal_at_6(step):
        if step == 6:
            os.kill(os.getpid(), signum)

    with pytest.raises(TrainingInterrupted, match=f"{said} at step 6"):
        _train(cfg, tmp_path / "interrupted", on_step=signal_at_6)
    assert LanguageModelRun(tmp_path / "interrupted").checkpoints.pointer("last")["step"] == 6
    _train(cfg, tmp_path / "interrupted")
    assert _losses(tmp_path / "interrupted") == _losses(tmp_path / "straight")


def test_a_kill_during_a_checkpoint_write_leaves_the_previous_checkpoint_valid(tiny_corpus, tmp_path, monkeypatch):
    cfg = tiny_config(tiny_corpus)
    real_save = checkpoint_module.save_file
    calls = {"n": 0}

    def dying_save(tensors, path):
        real_save(tensors, path)
        if "step-00000008" in path:
            calls["n"] += 1
            if calls["n"] == 2:  # the step-8 checkpoint dies after writing two of its files
                raise Killed

    monkeypatch.setattr(checkpoint_module, "save_file", dying_save)
    with pytest.raises(Killed):
        _train(cfg, tmp_path / "run")
    monkeypatch.undo()
    run = LanguageModelRun(tmp_path / "run")
    pointer = run.checkpoints.pointer("last")
    assert pointer["step"] == 4
    assert not (run.checkpoints.root / "step-00000008").exists()
    model, _, _ = run.load_model("last")  # loadable
    _train(cfg, tmp_path / "run")
    _train(cfg, tmp_path / "straight")
    assert _losses(tmp_path / "run") == _losses(tmp_path / "straight")


def test_a_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tiny_corpus, tmp_path, monkeypatch):
    cfg = tiny_config(tiny_corpus)
    trainer = Trainer(cfg, tmp_path / "run", progress=False, log=lambda s: None)
    original = Engine._step

    def poisoned(self, step):
        if step == 6:
            with torch.no_grad():
                self.model.embedding.weight.fill_(float("nan"))
        return original(self, step)

    monkeypatch.setattr(Engine, "_step", poisoned)
    with pytest.raises(TrainingDiverged, match=r"non-finite loss at step 6.*last good checkpoint \(step 4\) is kept"):
        trainer.train()
    weights = _weights(tmp_path / "run")
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_weight_averaging_averages_every_step_since_it_started_and_is_what_best_holds(tiny_corpus, tmp_path):
    cfg = tiny_config(tiny_corpus, train={"max_steps": 8, "eval_every": 8, "averaging_patience": None,
                                         "averaging_start": 0.5})
    seen = []
    trainer = Trainer(cfg, tmp_path / "run", progress=False, log=lambda s: None,
                      on_step=lambda step: seen.append({k: v.clone() for k, v in trainer.model.state_dict().items()}))
    trainer.train()
    averaged = _weights(tmp_path / "run", "best")
    assert LanguageModelRun(tmp_path / "run").checkpoints.pointer("best")["weights"] == "averaged"
    for name, value in averaged.items():
        expected = torch.stack([s[name] for s in seen[4:]]).mean(0)  # steps 5..8
        torch.testing.assert_close(value, expected)


def test_the_mlstm_recipe_trains_resumes_exactly_after_a_kill_and_loads(tiny_corpus, tmp_path):
    """Weight normalisation, orthogonal init, the forget bias and the linear schedule through the whole run:
    a killed run continues bit for bit (weights, averaged weights, schedule), and the run loads and scores."""
    import tomllib

    from moglm.runs.language_model import load_run

    cfg = tiny_config(tiny_corpus, model={"architecture": "multiplicative_lstm", "cell": {}, "weight_norm": True,
                                          "orthogonal_init": 1.0, "forget_bias": 3.0},
                      train={"max_steps": 14, "eval_every": 4, "averaging_patience": 1, "adam_beta1": 0.9,
                             "learning_rate_schedule": "linear", "min_learning_rate": 0.001})
    _kill_at_7_and_resume(cfg, tmp_path)
    assert any("parametrizations" in k for k in _weights(tmp_path / "killed"))  # g and v were checkpointed
    rates = [r["learning_rate"] for r in LanguageModelRun(tmp_path / "killed").read_metrics() if r["kind"] == "train"]
    assert rates == sorted(rates, reverse=True) and rates[-1] == pytest.approx(0.001)
    saved = tomllib.loads((tmp_path / "killed" / "config.toml").read_text())
    assert saved["model"]["weight_norm"] is True and saved["train"]["learning_rate_schedule"] == "linear"
    run = load_run(tmp_path / "killed")
    assert run.score("the cat sees the dog .\n").tokens > 0


def test_a_run_saved_before_the_recipe_fields_existed_still_resumes(tiny_corpus, tmp_path):
    """Fields added with defaults (the mLSTM recipe's) are not written while they hold them, so a run directory
    made by an earlier release, whose config.toml lacks them, matches the config that resumes it."""
    cfg = tiny_config(tiny_corpus, train={"max_steps": 4})
    _train(cfg, tmp_path / "run")
    text = (tmp_path / "run" / "config.toml").read_text()
    assert "weight_norm" not in text and "adam_beta1" not in text and "learning_rate_schedule" not in text
    _train(cfg, tmp_path / "run")  # no "different config" error: it finds the run finished


def test_a_run_directory_with_a_different_config_is_refused(tiny_corpus, tmp_path):
    _train(tiny_config(tiny_corpus, train={"max_steps": 4}), tmp_path / "run")
    with pytest.raises(MoglmError, match="different config .*train.learning_rate"):
        _train(tiny_config(tiny_corpus, train={"max_steps": 4, "learning_rate": 0.5}), tmp_path / "run")


def test_the_run_directory_holds_config_metrics_checkpoints_and_a_plot(tiny_corpus, tmp_path):
    _train(tiny_config(tiny_corpus), tmp_path / "run")
    run = LanguageModelRun(tmp_path / "run")
    assert run.load_config().format_version == 1
    assert run.plot_path.stat().st_size > 1000
    kinds = {r["kind"] for r in run.read_metrics()}
    assert kinds == {"train", "valid"}
    files = {p.name for p in run.checkpoints.pointer("last")["path"].iterdir()}
    assert {"model.safetensors", "training.safetensors", "state.json"} <= files
    assert json.loads(run.model_info_path.read_text())["hidden_size"] == 24


def test_tensorboard_gets_hyperparameters_throughput_gradient_norm_and_learning_rate(tiny_corpus, tmp_path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    _train(tiny_config(tiny_corpus), tmp_path / "run")
    events = event_accumulator.EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"train/xent", "train/grad_norm", "train/tokens_per_s", "train/learning_rate", "valid/xent"} <= scalars
    assert "hparam/best_valid_xent" in scalars  # written with the hyperparameters at the end
    plugins = events.PluginTagToContent("hparams")
    assert plugins, "no hyperparameter summary"
    assert any(b"model.cell.rounds" in content for content in plugins.values())


def test_cuda_graphs_asked_for_on_cpu_are_refused_in_one_line(tiny_corpus, tmp_path):
    cfg = tiny_config(tiny_corpus, train={"cuda_graphs": True})  # the tiny config trains on the CPU
    with pytest.raises(MoglmError, match=r"^train.cuda_graphs needs one CUDA device \(.*the device here is cpu\)$"):
        _train(cfg, tmp_path / "run")


def test_auto_cuda_graphs_are_off_on_cpu_without_a_word(tiny_corpus, tmp_path):
    lines: list[str] = []
    trainer = Trainer(tiny_config(tiny_corpus, train={"max_steps": 2}), tmp_path / "run", progress=False,
                      log=lines.append)
    trainer.train()
    assert trainer.engine.graphed is False and not any("CUDA graphs" in line for line in lines)


def test_a_run_saved_with_cuda_graphs_false_resumes_under_auto(tiny_corpus, tmp_path):
    """train.cuda_graphs was false by default before auto: a run directory of that release, whose config.toml
    says false, is the same run as the auto config that resumes it; auto is not written (nor is false)."""
    cfg = tiny_config(tiny_corpus, train={"max_steps": 4})
    assert cfg.train.cuda_graphs is None
    _train(cfg, tmp_path / "run")
    path = tmp_path / "run" / "config.toml"
    assert "cuda_graphs" not in path.read_text()
    path.write_text(path.read_text().replace("[train]\n", "[train]\ncuda_graphs = false\n"))
    assert LanguageModelRun(tmp_path / "run").load_config().train.cuda_graphs is False
    _train(cfg, tmp_path / "run")  # no "different config" error: it finds the run finished
    _train(tiny_config(tiny_corpus, train={"max_steps": 4, "cuda_graphs": False}), tmp_path / "run")
    with pytest.raises(MoglmError, match="different config .*train.cuda_graphs"):
        _train(tiny_config(tiny_corpus, train={"max_steps": 4, "cuda_graphs": True}), tmp_path / "run")


@pytest.mark.parametrize("asked", [None, True])
def test_a_failed_capture_in_training_falls_back_with_one_line_and_the_weights_of_plain_training(
        tiny_corpus, tmp_path, fake_cuda, monkeypatch, asked):
    """With graphs on (a CUDA device faked), a capture that fails turns graphs off with one line through the
    engine's log, and the steps and validations run ungraphed: the run ends with the weights of a run without."""
    from moglm.recurrence import cuda_graphs

    overrides = {"model": {"backend": "fused"}, "train": {"max_steps": 6}}
    cfg = tiny_config(tiny_corpus, **overrides)
    _train(cfg, tmp_path / "plain")
    cuda = fake_cuda(refuse_capture)
    real = cuda_graphs.resolve
    monkeypatch.setattr(cuda_graphs, "resolve", lambda setting, device, *a: real(setting, "cuda", *a))
    lines: list[str] = []
    cfg = tiny_config(tiny_corpus, model=overrides["model"], train={**overrides["train"], "cuda_graphs": asked})
    trainer = Trainer(cfg, tmp_path / "graphed", progress=False, log=lines.append)
    trainer.train()
    assert trainer.engine.graphed and cuda.captures == 1
    graph_lines = [line for line in lines if "CUDA graphs" in line]
    assert len(graph_lines) == 1 and "capturing a window failed (RuntimeError: CUDA error: operation" in graph_lines[0]
    assert ("although they were asked for" in graph_lines[0]) == bool(asked)
    plain, graphed = _weights(tmp_path / "plain"), _weights(tmp_path / "graphed")
    assert plain.keys() == graphed.keys() and all(torch.equal(plain[k], graphed[k]) for k in plain)
