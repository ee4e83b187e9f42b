"""lm-evaluation-harness's command line with the ``moglm`` model type registered: ``moglm lm-eval ARGS`` is
``lm_eval ARGS`` (lm-eval 0.4.13 reads no plug-in entry points, so its own ``lm_eval`` script does not know
``--model moglm``; this one does)."""

from __future__ import annotations

import sys

from ..errors import MoglmError

INSTALL_HINT = "lm-evaluation-harness is not installed: pip install 'moglm[lm-eval]'"


def run_lm_eval(args: list[str]) -> None:
    """Run lm-eval's command line on ``args`` (as ``lm_eval`` would read them) with ``--model moglm`` known."""
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError:
        raise MoglmError(INSTALL_HINT) from None
    from . import model  # noqa: F401 - registers the moglm model type

    saved = sys.argv
    sys.argv = ["lm_eval", *args]
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
