"""The test run itself stops on SIGTERM and SIGINT, even while a test trains in the pytest process (where the
training engine catches the signal to save a checkpoint)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

TESTS = '''
from pathlib import Path

from conftest import tiny_config, write_tiny_corpus
from moglm.train import Trainer


def test_a_long_training(tmp_path):
    corpus = write_tiny_corpus(tmp_path / "corpus")
    cfg = tiny_config(corpus, train={"max_steps": 1_000_000, "eval_every": 1_000_000})

    def started(step):
        if step == 2:
            Path(r"STARTED").write_text("training")

    try:
        Trainer(cfg, tmp_path / "run", progress=False, log=lambda s: None, on_step=started).train()
    except Exception:
        pass  # the engine's stop, whatever the test makes of it


def test_after_it():
    Path(r"AFTER").write_text("ran")
'''


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_training_test_stops_the_whole_run(tmp_path, signum):
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    started, after = tmp_path / "started", tmp_path / "after"
    (tmp_path / "test_long.py").write_text(TESTS.replace("STARTED", str(started)).replace("AFTER", str(after)))
    job = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                            str(tmp_path)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not started.exists():
            assert job.poll() is None and time.monotonic() < deadline, "the training test never started"
            time.sleep(0.1)
        job.send_signal(signum)
        out, _ = job.communicate(timeout=60)
    finally:
        job.kill()
    assert job.returncode != 0 and not after.exists(), out[-2000:]
