"""One vocabulary of options across commands: moglm train's hyperparameter options, "did you mean" for config
names, keys and options, quiet-by-default info, and an honest end to training."""

from __future__ import annotations

import sys

import pytest

from conftest import tiny_config
from moglm.cli import main

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@pytest.fixture
def config_file(tiny_corpus, tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(tiny_config(tiny_corpus, train={"max_steps": 8}, sample={"num_tokens": 0}).to_toml())
    return path


def test_train_takes_the_common_hyperparameters_as_options_and_says_what_it_scored(config_file, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", str(config_file), "--run-dir", str(run), "--learning-rate", "0.02", "--max-steps", "4",
                 "--batch-size", "3", "--hidden-size", "20", "--threads", "1", "--seed", "5", "--no-progress"]) == 0
    out = capsys.readouterr().out
    saved = tomllib.loads((run / "config.toml").read_text())
    assert saved["train"]["learning_rate"] == 0.02 and saved["train"]["max_steps"] == 4
    assert saved["train"]["batch_size"] == 3 and saved["train"]["threads"] == 1 and saved["train"]["seed"] == 5
    assert saved["model"]["hidden_size"] == 20
    final = [line for line in out.splitlines() if line.startswith("final scores above")]
    assert len(final) == 1 and "batch size 1" in final[0] and "validation lines during training" in final[0]
    assert out.count("valid: ") == 1  # the score once, as it was computed
    assert "softmax temperature factor" not in out and "logit factor" in out


def test_the_deprecated_lr_still_works_with_a_warning(config_file, tmp_path, capsys):
    assert main(["train", str(config_file), "--run-dir", str(tmp_path / "r"), "--lr", "0.02", "--max-steps", "2",
                 "--no-progress"]) == 0
    assert "--lr is deprecated" in capsys.readouterr().err
    assert tomllib.loads((tmp_path / "r" / "config.toml").read_text())["train"]["learning_rate"] == 0.02


@pytest.mark.parametrize("args, suggestion", [
    (["train", "ptb-word-mogrifer-cpu"], "did you mean 'ptb-word-mogrifier-cpu'?"),
    (["train", "--set", "train.learning_rat=0.1"], "did you mean 'train.learning_rate'?"),
    (["music", "train", "jsb-chorales-lstm-nade-cp"], "did you mean 'jsb-chorales-lstm-nade-cpu'?"),
    (["train", "--learning-rat", "0.1"], "Possible options: --learning-rate"),
])
def test_a_mistyped_config_name_key_or_option_gets_a_suggestion(args, suggestion, capsys):
    assert main(args) != 0
    err = capsys.readouterr().err
    assert suggestion in err and "Traceback" not in err


def test_info_is_a_summary_unless_verbose(capsys):
    assert main(["info"]) == 0
    quiet = capsys.readouterr().out
    assert main(["info", "--verbose"]) == 0
    verbose = capsys.readouterr().out
    assert len(quiet.splitlines()) <= len(verbose.splitlines()) and len(quiet.splitlines()) <= 20


@pytest.mark.parametrize("extra, named", [(["--sparse"], "--sparse"), (["--streams", "2"], "--streams"),
                                          (["--split", "valid"], "--split"), (["--mc-samples", "2"], "--mc-samples"),
                                          (["--search-tokens", "50"], "--search-tokens"),
                                          (["--checkpoint", "last"], "--checkpoint"), (["--episodic"], "--episodic"),
                                          (["--no-cuda-graphs"], "--cuda-graphs/--no-cuda-graphs")])
def test_run_only_options_are_refused_with_hf_instead_of_ignored(tmp_path, capsys, extra, named):
    (tmp_path / "model").mkdir()
    assert main(["dyneval", "--hf", str(tmp_path / "model"), "--text", "t.txt", *extra]) == 1
    err = capsys.readouterr().err
    assert named in err and "not to --hf" in err and err.count("\n") == 1


def test_a_local_hf_path_that_does_not_exist_is_no_such_directory(capsys):
    assert main(["dyneval", "--hf", "./nonexistent", "--text", "t.txt"]) == 1
    assert "--hf ./nonexistent: no such directory" in capsys.readouterr().err


def test_sample_uses_the_runs_sample_settings_and_names_prompt_words_it_does_not_know(tiny_corpus, tmp_path,
                                                                                      capsys):
    config = tmp_path / "s.toml"
    config.write_text(tiny_config(tiny_corpus, train={"max_steps": 4},
                                  sample={"num_tokens": 7, "temperature": 0.5, "top_k": 3, "prompt": "the"}).to_toml())
    run = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["sample", str(run), "--seed", "3"]) == 0
    saved = capsys.readouterr().out
    assert main(["sample", str(run), "--seed", "3", "--prompt", "the", "--num-tokens", "7", "--temperature", "0.5",
                 "--top-k", "3"]) == 0
    assert capsys.readouterr().out == saved
    assert main(["sample", str(run), "--seed", "3", "--prompt", "the zebra"]) == 1  # no <unk> to read it as
    err = capsys.readouterr().err
    assert "prompt: 'zebra' is not in the vocabulary" in err and err.count("\n") == 1


def test_prompt_words_outside_a_vocabulary_with_unk_are_named_once(tmp_path, capsys):
    from moglm.data.corpus import build_corpus
    from moglm.sampling import unknown_prompt_tokens

    corpus = build_corpus("w", "word", {"train": "the cat sat <unk> .\n", "valid": "the\n", "test": "the\n"})
    assert corpus.vocab.unk is not None
    assert unknown_prompt_tokens(corpus.vocab, "the zebra sat zebra quokka") == ["zebra", "quokka"]


def test_a_corpus_without_a_newline_trains_and_says_there_is_no_sample(tmp_path, capsys):
    text = tmp_path / "one-line.txt"
    text.write_text("the cat sat on the mat and the dog ran far away " * 200)  # no newline anywhere
    assert main(["train", "--set", f"data.path={text}", "--set", "data.format=char", "--max-steps", "2",
                 "--set", "train.eval_every=2", "--set", "sample.num_tokens=10", "--set", "sample.prompt=''",
                 "--run-dir", str(tmp_path / "run"),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "no sample after training" in out and "set sample.prompt" in out and "--- sample ---" not in out
    assert (tmp_path / "run" / "results.json").is_file()


def test_a_prompt_the_corpus_cannot_spell_never_stops_training(tmp_path, capsys):
    """The default config's prompt, "The ", on a corpus with no newline and no 'T': training runs, and after the
    final evaluation one line says the sample is skipped."""
    text = tmp_path / "lower.txt"
    text.write_text("the cat sat on the mat and the dog ran far away " * 200)
    assert main(["train", "--set", f"data.path={text}", "--max-steps", "2", "--set", "train.eval_every=2",
                 "--set", "sample.num_tokens=10", "--run-dir", str(tmp_path / "run"), "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    warning = [i for i, line in enumerate(lines) if line.startswith("no sample after training:")]
    assert len(warning) == 1 and "'T' is not in the vocabulary" in lines[warning[0]]
    assert warning[0] > max(i for i, line in enumerate(lines) if line.startswith("valid:"))  # at the end
    assert not any("--- sample ---" in line for line in lines)
    assert (tmp_path / "run" / "results.json").is_file()
    # a character corpus's scores are bits per character, the validation lines and the final ones alike
    assert any(line.startswith("step 2: valid ") and " bpc" in line for line in lines)
    assert any(line.startswith("valid: ") and " bpc" in line for line in lines)
    assert not any("word" in line for line in lines if "valid" in line)


def test_dyneval_hf_out_that_is_a_folder_is_refused_before_the_model_loads(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    (tmp_path / "out").mkdir()
    assert main(["dyneval", "--hf", str(tmp_path / "model"), "--text", "t.txt", "--out", str(tmp_path / "out")]) == 1
    assert "is a folder: give a file name" in capsys.readouterr().err


def test_a_saved_prompt_the_vocabulary_cannot_spell_falls_back_to_an_empty_one(tiny_corpus, tmp_path, capsys):
    config = tmp_path / "s.toml"
    config.write_text(tiny_config(tiny_corpus, train={"max_steps": 2},
                                  sample={"num_tokens": 0, "prompt": "zebra"}).to_toml())
    run = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["sample", str(run), "--num-tokens", "5", "--seed", "1"]) == 0
    assert "the run's [sample] prompt cannot be used" in capsys.readouterr().err
    assert main(["sample", str(run), "--prompt", "zebra"]) == 1  # asked for: an error, not a fallback
