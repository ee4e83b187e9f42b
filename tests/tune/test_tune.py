"""moglm tune: search-space files, a study with worker processes, resuming, failures, the best config."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
from conftest import tiny_config
from optuna.trial import TrialState

from moglm.cli import main
from moglm.errors import MoglmError
from moglm.train import TrainingDiverged
from moglm.runs.config import load_config
from moglm.tune import run_study, shipped_spaces, write_report
from moglm.train import trainer as trainer_module
from moglm.tune.objective import fit_rank, prepare
from moglm.tune.plots import near_best
from moglm.tune.search_space import load_space, validate_space
from moglm.tune.study import open_storage

SPACE = """
base = "{base}"
[study]
sampler = "gp"
seed = 0
startup_trials = 2
[pruner]
startup_trials = 2
[budget]
trials = 4
[params]
"train.learning_rate" = {{ low = 0.002, high = 0.02, log = true }}
"model.state_dropout" = {{ low = 0.0, high = 0.5 }}
"model.cell.rank" = {{ low = -20, high = 100, int = true }}
"model.tie_embeddings" = {{ choices = [true, false] }}
"""


@pytest.fixture
def space(tiny_corpus, tmp_path):
    base = tmp_path / "tiny.toml"
    base.write_text(tiny_config(tiny_corpus, train={"max_steps": 8}).to_toml())
    path = tmp_path / "space.toml"
    path.write_text(SPACE.format(base=base))
    return path


def _trials(directory: Path, name: str = "space") -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name=name, storage=open_storage(str(directory / "study.journal")))
    return study.get_trials()


@pytest.mark.slow
def test_study_with_two_workers_resumes_and_its_best_config_trains(space, tmp_path, capsys):
    study_dir = tmp_path / "study"
    assert main(["tune", str(space), "--workers", "2", "--study-dir", str(study_dir)]) == 0
    out = capsys.readouterr().out
    assert "running up to 4 with 2 workers x 1 thread" in out and "best: trial" in out
    trials = _trials(study_dir)
    assert len(trials) == 4 and all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    assert sorted(t.user_attrs["run"] for t in trials) == [0, 1, 2, 3]
    assert len({t.user_attrs["host"] for t in trials}) == 1
    for name in ("best.toml", "summary.txt", "parallel_coordinate.png", "optimization_history.png"):
        assert (study_dir / name).is_file(), name
    # resume: the total grows by one, then the same total runs nothing new
    again = ["tune", str(space), "--trials", "5", "--threads", "1", "--study-dir", str(study_dir), "--no-plots"]
    assert main(again) == 0
    assert "4 of 5 trials exist; running up to 1" in capsys.readouterr().out
    assert len(_trials(study_dir)) == 5
    assert main(again) == 0
    assert "5 of 5 trials exist; nothing to run" in capsys.readouterr().out
    assert len(_trials(study_dir)) == 5
    # only the best trial keeps its checkpoints
    done = [t for t in _trials(study_dir) if t.state == TrialState.COMPLETE]
    best = min(done, key=lambda t: t.value)
    kept = [p.parent.name for p in study_dir.glob("trials/*/checkpoints")]
    assert kept == [f"{best.user_attrs['run']:04d}"]
    # the best config: provenance, the tuned values, no trial token budget; `moglm train` takes it
    text = (study_dir / "best.toml").read_text()
    assert f"# trial {best.number} of 5: valid xent {best.value:.4f}" in text and "study 'space'" in text
    cfg = load_config(study_dir / "best.toml")
    assert cfg.name == "space-best" and cfg.train.max_tokens is None
    assert math.isclose(cfg.train.learning_rate, best.params["train.learning_rate"])
    run = tmp_path / "best-run"
    quick = ["train.max_steps=2", "train.eval_every=2", "train.threads=1", "sample.num_tokens=0",
             "evaluation.splits=[valid]"]
    assert main(["train", str(study_dir / "best.toml"), *[a for q in quick for a in ("--set", q)],
                 "--run-dir", str(run), "--no-progress"]) == 0
    assert "valid ppl" in capsys.readouterr().out and (run / "results.json").is_file()


class _FailingTrainer(trainer_module.Trainer):
    """Trial 1 runs out of memory, trial 2 diverges; the others train."""

    calls = 0

    def train(self):
        type(self).calls += 1
        if self.calls == 2:
            raise RuntimeError("DefaultCPUAllocator: not enough memory (simulated)")
        if self.calls == 3:
            raise TrainingDiverged("non-finite loss at step 3 (simulated)")
        return super().train()


def test_failing_trials_are_recorded_and_the_study_goes_on(space, tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_module, "Trainer", _FailingTrainer)  # what train_and_evaluate runs
    result = run_study(space, study_dir=tmp_path / "study", trials=4, threads=1, log=lambda s: None)
    states = [t.state for t in result.study.get_trials()]
    assert states.count(TrialState.FAIL) == 2 and len(states) == 4
    errors = [t.user_attrs["error"] for t in result.study.get_trials() if t.state == TrialState.FAIL]
    assert errors == ["RuntimeError: DefaultCPUAllocator: not enough memory (simulated)",
                      "TrainingDiverged: non-finite loss at step 3 (simulated)"]
    summary = write_report(result, plots=False)
    assert "2 fail" in summary and "failed: trial 1: RuntimeError" in summary and "best: trial" in summary


class _InterruptedTrainer(trainer_module.Trainer):
    """The first trial is interrupted (Ctrl-C) after its first checkpoint."""

    interrupted = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not type(self).interrupted:
            type(self).interrupted = True
            self.on_step = self._interrupt

    def _interrupt(self, step):
        if step == 5:
            raise trainer_module.TrainingInterrupted("interrupted at step 5")


def test_an_interrupted_trial_resumes_in_its_run_directory(space, tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_module, "Trainer", _InterruptedTrainer)
    with pytest.raises(MoglmError, match="rerun the same command to resume"):
        run_study(space, study_dir=tmp_path / "study", trials=2, threads=1, log=lambda s: None)
    result = run_study(space, study_dir=tmp_path / "study", trials=2, threads=1, log=lambda s: None)
    trials = result.study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    assert trials[1].user_attrs["replaces"] == 0 and trials[1].user_attrs["run"] == 0
    assert trials[1].params == trials[0].params
    log = (tmp_path / "study" / "trials" / "0000" / "tune.log").read_text()
    assert "resuming" in log  # training continued from the step-4 checkpoint


def test_a_rank_above_the_sizes_is_trained_as_full_rank(tiny_corpus):
    vocab = 13
    cfg, changed = fit_rank(tiny_config(tiny_corpus, model={"cell": {"rounds": 3, "rank": 66}}), vocab)
    assert cfg.model.cell["rank"] == 0 and changed == {"model.cell.rank": 0}
    for rounds, rank in ((3, 24), (3, 4), (3, 0), (3, -20), (0, 66)):  # fits (embedding = hidden = 24), full rank
        cfg, changed = fit_rank(tiny_config(tiny_corpus, model={"cell": {"rounds": rounds, "rank": rank}}), vocab)
        assert cfg.model.cell["rank"] == rank and changed == {}  # or no mogrifier rounds at all
    small_embedding = {"input_embedding_ratio": 0.5, "cell": {"rounds": 3, "rank": 13}}
    assert fit_rank(tiny_config(tiny_corpus, model=small_embedding), vocab)[1] == {"model.cell.rank": 0}
    budget = {"hidden_size": None, "num_params": 60_000, "input_embedding_ratio": 0.25,
              "cell": {"rounds": 2, "rank": 90}}
    cfg, changed = fit_rank(tiny_config(tiny_corpus, model=budget), vocab)  # no hidden size in budget fits k = 90
    assert changed == {"model.cell.rank": 0}


def test_every_shipped_space_loads_and_validates():
    spaces = shipped_spaces()
    assert {"mogrifier", "lstm", "enwik8-mogrifier", "enwik8-lstm", "dyneval-word", "dyneval-char"} <= set(spaces)
    for name in spaces:
        space, path = load_space(name)
        if space.target == "train":
            base = space.base or ("ptb-char-mogrifier-paper" if "mogrifier" in name else "ptb-char-lstm-paper")
            prepare(space, name, base, [], None, Path("studies"))
        elif space.target == "dyneval":  # run in test_a_dynamic_evaluation_study_tunes_a_trained_run
            assert {k.split(".", 1)[1] for k in space.params} == {"lr", "decay", "eps", "segment_length"}
        else:  # reverse copy: run in test_a_reverse_copy_study_trains_the_task_and_yields_the_best_settings
            assert set(space.params) == {"learning_rate", "l2_penalty"} and space.fixed["train_examples"] == 500_000
    mogrifier, _ = load_space("mogrifier")
    table4 = {k: (p.low, p.high, p.log) for k, p in mogrifier.params.items()}
    assert table4["train.learning_rate"] == (0.001, 0.004, True)
    assert table4["model.cell.rank"] == (-20, 100, False) and table4["model.output_dropout"] == (0.0, 0.95, False)
    assert load_space("dyneval-char")[0].params["dyneval.segment_length"].high == 50


@pytest.mark.parametrize(
    "text, message",
    [
        ('bse = "x"\n[params]\n"train.learning_rate" = { low = 0.001, high = 0.004 }', "unknown key 'bse'"),
        ('[params]\n"train.lerning_rate" = { low = 0.001, high = 0.004 }',
         "params.train.lerning_rate: no such config field"),
        ('[params]\n"train.learning_rate" = { low = 0.004, high = 0.001 }',
         "params.train.learning_rate: low (0.004) must be below high (0.001)"),
        ('[params]\n"train.l2_penalty" = { low = 0.0, high = 0.001, log = true }',
         "params.train.l2_penalty: log spacing needs low > 0"),
        ('[params]\n"train.learning_rate" = { low = 0.001, hi = 0.004 }',
         "unknown key 'params.train.learning_rate.hi'"),
        ('[budget]\ntrials = "many"\n[params]\n"train.learning_rate" = { low = 0.001, high = 0.004 }',
         "budget.trials: Input should be a valid integer"),
        ('[study]\nsampler = "vizier"\n[params]\n"train.learning_rate" = { low = 0.001, high = 0.004 }',
         "study.sampler: Input should be 'gp', 'tpe' or 'random'"),
        ("[params]\n", "params: Dictionary should have at least 1 item"),
        ('base = "ptb-word-lstm-cpu"\n[params]\n"model.cell.rounds" = { low = 0, high = 6, int = true }',
         "cell.rounds: unknown option for lstm"),
    ],
)
def test_a_malformed_space_is_one_line_naming_the_field(text, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "bad.toml"
    path.write_text(text + "\n")
    assert main(["tune", str(path), "--base", "ptb-word-mogrifier-cpu"] if "base =" not in text
                else ["tune", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1, err


def test_near_best_uses_each_parameters_range():
    a, b, c = "model.state_dropout", "train.l2_penalty", "model.architecture"
    space = validate_space({"params": {a: {"low": 0.0, "high": 1.0}, b: {"low": 1e-4, "high": 1.0, "log": True},
                                       c: {"choices": ["lstm", "mogrifier"]}}})
    dist = {a: optuna.distributions.FloatDistribution(0, 1),
            b: optuna.distributions.FloatDistribution(1e-4, 1, log=True),
            c: optuna.distributions.CategoricalDistribution(["lstm", "mogrifier"])}

    def trial(x, y, z):
        return optuna.trial.create_trial(params={a: x, b: y, c: z}, distributions=dist, value=1.0)

    best = trial(0.5, 1e-2, "lstm")
    trials = [best, trial(0.6, 1.2e-2, "lstm"), trial(0.7, 1e-2, "lstm"), trial(0.5, 1e-1, "lstm"),
              trial(0.5, 1e-2, "mogrifier")]
    assert near_best(trials, best, space, 0.15) == trials[:2]  # 1e-1 is 25% of b's log range away


def test_the_trial_of_a_dead_worker_is_queued_again_once():
    from moglm.tune.objective import requeue_stale_trial
    from moglm.tune.study import counted_trials

    study = optuna.create_study()
    dist = {"train.learning_rate": optuna.distributions.FloatDistribution(0.001, 0.004, log=True)}
    dead = optuna.trial.create_trial(params={"train.learning_rate": 0.002}, distributions=dist,
                                     state=TrialState.FAIL, user_attrs={"run": 0, "config": {}})
    study.add_trial(dead)
    requeue_stale_trial(study, study.trials[0])
    waiting = study.trials[1]
    assert waiting.state == TrialState.WAITING and waiting.params == {}  # params are fixed when it starts
    assert waiting.user_attrs == {"run": 0, "replaces": 0, "attempt": 2}
    assert waiting.system_attrs["fixed_params"] == {"train.learning_rate": 0.002}
    assert counted_trials(study) == []  # the dead trial is replaced; the waiting one counts once it starts
    again = optuna.trial.create_trial(params={"train.learning_rate": 0.002}, distributions=dist,
                                      state=TrialState.FAIL, user_attrs={"run": 0, "config": {}, "attempt": 2})
    study.add_trial(again)
    requeue_stale_trial(study, study.trials[-1])
    assert len(study.trials) == 3  # a second death is not retried


def test_a_killed_and_requeued_trial_does_not_shift_the_seeds_of_the_trials_after_it():
    """The next trial's sampler seed counts trials as the budget does, so a resumed study draws what an
    uninterrupted one draws."""
    from moglm.tune.objective import requeue_stale_trial
    from moglm.tune.study import counted_trials, trial_seed

    dist = {"train.learning_rate": optuna.distributions.FloatDistribution(0.001, 0.004, log=True)}

    def trial(state, **attrs):
        return optuna.trial.create_trial(params={"train.learning_rate": 0.002}, distributions=dist, state=state,
                                         value=1.0 if state == TrialState.COMPLETE else None,
                                         user_attrs={"run": 0, "config": {}, **attrs})

    plain, killed = optuna.create_study(), optuna.create_study()
    plain.add_trials([trial(TrialState.COMPLETE), trial(TrialState.COMPLETE)])
    killed.add_trials([trial(TrialState.COMPLETE), trial(TrialState.FAIL)])
    requeue_stale_trial(killed, killed.trials[1])
    killed.add_trial(trial(TrialState.COMPLETE, replaces=1))  # the re-queued trial, run
    assert len(killed.trials) == 4
    seeds = [trial_seed(7, len(counted_trials(study)), 0) for study in (plain, killed)]
    assert seeds[0] == seeds[1]


DYNEVAL = """
target = "dyneval"
[study]
sampler = "tpe"
startup_trials = 2
[budget]
trials = 3
max_tokens = 100
[fixed]
"dyneval.stats_fraction" = 0.2
[params]
"dyneval.lr" = { low = 1e-6, high = 1e-3, log = true }
"dyneval.segment_length" = { low = 1, high = 5, int = true }
"""


def test_a_dynamic_evaluation_study_tunes_a_trained_run(tiny_corpus, tmp_path, capsys):
    run = tmp_path / "run"
    trainer_module.Trainer(tiny_config(tiny_corpus, train={"max_steps": 8, "threads": 1}), run, progress=False,
                           log=lambda s: None).train()
    space = tmp_path / "dyneval.toml"
    space.write_text(DYNEVAL)
    result = run_study(space, base=str(run), study_dir=tmp_path / "study", threads=1, log=lambda s: None)
    trials = result.study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3 and all(math.isfinite(t.value) for t in trials)
    assert all(t.value < t.user_attrs["static_xent"] + 1 for t in trials)
    summary = write_report(result, plots=False)
    assert "dynamic-evaluation cross-entropy" in summary
    text = (tmp_path / "study" / "best_dyneval.toml").read_text()
    assert "[dyneval]" in text and f"# apply: moglm dyneval {run.resolve()} --rule rms-rmsdecay" in text
    assert " --learning-rate " in text and " --lr " not in text  # the command line's name of dyneval.lr
    # the shipped table-6 space runs too; a key that is no dynamic-evaluation setting is a one-line error
    run_study("dyneval-word", base=str(run), study_dir=tmp_path / "word", trials=1, threads=1, max_tokens=60,
              log=lambda s: None)
    space.write_text(DYNEVAL.replace('"dyneval.lr"', '"dyneval.learning_rate"'))
    assert main(["tune", str(space), "--base", str(run), "--study-dir", str(tmp_path / "bad")]) == 1
    assert "params.dyneval.learning_rate: not a dynamic-evaluation setting" in capsys.readouterr().err


def test_a_trial_prints_its_evaluations_and_titles_its_learning_curve(space, tmp_path, capsys):
    study_dir = tmp_path / "study"
    args = ["tune", str(space), "--trials", "1", "--threads", "1", "--study-dir", str(study_dir), "--no-plots"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "[trial 0] step 8: valid" in out  # a line per evaluation while the trial trains
    name = load_config(study_dir / "trials" / "0000" / "config.toml").name
    assert name.startswith("space trial 0: learning_rate=") and "rank=" in name  # its learning curve's title
    assert (study_dir / "trials" / "0000" / "learning_curve.png").is_file()
    assert main([*args, "--trials", "2", "--no-progress"]) == 0
    assert "[trial 1]" not in capsys.readouterr().out


def test_tune_token_budgets_and_the_old_option(space, tmp_path, capsys):
    args = ["tune", str(space), "--trials", "1", "--threads", "1", "--study-dir", str(tmp_path / "s"), "--no-plots",
            "--no-progress"]
    assert main([*args, "--max-tokens", "40"]) == 0
    assert "warning: --max-tokens is deprecated" in capsys.readouterr().err
    trial = _trials(tmp_path / "s")[0]
    assert trial.user_attrs["tokens"] <= 40 + 4 * 10  # batch 4 x bptt 10: the budget rounds up to a step


TINY_REVERSE_COPY = {"num_params": None, "hidden_size": 8, "vocab_size": 6, "min_length": 2, "max_length": 4,
                     "train_examples": 40, "valid_examples": 12, "test_examples": 12, "batch_size": 8, "steps": 6,
                     "eval_every": 3, "cell": {"rounds": 2}}


def test_a_reverse_copy_study_trains_the_task_and_yields_the_best_settings(tmp_path, capsys):
    import json

    from moglm.tune.reverse_copy import tune_reverse_copy

    study_dir = tmp_path / "study"
    best = tune_reverse_copy("reverse-copy-mogrifier", study_dir, TINY_REVERSE_COPY, trials=2, threads=1,
                             log=lambda s: None)
    assert set(best) == {"learning_rate", "l2_penalty"} and 3e-4 <= best["learning_rate"] <= 1e-2
    result = run_study("reverse-copy-mogrifier", study_dir=study_dir, trials=2, threads=1, log=lambda s: None,
                       overrides=[f"{k}={json.dumps(v)}" for k, v in TINY_REVERSE_COPY.items()])
    trials = result.study.get_trials()  # resumed: the study already has its 2 trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2 and result.study.best_params == best
    for t in trials:
        run = study_dir / "trials" / f"{t.number:04d}"
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        valid = [m["xent"] for m in metrics if m["kind"] == "valid"]
        assert t.intermediate_values == {3: valid[0], 6: valid[1]}  # every validation reported for pruning
        assert t.value == pytest.approx(min(valid))  # the objective: the best validation cross-entropy
        config = t.user_attrs["config"]
        assert config["architecture"] == "mogrifier" and config["cell"] == {"rounds": 2}
        assert config["learning_rate"] == t.params["learning_rate"]
    summary = write_report(result, plots=False)
    assert "reverse copy: validation cross-entropy" in summary
    text = (study_dir / "best_reverse_copy.toml").read_text()
    assert "# train: moglm task reverse-copy " in text and f"learning_rate = {best['learning_rate']}" in text
    with pytest.raises(MoglmError, match="other settings"):  # a study directory keeps its fixed settings
        tune_reverse_copy("reverse-copy-mogrifier", study_dir, {**TINY_REVERSE_COPY, "vocab_size": 7}, trials=2)
    # from the command line: a length replaces the space's range; keys are checked before any trial
    settings = [x for k, v in TINY_REVERSE_COPY.items() if k not in ("min_length", "max_length", "cell")
                for x in ("--set", f"{k}={json.dumps(v)}")]
    args = ["tune", "reverse-copy-lstm", "--trials", "1", "--threads", "1", "--no-plots", "--no-progress"]
    assert main([*args, "--study-dir", str(tmp_path / "cli"), *settings, "--set", "length=3"]) == 0
    (trial,) = optuna.load_study(study_name="reverse-copy-lstm",
                                 storage=open_storage(str(tmp_path / "cli" / "study.journal"))).get_trials()
    assert trial.user_attrs["config"]["length"] == 3 and "min_length" not in trial.user_attrs["config"]
    capsys.readouterr()
    assert main([*args, "--study-dir", str(tmp_path / "bad"), "--set", "lenght=3"]) == 1
    assert "lenght: not a reverse-copy setting" in capsys.readouterr().err
