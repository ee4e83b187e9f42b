"""Configs: every shipped config loads and builds; unknown keys, wrong types and bad files get one-line errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from moglm.errors import MoglmError
from moglm.model import count_parameters
from moglm.runs.build import build_model, resolve_hidden_size
from moglm.runs.config import apply_overrides, describe, load_config, shipped_configs, validate

# vocabulary sizes of the corpora the shipped configs name (so they build without reading the data)
VOCAB = {"ptb": 10_000, "ptb-char": 50, "wikitext-2": 33_278, "enwik8": 256, "text8": 27, None: 103}


@pytest.mark.parametrize("name", sorted(shipped_configs()))
def test_every_shipped_config_loads_and_builds(name):
    cfg = load_config(name)
    training = cfg.data.tokenizer_training
    vocab = training.vocab_size if training else 256 if cfg.data.format == "byte" else VOCAB[cfg.data.path]
    hidden = resolve_hidden_size(cfg.model, vocab)
    with torch.device("meta"):
        model = build_model(cfg.model, vocab, hidden)
    if cfg.model.num_params:
        assert count_parameters(model) <= cfg.model.num_params
        assert cfg.model.num_params - count_parameters(model) < 0.01 * cfg.model.num_params
    assert validate(cfg.model_dump(mode="json")) == cfg  # the resolved form round-trips
    assert cfg.description


def test_there_are_paper_and_cpu_budget_configs_for_each_corpus_and_model():
    names = set(shipped_configs())
    for corpus in ("ptb-word", "ptb-char", "wikitext-2"):
        for model in ("lstm", "mogrifier"):
            for budget in ("paper", "cpu"):
                assert f"{corpus}-{model}-{budget}" in names
    for corpus in ("ptb-word", "ptb-char"):  # the Transformer beside them (Krause thesis ch. 6)
        for budget in ("paper", "cpu"):
            assert f"{corpus}-transformer-{budget}" in names


def test_overrides_use_dotted_keys_and_yaml_values():
    cfg = load_config("default", ["train.learning_rate=0.002", "model.cell={rounds: 2, rank: 8}", "data.path=ptb"])
    assert cfg.train.learning_rate == 0.002 and cfg.model.cell == {"rounds": 2, "rank": 8} and cfg.data.path == "ptb"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["train.learning_rat=0.1"], "unknown key 'train.learning_rat'"),
        (["bogus.x=1"], "unknown key 'bogus'"),
        (["train.batch_size=many"], "train.batch_size: Input should be a valid integer"),
        (["model.state_dropout=1.5"], "model.state_dropout"),
        (["model.cell.rounds=2", "model.cell.ranks=3"], "cell.ranks: unknown option for mogrifier"),
        (["model.architecture=gpt"], "architecture must be one of"),
        (["model.num_params=1000"], "set exactly one of hidden_size and num_params"),
        (["format_version=99"], "format_version 99 is not supported"),
        (["nonsense"], "expected key=value"),
        (["train.learning_rate_schedule=linear", "train.min_learning_rate=1"], "min_learning_rate 1.0 is above"),
    ],
)
def test_bad_config_values_give_one_line_errors_naming_the_key(overrides, message):
    with pytest.raises(MoglmError, match=message) as e:
        load_config("default", overrides)
    assert "\n" not in str(e.value)


def test_config_files_in_toml_and_yaml_and_their_errors(tmp_path):
    (tmp_path / "a.toml").write_text('[train]\nlearning_rate = 0.001\n')
    (tmp_path / "b.yaml").write_text("train:\n  learning_rate: 0.001\n")
    assert load_config(tmp_path / "a.toml").train.learning_rate == load_config(tmp_path / "b.yaml").train.learning_rate
    assert load_config(tmp_path / "a.toml").name == "a"
    (tmp_path / "empty.toml").write_text("")
    (tmp_path / "broken.toml").write_text("[train\n")
    (tmp_path / "typo.toml").write_text('[train]\nlearnig_rate = 0.1\n')
    for path, message in [("empty.toml", "config file is empty"), ("broken.toml", "not valid TOML"),
                          ("missing.toml", "no such config file"), ("typo.toml", "unknown key 'train.learnig_rate'")]:
        with pytest.raises(MoglmError, match=message):
            load_config(tmp_path / path)


def test_every_field_is_documented():
    text = describe()
    assert "learning_rate" in text and "None\n" not in text.replace("= None\n", "")
    assert all(line.strip() for line in text.splitlines()[1:] if line.startswith("      "))


def test_apply_overrides_refuses_to_descend_into_a_value():
    with pytest.raises(MoglmError, match="not a section"):
        apply_overrides({"train": 3}, ["train.x=1"])


def test_cell_options_are_typed_per_architecture_and_set_as_an_inline_table():
    cfg = load_config("default", ["model.cell={rounds = 3, rank = 4}"])
    assert cfg.model.cell == {"rounds": 3, "rank": 4}
    with pytest.raises(MoglmError, match=r"model.cell: .*cell.depth: unknown option for mogrifier \(its options: "):
        load_config("default", ["model.cell.depth=3"])
    with pytest.raises(MoglmError, match=r"cell.rounds: .*integer.*got 'three'"):
        load_config("default", ["model.cell.rounds=three"])
    with pytest.raises(MoglmError, match=r"cell.zigzag: .*boolean"):
        load_config("default", ["model.cell.zigzag=3"])


def test_switching_the_architecture_drops_the_files_cell_options_the_new_one_lacks():
    assert load_config("default", ["model.architecture=lstm"]).model.cell == {}
    assert load_config("default", ["model.architecture=mogrifier_gru"]).model.cell == {"rounds": 5, "rank": 32}
    with pytest.raises(MoglmError, match="cell.rounds: unknown option for lstm"):  # asked for explicitly: refused
        load_config("default", ["model.architecture=lstm", "model.cell.rounds=2"])


def test_help_config_documents_every_architectures_options():
    from moglm.modules import ARCHITECTURES
    from moglm.runs.config import describe

    text = describe()
    for name, module in ARCHITECTURES.items():
        assert f"[model.cell] for architecture = {name!r}" in text
        for f in dataclasses.fields(module.Options):
            assert f.metadata["help"] and f.metadata["help"].split()[0] in text
    assert "rounds = 5" in text and "Mogrifier rounds" in text


def test_the_shipped_configs_use_the_papers_initialisation_and_the_default_is_torchs():
    from moglm.runs.config import ModelConfig, shipped_configs

    assert ModelConfig(hidden_size=8).init == "torch"
    assert all(load_config(name).model.init == "paper" for name in shipped_configs())


def test_the_data_section_reads_files_or_a_datasets_corpus_with_a_tokenizer():
    """The data fields, their defaults and their order are pinned: configs and run directories name them."""
    from moglm.runs.config import DataConfig, TokenizerTraining

    defaults = {name: (f.default_factory() if f.default_factory else f.default)
                for name, f in DataConfig.model_fields.items()}
    assert defaults == {"path": None, "source": None, "text_field": "text", "split_names": None, "format": "char",
                        "tokenizer": None, "tokenizer_training": None, "detokenize": None, "files": None,
                        "split_fractions": (0.9, 0.05, 0.05), "episodic": False, "max_length": None}
    assert TokenizerTraining().model_dump() == {"kind": "bpe", "vocab_size": 8000}
    cfg = validate({"data": {"source": "wikitext:wikitext-2-raw-v1", "text_field": "page", "split_names": {
        "valid": "validation"}, "format": "tokenizer", "tokenizer_training": {"kind": "unigram", "vocab_size": 4000},
        "detokenize": "wikitext"}})
    assert cfg.data.tokenizer_training.kind == "unigram" and cfg.data.split_names == {"valid": "validation"}
    assert validate(cfg.model_dump(mode="json")) == cfg
    assert all(f.description for f in DataConfig.model_fields.values())


@pytest.mark.parametrize("data, message", [
    ({"format": "tokenizer"}, "needs one of data.tokenizer .* and data.tokenizer_training"),
    ({"format": "tokenizer", "tokenizer": "t.json", "tokenizer_training": {}}, "needs one of"),
    ({"format": "char", "tokenizer": "t.json"}, "need format 'tokenizer', not 'char'"),
    ({"format": "word", "detokenize": "wikitext"}, "a word model reads the corpus's own tokens"),
    ({"format": "char", "detokenize": "ptb"}, "data.detokenize: Input should be 'wikitext'"),
    ({"source": "x", "files": {"train": "a"}}, "set data.source"),
    ({"format": "tokenizer", "tokenizer_training": {"vocab_size": 100}}, "vocab_size: Input should be greater"),
])
def test_bad_data_sections_are_one_line_errors(data, message):
    with pytest.raises(MoglmError, match=message) as e:
        validate({"data": data})
    assert "\n" not in str(e.value)


def test_the_new_data_fields_at_their_defaults_leave_saved_configs_and_digests_as_they_were():
    import json

    from moglm.experiments.runner import config_digest
    from moglm.runs.config import without_added_defaults

    cfg = load_config("wikitext-2-mogrifier-cpu")
    saved = without_added_defaults(json.loads(cfg.model_dump_json(exclude_none=True)))
    assert set(saved["data"]) == {"path", "format", "split_fractions", "episodic"}
    before = {k: v for k, v in json.loads(cfg.model_dump_json(exclude_none=True)).items()}
    before["data"] = {k: before["data"][k] for k in ("path", "format", "split_fractions", "episodic")}
    assert config_digest(json.loads(cfg.model_dump_json(exclude_none=True))) == config_digest(before)


def test_train_cuda_graphs_is_auto_by_default_and_takes_true_false_or_null(tmp_path):
    assert load_config().train.cuda_graphs is None
    for text, value in (("true", True), ("false", False), ("null", None)):
        assert load_config(None, [f"train.cuda_graphs={text}"]).train.cuda_graphs is value
    with pytest.raises(MoglmError, match="train.cuda_graphs: Input should be a valid boolean"):
        load_config(None, ["train.cuda_graphs=sometimes"])
    old = tmp_path / "old.toml"  # what a run directory of the release before auto holds
    old.write_text('format_version = 1\n[train]\ncuda_graphs = false\n')
    assert load_config(old).train.cuda_graphs is False


def test_auto_cuda_graphs_are_compared_and_digested_as_the_false_runs_recorded_before_auto():
    """Runs are found by their config's digest and resumed when their saved config matches: auto (the new
    default, left out of config.toml) is the false that configs recorded before it; true stays a run of its own."""
    import json

    from moglm.experiments.runner import config_digest
    from moglm.runs.config import run_identity, without_added_defaults

    cfg = load_config("wikitext-2-mogrifier-cpu")
    dumped = cfg.model_dump(mode="json")
    recorded = dumped | {"train": dumped["train"] | {"cuda_graphs": False}}  # as the release before auto had it
    assert config_digest(run_identity(dumped)) == config_digest(recorded)
    asked = dumped | {"train": dumped["train"] | {"cuda_graphs": True}}
    assert config_digest(run_identity(asked)) != config_digest(recorded)
    saved = without_added_defaults(json.loads(cfg.model_dump_json(exclude_none=True)))  # what config.toml holds
    assert "cuda_graphs" not in saved["train"]
    saved_before = saved | {"train": saved["train"] | {"cuda_graphs": False}}  # that release's config.toml
    saved_asked = saved | {"train": saved["train"] | {"cuda_graphs": True}}
    assert run_identity(saved) == run_identity(saved_before) != run_identity(saved_asked)
