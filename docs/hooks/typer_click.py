"""mkdocs hook: mkdocs-click documenting typer's commands.

Typer (0.26 and later) builds its commands from its own copy of click, whose classes are not click's: where
mkdocs-click asks ``isinstance(param, click.Option)`` it finds no option, and typer's options carry no click
parameter type. So that the command-line reference lists every option, this hook has mkdocs-click's loader
translate the command it loads into click's own classes: the same tree of groups and commands, each option
with its flags, its value's type or choices, its help and its default as ``moglm ... --help`` prints them.
The commands themselves stay as they are; only what mkdocs-click reads is translated, and a command that is
already click's passes through.
"""

from __future__ import annotations

import re

import click

try:  # the loader mkdocs-click's markdown extension calls
    import mkdocs_click._extension as _extension
except ImportError:  # pragma: no cover - the docs extra is not installed: nothing to adapt
    _extension = None

_original_load = getattr(_extension, "load_command", None)


def on_config(config):
    if _extension is not None and _extension.load_command is _original_load:
        _extension.load_command = _load_as_click
    return config


def _load_as_click(module: str, attribute: str):
    command = _original_load(module, attribute)
    return command if isinstance(command, click.Command) else as_click(command)


class _Shown(click.ParamType):
    """A parameter type that only has the name ``--help`` shows for it (``float``, ``path``, ``int range``)."""

    def __init__(self, name: str) -> None:
        self.name = name


def as_click(command, name: str | None = None, parent=None) -> click.Command:
    """``command`` (typer's) as click's classes, with its subcommands."""
    name = name or command.name
    ctx = command.context_class(command, info_name=name, parent=parent)
    params = [_parameter(p, ctx) for p in command.get_params(ctx)]
    common = dict(params=params, help=command.help, short_help=command.short_help, hidden=command.hidden)
    if hasattr(command, "list_commands"):
        subcommands = {n: as_click(command.get_command(ctx, n), n, ctx) for n in command.list_commands(ctx)}
        return click.Group(name, commands=subcommands, **common)
    return click.Command(name, **common)


def _parameter(param, ctx) -> click.Parameter:
    if param.param_type_name == "argument":
        return click.Argument([param.name], required=param.required, nargs=param.nargs)
    names, text = param.get_help_record(ctx) or ("", param.help or "")
    text, default = _without_default(text)
    decls = list(param.opts)
    if param.secondary_opts:
        decls[0] = f"{decls[0]}/{param.secondary_opts[0]}"
    flag = bool(param.is_flag or param.secondary_opts)
    text = text.replace("|", "&#x7C;").replace("<", "&lt;")  # a table cell of mkdocs-click's: no pipe, no tag
    option = click.Option([*decls, param.name], help=text or None, required=param.required, hidden=param.hidden,
                          is_flag=flag, multiple=param.multiple and not flag,
                          type=None if flag else _type(names))
    option.default = default  # as --help shows it; mkdocs-click only prints it
    return option


def _type(names: str) -> click.ParamType:
    """The option's value type from its help record, ``--rule <sgd|rms|...>``: choices, or a named type."""
    shown = names.split(" <", 1)[1].rstrip(">") if " <" in names else "text"
    listed = re.fullmatch(r"list\[(.*)\]", shown)
    inner = listed.group(1) if listed else shown
    if "|" in inner and " " not in inner:
        choices = click.Choice(inner.split("|"))
        choices.name = "choices, repeatable" if listed else "choice"
        return choices
    return _Shown(f"{inner}, repeatable" if listed else inner)


def _without_default(text: str) -> tuple[str, str | None]:
    """``help  [default: 0; x>=0]`` -> (``help (x>=0)``, ``0``): the default apart, the other notes kept."""
    match = re.search(r"\s*\[([^\[\]]*)\]\s*$", text)
    if not match:
        return text, None
    default, notes = None, []
    for note in match.group(1).split("; "):
        if note.startswith("default: "):
            default = note.removeprefix("default: ")
        else:
            notes.append(note)
    text = text[:match.start()] + (f" ({'; '.join(notes)})" if notes else "")
    return text, default
