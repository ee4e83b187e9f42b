"""Every command's ``--help`` shows all of its text; options with a fixed set of values show the values and
refuse others with one line; the deprecated spellings of renamed options still work, with a warning."""

from __future__ import annotations

import enum
import types
import typing

import pytest
import typer

from moglm.cli import common as cli_common
from moglm.cli import main
from moglm.cli.app import build_app


def _commands(command=None, path=()):
    """(path, click command) of the root, every command and every sub-command, from the app itself."""
    command = command or typer.main.get_command(build_app())
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _commands(sub, path + (name,))


COMMANDS = list(_commands())


def _squeeze(text: str) -> str:
    """Without whitespace: click wraps lines (also after hyphens) and pads columns."""
    return "".join(text.split())


def _choices(param) -> list[str]:
    """The values of an option with a fixed set: click's Choice type, or (Typer without click types) the
    option's ``Literal`` or ``Enum`` annotation, inside ``Optional`` and ``list``."""
    choices = getattr(getattr(param, "type", None), "choices", None)
    if choices is None:
        annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
        while typing.get_origin(annotation) in (typing.Union, list, types.UnionType):
            annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
        if typing.get_origin(annotation) is typing.Literal:
            choices = typing.get_args(annotation)
        elif isinstance(annotation, type) and issubclass(annotation, enum.Enum):
            choices = list(annotation)
    return [getattr(c, "value", c) for c in choices or []]


def test_every_command_is_found():
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"", "train", "evaluate", "sample", "tune", "dyneval", "task dyck", "bench throughput"} <= names
    assert len(names) >= 15


@pytest.mark.parametrize("path,command", COMMANDS, ids=[" ".join(p) or "moglm" for p, _ in COMMANDS])
def test_help_shows_every_help_text_and_choice(path, command, capsys):
    assert main([*path, "--help"]) == 0
    captured = capsys.readouterr()
    out = _squeeze(captured.out)
    assert captured.err == ""
    if command.help:
        assert _squeeze(command.help.split("\n\n")[0]) in out
    for param in command.params:
        if getattr(param, "hidden", False):
            for name in param.opts:
                assert name not in captured.out.split(), f"hidden {name} shows"
            continue
        if getattr(param, "help", None):
            assert _squeeze(param.help) in out, f"{' '.join(path)} {param.name}: help text lost"
        choices = _choices(param)
        if choices:
            assert _squeeze("|".join(choices)) in out, f"{' '.join(path)} {param.name}: choices not shown"
            for name in param.opts:
                assert f"{name} <str>" not in captured.out


def test_options_with_a_fixed_set_of_values_are_choices():
    expected = {("evaluate", "split"), ("evaluate", "checkpoint"), ("sample", "checkpoint"), ("tune", "sampler"),
                ("dyneval", "split"), ("dyneval", "rule"), ("dyneval", "checkpoint"), ("task dyck", "objective"),
                ("task dyck", "positions"), ("task dyck", "architecture"), ("task reverse-copy", "architecture"),
                ("bench throughput", "model")}
    found = {(" ".join(path), p.name) for path, command in COMMANDS for p in command.params if _choices(p)}
    assert expected <= found


def test_the_value_sets_match_the_modules_that_define_them():
    from moglm import ARCHITECTURES
    from moglm.bench.throughput import GRAPHED, MODELS
    from moglm.dynamic_evaluation.update_rules import RULES
    from moglm.tasks.dyck_training import OBJECTIVES
    from moglm.tasks.wcpa import POSITIONS
    from moglm.data.detokenize import DETOKENIZERS
    from moglm.data.tokenizer import KINDS
    from moglm.tune.search_space import StudySettings

    assert typing.get_args(cli_common.TokenizerKind) == KINDS
    assert typing.get_args(cli_common.Detokenizer) == DETOKENIZERS
    assert typing.get_args(cli_common.UpdateRule) == tuple(RULES)
    assert typing.get_args(cli_common.DyckObjective) == tuple(OBJECTIVES)
    assert typing.get_args(cli_common.DyckPositions) == tuple(POSITIONS)
    assert set(typing.get_args(cli_common.Architecture)) == set(ARCHITECTURES)
    assert [m.value for m in cli_common.ThroughputModel] == [*MODELS, *GRAPHED]
    assert typing.get_args(cli_common.Sampler) == typing.get_args(StudySettings.model_fields["sampler"].annotation)


@pytest.mark.parametrize("args,values", [
    (["dyneval", "run", "--rule", "adam"], "'sgd', 'sgd-decay', 'rms', 'rms-decay', 'rms-rmsdecay'"),
    (["evaluate", "run", "--split", "dev"], "'train', 'valid', 'test'"),
    (["sample", "run", "--checkpoint", "first"], "'best', 'last'"),
    (["tune", "space", "--sampler", "cma"], "'gp', 'tpe', 'random'"),
    (["task", "dyck", "--objective", "xent"], "'closing', 'lm'"),
])
def test_a_bad_choice_is_one_line_naming_the_values(args, values, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: Invalid value for") and values in err
    assert f"(see moglm {args[0]}" in err and "Traceback" not in err and "Usage" not in err


def test_usage_errors_are_one_line(capsys):
    assert main(["evaluate"]) == 2
    err = capsys.readouterr().err
    assert err == "error: Missing argument 'run_dir'. (see moglm evaluate --help)\n"
    assert main(["train", "--no-such-option"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_command_without_arguments_prints_its_help(capsys):
    assert main([]) == 2
    assert "Usage: moglm [OPTIONS] COMMAND" in capsys.readouterr().out
    assert main(["bench"]) == 2
    assert "throughput" in capsys.readouterr().out


@pytest.mark.parametrize("args,old,new", [
    (["evaluate", "{run}", "--temperature", "1.0"], "--temperature", "--logit-factor"),
    (["dyneval", "{run}", "--lr", "0.1"], "--lr", "--learning-rate"),
    (["dyneval", "{run}", "--max-tokens", "10"], "--max-tokens", "--eval-tokens"),
    (["sample", "{run}", "--tokens", "3"], "--tokens", "--num-tokens"),
    (["sample", "{run}", "--adapt-lr", "0.1"], "--adapt-lr", "--adapt-learning-rate"),
])
def test_old_spellings_still_work_with_a_deprecation_warning(args, old, new, tmp_path, capsys):
    run = tmp_path / "no-run"
    assert main([a.format(run=run) for a in args]) == 1  # parsed, then refused: no run there
    err = capsys.readouterr().err
    assert f"warning: {old} is deprecated and will be removed in the next release; use {new}" in err
    assert "not a run directory" in err


def test_tune_token_budgets_say_which_kind_of_space_they_fit(capsys):
    assert main(["tune", "dyneval-word", "--train-tokens", "100"]) == 1
    assert "this space tunes dynamic evaluation" in capsys.readouterr().err
    assert main(["tune", "mogrifier", "--eval-tokens", "100"]) == 1
    assert "--eval-tokens applies to dynamic-evaluation spaces" in capsys.readouterr().err
