"""Running the ``moglm`` command: every user error is one line on stderr and a non-zero exit, never a
traceback (``--debug`` or ``MOGLM_DEBUG=1`` shows it for an internal error)."""

from __future__ import annotations

import os
import sys
import warnings

import typer

from ..errors import MoglmError
from .app import build_app
from .common import expand_list_options

_PYTHON_FORMATWARNING = warnings.formatwarning  # Python's own, for the warnings that are not moglm's


def run(argv: list[str] | None) -> int:
    """Run the command line on ``argv`` (default: ``sys.argv[1:]``); returns the exit code. moglm's own
    warnings print as one line each (:func:`format_warning`) while it runs."""
    formatted = warnings.formatwarning
    warnings.formatwarning = format_warning
    try:
        return _run(argv)
    finally:
        warnings.formatwarning = formatted


def format_warning(message, category, filename, lineno, line=None) -> str:
    """``warnings.formatwarning`` for the command line: a warning of moglm's own (its text starts with "moglm:")
    is one line, without the file, line and source of the library code that raised it; any other is formatted as
    Python formats it. Where and whether a warning is shown stays Python's (its filters, ``catch_warnings``)."""
    text = str(message)
    if text.startswith("moglm:"):
        return " ".join(text.split()) + "\n"
    return _PYTHON_FORMATWARNING(message, category, filename, lineno, line)


def _run(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("MOGLM_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    app = build_app()
    argv = expand_list_options(typer.main.get_command(app), argv)
    click_error = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
    try:
        code = app(args=argv, prog_name="moglm", standalone_mode=False)  # --help, --version: the exit code
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except click_error as e:  # a usage error: one line, not the usage and a box
        return _usage_error(e)
    except typer.Abort:
        print("error: aborted", file=sys.stderr)
        return 1
    except MoglmError as e:
        if str(e):  # empty: a data-parallel rank stopping because rank 0 reported the error
            print(f"error: {e}", file=sys.stderr)
        return 130 if type(e).__name__ == "TrainingInterrupted" else 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # anything else: one line, the traceback only with --debug
        if debug:
            raise
        print(f"error: {_unexpected(e)}", file=sys.stderr)
        return 1
    return code if isinstance(code, int) else 0


def _unexpected(e: Exception) -> str:
    """One line for an exception no command turned into a :class:`MoglmError`: out of memory, a full or
    read-only disk, or an internal error (with the pointer to ``--debug``)."""
    import errno

    text = " ".join(str(e).split())
    memory = ("out of memory", "not enough memory", "can't allocate memory", "cannot allocate memory")
    if type(e).__name__ == "OutOfMemoryError" or any(m in text.lower() for m in memory):
        return (f"out of memory ({text[:200]}); use a smaller model (model.hidden_size, model.num_params) or "
                "batch (train.batch_size, evaluation.batch_size)")
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return f"no space left on the device{f' writing {e.filename}' if e.filename else ''}; free some and rerun"
    if isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
        return f"cannot write {e.filename or 'a file'} ({e.strerror}); choose a writable --run-dir or study dir"
    return f"{type(e).__name__}: {text[:300]} (an internal error: rerun with --debug for the traceback)"


def _usage_error(error) -> int:
    """Print a usage error as one line naming the command's ``--help`` (the help itself when a command
    that needs arguments got none); returns its exit code (2)."""
    ctx = getattr(error, "ctx", None)
    if type(error).__name__ == "NoArgsIsHelpError" and ctx is not None:
        print(ctx.get_help())
        return error.exit_code
    message = " ".join(error.format_message().replace("Value error, ", "").split())
    where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
    print(f"error: {message}{where}", file=sys.stderr)
    return error.exit_code
