"""Dynamic evaluation of a trained run: ``moglm dyneval`` end to end, cached statistics, one-line errors,
and ``moglm sample`` adapting to its prompt and output."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import copied_run, dyneval_report, tiny_trained_run, write_tiny_corpus
from moglm.cli import main
from moglm.dynamic_evaluation import DynamicEvaluator, Hyperparameters, StatisticsSettings
from moglm.dynamic_evaluation import statistics as statistics_module
from moglm.dynamic_evaluation.run import dyneval_run, run_statistics
from moglm.sampling import encode_prompt, sample
from moglm.runs.language_model import LanguageModelRun


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny trained run (shared by the tests of this module; they must not change it)."""
    return tiny_trained_run(tmp_path_factory.mktemp("dyneval"), max_steps=30, eval_every=10)


def test_dyneval_end_to_end(tiny_run, tmp_path, capsys):
    run = copied_run(tiny_run, tmp_path)
    args = ["dyneval", str(run), "--split", "valid", "--split", "test", "--search", "--search-tokens", "120",
            "--eval-tokens", "150", "--stats-batch-size", "2", "--stats-fraction", "0.5", "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "RMS statistics cached" in out and "searching on the first 121 validation tokens" in out
    assert "test: static ppl" in out and "-> dynamic ppl" in out and "rollbacks" in out
    report = dyneval_report(run, "full-first150")  # a short run: never the run's full.json
    assert not (run / "dyneval" / "full.json").exists()
    assert set(report["splits"]) == {"valid", "test"} and report["search"]["trials"]
    test = report["splits"]["test"]
    assert test["dynamic"]["tokens"] == test["static"]["tokens"] == 150 and test["profile"]["dynamic"]
    assert report["hyperparameters"] == report["search"]["kept"]  # the best, unless its gain is within its noise
    assert (run / "dyneval" / "full-first150-test.png").is_file()
    # the statistics are cached: a second run collects nothing
    assert main(args[:4] + ["--eval-tokens", "50", "--stats-batch-size", "2", "--stats-fraction", "0.5",
                            "--no-progress"]) == 0
    assert "RMS statistics cached" not in capsys.readouterr().out
    # sparse and episodic variants write their own reports
    assert main(["dyneval", str(run), "--sparse", "--sparse-units", "6", "--streams", "2", "--eval-tokens", "100",
                 "--rule", "sgd", "--learning-rate", "0.1", "--no-progress"]) == 0
    assert main(["dyneval", str(run), "--episodic", "--eval-tokens", "100", "--rule", "sgd", "--learning-rate", "0.1",
                 "--no-progress"]) == 0
    assert "decay 0" in capsys.readouterr().out
    assert dyneval_report(run, "sparse-first100")["sparse"] == {"units": 6, "layers": [0, 1]}
    assert dyneval_report(run, "full-episodic-first100")["episodic"] is True


def test_statistics_are_loaded_from_the_cache(tiny_run, tmp_path, monkeypatch):
    run = LanguageModelRun(copied_run(tiny_run, tmp_path))
    model, cfg, _ = run.load_model()
    from moglm.runs.build import load_data

    train = load_data(cfg.data)["train"]
    settings = StatisticsSettings(fraction=0.2, batch_size=2)
    first = run_statistics(run, "best", model, train, None, settings, False, lambda s: None)
    monkeypatch.setattr(statistics_module, "gradient_rms", lambda *a, **k: pytest.fail("collected again"))
    second = run_statistics(run, "best", model, train, None, settings, False, lambda s: None)
    assert sorted(first) == sorted(n for n, _ in model.named_parameters())
    assert all(torch.equal(first[n], second[n]) for n in first)


@pytest.mark.parametrize(
    "args, message, code",
    [
        (["--segment-length", "0"], "segment length must be an integer >= 1, got 0", 1),
        (["--rule", "adam"], "'adam' is not one of 'sgd', 'sgd-decay', 'rms', 'rms-decay', 'rms-rmsdecay'", 2),
        (["--split", "nope"], "'nope' is not one of 'train', 'valid', 'test'", 2),
        (["--episodic", "--streams", "2"], "episodic dynamic evaluation reads one stream", 1),
        (["--episodic", "--boundary", "<nope>"], "boundary token '<nope>' is not in the vocabulary", 1),
        (["--device", "cpu", "--cuda-graphs"], "--cuda-graphs needs one CUDA device (CUDA graphs are not supported "
         "on CPU or with data-parallel training; the device here is cpu)", 1),
    ],
)
def test_bad_arguments_are_one_line_errors(tiny_run, args, message, code, capsys):
    assert main(["dyneval", str(tiny_run), "--no-progress", *args]) == code
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_run_whose_training_data_is_missing_is_a_clear_error(tiny_run, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MOGLM_CACHE_DIR", str(tmp_path / "cache"))
    run = copied_run(tiny_run, tmp_path)
    corpus = write_tiny_corpus(tmp_path / "gone")
    config = (run / "config.toml").read_text()
    old = json.dumps(str(tiny_run.parent / "tiny"))
    assert old in config
    (run / "config.toml").write_text(config.replace(old, json.dumps(str(corpus))))
    (corpus / "train.txt").unlink()
    assert main(["dyneval", str(run), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "dynamic evaluation needs the run's training data" in err and err.count("\n") == 1
    assert main(["sample", str(run), "--adapt", "--num-tokens", "3"]) == 1
    assert "adapting while sampling needs the run's training data" in capsys.readouterr().err
    assert main(["dyneval", str(tmp_path / "nowhere")]) == 1
    assert "not a run directory" in capsys.readouterr().err


def test_sampling_adapts_to_the_prompt_and_to_its_output(tiny_run):
    model, _, vocab = LanguageModelRun(tiny_run).load_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    prompt = "the cat sees the dog .\nthe owl eats the cow .\nthe"
    assert encode_prompt(vocab, prompt).count(vocab.stoi["<eos>"]) == 3  # newlines are <eos>
    adapter = DynamicEvaluator(model, Hyperparameters(rule="sgd", lr=0.2, segment_length=3))
    text = sample(model, vocab, prompt, 12, generator=torch.Generator().manual_seed(0), adapter=adapter,
                  adapt_output=True)
    # 16 prompt ids: 15 inputs in segments of 3, then one update per 3 sampled tokens
    assert text.startswith(prompt) and adapter.updates == 5 + 12 // 3
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not all(torch.equal(a, b) for a, b in zip(adapter.params, adapter.adapted.initial))


def test_sample_command_with_adaptation(tiny_run, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MOGLM_CACHE_DIR", str(tmp_path / "cache"))
    run = copied_run(tiny_run, tmp_path)
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("the cat sees the dog .\nthe bird likes the fish .\n")
    args = ["sample", str(run), "--prompt-file", str(prompt), "--num-tokens", "6", "--seed", "1", "--adapt-output"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("the cat sees the dog .\nthe bird likes the fish .")
    assert list((run / "dyneval").glob("rms-*.safetensors"))  # the default rule's statistics
    assert main(["sample", str(run), "--prompt", "x", "--prompt-file", str(prompt)]) == 1
    assert "not both" in capsys.readouterr().err


def test_library_entry_point_on_a_run(tiny_run, tmp_path):
    run = LanguageModelRun(copied_run(tiny_run, tmp_path))
    report = dyneval_run(run, ("valid",), Hyperparameters(rule="sgd", lr=0.1), eval_tokens=80, progress=False,
                         log=lambda s: None, write=False)
    assert report["splits"]["valid"]["dynamic"]["tokens"] == 80 and not (run.path / "dyneval").exists()
