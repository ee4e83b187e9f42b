"""The fault suite: damaged files, concurrent runs and bad input end in a one-line error or a recovery, with
nothing lost. Each case runs the command line as a user would and checks stderr has no traceback. (Ctrl-C
and SIGTERM during training are in test_train_trainer.py, beside the other resume tests.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import tiny_config
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


def test_a_second_trainer_on_the_same_run_directory_is_refused_with_the_holders_pid(tiny_corpus, tmp_path):
    run = RunDirectory(tmp_path / "run")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from moglm.runs import RunDirectory\n"
        f"with RunDirectory({str(run.path)!r}).lock():\n    print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(MoglmError, match=rf"in use by another moglm process \(pid {holder.pid}\)"):
            _train(tiny_config(tiny_corpus), run.path)
    finally:
        holder.kill()
        holder.wait()
    _train(tiny_config(tiny_corpus), run.path)  # a killed holder releases the lock


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

    def read_only(path, text):  # what a read-only folder does to the write (tests may run as root)
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(final_evaluation, "atomic_write_text", read_only)
    code = main(["evaluate", str(run), "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 1 and "valid:" in out and "Permission denied); the results printed above were not saved" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("name, content, message", [
    ("one character", "a", "split has no tokens"),
    ("byte-order mark only", "\ufeff", "file is empty"),
    ("no newline, empty prompt", "abcabcabcabcabc" * 20, "no line separator to start from"),
])
def test_bad_corpora_are_refused_before_training(tmp_path, capsys, name, content, message):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(content, encoding="utf-8")
    overrides = [f"data.path={corpus}", "data.format=char", "train.max_steps=2", "sample.prompt=''",
                 "model.hidden_size=8", "model.cell.rank=2", "train.batch_size=2", "train.bptt=4"]
    code, err = _cli(["train", "default", "--run-dir", tmp_path / "run", *[a for o in overrides for a in ("--set", o)]],
                     capsys)
    assert code == 1 and message in err
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing trained


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
    from moglm.train.config import load_config

    with pytest.raises(MoglmError, match=r"split_fractions: .*together at most 1"):
        load_config("default", ["data.split_fractions=[0.5, 0.5, 0.5]"])


@pytest.mark.parametrize("raised, message", [
    (RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 400000000000 bytes"),
     "out of memory (DefaultCPUAllocator"),
    (OSError(28, "No space left on device", "runs/x/checkpoints/step-00000004"),
     "no space left on the device writing runs/x/checkpoints/step-00000004"),
    (PermissionError(13, "Permission denied", "studies/s/study.db"), "cannot write studies/s/study.db (Permission"),
    (ZeroDivisionError("division by zero"), "ZeroDivisionError: division by zero (an internal error: rerun with --debug"),
])
def test_any_other_exception_is_one_line_and_debug_shows_the_traceback(monkeypatch, capsys, raised, message):
    import moglm.cli as cli

    def explode(*args, **kwargs):
        raise raised

    monkeypatch.setattr(cli, "_info", explode)
    code = main(["info"])
    err = capsys.readouterr().err
    assert code == 1 and message in err and err.count("\n") == 1 and "Traceback" not in err
    with pytest.raises(type(raised)):
        main(["info", "--debug"])
