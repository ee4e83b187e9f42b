"""The workload registry: every built-in workload's hooks import, every shipped experiment and search space
finds its workload, a plug-in joins through the entry-point group, and the package keeps its layers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from moglm import registry
from moglm.errors import MoglmError
from moglm.registry import Workload, for_experiment, for_tuning, workloads

PACKAGE = Path(registry.__file__).parent


@pytest.mark.parametrize("workload", registry.BUILTIN, ids=lambda w: w.name)
def test_every_hook_of_a_builtin_workload_imports(workload):
    for hook in workload.hooks:
        assert callable(workload.hook(hook)), hook
    if workload.commands is not None:
        assert registry.load(workload.commands[1]).registered_commands


def test_every_shipped_experiment_and_search_space_has_its_workload():
    from moglm.experiments.spec import load_experiment, shipped
    from moglm.tune import load_space, shipped_spaces

    for name in shipped():
        exp = load_experiment(name)
        assert exp.is_analysis or for_experiment(exp.kind).experiment_kind == exp.kind
    for name in shipped_spaces():
        space = load_space(name)[0]
        assert for_tuning(space.target).tuning_target == space.target


def test_an_unknown_kind_or_target_is_one_line_naming_the_known_ones():
    with pytest.raises(MoglmError, match="no workload for experiment kind 'chess' .*language_model"):
        for_experiment("chess")
    with pytest.raises(MoglmError, match="no workload for tuning target 'chess' .*dyneval"):
        for_tuning("chess")
    with pytest.raises(ValueError, match="unknown hook 'train'"):
        Workload("chess", "a game", hooks={"train": "chess:train"})
    with pytest.raises(MoglmError, match="the dyck workload has no experiment run"):
        next(w for w in workloads() if w.name == "dyck").hook("experiment_run")


def test_a_package_adds_a_workload_through_the_entry_point_group(monkeypatch):
    import importlib.metadata as metadata

    chess = Workload("chess", "a game", experiment_kind="chess", hooks={"config": "moglm.runs.config:RunConfig"})

    class Entry:
        name, value = "chess", "chess_plugin:WORKLOAD"

        def load(self):
            return chess

    monkeypatch.setattr(metadata, "entry_points", lambda group: [Entry()] if group == "moglm.workloads" else [])
    assert for_experiment("chess") is chess and chess in workloads()


def test_no_command_function_is_longer_than_80_lines():
    long = []
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if node.end_lineno - start + 1 > 80:
                    long.append(f"{path.name}:{node.name}")
    assert not long


def test_the_layers_and_the_absence_of_import_cycles_hold():
    """The import-linter contracts of pyproject.toml (what `lint-imports` checks in CI)."""
    pytest.importorskip("importlinter")
    from importlinter.cli import lint_imports

    root = PACKAGE.parent
    if not (root / "pyproject.toml").is_file():
        pytest.skip("not a source checkout (no pyproject.toml beside the package)")
    assert lint_imports(config_filename=str(root / "pyproject.toml"), no_cache=True) == 0
