"""The synthetic tasks from the command line, end to end on tiny settings."""

from __future__ import annotations

import json

from moglm.cli import main


def test_dyck_dyck_rnn_and_a_language_model(tmp_path, capsys):
    tiny = ["--train-sequences", "60", "--valid-sequences", "10", "--test-sequences", "10", "--train-lengths", "6", "30", "--test-lengths",
            "32", "40", "--steps", "20", "--batch-size", "8", "--no-progress"]
    assert main(["task", "dyck", "--k", "2", "--m", "4", "--run-dir", str(tmp_path / "d"), *tiny]) == 0
    out = capsys.readouterr().out
    assert "test WCPA" in out and "closing-bracket prediction: dyck_rnn, hidden 4" in out
    results = json.loads((tmp_path / "d" / "results.json").read_text())
    assert results["task"]["max_depth"] == 4 and results["training"]["objective"] == "closing"
    assert {"config.toml", "metrics.jsonl", "results.json", "model.json", "checkpoints", "data"} <= {
        p.name for p in (tmp_path / "d").iterdir()}
    assert main(["task", "dyck", "--architecture", "gru", "--learned-embedding", *tiny]) == 1
    assert "learned 2-d bracket embedding" in capsys.readouterr().err
    assert main(["task", "dyck", "--architecture", "mmlstm", "--set", "model.cell.num_matrices=2",
                 "--run-dir", str(tmp_path / "lm"), *tiny]) == 0
    assert "test WCPA" in capsys.readouterr().out
    assert (tmp_path / "lm" / "lm" / "config.toml").is_file() and (tmp_path / "lm" / "data" / "train.txt").is_file()


def test_reverse_copy(tmp_path, capsys):
    args = ["task", "reverse-copy", "--length", "4", "--vocab-size", "6", "--architecture", "mogrifier",
            "--num-params", "5000", "--cell", "rounds=2", "--cell", "rank=2", "--steps", "10", "--eval-every", "5",
            "--test-examples", "50", "--run-dir", str(tmp_path / "rc"), "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "test: cross-entropy" in out and "of sequences exact" in out
    results = json.loads((tmp_path / "rc" / "results.json").read_text())
    assert results["num_params"] <= 5000 and results["task"]["cell"] == {"rounds": 2, "rank": 2}
    assert main([*args[:-3], "--run-dir", str(tmp_path / "rc"), "--length", "5", "--no-progress"]) == 1
    assert "different config" in capsys.readouterr().err
    assert main([*args[:-3], "--run-dir", str(tmp_path / "rc"), "--length", "5", "--restart", "--no-progress"]) == 0


def test_partial_sentences(tiny_corpus, tmp_path, capsys):
    args = ["task", "partial-sentences", "--cut", "3", "--set", f"data.path={tiny_corpus}", "--set", "data.format=word",
            "--set", "model.hidden_size=16", "--set", "model.cell={rounds: 2, rank: 2}", "--set", "train.max_steps=6",
            "--set", "train.eval_every=3", "--set", "train.batch_size=4", "--set", "train.bptt=8",
            "--set", "sample.num_tokens=0", "--set", "evaluation.temperature_search=false",
            "--set", "evaluation.splits=[valid, test]",
            "--run-dir", str(tmp_path / "p"), "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "trained on sentences cut at 3" in out and "test ppl" in out
    assert (tmp_path / "p" / "data" / "train.txt").read_text().splitlines()[0].count(" ") == 2
