"""Progress: a bar on a terminal; plain lines with tokens/s and the ETA every $MOGLM_PROGRESS_SECONDS where stderr
is a log file or a pipe; every bar of the package from one chooser."""

from __future__ import annotations

import re

import io
import sys

import pytest

from moglm import progress


def test_a_log_file_gets_plain_progress_lines_not_carriage_return_frames(monkeypatch):
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)  # not a terminal
    bar = progress.progress_bar(100, "train", tokens_per_step=64)
    assert isinstance(bar, progress.LineProgress)
    bar.every = 0.0  # a line at every step, for the test
    bar.set_postfix_str("train 1.23 bpc")
    for _ in range(3):
        bar.update()
    lines = log.getvalue().splitlines()
    assert len(lines) == 3 and "\r" not in log.getvalue()
    assert lines[-1].startswith("train: step 3/100 (3%),") and "tok/s, ETA" in lines[-1] and "train 1.23 bpc" in lines[-1]


def test_the_last_step_always_gets_its_line(monkeypatch):
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    bar = progress.progress_bar(5, "eval", tokens_per_step=1)  # 60 s between lines: only the end prints
    for _ in range(5):
        bar.update()
    assert log.getvalue().count("\n") == 1 and "step 5/5 (100%)" in log.getvalue()


def test_a_terminal_gets_the_bar_and_disabled_progress_prints_nothing(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    bar = progress.progress_bar(10, "train", tokens_per_step=1)
    assert isinstance(bar, progress.TokenBar)
    bar.close()
    assert isinstance(progress.progress_bar(10, "train", 1, enabled=False), progress._Silent)


@pytest.mark.slow
def test_a_run_logged_to_a_file_has_a_plain_line_every_n_seconds_and_no_carriage_return(tiny_corpus, tmp_path):
    """``moglm train`` with stdout and stderr in one log file: training and the final evaluation print plain
    progress lines ($MOGLM_PROGRESS_SECONDS = 0: one every step), never a bar's carriage-return frames."""
    import os
    import subprocess

    from conftest import tiny_config

    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(tiny_corpus, train={"max_steps": 4, "eval_every": 2, "threads": 1}).to_toml())
    log = tmp_path / "train.log"
    with log.open("w") as out:
        done = subprocess.run([sys.executable, "-m", "moglm", "train", str(config), "--run-dir", str(tmp_path / "run")],
                              stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, MOGLM_PROGRESS_SECONDS="0"))
    text = log.read_text()
    assert done.returncode == 0, text
    assert "\r" not in text and "\x1b[" not in text
    lines = text.splitlines()
    for step in range(1, 5):
        assert any(line.startswith(f"train: step {step}/4 (") and "tok/s, ETA" in line for line in lines), text
    assert any(line.startswith("valid: step ") and "(100%)" in line for line in lines), text  # the final evaluation


def test_the_seconds_between_lines_come_from_the_environment(monkeypatch):
    from moglm.errors import MoglmError

    monkeypatch.setenv("MOGLM_PROGRESS_SECONDS", "5")
    assert progress.LineProgress(10, "x", 1).every == 5.0
    monkeypatch.delenv("MOGLM_PROGRESS_SECONDS")
    assert progress.LineProgress(10, "x", 1).every == 60.0
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv("MOGLM_PROGRESS_SECONDS", bad)
        with pytest.raises(MoglmError, match="MOGLM_PROGRESS_SECONDS"):
            progress.line_seconds()


def test_every_progress_bar_of_the_package_comes_from_the_one_chooser():
    """Training, evaluation, dynamic evaluation, tuning, experiments, compression and music all call
    progress_bar: no other module draws a tqdm bar of its own."""
    from pathlib import Path

    import moglm

    package = Path(moglm.__file__).parent
    own = [str(p.relative_to(package)) for p in package.rglob("*.py")
           if p.name != "progress.py" and re.search(r"^\s*(from tqdm|import tqdm)", p.read_text(encoding="utf-8"), re.M)]
    assert own == []
