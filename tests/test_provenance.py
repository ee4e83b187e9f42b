"""Every result file records where it came from (moglm.provenance): machine, command, code, versions, seed."""

from __future__ import annotations

import json
import sys

from conftest import tiny_config
from moglm import provenance
from moglm.cli import main


def test_a_trained_runs_results_record_machine_command_code_versions_and_seed(tiny_corpus, tmp_path, monkeypatch):
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(tiny_corpus, train={"max_steps": 4, "seed": 7}, sample={"num_tokens": 0}).to_toml())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["/some/venv/bin/moglm", "train", str(config), "--run-dir", "run"])
    assert main(["train", str(config), "--run-dir", "run", "--no-progress"]) == 0
    record = json.loads((tmp_path / "run" / "results.json").read_text())["provenance"]
    assert record["seed"] == 7 and record["moglm"] and record["torch"] and record["python"]
    assert record["machine"]["cpu"] and record["machine"]["cores"] >= 1 and record["machine"]["usable_cores"] >= 1
    assert record["command"] == "moglm train tiny.toml --run-dir run"  # no absolute path of this machine
    if (provenance.Path(provenance.__file__).resolve().parent.parent / ".git").exists():
        assert len(record["commit"]) == 40 and isinstance(record["dirty"], bool)


def test_commands_are_written_with_portable_paths(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path.parent))
    monkeypatch.setattr(sys, "argv", ["/x/bin/moglm", "report", f"{tmp_path}/runs/a", f"{tmp_path.parent}/b c"])
    assert provenance.command() == "moglm report runs/a '~/b c'"
    monkeypatch.setattr(sys, "argv", ["/x/moglm/__main__.py", "info"])
    assert provenance.command() == "moglm info"


def test_stamping_replaces_an_old_record_and_keeps_the_data(tmp_path):
    path = provenance.write_result(tmp_path / "r.json", {"score": 1.5, "provenance": {"old": True}}, seed=3)
    data = json.loads(path.read_text())
    assert data["score"] == 1.5 and data["provenance"]["seed"] == 3 and "old" not in data["provenance"]


def test_a_benchmark_script_and_the_installed_tool_are_recorded_as_typed_wherever_the_tool_is_installed(
        monkeypatch, tmp_path):
    """One recorder for results' commands: ``moglm ...`` for the entry point even where its environment lies in the
    working folder, ``python benchmarks/x.py ...`` for a script there, a script elsewhere by its name alone."""
    from moglm.bench import command_line

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", "/nonexistent-home")
    monkeypatch.setattr(sys, "argv", [f"{tmp_path}/.venv/bin/moglm", "bench", "throughput", "--model", "moglm LSTM"])
    assert provenance.command() == command_line() == "moglm bench throughput --model 'moglm LSTM'"
    monkeypatch.setattr(sys, "argv", [f"{tmp_path}/benchmarks/x.py", "--out", f"{tmp_path}/r.json"])
    assert command_line() == "python benchmarks/x.py --out r.json"
    monkeypatch.setattr(sys, "argv", ["/elsewhere/y.py", "--repeats", "3"])
    assert command_line() == "y.py --repeats 3"
