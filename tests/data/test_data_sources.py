"""datasets corpora (data.source): saved datasets, local JSON / parquet / text files, split names, text fields."""

from __future__ import annotations

import json

import numpy as np
import pytest

from moglm.data import EOS, load_corpus
from moglm.data import sources
from moglm.errors import MoglmError

datasets = pytest.importorskip("datasets")

SPLIT_TEXTS = {"train": ["the cat sat", "the dog ran\n", "", "a cat ran"], "validation": ["the cat ran"],
               "test": ["a dog sat", "the cat"]}


def _files_corpus(tmp_path, fmt="word"):
    """The same text as files: each record a line."""
    d = tmp_path / "files"
    d.mkdir()
    for split, name in (("train", "train"), ("valid", "validation"), ("test", "test")):
        (d / f"{split}.txt").write_text("".join(t if t.endswith("\n") else t + "\n" for t in SPLIT_TEXTS[name]))
    return load_corpus(str(d), fmt, use_cache=False)


def _same(a, b):
    assert a.vocab.itos == b.vocab.itos
    for s in ("train", "valid", "test"):
        np.testing.assert_array_equal(a[s], b[s])
    assert a.words == b.words and a.bytes == b.bytes


def test_a_saved_dataset_dict_reads_its_field_and_maps_validation_to_valid(tmp_path):
    saved = datasets.DatasetDict({k: datasets.Dataset.from_dict({"body": v, "id": list(range(len(v)))})
                                  for k, v in SPLIT_TEXTS.items()})
    saved.save_to_disk(str(tmp_path / "saved"))
    c = load_corpus(format="word", source=str(tmp_path / "saved"), text_field="body", use_cache=False)
    _same(c, _files_corpus(tmp_path))
    assert c.name == "saved"


@pytest.mark.parametrize("fmt", ["word", "char", "byte"])
def test_json_lines_files_in_a_folder_equal_the_same_text_as_files(tmp_path, fmt):
    folder = tmp_path / "jsonl"
    folder.mkdir()
    for split, texts in SPLIT_TEXTS.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"text": t, "n": 1}) + "\n" for t in texts))
    _same(load_corpus(format=fmt, source=str(folder), use_cache=False), _files_corpus(tmp_path, fmt))


def test_a_text_file_source_is_one_record_per_line(tmp_path):
    files = tmp_path / "texts"
    files.mkdir()
    for split, texts in SPLIT_TEXTS.items():
        (files / f"{split}.txt").write_text("".join(t if t.endswith("\n") else t + "\n" for t in texts))
    _same(load_corpus(format="word", source=str(files), use_cache=False), _files_corpus(tmp_path))


def test_one_parquet_file_is_cut_by_split_fractions_of_its_records(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    texts = [f"record {i} says {'ab' * (i % 5)}" for i in range(100)]
    pq.write_table(pa.table({"content": texts}), str(tmp_path / "all.parquet"))
    c = load_corpus(format="char", source=str(tmp_path / "all.parquet"), text_field="content",
                    split_fractions=(0.8, 0.1, 0.1), use_cache=False)
    assert c.vocab.decode(c["valid"]) == "".join(t + "\n" for t in texts[80:90])
    assert c.vocab.decode(c["test"]) == "".join(t + "\n" for t in texts[90:])


def test_split_names_map_other_names_and_unknown_ones_are_one_line(tmp_path):
    saved = datasets.DatasetDict({"fit": datasets.Dataset.from_dict({"text": ["a b", "b a"]}),
                                  "dev": datasets.Dataset.from_dict({"text": ["a"]}),
                                  "heldout": datasets.Dataset.from_dict({"text": ["b a"]})})
    saved.save_to_disk(str(tmp_path / "s"))
    c = load_corpus(format="word", source=str(tmp_path / "s"), split_names={"train": "fit", "test": "heldout"},
                    use_cache=False)
    tokens = {split: [c.vocab.itos[i] for i in c[split]] for split in ("valid", "test")}
    assert tokens == {"test": ["b", "a", EOS], "valid": ["a", EOS]}  # valid: dev, found by default
    with pytest.raises(MoglmError, match=r"has no split 'testing' \(its splits: fit, dev, heldout\)") as e:
        load_corpus(format="word", source=str(tmp_path / "s"), split_names={"train": "fit", "test": "testing"})
    assert "\n" not in str(e.value)
    with pytest.raises(MoglmError, match="no split found for train, test"):
        load_corpus(format="word", source=str(tmp_path / "s"))


def test_a_field_that_does_not_exist_is_one_line_naming_the_fields(tmp_path):
    saved = datasets.Dataset.from_dict({"body": ["a b"] * 20, "label": [0] * 20})
    saved.save_to_disk(str(tmp_path / "one"))
    with pytest.raises(MoglmError) as e:
        load_corpus(format="word", source=str(tmp_path / "one"))
    assert str(e.value) == f"data.text_field 'text': the dataset {str(tmp_path / 'one')!r} has no such field " \
                           "(its fields: body, label)"
    (tmp_path / "j.jsonl").write_text('{"body": "x"}\n' * 30)
    with pytest.raises(MoglmError, match="data.text_field 'text'.*its fields: body"):
        load_corpus(format="word", source=str(tmp_path / "j.jsonl"))


def test_a_hub_name_without_network_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(MoglmError, match="cannot be read as a datasets corpus") as e:
        load_corpus(format="word", source="no-such-user/no-such-dataset", use_cache=False)
    assert "\n" not in str(e.value)


def test_records_stream_in_batches_and_no_split_is_read_whole(tmp_path, monkeypatch):
    """A saved dataset is read a batch of records at a time (memory-mapped Arrow), and each split's text
    reaches the tokenizer piece by piece: no split's text is ever one string."""
    saved = datasets.Dataset.from_dict({"text": [f"w{i % 7} w{i % 3}" for i in range(2_500)]})
    saved.save_to_disk(str(tmp_path / "big"))
    monkeypatch.setattr(sources, "BATCH", 100)
    opened = sources.open_source(str(tmp_path / "big"))
    pieces = list(opened.splits["train"]())
    assert len(pieces) == 2_250 and max(len(p) for p in pieces) < 10
    c = load_corpus(format="word", source=str(tmp_path / "big"), use_cache=False)
    assert len(c["train"]) == 3 * 2_250


def test_a_source_and_a_path_together_are_refused_by_the_config():
    from moglm.runs.config import validate

    with pytest.raises(MoglmError, match="set data.source .* or data.path"):
        validate({"data": {"source": "x", "path": "y"}})


def test_the_wikitext_103_byte_recipe_reads_the_raw_release_as_detokenized_bytes(tmp_path, monkeypatch):
    """wikitext-103-byte-mogrifier-gpu's data section, pointed at a local copy laid out as the Hub's
    wikitext-103-raw-v1 (one record per line, ``train`` / ``validation`` / ``test``), reads the text as bytes with
    WikiText's tokenization undone: what the general English model for compression trains on."""
    from moglm.runs.build import load_data
    from moglm.runs.config import load_config

    raw = {"train": ["", " = Valkyria = \n", "", " The game @-@ play , set in 1 @,@ 500 , began . \n"],
           "validation": [" = Tower = \n", " It is 3 @.@ 5 m high . \n"],
           "test": [" = River = \n", " The river 's course ( north ) runs far . \n"]}
    datasets.DatasetDict({k: datasets.Dataset.from_dict({"text": v}) for k, v in raw.items()}).save_to_disk(
        str(tmp_path / "wikitext-103-raw"))
    monkeypatch.chdir(tmp_path)
    cfg = load_config("wikitext-103-byte-mogrifier-gpu")
    assert cfg.data.source == "Salesforce/wikitext:wikitext-103-raw-v1" and cfg.data.format == "byte"
    corpus = load_data(cfg.data.model_copy(update={"source": "wikitext-103-raw"}))
    text = {s: bytes(corpus[s].tolist()).decode() for s in ("train", "valid", "test")}
    assert "The game-play, set in 1,500, began.\n" in text["train"]
    assert "It is 3.5 m high.\n" in text["valid"]
    assert "The river's course (north) runs far.\n" in text["test"]
    assert len(corpus.vocab) == 256 and " @" not in "".join(text.values())
