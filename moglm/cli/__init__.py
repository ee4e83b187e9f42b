"""The ``moglm`` command line (Typer). Each command is a module-level function in a module of this package
(``moglm.cli.train.train``, ``moglm.cli.dynamic_evaluation.dyneval`` ...) that can be imported and tested on
its own; :mod:`moglm.cli.app` mounts them, :mod:`moglm.cli.entry` runs them with one-line errors."""

from __future__ import annotations

import sys

EXTRA_HINT = "moglm's command line needs its optional dependencies: pip install 'moglm[all]'"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``moglm`` script (a torchrun worker ends here, see
    :func:`moglm.distributed.exit_worker`)."""
    try:
        import typer  # noqa: F401 - the cli extra
    except ImportError:  # pragma: no cover - exercised only without the extra
        print(f"error: {EXTRA_HINT}", file=sys.stderr)
        return 2
    from .entry import run

    code = run(argv)
    if argv is None and "torch.distributed" in sys.modules:
        from ..distributed import exit_worker

        exit_worker(code)
    return code


def __getattr__(name: str):
    """``moglm.cli.click_command``: the whole command line as a click command (for the docs' CLI reference)."""
    if name == "click_command":
        import typer

        from .app import build_app

        return typer.main.get_command(build_app())
    raise AttributeError(f"module 'moglm.cli' has no attribute {name!r}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
