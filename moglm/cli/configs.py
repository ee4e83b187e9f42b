"""``moglm configs``: the shipped language-model configs."""

from __future__ import annotations


import typer



def configs() -> None:
    """List the language-model configs that ship with moglm (music: `moglm music configs`)."""
    from ..runs.config import read_mapping, shipped_configs

    for name, path in shipped_configs().items():
        typer.echo(f"{name:32s} {read_mapping(path).get('description', '')}")
    typer.echo("(music configs, for `moglm music train`: `moglm music configs`)")
