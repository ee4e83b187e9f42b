"""Progress: a bar on a terminal; plain lines with tokens/s and the ETA where stderr is a log file."""

from __future__ import annotations

import io
import sys

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
