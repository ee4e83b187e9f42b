"""Data-parallel training with torch.distributed on CPU (gloo): a 2-process torchrun run trains what one
process trains with the same global batch, and a run whose rank is killed resumes to the same end."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import dyneval_report, tiny_config, write_tiny_corpus

from moglm.cli import main
from moglm.runs.language_model import LanguageModelRun
from moglm.train import Trainer

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # several processes each: CI runs them (pytest -m slow)

# SIGKILL of one rank at a given step, as an external kill would: nothing is saved on the way out
KILLER = """
import os, signal, sys
from moglm.train import engine
step_of_death, rank = (int(v) for v in os.environ["KILL_AT"].split(":"))
original = engine.Engine._step
def _step(self, step):
    if step == step_of_death and self.group.rank == rank:
        os.kill(os.getpid(), signal.SIGKILL)
    return original(self, step)
engine.Engine._step = _step
from moglm.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _torchrun(*args, env=None):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def _records(run_dir):
    return [(r["kind"], r["step"], r["xent"]) for r in LanguageModelRun(run_dir).read_metrics()
            if r["kind"] in ("train", "valid")]


def _assert_close(records, expected, rel=1e-5):
    assert [r[:2] for r in records] == [e[:2] for e in expected]
    for (kind, step, a), (_, _, b) in zip(records, expected):
        assert abs(a - b) <= rel * abs(b), f"{kind} step {step}: {a} vs {b}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One config (no dropout, so one and two processes draw the same numbers; frequent state resets),
    trained by one process and by two."""
    root = tmp_path_factory.mktemp("data-parallel")
    cfg = tiny_config(write_tiny_corpus(root / "corpus"),
                      model={"input_dropout": 0.0, "state_dropout": 0.0, "output_dropout": 0.0},
                      train={"max_steps": 16, "eval_every": 4, "state_reset_probability": 0.3, "threads": 1},
                      sample={"num_tokens": 0}, evaluation={"splits": ["valid"]})
    path = root / "tiny.toml"
    path.write_text(cfg.to_toml())
    Trainer(cfg, root / "one", progress=False, log=lambda s: None).train()
    assert main(["train", str(path), "--run-dir", str(root / "two"), "--no-progress", "--nproc-per-node", "2"]) == 0
    return root, path, cfg


def test_two_processes_train_what_one_process_trains(runs):
    root, _, _ = runs
    one, two = _records(root / "one"), _records(root / "two")
    assert len(one) == 8  # train and valid records at steps 4, 8, 12, 16
    _assert_close(two, one)
    assert (root / "two" / "results.json").is_file() and (root / "two" / "learning_curve.png").is_file()
    state = json.loads((root / "two" / "checkpoints" / "step-00000016" / "state.json").read_text())
    assert state["world_size"] == 2


def test_a_killed_rank_stops_the_job_and_the_rerun_resumes_to_the_same_end(runs):
    root, path, cfg = runs
    killer = root / "killer.py"
    killer.write_text(KILLER)
    run = root / "killed"
    args = ["train", str(path), "--run-dir", str(run), "--no-progress"]
    killed = _torchrun(str(killer), *args, env={"KILL_AT": "10:1"})  # rank 1 dies in step 10
    assert killed.returncode != 0
    assert "error: rank 0: another process of the job stopped" in killed.stderr
    assert LanguageModelRun(run).checkpoints.pointer("last")["step"] == 8
    shutil.copytree(run, root / "killed-copy")
    rerun = _torchrun("-m", "moglm", *args)  # the documented command, as it was first run
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "resuming" in rerun.stdout and "from step 8" in rerun.stdout
    assert _records(run) == _records(root / "two")  # bit for bit: the same world size
    # one process resumes the same run: the same global stripes and their carried state
    Trainer(cfg, root / "killed-copy", progress=False, log=lambda s: None).train()
    _assert_close(_records(root / "killed-copy"), _records(root / "one"))


def test_a_batch_that_does_not_split_over_the_processes_is_one_line(runs, tmp_path):
    root, path, _ = runs
    result = subprocess.run([sys.executable, "-m", "moglm", "train", str(path), "--set", "train.batch_size=3",
                             "--run-dir", str(tmp_path / "odd"), "--no-progress", "--nproc-per-node", "2"],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 1
    assert result.stderr == "error: train.batch_size = 3 does not split evenly over 2 processes; use a multiple of 2\n"


def test_dynamic_evaluation_splits_its_streams_over_the_processes(runs, tmp_path):
    root, _, _ = runs
    run = tmp_path / "run"
    shutil.copytree(root / "one", run)
    args = ["dyneval", str(run), "--split", "valid", "--streams", "4", "--sparse", "--sparse-units", "8", "--rule",
            "sgd", "--no-progress"]
    assert main(args) == 0
    one = dyneval_report(run, "sparse")["splits"]["valid"]
    result = _torchrun("-m", "moglm", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("valid: static") == 1  # rank 0 reports
    two = dyneval_report(run, "sparse")["splits"]["valid"]
    for kind in ("static", "dynamic"):  # each stripe adapts its own matrix: the same scores as one process
        assert two[kind]["tokens"] == one[kind]["tokens"]
        assert abs(two[kind]["xent"] - one[kind]["xent"]) <= 1e-6 * one[kind]["xent"]
    assert two["dynamic"]["xent"] != two["static"]["xent"]


def test_ctrl_c_stops_every_process_at_one_step_after_a_checkpoint(runs, tmp_path):
    root, path, _ = runs
    run = tmp_path / "run"
    job = subprocess.Popen([sys.executable, "-m", "moglm", "train", str(path), "--set", "train.max_steps=100000",
                            "--run-dir", str(run), "--no-progress", "--nproc-per-node", "2"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    pointer = run / "checkpoints" / "last.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not pointer.is_file():
        time.sleep(0.1)
    os.killpg(job.pid, signal.SIGINT)  # as Ctrl-C in a terminal: the launcher and both ranks get it
    _, err = job.communicate(timeout=120)
    assert job.returncode == 130
    (line,) = err.splitlines()  # one rank speaks, once
    step = LanguageModelRun(run).checkpoints.pointer("last")["step"]
    assert line == f"error: interrupted at step {step}; checkpoint saved, rerun the same command to resume"


def test_exit_worker_returns_outside_a_torchrun_job(monkeypatch):
    """Only a launched worker with a process group skips Python's finalization; anything else exits normally."""
    from moglm import distributed

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert distributed.exit_worker(0) is None  # still running: it returned
    monkeypatch.setenv("WORLD_SIZE", "2")  # launched, but no process group was ever made in this process
    assert distributed.exit_worker(0) is None
