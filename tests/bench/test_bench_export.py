"""``moglm bench export``: a tiny run exported and checked against itself, from the command line."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")

from conftest import tiny_trained_run  # noqa: E402

from moglm.cli import main  # noqa: E402


def test_bench_export_reports_equal_logits_and_the_same_greedy_tokens(tmp_path, capsys):
    run = tiny_trained_run(tmp_path, max_steps=2, eval_every=2)
    out = tmp_path / "export.json"
    assert main(["bench", "export", str(run), "--tokens", "60", "--new-tokens", "8", "--repeats", "1",
                 "--prompt", "the cat", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["logits"]["tokens"] == 60 and report["logits"]["window"] == 10
    assert report["logits"]["max_abs_difference_one_pass"] <= 1e-5
    assert report["logits"]["max_abs_difference_windows"] <= 1e-5
    assert report["generation"]["same_tokens"] and report["generation"]["generate_tokens_per_second"] > 0
    assert report["provenance"]["machine"]["cpu"] and report["export"]["bytes"] > 0
    assert "| the same tokens | yes |" in capsys.readouterr().out
