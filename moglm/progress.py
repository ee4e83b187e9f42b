"""Progress for long loops, tokens per second and ETA: a tqdm bar on a terminal, a plain line every
``$MOGLM_PROGRESS_SECONDS`` seconds (default 60) in a log file or a pipe. Every loop's progress comes from
:func:`progress_bar`."""

from __future__ import annotations

import os
import sys
from typing import Callable

from tqdm.auto import tqdm

from .errors import MoglmError


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass

    def write(self, log, message: str) -> None:
        log(message)


class TokenBar:
    """A tqdm bar over steps whose postfix shows tokens/s (the ETA comes from tqdm's rate)."""

    def __init__(self, total: int, desc: str, tokens_per_step: int, initial: int = 0) -> None:
        self.bar = tqdm(total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True,
                        file=sys.stderr, leave=False, mininterval=0.5)
        self.tokens_per_step = tokens_per_step
        self.extra = ""

    def update(self, n: int = 1) -> None:
        self.bar.update(n)
        rate = self.bar.format_dict.get("rate")
        if rate:
            self.bar.set_postfix_str(f"{rate * self.tokens_per_step:,.0f} tok/s{self.extra}", refresh=False)

    def set_postfix_str(self, s: str) -> None:
        self.extra = f", {s}" if s else ""

    def close(self) -> None:
        self.bar.close()

    def write(self, log, message: str) -> None:
        """``log(message)`` above the bar: the bar is cleared, the line printed, the bar redrawn (any
        ``log`` callable works, print or typer.echo, unlike ``tqdm.write``)."""
        with self.bar.external_write_mode(file=sys.stderr):
            log(message)


class LineProgress(_Silent):
    """Progress for a log file (stderr is not a terminal): a plain line every ``every`` seconds (default
    :func:`line_seconds`) and at the end, with the step, tokens/s and the ETA, instead of a bar's
    carriage-return frames."""

    def __init__(self, total: int, desc: str, tokens_per_step: int, initial: int = 0, every: float | None = None) -> None:
        import time

        self.total, self.desc, self.tokens_per_step = total, desc, tokens_per_step
        self.every = line_seconds() if every is None else every
        self.step = self.start_step = initial
        self.start = self.last = time.monotonic()
        self.extra = ""

    def update(self, n: int = 1) -> None:
        import time

        self.step += n
        now = time.monotonic()
        if now - self.last >= self.every or self.step >= self.total:
            self.last = now
            rate = (self.step - self.start_step) / max(now - self.start, 1e-9)  # steps/s
            eta = (self.total - self.step) / rate if rate > 0 else float("inf")
            print(f"{self.desc}: step {self.step:,}/{self.total:,} ({100 * self.step / max(self.total, 1):.0f}%), "
                  f"{rate * self.tokens_per_step:,.0f} tok/s, ETA {eta / 60:.1f} min{self.extra}", file=sys.stderr,
                  flush=True)

    def set_postfix_str(self, s: str) -> None:
        self.extra = f", {s}" if s else ""


def line_seconds() -> float:
    """Seconds between a log file's progress lines: ``$MOGLM_PROGRESS_SECONDS``, default 60."""
    raw = os.environ.get("MOGLM_PROGRESS_SECONDS", "60")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise MoglmError(f"MOGLM_PROGRESS_SECONDS={raw!r}: expected a number of seconds >= 0")
    return seconds


def progress_bar(total: int, desc: str, tokens_per_step: int, enabled: bool = True, initial: int = 0):
    """A :class:`TokenBar` on a terminal, a :class:`LineProgress` when stderr goes to a file or a pipe (no
    carriage-return frames in a log), or a silent stand-in when ``enabled`` is false."""
    if not enabled:
        return _Silent()
    if not sys.stderr.isatty():
        return LineProgress(total, desc, tokens_per_step, initial)
    return TokenBar(total, desc, tokens_per_step, initial)


def above_bars(log: Callable[[str], None] = print) -> Callable[[str], None]:
    """``log`` wrapped so that every line goes above the active progress bars (they are cleared, the line
    is written, they are redrawn) rather than into a bar's line. Any ``log`` works (print, typer.echo)."""
    def write(message: str) -> None:
        with tqdm.external_write_mode(file=sys.stderr):
            log(message)

    return write
