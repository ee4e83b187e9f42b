"""``moglm lm-eval``: lm-evaluation-harness's command line, with ``--model moglm`` registered
(:mod:`moglm.harness`)."""

from __future__ import annotations

import typer


def lm_eval(ctx: typer.Context) -> None:
    """lm-evaluation-harness with moglm runs as a model type: every argument goes to lm-eval's command line
    (lm_eval --help lists them), e.g. moglm lm-eval --model moglm --model_args run=RUN[,dynamic=true] --tasks
    wikitext. An unknown model_args key is refused with the list of the known ones."""
    from ..harness.launch import run_lm_eval

    run_lm_eval(list(ctx.args))


#: how ``moglm.cli.app`` mounts it: every argument and option passes through to lm-eval
lm_eval.command_options = {"context_settings": {"allow_extra_args": True, "ignore_unknown_options": True},
                           "no_args_is_help": True}
