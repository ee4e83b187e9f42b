"""The command line end to end: train, evaluate, sample; one-line errors; a real SIGKILL and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moglm.cli import main

TINY = """
name = "tiny"
[data]
format = "word"
[model]
architecture = "mogrifier"
num_layers = 2
hidden_size = 24
cell = {{ rounds = 3, rank = 4 }}
[train]
batch_size = 4
bptt = 10
max_steps = {steps}
eval_every = {eval_every}
eval_batch_size = 2
device = "cpu"
[evaluation]
temperature_tokens = 200
[sample]
num_tokens = 8
prompt = "the cat"
"""


def _config(tmp_path, steps=12, eval_every=4):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.format(steps=steps, eval_every=eval_every))
    return path


def test_train_evaluate_sample_end_to_end(tiny_corpus, tmp_path, capsys):
    cfg = _config(tmp_path)
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--set", f"data.path={tiny_corpus}", "--run-dir", str(run), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "valid ppl" in out and "--- sample ---" in out and "the cat" in out
    results = json.loads((run / "results.json").read_text())
    assert set(results["splits"]) == {"valid", "test"} and results["splits"]["test"]["perplexity"] > 1
    assert main(["evaluate", str(run), "--split", "test", "--logit-factor", "1.0", "--no-progress"]) == 0
    assert "test: ppl" in capsys.readouterr().out
    assert main(["evaluate", str(run), "--split", "test", "--no-cuda-graphs", "--no-progress"]) == 0
    assert main(["evaluate", str(run), "--device", "cpu", "--cuda-graphs", "--no-progress"]) == 1
    err = capsys.readouterr().err  # graphs asked for on CPU
    assert "--cuda-graphs needs one CUDA device" in err and err.count("\n") == 1 and "Traceback" not in err
    assert main(["sample", str(run), "--prompt", "the dog", "--num-tokens", "5", "--seed", "3"]) == 0
    first = capsys.readouterr().out
    assert main(["sample", str(run), "--prompt", "the dog", "--num-tokens", "5", "--seed", "3"]) == 0
    assert capsys.readouterr().out == first and first.startswith("the dog")
    # rerunning the finished command does not train again
    assert main(["train", str(cfg), "--set", f"data.path={tiny_corpus}", "--run-dir", str(run), "--no-progress"]) == 0
    assert "already finished" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "nope.toml"], "nope.toml: no such config file or shipped config"),
        (["train", "default", "--set", "data.path=/no/such/corpus"], "corpus '/no/such/corpus' not found"),
        (["train", "default", "--set", "train.lr=0.1"], "unknown key 'train.lr'"),
        (["train", "default", "--set", "train.max_steps=ten"], "train.max_steps: Input should be a valid integer"),
        (["evaluate", "no-such-run"], "not a run directory"),
        (["sample", "no-such-run"], "not a run directory"),
    ],
)
def test_bad_input_is_one_line_on_stderr_with_a_non_zero_exit(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(args) != 0
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_unknown_command_line_options_are_usage_errors(capsys):
    assert main(["train", "--no-such-option"]) == 2
    assert "No such option" in capsys.readouterr().err


def test_empty_corpus_file_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.txt").write_text("")
    assert main(["train", "--set", f"data.path={tmp_path / 'empty.txt'}", "--no-progress"]) == 1
    assert "empty.txt: file is empty" in capsys.readouterr().err


def test_help_config_documents_every_field(capsys):
    assert main(["train", "--help-config"]) == 0
    out = capsys.readouterr().out
    assert "learning_rate" in out and "state_dropout" in out and "format_version" in out


def test_configs_lists_the_shipped_configs(capsys):
    assert main(["configs"]) == 0
    out = capsys.readouterr().out
    assert "default" in out and "ptb-word-mogrifier-paper" in out and "moglm music configs" in out


def test_info_prints_the_compiled_recurrence_and_its_gemm_route_as_json_and_as_lines(capsys):
    from moglm.recurrence import compiled

    assert main(["info", "--json"]) == 0
    details = json.loads(capsys.readouterr().out)
    assert {"moglm", "torch", "threads", "cpu", "compiled", "reason", "build_dir"} <= set(details)
    if details["compiled"]:
        assert details["gemm_route"] in compiled.ROUTES and details["reason"] is None
        assert details["weight_gradient_route"] in ("aten", "brgemm")
        assert {"cached_bytes", "cached_blocks", "hits", "misses", "limit_bytes"} == set(details["workspace_cache"])
    else:
        assert details["reason"] and "gemm_route" not in details
    assert main(["info"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(": " in line for line in lines)  # key: value
    recurrence = [line for line in lines if line.startswith("recurrence:")]
    assert len(recurrence) == 1 and recurrence[0].startswith("recurrence: compiled") == details["compiled"]
    assert any(line.startswith("gemm_route: ") for line in lines) == details["compiled"]
    assert any(line.startswith("weight_gradient_route: ") for line in lines) == details["compiled"]
    assert any(line.startswith("workspace_cache: ") for line in lines) == details["compiled"]


def test_info_says_why_the_compiled_recurrence_is_unavailable(capsys, monkeypatch):
    from moglm.recurrence.compiled import build

    monkeypatch.setattr(build, "available", lambda: False)
    monkeypatch.setattr(build, "unavailable_reason", lambda: "no C++ compiler here")
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "recurrence: Python fused (the compiled recurrence is unavailable: no C++ compiler here)" in out
    assert "gemm_route" not in out
    assert main(["info", "--json"]) == 0
    details = json.loads(capsys.readouterr().out)
    assert details["compiled"] is False and details["reason"] == "no C++ compiler here"


def _metrics(run: Path):
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_sigkill_then_the_same_command_resumes_and_matches_an_uninterrupted_run(tiny_corpus, tmp_path):
    cfg = _config(tmp_path, steps=400, eval_every=50)
    base = [sys.executable, "-m", "moglm.cli", "train", str(cfg), "--set", f"data.path={tiny_corpus}",
            "--set", "sample.num_tokens=0", "--set", "evaluation.splits=[valid]", "--no-progress"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    straight = subprocess.run(base + ["--run-dir", str(tmp_path / "straight")], env=env, capture_output=True, text=True)
    assert straight.returncode == 0, straight.stderr
    run = tmp_path / "killed"
    proc = subprocess.Popen(base + ["--run-dir", str(run)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:  # kill once the first checkpoint exists and training has moved on
        if (run / "checkpoints" / "last.json").exists() and any(
            r["kind"] == "train" and r["step"] >= 60 for r in _metrics(run)
        ):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    resumed = subprocess.run(base + ["--run-dir", str(run)], env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stdout

    def losses(r):
        return [(m["step"], m["xent"]) for m in _metrics(r) if m["kind"] in ("train", "valid")]

    assert losses(run) == losses(tmp_path / "straight")


def test_version_flag_and_python_dash_m_moglm(capsys):
    from moglm import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"moglm {__version__}"
    done = subprocess.run([sys.executable, "-m", "moglm", "--version"], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.strip() == f"moglm {__version__}", done.stderr


def test_moglm_warnings_print_as_one_line_and_others_as_python_shows_them():
    """While a command runs, a warning of moglm's own (the compiled recurrence unavailable, say) is formatted as one
    line, not the library file, line and source line that raised it; anything else as Python formats it; and the
    hook is gone after the command."""
    import warnings

    from moglm.cli.entry import format_warning

    assert format_warning(UserWarning("moglm: the compiled recurrence is unavailable (no compiler);\n   slower"),
                          UserWarning, "/somewhere/typer/main.py", 1445, line="return callback(**use_params)") \
        == "moglm: the compiled recurrence is unavailable (no compiler); slower\n"
    assert format_warning(UserWarning("not ours"), UserWarning, "/somewhere/lib.py", 3, line="x = 1") \
        == warnings.formatwarning(UserWarning("not ours"), UserWarning, "/somewhere/lib.py", 3, line="x = 1")
    assert "lib.py:3: UserWarning: not ours" in format_warning("not ours", UserWarning, "/somewhere/lib.py", 3)
    before = warnings.formatwarning
    assert main(["--version"]) == 0 and warnings.formatwarning is before
