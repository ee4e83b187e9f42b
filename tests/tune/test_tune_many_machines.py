"""moglm tune beyond one process: a journal file shared by workers that join from elsewhere, a trial whose
worker is killed is retried (not lost), a PostgreSQL server, and a trial trained by a torchrun job."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pytest
from conftest import tiny_config
from optuna.trial import TrialState

from moglm.cli import main
from moglm.tune.study import WORKER, counted_trials, open_storage

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # several processes each: CI runs them (pytest -m slow)

SPACE = """
base = "{base}"
[study]
sampler = "random"
seed = 0
[pruner]
type = "none"
[budget]
trials = {trials}
[params]
"train.learning_rate" = {{ low = 0.002, high = 0.02, log = true }}
"model.state_dropout" = {{ low = 0.0, high = 0.5 }}
"""


def _space(tmp_path, corpus, trials=2, **train):
    base = tmp_path / "tiny.toml"
    base.write_text(tiny_config(corpus, train={"max_steps": 8, "threads": 1, **train},
                                evaluation={"splits": ["valid"]}).to_toml())
    path = tmp_path / "space.toml"
    path.write_text(SPACE.format(base=base, trials=trials))
    return path


def _study(storage: str, name: str = "space") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=open_storage(storage))


def _moglm(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "moglm", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_workers_join_a_study_through_its_journal_file(tiny_corpus, tmp_path, capsys):
    space = _space(tmp_path, tiny_corpus, trials=4)
    journal = str(tmp_path / "shared" / "tuning.journal")
    (tmp_path / "shared").mkdir()
    # a joining worker needs the study to exist
    assert main(["tune", str(space), "--storage", journal, "--worker"]) == 1
    assert "--worker: no study at" in capsys.readouterr().err
    # the study's creator and a worker from "another machine" (its own study directory) share the budget
    common = ["--storage", journal, "--no-plots", "--no-progress"]
    creator = _moglm("tune", str(space), "--set", "train.max_steps=12", "--study-dir", str(tmp_path / "a"), *common)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (os.path.exists(journal) and "setup" in _study(journal).user_attrs):
        time.sleep(0.2)
    joined = _moglm("tune", str(space), "--worker", "--study-dir", str(tmp_path / "b"), *common)
    outputs = [p.communicate(timeout=240) for p in (creator, joined)]
    assert [p.returncode for p in (creator, joined)] == [0, 0], [o[1][-2000:] for o in outputs]
    study = _study(journal)
    trials = study.get_trials()
    assert len(counted_trials(study)) == len(trials) == 4
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert sorted(t.user_attrs["run"] for t in trials) == [0, 1, 2, 3]
    # the worker trained the creator's config (its --set came from the storage), in its own directory
    for t in trials:
        assert t.user_attrs["config"]["train"]["max_steps"] == 12 and t.user_attrs["steps"] == 12
    dirs = {Path(t.user_attrs["run_dir"]).parent.parent.name for t in trials}
    assert dirs <= {"a", "b"}
    assert "study 'space'" in outputs[1][0] and "of 4 trials exist" in outputs[1][0]


def test_a_killed_tune_leaves_no_trial_behind_and_the_rerun_resumes_it(tiny_corpus, tmp_path):
    space = _space(tmp_path, tiny_corpus, trials=1, max_steps=400, eval_every=20)
    study_dir = tmp_path / "study"
    args = ["tune", str(space), "--study-dir", str(study_dir), "--no-plots", "--no-progress"]
    tune = _moglm(*args)
    pointer = study_dir / "trials" / "0000" / "checkpoints" / "last.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not pointer.is_file() and tune.poll() is None:
        time.sleep(0.05)
    assert tune.poll() is None, "the trial finished before it could be killed"
    tune.send_signal(signal.SIGKILL)  # nothing is saved on the way out
    tune.wait()
    journal = str(study_dir / "study.journal")
    (trial,) = _study(journal).get_trials()
    assert trial.state == TrialState.RUNNING and trial.system_attrs[WORKER]["pid"] == tune.pid
    rerun = subprocess.run([sys.executable, "-m", "moglm", *args], capture_output=True, text=True, timeout=240)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "trial 0 lost its worker: queued again" in rerun.stdout
    assert "0 of 1 trials exist; running up to 1" in rerun.stdout  # the killed trial is not counted
    study = _study(journal)
    killed, retried = study.get_trials()
    assert killed.state == TrialState.FAIL and "worker died" in killed.user_attrs["error"]
    assert retried.state == TrialState.COMPLETE and retried.params == killed.params
    assert retried.user_attrs["replaces"] == 0 and retried.user_attrs["run"] == 0
    assert counted_trials(study) == [retried]
    log = (study_dir / "trials" / "0000" / "tune.log").read_text()
    assert "resuming" in log and retried.user_attrs["steps"] == 400


def _postgres_binaries() -> Path | None:
    for candidate in [os.path.dirname(shutil.which("pg_ctl") or ""), *sorted(glob.glob("/usr/lib/postgresql/*/bin"))]:
        if candidate and os.path.isfile(os.path.join(candidate, "initdb")):
            return Path(candidate)
    return None


@pytest.fixture
def postgres():
    """A PostgreSQL server on 127.0.0.1 for the test (Debian's postgresql binaries), stopped afterwards."""
    pytest.importorskip("psycopg", reason="no PostgreSQL driver: pip install 'moglm[postgres]'")
    binaries = _postgres_binaries()
    if binaries is None:
        pytest.skip("PostgreSQL cannot start here: no initdb/pg_ctl (apt-get install postgresql)")
    root = Path(tempfile.mkdtemp(prefix="moglm-pg-"))  # not under pytest's private tmp: the server's user reads it
    root.chmod(0o755)
    as_user: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        if shutil.which("runuser") is None:
            pytest.skip("PostgreSQL cannot start here: running as root without runuser")
        shutil.chown(root, "nobody")
        as_user = ["runuser", "-u", "nobody", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = root / "data"
    run = lambda *cmd: subprocess.run([*as_user, *cmd], capture_output=True, text=True, timeout=120)  # noqa: E731
    init = run(str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
    start = init.returncode == 0 and run(str(binaries / "pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-w",
                                         "-o", f"-h 127.0.0.1 -p {port} -k {root}", "start")
    if not start or start.returncode:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"PostgreSQL cannot start here: {(init.stderr or (start and start.stderr) or '').strip()[:300]}")
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        run(str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


def test_a_study_in_postgresql(postgres, tiny_corpus, tmp_path, capsys):
    space = _space(tmp_path, tiny_corpus, trials=2)
    args = ["tune", str(space), "--storage", postgres, "--study-dir", str(tmp_path / "study"), "--no-plots",
            "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "study 'space' (postgresql+psycopg://postgres@127.0.0.1" in out and "best: trial" in out
    study = optuna.load_study(study_name="space", storage=postgres)
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE] * 2
    assert study.user_attrs["setup"]["trials"] == 2
    # a worker from elsewhere joins through the URL alone; the budget is spent, so it runs nothing
    assert main(["tune", str(space), "--storage", postgres, "--worker", "--study-dir", str(tmp_path / "other"),
                 "--no-plots"]) == 0
    assert "2 of 2 trials exist; nothing to run" in capsys.readouterr().out


def test_a_trial_trained_by_a_torchrun_job(tiny_corpus, tmp_path, capsys):
    space = _space(tmp_path, tiny_corpus, trials=1)
    journal = str(tmp_path / "study.journal")
    common = ["--storage", journal, "--study-dir", str(tmp_path / "study"), "--no-plots", "--no-progress"]
    assert main(["tune", str(space), "--trials", "0", *common]) == 0  # create the study only
    job = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                          "-m", "moglm", "tune", str(space), "--worker", "--trials", "1", *common],
                         capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.stdout.count("best: trial 0") == 1  # rank 0 reports
    (trial,) = _study(journal).get_trials()
    assert trial.state == TrialState.COMPLETE and len(trial.intermediate_values) == 2  # steps 4 and 8
    checkpoint = Path(trial.user_attrs["run_dir"]) / "checkpoints" / "step-00000008" / "state.json"
    assert json.loads(checkpoint.read_text())["world_size"] == 2


def test_a_study_directory_from_an_earlier_moglm_goes_on_in_its_sqlite_file(tmp_path):
    from moglm.tune.study import default_storage

    assert default_storage(tmp_path) == str((tmp_path / "study.journal").resolve())
    optuna.create_study(study_name="old", storage=f"sqlite:///{tmp_path / 'study.db'}")
    assert default_storage(tmp_path) == f"sqlite:///{(tmp_path / 'study.db').resolve()}"
    assert [s.study_name for s in optuna.get_all_study_summaries(open_storage(default_storage(tmp_path)))] == ["old"]
