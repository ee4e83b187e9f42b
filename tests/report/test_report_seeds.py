"""Orderings with their spread (moglm.report.seeds): several seeds per variant give mean ± std rows, and an
ordering is called reproduced only when the gap between means exceeds the sum of the standard deviations."""

from __future__ import annotations

import json
import statistics

import pytest

pytest.importorskip("optuna")

from conftest import tiny_text_file as _tiny_text  # noqa: E402
from moglm.experiments.runner import run_experiment  # noqa: E402
from moglm.report import write_report  # noqa: E402
from moglm.report.runs import read_experiment  # noqa: E402
from moglm.report.seeds import ordering_record, stands  # noqa: E402

TWO_SEEDS = """
format_version = 1
name = "two-seeds"
description = "LSTM vs Mogrifier over two seeds"
source = "a test"
config = "{corpus}-mogrifier-{size}"
seeds = [1, 2]
evaluations = ["static"]
[corpora.ptb-word]
label = "PTB word"
[variants.mogrifier]
label = "Mogrifier"
[variants.lstm]
label = "LSTM"
set = { "model.architecture" = "lstm" }
[scales.smoke]
size = "cpu"
set = { "model.num_params" = 100_000, "train.max_steps" = 4, "train.eval_every" = 2, "train.batch_size" = 4, "train.bptt" = 12, "train.eval_batch_size" = 2, "evaluation.temperature_tokens" = 200, "sample.num_tokens" = 0 }
[scales.cpu]
[scales.paper]
[[tables]]
title = "Scores"
evaluations = ["static"]
"""


def test_a_gap_counts_only_beyond_the_spread_and_only_with_several_seeds():
    assert stands((100.0, 1.0, 3), (103.0, 1.5, 3))  # gap 3 > 2.5
    assert not stands((100.0, 1.0, 3), (102.0, 1.5, 3))  # gap 2 <= 2.5
    assert not stands((100.0, 0.0, 1), (200.0, 0.0, 1))  # one seed: no spread known, nothing reproduced


def test_a_two_seed_experiment_reports_mean_std_and_each_ordering_against_the_spread(tmp_path):
    definition = tmp_path / "two-seeds.toml"
    definition.write_text(TWO_SEEDS)
    folder = run_experiment(definition, "smoke", root=tmp_path / "root", data=str(_tiny_text(tmp_path / "tiny.txt")),
                            progress=False, log=lambda s: None)
    report = write_report([folder]).read_text()
    _, runs = read_experiment(folder)
    assert sorted((r.variant, r.seed) for r in runs) == [("lstm", 1), ("lstm", 2), ("mogrifier", 1), ("mogrifier", 2)]
    assert "| Mogrifier (seed 1) |" in report and "| LSTM (seed 2) |" in report
    values = [json.loads((r.path / "evaluations" / "static.json").read_text())["splits"]["test"]["bits_per_token"]
              for r in runs if r.variant == "lstm"]
    mean, std = statistics.fmean(values), statistics.stdev(values)
    row = next(line for line in report.splitlines() if line.startswith("| LSTM |"))
    assert f"{mean:.3f} ± {std:.3f} (n = 2)" in row
    def scores(variant):  # the test bits per character of a variant's seeds, read from their files
        return [json.loads((r.path / "evaluations" / "static.json").read_text())["splits"]["test"]["bits_per_token"]
                for r in runs if r.variant == variant]

    (m, sm), (l, sl) = ((statistics.fmean(v), statistics.stdev(v)) for v in (scores("mogrifier"), scores("lstm")))
    better, worse = ("Mogrifier", "LSTM") if m < l else ("LSTM", "Mogrifier")
    sign = " < " if abs(m - l) > sm + sl else " ≈ "
    assert f"- static test: {better}{sign}{worse}" in report
    record = ordering_record({"evaluations": ["static"], "splits": ["test"]}, runs)
    assert len(record) == 1 and record[0]["gap"] == pytest.approx(abs(m - l))
    assert record[0]["spread"] == pytest.approx(sm + sl)


def test_a_bundled_report_links_only_to_files_inside_its_folder_and_they_carry_their_provenance(tmp_path):
    from moglm.report.bundle import LINK

    definition = tmp_path / "two-seeds.toml"
    definition.write_text(TWO_SEEDS.replace("seeds = [1, 2]", "seeds = [1]"))
    folder = run_experiment(definition, "smoke", root=tmp_path / "root", data=str(_tiny_text(tmp_path / "tiny.txt")),
                            progress=False, log=lambda s: None)
    out = tmp_path / "committed"
    report = write_report([folder], out, bundle=True)
    links = [link for link in LINK.findall(report.read_text()) if "://" not in link]
    assert any(link.endswith("evaluations/static.json") for link in links)
    for link in links:
        target = (out / link).resolve()
        assert target.exists() and out.resolve() in target.parents, link
    static = json.loads((out / "runs" / "tiny-lstm-s1" / "evaluations" / "static.json").read_text())
    assert static["provenance"]["seed"] == 1 and static["provenance"]["machine"]["cpu"]
    assert not list(out.rglob("*.safetensors"))  # never checkpoints or token losses
