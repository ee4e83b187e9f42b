"""Subword runs from the command line: `moglm tokenizer train`, then train, evaluate, sample and load_run with the
tokenizer; bits per byte in results.json; one-line errors for files in the way and text a tokenizer cannot encode."""

from __future__ import annotations

import json
import shutil

import pytest

from moglm import load_run
from moglm.cli import main
from moglm.data.corpus import cache_root

pytest.importorskip("tokenizers")

TINY = """
[data]
format = "tokenizer"
[model]
architecture = "mogrifier"
num_layers = 1
hidden_size = 16
cell = { rounds = 2, rank = 3 }
[train]
batch_size = 4
bptt = 12
max_steps = 6
eval_every = 3
eval_batch_size = 2
device = "cpu"
[evaluation]
temperature_tokens = 200
[sample]
num_tokens = 6
prompt = "the cat"
"""


def _one_line_error(capsys, args, *expected):
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in err, err


def test_a_trained_tokenizer_file_trains_evaluates_and_samples_a_run(tiny_corpus, tmp_path, capsys):
    tok = tmp_path / "tok.json"
    assert main(["tokenizer", "train", str(tiny_corpus), "--vocab-size", "300", "--kind", "bpe", "-o", str(tok)]) == 0
    assert "tokenizer: " in capsys.readouterr().out and json.loads(tok.read_text())["model"]["type"] == "BPE"
    _one_line_error(capsys, ["tokenizer", "train", str(tiny_corpus), "--vocab-size", "300", "-o", str(tok)],
                    "exists: give --force")
    assert main(["tokenizer", "train", str(tiny_corpus), "--vocab-size", "290", "-o", str(tok), "--force"]) == 0
    capsys.readouterr()
    (tmp_path / "tiny.toml").write_text(TINY)
    run = tmp_path / "run"
    assert main(["train", str(tmp_path / "tiny.toml"), "--set", f"data.path={tiny_corpus}", "--set",
                 f"data.tokenizer={tok}", "--run-dir", str(run), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "valid ppl" in out and "bits/byte" in out and "--- sample ---\nthe cat" in out
    results = json.loads((run / "results.json").read_text())
    test = results["splits"]["test"]
    text = (tiny_corpus / "test.txt").read_text()
    assert results["level"] == "tokenizer" and test["bytes"] == len(text.encode())
    assert test["bits_per_byte"] == pytest.approx(test["xent"] * test["tokens"] / 0.6931471805599453 / test["bytes"])
    assert json.loads((run / "tokenizer.json").read_text()) == json.loads(tok.read_text())
    assert main(["evaluate", str(run), "--split", "test", "--no-progress"]) == 0
    assert "test: ppl" in capsys.readouterr().out
    assert main(["sample", str(run), "--prompt", "the dog", "--num-tokens", "5", "--seed", "3"]) == 0
    assert capsys.readouterr().out.startswith("the dog")
    trained = load_run(run)
    scores = trained.score("the cat sees the dog .\n")
    assert scores.tokens == len(trained.encode("the cat sees the dog .\n")) - 1


def test_a_run_that_trained_its_unigram_tokenizer_reads_its_corpus_with_that_one_later(tiny_corpus, tmp_path,
                                                                                       capsys):
    """Unigram training need not give the same vocabulary twice: evaluating after the corpus cache is gone reads the
    corpus with the run's own tokenizer.json, and the corpus it trained on is found again."""
    (tmp_path / "tiny.toml").write_text(TINY)
    run = tmp_path / "run"
    assert main(["train", str(tmp_path / "tiny.toml"), "--set", f"data.path={tiny_corpus}", "--set",
                 'data.tokenizer_training={kind = "unigram", vocab_size = 300}', "--run-dir", str(run),
                 "--no-progress", "--set", "sample.num_tokens=0"]) == 0
    first = json.loads((run / "results.json").read_text())["splits"]["test"]
    shutil.rmtree(cache_root())
    assert main(["evaluate", str(run), "--no-progress"]) == 0
    capsys.readouterr()
    assert json.loads((run / "results.json").read_text())["splits"]["test"] == first


def test_a_tokenizer_that_does_not_cover_the_corpus_is_one_line_before_training(tiny_corpus, tmp_path, capsys):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = Tokenizer(models.WordLevel({"[UNK]": 0, "the": 1, "cat": 2, ".": 3, "\n": 4}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words.save(str(tmp_path / "words.json"))
    (tmp_path / "tiny.toml").write_text(TINY)
    _one_line_error(capsys, ["train", str(tmp_path / "tiny.toml"), "--set", f"data.path={tiny_corpus}", "--set",
                             f"data.tokenizer={tmp_path / 'words.json'}", "--run-dir", str(tmp_path / "run")],
                    "the tokenizer cannot encode the train split: ", "at character 4 becomes its unknown token '[UNK]'")
    assert not (tmp_path / "run" / "vocab.json").exists()  # refused before training began


def test_a_datasets_field_that_does_not_exist_is_one_line(tmp_path, capsys):
    (tmp_path / "d.jsonl").write_text('{"body": "the cat"}\n' * 40)
    _one_line_error(capsys, ["train", "--set", f"data.source={tmp_path / 'd.jsonl'}", "--set", "data.format=word",
                             "--set", "data.text_field=content", "--run-dir", str(tmp_path / "run")],
                    "data.text_field 'content'", "has no such field (its fields: body)")
