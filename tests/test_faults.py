"""The fault suite: damaged files, concurrent runs and bad input end in a one-line error or a recovery, with
nothing lost. Each case runs the command line as a user would and checks stderr has no traceback. (Ctrl-C
and SIGTERM during training are in test_train_trainer.py, beside the other resume tests.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import tiny_config, write_tiny_corpus
import fault_injection
from fault_injection import CANNOT_DROP_OVERRIDE, STAGES, inject
from moglm.cli import main
from moglm.errors import MoglmError
from moglm.runs import RunDirectory
from moglm.train import Trainer


def _train(cfg, run_dir, **kw):
    return Trainer(cfg, run_dir, progress=False, log=kw.pop("log", lambda s: None), **kw).train()


def _losses(run_dir):
    return [(r["kind"], r["step"], r["xent"]) for r in RunDirectory(run_dir).read_metrics()]


@pytest.fixture
def config_file(tiny_corpus, tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(tiny_config(tiny_corpus, train={"max_steps": 8}, sample={"num_tokens": 0}).to_toml())
    return path


def _cli(args, capsys):
    code = main([*map(str, args), *(["--no-progress"] if args[0] in ("train", "evaluate") else [])])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def _damage(run, what):
    store = RunDirectory(run).checkpoints
    last = store.pointer("last")["path"]
    if what == "truncated weights":
        path = last / "model.safetensors"
        path.write_bytes(path.read_bytes()[:100])
    elif what == "flipped bit":
        path = last / "model.safetensors"
        data = bytearray(path.read_bytes())
        data[-5] ^= 0x10
        path.write_bytes(bytes(data))
    elif what == "truncated state":
        (last / "state.json").write_text('{"progress": {')
    elif what == "pointer is a list":
        (store.root / "last.json").write_text("[1, 2]")


@pytest.mark.parametrize("what", ["truncated weights", "flipped bit", "truncated state", "pointer is a list"])
@pytest.mark.slow
def test_a_damaged_last_checkpoint_falls_back_to_the_previous_one_and_resumes_exactly(tiny_corpus, tmp_path, what):
    cfg = tiny_config(tiny_corpus, train={"max_steps": 12})
    _train(cfg, tmp_path / "straight")

    class Killed(Exception):
        pass

    def kill_at_9(step):
        if step == 9:
            raise Killed

    with pytest.raises(Killed):
        _train(cfg, tmp_path / "run", on_step=kill_at_9)  # checkpoints at 4 and 8
    _damage(tmp_path / "run", what)
    lines = []
    _train(cfg, tmp_path / "run", log=lines.append)
    assert any("falling back to the previous checkpoint (step 4)" in line for line in lines)
    assert _losses(tmp_path / "run") == _losses(tmp_path / "straight")


@pytest.mark.parametrize("what", ["flipped bit", "truncated weights"])
def test_evaluating_a_damaged_best_checkpoint_is_a_one_line_error_and_keeps_the_results(config_file, tmp_path,
                                                                                        capsys, what):
    run = tmp_path / "run"
    assert _cli(["train", config_file, "--run-dir", run], capsys)[0] == 0
    results = (run / "results.json").read_text()
    store = RunDirectory(run).checkpoints
    store.point("last", store.pointer("best")["path"], step=8)  # the damaged one is also the last
    (store.root / "previous.json").unlink(missing_ok=True)
    _damage(run, what)
    code, err = _cli(["evaluate", run], capsys)
    assert code == 1 and "model.safetensors" in err and err.count("\n") == 1
    assert (run / "results.json").read_text() == results  # not overwritten with scores of damaged weights


def test_a_pointer_without_dir_is_a_one_line_error_naming_the_file(config_file, tmp_path, capsys):
    run = tmp_path / "run"
    assert _cli(["train", config_file, "--run-dir", run], capsys)[0] == 0
    (run / "checkpoints" / "best.json").write_text('{"step": 8}')
    code, err = _cli(["evaluate", run], capsys)
    assert code == 1 and "best.json: corrupt checkpoint pointer" in err


def _hold(run):
    """A process holding ``run``'s lock (until killed)."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from moglm.runs import RunDirectory\n"
        f"with RunDirectory({str(run)!r}).lock():\n    print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_trainer_on_the_same_run_directory_is_refused_with_the_holders_pid(tiny_corpus, tmp_path):
    run = RunDirectory(tmp_path / "run")
    holder = _hold(run.path)
    try:
        with pytest.raises(MoglmError, match=rf"in use by another moglm process \(pid {holder.pid}\)"):
            _train(tiny_config(tiny_corpus), run.path)
    finally:
        holder.kill()
        holder.wait()
    _train(tiny_config(tiny_corpus), run.path)  # a killed holder releases the lock


@pytest.mark.slow
def test_restart_while_another_trainer_runs_is_refused_and_removes_nothing(config_file, tmp_path, capsys):
    run = tmp_path / "run"
    assert _cli(["train", config_file, "--run-dir", run], capsys)[0] == 0
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    holder = _hold(run)
    try:
        code, err = _cli(["train", config_file, "--run-dir", run, "--restart"], capsys)
        assert code == 1 and f"in use by another moglm process (pid {holder.pid})" in err and err.count("\n") == 1
        assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
    finally:
        holder.kill()
        holder.wait()
    (run / "results.json").write_text("{}")
    assert _cli(["train", config_file, "--run-dir", run, "--restart"], capsys)[0] == 0
    assert json.loads((run / "results.json").read_text())["splits"]  # trained again from the start


def test_records_of_a_run_killed_before_its_first_checkpoint_are_not_duplicated(tiny_corpus, tmp_path):
    cfg = tiny_config(tiny_corpus, train={"max_steps": 12, "eval_every": 12})  # a training record at step 10

    class Killed(Exception):
        pass

    def kill_at_11(step):
        if step == 11:
            raise Killed

    _train(cfg, tmp_path / "straight")
    with pytest.raises(Killed):
        _train(cfg, tmp_path / "run", on_step=kill_at_11)
    assert RunDirectory(tmp_path / "run").read_metrics()  # records written before the kill
    _train(cfg, tmp_path / "run")
    assert _losses(tmp_path / "run") == _losses(tmp_path / "straight")


def test_temporary_files_a_kill_left_in_the_checkpoint_folder_are_removed(tiny_corpus, tmp_path):
    cfg = tiny_config(tiny_corpus)
    _train(cfg, tmp_path / "run", on_step=None)
    root = tmp_path / "run" / "checkpoints"
    (root / ".last.json.abc123.tmp.json").write_text("{")
    (root / ".tmp-step-00000099-xyz").mkdir()
    RunDirectory(tmp_path / "run").checkpoints.prune()
    assert not (root / ".last.json.abc123.tmp.json").exists() and not (root / ".tmp-step-00000099-xyz").exists()
    assert json.loads((root / "last.json").read_text())["step"] == 12


@pytest.mark.parametrize("args, message", [
    (["--logit-factor", "0"], "logit factor) must be a finite number > 0, got 0.0"),
    (["--logit-factor", "-2"], "must be a finite number > 0, got -2.0"),
    (["--batch-size", "0"], "batch size must be >= 1, got 0"),
    (["--mc-samples", "-1"], "MC-dropout samples must be >= 0, got -1"),
])
def test_evaluate_arguments_that_would_give_wrong_scores_are_one_line_errors(config_file, tmp_path, capsys, args,
                                                                              message):
    run = tmp_path / "run"
    assert _cli(["train", config_file, "--run-dir", run], capsys)[0] == 0
    results = (run / "results.json").read_text()
    code, err = _cli(["evaluate", run, *args], capsys)
    assert code != 0 and message in err and (run / "results.json").read_text() == results


@pytest.mark.parametrize("name, cut", [("vocab.json", 40), ("vocab.json", 0), ("model.json", 30)])
def test_a_damaged_vocabulary_or_model_file_is_a_one_line_error_naming_it(config_file, tmp_path, capsys, name, cut):
    run = tmp_path / "run"
    assert _cli(["train", config_file, "--run-dir", run], capsys)[0] == 0
    path = run / name
    path.write_text(path.read_text()[:cut] if cut else '{"level": "word"}')
    code, err = _cli(["evaluate", run], capsys)
    assert code == 1 and f"{path}: damaged" in err and err.count("\n") == 1


def test_a_run_directory_that_is_a_file_is_a_one_line_error(config_file, tmp_path, capsys):
    code, err = _cli(["train", config_file, "--run-dir", config_file], capsys)
    assert code == 1 and f"{config_file}: cannot create the run directory" in err and err.count("\n") == 1


def test_sample_with_a_nan_temperature_is_a_one_line_error(config_file, tmp_path, capsys):
    run = tmp_path / "run"
    assert _cli(["train", config_file, "--run-dir", run], capsys)[0] == 0
    code, err = _cli(["sample", run, "--temperature", "nan"], capsys)
    assert code == 1 and "temperature must be a finite number > 0, got nan" in err


def test_evaluating_after_the_corpus_changed_is_refused(config_file, tiny_corpus, tmp_path, capsys):
    run = tmp_path / "run"
    assert _cli(["train", config_file, "--run-dir", run], capsys)[0] == 0
    with open(tiny_corpus / "test.txt", "a") as f:
        f.write("the owl sees the cat .\n")
    code, err = _cli(["evaluate", run], capsys)
    assert code == 1 and "changed since this run trained on it" in err


def test_a_read_only_run_directory_prints_the_results_and_says_they_were_not_saved(config_file, tmp_path, capsys,
                                                                                  monkeypatch):
    from moglm.train import final_evaluation

    run = tmp_path / "run"
    assert _cli(["train", config_file, "--run-dir", run], capsys)[0] == 0

    def read_only(path, data, seed=None):  # what a read-only folder does to the write (tests may run as root)
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(final_evaluation, "write_result", read_only)
    code = main(["evaluate", str(run), "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 1 and "valid:" in out and "Permission denied); the results printed above were not saved" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("name, content, message", [
    ("one character", "a", "split has no tokens"),
    ("byte-order mark only", "\ufeff", "file is empty"),
])
def test_bad_corpora_are_refused_before_training(tmp_path, capsys, name, content, message):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(content, encoding="utf-8")
    overrides = [f"data.path={corpus}", "data.format=char", "train.max_steps=2", "sample.prompt=''",
                 "model.hidden_size=8", "model.cell.rank=2", "train.batch_size=2", "train.bptt=4"]
    code, err = _cli(["train", "default", "--run-dir", tmp_path / "run", *[a for o in overrides for a in ("--set", o)]],
                     capsys)
    assert code == 1 and message in err
    assert [p.name for p in (tmp_path / "run").iterdir()] == [".lock"]  # nothing trained, no config kept


def test_crlf_and_a_byte_order_mark_do_not_become_tokens(tmp_path):
    from moglm.data.corpus import load_corpus

    corpus = tmp_path / "c.txt"
    corpus.write_bytes("\ufeff".encode() + b"ab cd\r\nef gh\r\n" * 50)
    loaded = load_corpus(str(corpus), "char")
    assert "\r" not in loaded.vocab.stoi and "\ufeff" not in loaded.vocab.stoi and "\n" in loaded.vocab.stoi


def test_a_damaged_corpus_cache_is_a_cache_miss(tiny_corpus):
    from moglm.data.corpus import cache_root, load_corpus

    first = load_corpus(str(tiny_corpus), "word")
    for meta in cache_root().glob("*/meta.json"):
        meta.write_text("{}")
    again = load_corpus(str(tiny_corpus), "word")
    assert again.digest() == first.digest()


def test_split_fractions_that_overlap_are_refused_before_training():
    from moglm.runs.config import load_config

    with pytest.raises(MoglmError, match=r"split_fractions: .*together at most 1"):
        load_config("default", ["data.split_fractions=[0.5, 0.5, 0.5]"])


@pytest.mark.parametrize("raised, message", [
    (RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 400000000000 bytes"),
     "out of memory (DefaultCPUAllocator"),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
                  "tried to allocate 160000000000000000 bytes. Error code 12 (Cannot allocate memory)"),
     "out of memory ([enforce fail"),
    (OSError(28, "No space left on device", "runs/x/checkpoints/step-00000004"),
     "no space left on the device writing runs/x/checkpoints/step-00000004"),
    (PermissionError(13, "Permission denied", "studies/s/study.db"), "cannot write studies/s/study.db (Permission"),
    (ZeroDivisionError("division by zero"), "ZeroDivisionError: division by zero (an internal error: rerun with --debug"),
])
def test_any_other_exception_is_one_line_and_debug_shows_the_traceback(monkeypatch, capsys, raised, message):
    from moglm.cli import info

    def explode(*args, **kwargs):
        raise raised

    monkeypatch.setattr(info, "describe", explode)
    code = main(["info"])
    err = capsys.readouterr().err
    assert code == 1 and message in err and err.count("\n") == 1 and "Traceback" not in err
    with pytest.raises(type(raised)):
        main(["info", "--debug"])


def _checkpoint_arrivals(run):
    """How often a straight run reached each stage of a checkpoint write (see fault_injection.STAGES)."""
    records = [r for r in RunDirectory(run).read_metrics() if r["kind"] == "valid"]
    n = len(records)
    return {**dict.fromkeys(STAGES, n), "previous pointer": n - 1, "best pointer": sum(r["best"] for r in records)}


def _results(run):
    """The run's results without their provenance (which records when and by which command they were made)."""
    results = json.loads((run / "results.json").read_text())
    assert results.pop("provenance")["seed"] == 1
    return results


@pytest.mark.parametrize("stage", [s for s in STAGES if s != "pruning"])
@pytest.mark.slow
def test_a_full_disk_inside_the_last_checkpoint_write_is_one_line_and_the_rerun_finishes_exactly(
        tiny_corpus, tmp_path, capsys, stage):
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(tiny_corpus, train={"max_steps": 12}, sample={"num_tokens": 0}).to_toml())
    straight, run = tmp_path / "straight", tmp_path / "run"
    assert _cli(["train", config, "--run-dir", straight], capsys)[0] == 0
    with inject(stage, "enospc", nth=_checkpoint_arrivals(straight)[stage]):  # the last checkpoint, step 12
        code, err = _cli(["train", config, "--run-dir", run], capsys)
    assert code == 1 and err.count("\n") == 1 and "error: no space left on the device writing" in err
    assert str(run / "checkpoints") in err
    store = RunDirectory(run).checkpoints
    assert store.open("last", log=pytest.fail)["step"] in (8, 12)  # valid as it is: no fallback needed
    assert not list(store.root.glob(".*"))  # no temporaries left
    assert _cli(["train", config, "--run-dir", run], capsys)[0] == 0
    assert _losses(run) == _losses(straight)
    assert _results(run) == _results(straight)


def _cli_as_owner(args, directory):
    """``moglm args`` in a fresh Python process that meets file modes as the files' owner does (as root, without
    the capabilities that ignore them); returns ``(exit code, stderr)``. A subprocess, not a fork: forking a
    process whose torch threads are running can deadlock the child."""
    done = subprocess.run([sys.executable, str(Path(fault_injection.__file__)), *map(str, args), "--no-progress"],
                          cwd=directory, capture_output=True, text=True, timeout=600)
    if done.returncode == CANNOT_DROP_OVERRIDE:
        pytest.skip(f"running as root where file modes cannot be enforced: {done.stderr.strip()}")
    return done.returncode, done.stderr


def _read_only(path):
    for p in [path, *path.rglob("*")]:
        p.chmod(p.stat().st_mode & ~0o222)


def _one_line(code, err, *names):
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert all(str(name) in err for name in names), err


@pytest.mark.slow
def test_training_in_a_read_only_run_directory_is_one_line(tmp_path):
    write_tiny_corpus(tmp_path / "tiny")
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(tmp_path / "tiny", train={"max_steps": 4}, sample={"num_tokens": 0}).to_toml())
    run = tmp_path / "run"
    assert _cli_as_owner(["train", config, "--run-dir", run], tmp_path)[0] == 0
    _read_only(run)
    _one_line(*_cli_as_owner(["train", config, "--run-dir", run], tmp_path), run, "cannot write")
    _one_line(*_cli_as_owner(["train", config, "--run-dir", run / "inner"], tmp_path), run / "inner",
              "Permission denied")


def _space(directory):
    write_tiny_corpus(directory / "tiny")
    base = directory / "tiny.toml"
    base.write_text(tiny_config(directory / "tiny", train={"max_steps": 4}, sample={"num_tokens": 0}).to_toml())
    space = directory / "space.toml"
    space.write_text(f'base = "{base}"\n[study]\nsampler = "random"\nseed = 0\n[budget]\ntrials = 1\n'
                     '[params]\n"train.learning_rate" = { low = 0.002, high = 0.02, log = true }\n')
    return space


def test_tuning_in_a_read_only_study_directory_is_one_line(tmp_path):
    space, study = _space(tmp_path), tmp_path / "study"
    study.mkdir()
    _read_only(study)
    _one_line(*_cli_as_owner(["tune", space, "--study-dir", study, "--no-plots"], tmp_path), study, "Permission denied")


@pytest.mark.parametrize("sqlite", [False, True], ids=["journal", "sqlite"])
@pytest.mark.slow
def test_adding_trials_to_a_read_only_study_is_one_line_naming_the_study(tmp_path, sqlite):
    space, study = _space(tmp_path), tmp_path / "study"
    storage = ["--storage", f"sqlite:///{study / 'study.db'}"] if sqlite else []
    study.mkdir()
    assert _cli_as_owner(["tune", space, "--study-dir", study, *storage, "--no-plots"], tmp_path)[0] == 0
    _read_only(study)
    code, err = _cli_as_owner(["tune", space, "--study-dir", study, *storage, "--no-plots", "--trials", "2"], tmp_path)
    _one_line(code, err, study)


# -- --restart deletes only what a run wrote; a sample never replaces a user's file -----------------------------

def _tree(folder):
    return sorted((str(p.relative_to(folder)), p.read_bytes() if p.is_file() else None) for p in folder.rglob("*"))


@pytest.mark.parametrize("run_dir", [".", "..", "~", "/"])
def test_the_working_folder_home_root_and_their_parents_are_never_a_run_folder(config_file, tmp_path, monkeypatch,
                                                                               capsys, run_dir):
    work = tmp_path / "work"
    work.mkdir()
    (work / "thesis.tex").write_text("my own work")
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(work))
    before = _tree(tmp_path)
    code, err = _cli(["train", config_file, "--run-dir", run_dir, "--restart"], capsys)
    assert code == 1 and "a run needs a folder of its own" in err and err.count("\n") == 1
    assert _tree(tmp_path) == before


def test_a_config_named_dot_dot_is_refused_before_anything_is_written(tiny_corpus, tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    work.mkdir()
    (work / "thesis.tex").write_text("my own work")
    config = work / "cfg.toml"
    config.write_text(tiny_config(tiny_corpus).model_copy(update={"name": ".."}).to_toml())
    monkeypatch.chdir(work)
    before = _tree(tmp_path)
    code, err = _cli(["train", config, "--restart"], capsys)
    assert code == 1 and "name '..' is not a folder name" in err
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("command", [["train", "CONFIG"], ["music", "train", "jsb-chorales-lstm-nade-cpu"],
                                     ["task", "dyck", "--steps", "1"]])
def test_restart_refuses_a_folder_holding_the_users_own_files_and_removes_nothing(config_file, tmp_path, capsys,
                                                                                 command):
    folder = tmp_path / "mine"
    (folder / "checkpoints").mkdir(parents=True)  # even beside names a run uses
    (folder / "thesis.tex").write_text("my own work")
    (folder / "config.toml").write_text('name = "not a run"\n')
    before = _tree(folder)
    args = [config_file if a == "CONFIG" else a for a in command] + ["--run-dir", folder, "--restart"]
    code, err = _cli(args, capsys)
    assert code == 1 and "holds files that are not a moglm run's (thesis.tex)" in err and err.count("\n") == 1
    assert _tree(folder) == before


def test_restart_refuses_a_folder_of_run_names_that_is_not_a_run(config_file, tmp_path, capsys):
    folder = tmp_path / "mine"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "corpus.txt").write_text("my corpus")
    before = _tree(folder)
    code, err = _cli(["train", config_file, "--run-dir", folder, "--restart"], capsys)
    assert code == 1 and "is not a moglm run (no config.toml)" in err
    assert _tree(folder) == before


def test_restart_still_discards_a_real_run_and_its_interrupted_writes(config_file, tmp_path, capsys):
    run = tmp_path / "run"
    assert _cli(["train", config_file, "--run-dir", run], capsys)[0] == 0
    (run / ".results.json.abc123.tmp.json").write_text("{")  # an atomic write cut short by a kill
    (run / "results.json").write_text("{}")
    assert _cli(["train", config_file, "--run-dir", run, "--restart"], capsys)[0] == 0
    assert json.loads((run / "results.json").read_text())["splits"]
    assert not (run / ".results.json.abc123.tmp.json").exists()


def test_a_music_sample_never_replaces_a_users_file_without_force(tmp_path, capsys):
    pytest.importorskip("pretty_midi")
    from conftest import tiny_music_config as music_config, write_music_corpus as write_corpus

    config = tmp_path / "tiny.toml"
    config.write_text(music_config(write_corpus(tmp_path / "songs.json")).to_toml())
    run = tmp_path / "run"
    assert main(["music", "train", str(config), "--run-dir", str(run), "--no-progress"]) == 0
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    code, err = _cli(["sample", run, "--output", notes], capsys)
    assert code == 1 and "a music sample is a MIDI file" in err and notes.read_text() == "my notes"
    tune = tmp_path / "tune.mid"
    tune.write_bytes(b"my own tune")
    code, err = _cli(["sample", run, "--output", tune], capsys)
    assert code == 1 and "exists: give --force to replace it" in err and tune.read_bytes() == b"my own tune"
    roll = tmp_path / "other.png"
    roll.write_bytes(b"my picture")
    code, err = _cli(["sample", run, "--output", tmp_path / "other.mid"], capsys)
    assert code == 1 and "other.png exists" in err and roll.read_bytes() == b"my picture"
    assert not (tmp_path / "other.mid").exists()
    assert _cli(["sample", run, "--output", tune, "--force", "--num-tokens", "4"], capsys)[0] == 0
    assert tune.read_bytes() != b"my own tune"
    code, err = _cli(["sample", run, "--output", tmp_path], capsys)
    assert code == 1 and "a music sample is a MIDI file" in err


def test_a_model_too_large_for_the_memory_is_one_line_before_anything_is_allocated(config_file, tmp_path, capsys):
    code, err = _cli(["train", config_file, "--run-dir", tmp_path / "run", "--set", "model.num_layers=100000",
                      "--hidden-size", "256"], capsys)
    assert code == 1 and err.count("\n") == 1 and "100000 layers" in err and "GiB free here" in err
    code, err = _cli(["train", config_file, "--run-dir", tmp_path / "run", "--hidden-size", "300000"], capsys)
    assert code == 1 and "need about" in err and "lower model.num_layers, model.hidden_size" in err


# -- the hold-out fault run's remaining cases: each a one-line error naming the problem -----------------------

@pytest.fixture
def trained(config_file, tmp_path, capsys):
    run = tmp_path / "trained"
    assert _cli(["train", config_file, "--run-dir", run], capsys)[0] == 0
    return run


@pytest.mark.parametrize("args, message", [
    (["train", "CONFIG", "--set", "train.adam_eps=inf"], "train.adam_eps: Input should be a finite number"),
    (["train", "CONFIG", "--set", "model.forget_bias=inf"], "model.forget_bias: Input should be a finite number"),
    (["train", "CONFIG", "--set", "data.split_fractions=[nan, 0.1, 0.1]"], "data.split_fractions.0: Input should be a finite"),
    (["train", "CONFIG", "--set", "train.seed=99999999999999999999"], "train.seed"),
    (["train", "CONFIG", "--seed", "99999999999999999999"], "--seed"),
    (["dyneval", "RUN", "--margin", "-1"], "--margin must be > 0"),
    (["dyneval", "RUN", "--threads", "0"], "--threads"),
    (["evaluate", "RUN", "--logit-factor", "0"], "must be a finite number > 0"),
    (["evaluate", "RUN", "--device", "bogus"], "unknown device 'bogus'"),
    (["tune", "mogrifier", "--trials", "-1"], "--trials"),
    (["task", "reverse-copy", "--vocab-size", "1"], "vocab_size must be >= 2"),
    (["compress", "RUN", "CONFIG", "--report", "DIR"], "is a folder: give a file name"),
    (["compress", "RUN", "CONFIG", "-o", "FILE/x.moglm"], "is a file, not a folder"),
])
def test_bad_values_and_outputs_are_one_line_errors(trained, config_file, tmp_path, capsys, args, message):
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    where = {"CONFIG": config_file, "RUN": trained, "DIR": tmp_path / "dir", "FILE": tmp_path / "file"}
    args = [str(where.get(a, a)) if a not in ("FILE/x.moglm",) else f"{tmp_path / 'file'}/x.moglm" for a in args]
    code, err = _cli(args, capsys)
    assert code != 0 and message in err and "internal error" not in err, err


def test_a_config_or_prompt_file_that_is_not_utf8_is_one_line(trained, tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b'name = "x"\n\xff\xfe\n')
    code, err = _cli(["train", bad], capsys)
    assert code == 1 and "not UTF-8 text" in err and err.count("\n") == 1
    prompt = tmp_path / "prompt.txt"
    prompt.write_bytes(b"\xff\xfe the")
    code, err = _cli(["sample", trained, "--prompt-file", prompt], capsys)
    assert code == 1 and "not UTF-8 text" in err


def test_ptb_char_format_on_plain_text_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MOGLM_CACHE_DIR", str(tmp_path / "cache"))
    text = tmp_path / "plain.txt"
    text.write_text("the cat sat on the mat\n" * 50)
    code, err = _cli(["train", "--set", f"data.path={text}", "--set", "data.format=ptb_char", "--run-dir",
                      tmp_path / "run"], capsys)
    assert code == 1 and "not PTB char format" in err and "'the'" in err and 'data.format = "char"' in err


def test_a_damaged_results_or_dyneval_file_is_an_error_not_a_default(trained, capsys):
    import moglm

    (trained / "dyneval").mkdir(exist_ok=True)
    (trained / "dyneval" / "full.json").write_text('{"hyperparameters": [1, 2]')
    code, err = _cli(["sample", trained, "--adapt", "--prompt", "the"], capsys)
    assert code == 1 and "full.json: damaged" in err
    (trained / "results.json").write_text('{"temperature": "hot"}')
    with pytest.raises(MoglmError, match="results.json: damaged"):
        moglm.load_run(trained)


def test_trained_run_refuses_a_bad_temperature_or_token_count(trained):
    import moglm

    run = moglm.load_run(trained)
    for bad in (-1.0, float("nan"), 0.0):
        with pytest.raises(MoglmError, match="finite number > 0"):
            run.score("the cat sees the dog .\n", temperature=bad)
    with pytest.raises(MoglmError, match="num_tokens must be an integer >= 0"):
        run.sample(num_tokens=-5)


def test_music_a_deep_json_and_a_corpus_changed_since_training_are_one_line(tmp_path, capsys):
    from conftest import tiny_music_config as music_config, write_music_corpus as write_corpus

    deep = tmp_path / "deep.json"
    deep.write_text('{"train": ' + "[" * 100_000 + "]" * 100_000 + "}")
    code, err = _cli(["music", "train", "jsb-chorales-lstm-nade-cpu", "--set", f"data.path={deep}", "--run-dir",
                      tmp_path / "m"], capsys)
    assert code == 1 and "nested too deeply" in err
    corpus = write_corpus(tmp_path / "songs.json")
    config = tmp_path / "tiny.toml"
    config.write_text(music_config(corpus, max_steps=4).to_toml())
    assert main(["music", "train", str(config), "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 0
    write_corpus(corpus, seed=1)  # other songs at the same path
    code, err = _cli(["music", "evaluate", tmp_path / "run"], capsys)
    assert code == 1 and "changed since this run trained on it" in err


def test_a_run_whose_config_was_deleted_is_refused_then_restart_discards_it(config_file, tmp_path, capsys):
    run = tmp_path / "run"
    assert _cli(["train", config_file, "--run-dir", run], capsys)[0] == 0
    (run / "config.toml").unlink()
    code, err = _cli(["train", config_file, "--run-dir", run, "--hidden-size", "30"], capsys)
    assert code == 1 and "config.toml is missing" in err and err.count("\n") == 1
    assert _cli(["train", config_file, "--run-dir", run, "--hidden-size", "30", "--restart"], capsys)[0] == 0
    assert "hidden_size = 30" in (run / "config.toml").read_text()


def test_weights_copied_in_from_another_run_of_the_same_shape_are_refused(config_file, tmp_path, capsys):
    import shutil

    for name in ("a", "b"):
        assert _cli(["train", config_file, "--run-dir", tmp_path / name], capsys)[0] == 0
    best = RunDirectory(tmp_path / "a").checkpoints.pointer("best")["path"]
    other = RunDirectory(tmp_path / "b").checkpoints.pointer("best")["path"]
    shutil.rmtree(best)
    shutil.copytree(other, best)  # b's checkpoint, manifest and all, under a's name
    code, err = _cli(["evaluate", tmp_path / "a"], capsys)
    assert code == 1 and "the weights of another run" in err and err.count("\n") == 1
    assert _cli(["evaluate", tmp_path / "b"], capsys)[0] == 0


def test_a_config_that_differs_only_in_its_description_resumes_the_same_run(tiny_corpus, tmp_path):
    cfg = tiny_config(tiny_corpus, train={"max_steps": 4})
    _train(cfg, tmp_path / "run")
    relabelled = cfg.model_copy(update={"description": "the same model, described otherwise"})
    _train(relabelled, tmp_path / "run")  # no "different config" error: the run is finished, nothing retrains
    changed = tiny_config(tiny_corpus, train={"max_steps": 4, "learning_rate": 0.02})
    with pytest.raises(MoglmError, match="different config"):
        _train(changed, tmp_path / "run")
