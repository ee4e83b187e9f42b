"""Experiments: every shipped file loads at every scale with configs that validate; every experiment runs
end to end at smoke scale on a tiny generated corpus and its report has the expected rows and figures;
reruns resume; runs shared between experiments train once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("optuna")
from typer.testing import CliRunner  # noqa: E402

from conftest import tiny_text_file as _tiny_text  # noqa: E402
from moglm.cli.app import build_app  # noqa: E402
from moglm.errors import MoglmError  # noqa: E402
from moglm.experiments import load_experiment, runs, shipped  # noqa: E402
from moglm.workloads.language_model import run_config  # noqa: E402
from moglm.experiments.runner import run_experiment, status  # noqa: E402
from moglm.report import write_report  # noqa: E402

EXPECTED = {"ablation", "rounds", "headline", "reverse-copy", "surprise", "budget", "transformer-dyneval",
            "unseen-words", "optimisers", "mlstm-size", "music"}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One root for every smoke run of this module, as a user's would be (runs are shared)."""
    base = tmp_path_factory.mktemp("experiments")
    return base / "root", _tiny_text(base / "tiny.txt")


def test_the_shipped_experiments_are_the_papers():
    assert EXPECTED <= set(shipped())


@pytest.mark.parametrize("name", sorted(shipped()))
@pytest.mark.parametrize("scale", ["smoke", "cpu", "paper"])
def test_every_shipped_experiment_loads_and_its_configs_validate(name, scale):
    exp = load_experiment(name)
    trained = load_experiment(exp.uses) if exp.kind == "analysis" else exp
    specs = runs(trained, scale)
    assert specs and len({s.name for s in specs}) == len(specs)
    for spec in specs:
        if trained.kind == "language_model":
            cfg = run_config(spec)
            assert cfg.train.seed == spec.seed
        elif trained.kind == "music":
            from moglm.workloads.music import music_config

            cfg = music_config(spec)
            assert cfg.train.seed == spec.seed and cfg.name == spec.name
        else:
            from moglm.tasks.reverse_copy import ReverseCopyConfig

            ReverseCopyConfig(**spec.overrides)


def test_equal_budget_variants_differ_only_where_the_paper_says():
    """The ablation's variants share the parameter budget and every training setting; only the cell changes."""
    configs = {s.variant: run_config(s) for s in runs(load_experiment("ablation"), "cpu")}
    budgets = {c.model.num_params for c in configs.values()}
    assert budgets == {2_000_000}
    assert {c.train.model_dump_json() for c in configs.values()}.__len__() == 1
    assert configs["full-rank"].model.cell["rank"] == 0 and configs["no-zigzag"].model.cell["zigzag"] is False
    assert configs["lstm"].model.architecture == "lstm" and "rounds" not in configs["lstm"].model.cell


def test_config_fields_added_later_leave_the_digest_of_configs_at_their_defaults_alone():
    """Runs are found by their config's digest: a release that adds a config field with a default must not make
    every existing experiment retrain; a config that sets such a field gets a digest of its own."""
    from moglm.experiments.runner import config_digest, _resolved
    from moglm.runs.config import ADDED_FIELDS

    exp = load_experiment("ablation")
    config = _resolved(exp, runs(exp, "cpu")[0])
    before = {section: {k: v for k, v in config[section].items() if k not in ADDED_FIELDS[section]}
              for section in ADDED_FIELDS}
    assert config_digest(config) == config_digest(config | before)
    assert config_digest(config) != config_digest(config | {"train": config["train"] | {"adam_beta1": 0.9}})


def test_a_bad_experiment_file_is_a_one_line_error_naming_the_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('format_version = 1\nname = "x"\ndescription = "d"\nsource = "s"\nevaluations = ["magic"]\n'
                   '[variants.a]\n[scales.smoke]\n[scales.cpu]\n[scales.paper]\n')
    with pytest.raises(MoglmError, match="magic"):
        load_experiment(bad)
    with pytest.raises(MoglmError, match="no experiment 'nope'"):
        load_experiment("nope")


def _rows(report: str, label: str) -> list[str]:
    return [line for line in report.splitlines() if line.startswith(f"| {label} |")]


@pytest.mark.slow
def test_ablation_at_smoke_scale_trains_every_variant_and_reports_them(smoke):
    root, data = smoke
    folder = run_experiment("ablation", "smoke", root=root, data=str(data), progress=False, log=lambda s: None)
    report = write_report([folder]).read_text()
    for label in ("Mogrifier", "Full rank Q, P", "No zigzag", "LSTM", "mLSTM"):
        row = _rows(report, label)
        assert row, label
        assert re.search(r"\[\d+\.\d{3}\]\(\.\./runs/tiny-[a-z-]+-s1/evaluations/static\.json", row[0])
    assert (folder / "learning_curves-tiny.png").is_file()
    assert all(r["state"] == "done" for r in status("ablation", "smoke", root, str(data)))


@pytest.mark.slow
def test_report_numbers_are_the_run_files_numbers(smoke):
    root, data = smoke
    folder = root / "smoke-tiny" / "ablation"
    run_dir = root / "smoke-tiny" / "runs" / "tiny-mogrifier-s1"
    static = json.loads((run_dir / "evaluations" / "static.json").read_text())
    report = write_report([folder]).read_text()
    row = _rows(report, "Mogrifier")[0]
    assert f"[{static['splits']['valid']['bits_per_token']:.3f}]" in row
    assert f"[{static['splits']['test']['bits_per_token']:.3f}]" in row


@pytest.mark.slow
def test_headline_and_surprise_share_runs_and_add_their_evaluations(smoke):
    root, data = smoke
    seen: list[str] = []
    folder = run_experiment("headline", "smoke", root=root, data=str(data), progress=False, log=seen.append)
    assert not any("tiny-mogrifier-s1] step" in line for line in seen), "the ablation's Mogrifier was retrained"
    evaluations = root / "smoke-tiny" / "runs" / "tiny-mogrifier-s1" / "evaluations"
    assert {p.name for p in evaluations.iterdir()} >= {"static.json", "mc_dropout.json", "dynamic.json",
                                                      "mc_dynamic.json"}
    report = write_report([folder]).read_text()
    for label in ("LSTM", "Mogrifier"):
        assert len(re.findall(r"\[\d+\.\d{3}\]", _rows(report, label)[0])) == 8  # 4 evaluations x valid, test
    assert "static scores of those same tokens" in report
    assert (evaluations / "token_losses.safetensors").is_file()  # kept from the dynamic pass over test
    seen.clear()
    surprise = run_experiment("surprise", "smoke", root=root, data=str(data), progress=False, log=seen.append)
    assert not any("evaluation: token_losses" in line for line in seen), "the dynamic pass was repeated"
    text = write_report([surprise]).read_text()
    assert (surprise / "surprise-tiny.png").is_file()
    analysis = json.loads((surprise / "surprise-tiny.json").read_text())
    assert set(analysis["static"]["models"]) == {"LSTM", "Mogrifier"}
    assert analysis["static"]["surprising"] == round(0.1 * analysis["static"]["tokens"])
    assert "surprising tokens of" in text


@pytest.mark.slow
def test_mc_dropout_evaluations_repeat_exactly_whatever_ran_before_them(smoke):
    """Their dropout masks come from the run's seed, not from the random state a process happens to have."""
    from moglm.workloads.language_model import evaluate_run_spec
    from moglm.experiments.spec import load_experiment, scale_of

    root, data = smoke
    run_experiment("headline", "smoke", root=root, data=str(data), progress=False, log=lambda s: None)
    run_dir = root / "smoke-tiny" / "runs" / "tiny-mogrifier-s1"
    scale = scale_of(load_experiment("headline"), "smoke")
    for name in ("mc_dropout", "mc_dynamic"):
        path = run_dir / "evaluations" / f"{name}.json"
        first = json.loads(path.read_text())
        path.unlink()
        torch.rand(12345)  # a process whose past differs
        evaluate_run_spec(scale, run_dir, [name], progress=False, log=lambda s: None)
        again = json.loads(path.read_text())
        for split in ("valid", "test"):
            got, want = again["splits"][split], first["splits"][split]
            if name == "mc_dynamic":  # a dynamic-evaluation report: its dynamic score
                got, want = got["dynamic"], want["dynamic"]
            assert got["xent"] == want["xent"], (name, split)


@pytest.mark.slow
def test_transformer_dyneval_scores_four_ways_and_says_whether_the_thesis_order_holds(smoke):
    root, data = smoke
    folder = run_experiment("transformer-dyneval", "smoke", root=root, data=str(data), progress=False,
                            log=lambda s: None)
    evaluations = root / "smoke-tiny" / "runs" / "tiny-transformer-s1" / "evaluations"
    assert {p.name for p in evaluations.iterdir()} >= {"static.json", "cache.json", "dynamic.json",
                                                      "dynamic_cache.json"}
    cache = json.loads((evaluations / "cache.json").read_text())
    assert cache["cache"]["size"] > 0 and cache["splits"]["test"]["static"]["tokens"] == \
        cache["splits"]["test"]["tokens"]  # beside the static score of the same tokens
    report = write_report([folder]).read_text()
    assert "source's order on test: dynamic evaluation < neural cache < static" in report
    for label in ("LSTM", "Mogrifier", "Transformer"):
        row = _rows(report, label)[0]
        assert len(re.findall(r"\[\d+\.\d{3}\]", row)) == 8  # 4 evaluations x valid, test
        assert row.rstrip(" |").endswith(("yes", "-")) or "| no: " in row


@pytest.mark.slow
def test_mi_lstm_trains_both_thesis_recipes_with_their_own_orthogonal_scales(smoke):
    """Thesis table 3.1's MI-LSTM against the mLSTM: the same recipe, 0.5 and 0.7 orthogonal scales (footnote 2)."""
    specs = {s.variant: run_config(s) for s in runs(load_experiment("mi-lstm"), "cpu")}
    assert {v.model.architecture for v in specs.values()} == {"multiplicative_lstm", "mi_lstm"}
    assert specs["mi-lstm"].model.orthogonal_init == 0.5 and specs["mlstm"].model.orthogonal_init == 0.7
    assert specs["mi-lstm"].train.model_dump_json() == specs["mlstm"].train.model_dump_json()
    root, data = smoke
    folder = run_experiment("mi-lstm", "smoke", root=root, data=str(data), progress=False, log=lambda s: None)
    report = write_report([folder]).read_text()
    assert _rows(report, "mLSTM") and _rows(report, "MI-LSTM")


@pytest.mark.slow
def test_surprise_mlstm_reads_the_mlstm_size_runs(smoke):
    """Thesis figure 3.3 as stated: the mLSTM against the LSTM, from mlstm-size's runs."""
    root, data = smoke
    run_experiment("mlstm-size", "smoke", root=root, data=str(data), progress=False, log=lambda s: None)
    folder = run_experiment("surprise-mlstm", "smoke", root=root, data=str(data), progress=False, log=lambda s: None)
    report = write_report([folder]).read_text()
    assert "mLSTM" in report and (folder / "surprise-tiny.png").is_file()


@pytest.mark.slow
def test_optimisers_tunes_each_optimiser_on_transformer_dynevals_runs_and_checks_the_thesis(smoke):
    """Krause thesis 5.4: every optimiser's row, each with its own learning rate, on the same tokens."""
    root, data = smoke
    folder = run_experiment("optimisers", "smoke", root=root, data=str(data), progress=False, log=lambda s: None)
    names = ["static", "sgd", "momentum-0.5", "momentum-0.9", "rmsprop", "hybrid", "global-rms", "global-rms-0.001",
             "global-rms-0.1", "nonlocal-rmsprop", "sgd-decay", "global-rms-decay", "global-rms-rmsdecay"]
    for model in ("lstm", "mogrifier", "transformer"):
        path = root / "smoke-tiny" / "runs" / f"tiny-{model}-s1" / "evaluations" / "optimisers.json"
        report = json.loads(path.read_text())
        rows = {r["name"]: r for r in report["rows"]}
        assert list(rows) == names and report["tokens"] == 40 and report["level"] == "char"
        for name, row in rows.items():
            if row.get("skipped"):  # 0.1% of this tiny training split is too few tokens for a batch of 8
                assert name == "global-rms-0.001" and "too few" in row["skipped"]
                continue
            assert row["valid"]["tokens"] == row["test"]["tokens"] == 40  # the analysis's own eval_tokens
            assert row["test"]["score"] == row["test"]["bits_per_token"]
            if name != "static":
                assert row["lr"] > 0 and row["settings"]["rule"] == row["rule"] and row["trials"]
                assert row["valid"]["xent"] == min(t["xent"] for t in row["trials"])  # the best of its search
                assert len(row["trials"]) <= (4 if name == "hybrid" else 2)  # the smoke scale's tune_trials
        assert rows["momentum-0.9"]["settings"]["momentum"] == 0.9 and "alpha" not in rows["sgd"]["settings"]
        assert rows["rmsprop"]["settings"]["eps"] == 1e-8 and rows["rmsprop"]["statistics_fraction"] is None
        assert rows["nonlocal-rmsprop"]["settings"]["eps"] == rows["hybrid"]["settings"]["eps"]
        assert len({t["eps"] for t in rows["hybrid"]["trials"]}) >= 2  # the hybrid's eps was searched
        assert [rows[f]["statistics_fraction"] for f in ("global-rms-0.001", "global-rms", "global-rms-0.1")] == \
            [0.001, 0.01, 0.1]
    text = write_report([folder]).read_text()
    assert "### Optimisers for dynamic evaluation (Krause thesis 5.4): valid / test" in text
    for label in ("SGD + momentum 0.9", "RMSprop, eps 1e-8 (deep learning frameworks)",
                  "global RMS, 10% of training data"):
        assert len(re.findall(r"\[\d+\.\d{3}\]\(\.\./runs/tiny-[a-z]+-s1/evaluations/optimisers\.json",
                              _rows(text, label)[0])) == 6  # 3 models x valid, test
    claims = [line for line in text.splitlines() if line.startswith(("| momentum hurts", "| the amount of"))]
    assert len(claims) == 2 and all(c.count("| yes") + c.count("| no") == 3 for c in claims)
    assert (folder / "optimisers-tiny.png").is_file() and "![optimisers](optimisers-tiny.png)" in text


def _text_with_new_words(path: Path) -> Path:
    """Like :func:`_tiny_text`, but its last lines (the test split, past the first 90% of the characters that
    train on) also use three words that never occur before them."""
    import random

    rng = random.Random(1)
    words = "the cat sat on a mat and dog ran far away from home".split()
    later = words + "moth swan gnat".split() * 2
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(600)]
    lines += [" ".join(rng.choice(later) for _ in range(rng.randint(3, 12))) for _ in range(50)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_unseen_words_reads_transformer_dyneval_runs_word_by_word(smoke):
    """Krause thesis 5.3: character-level runs on a corpus whose test split has words unseen in training."""
    root, _ = smoke
    data = _text_with_new_words(root.parent / "novel.txt")
    folder = run_experiment("unseen-words", "smoke", root=root, data=str(data), progress=False, log=lambda s: None)
    runs_dir = root / "smoke-novel" / "runs"
    assert (runs_dir / "novel-transformer-s1" / "evaluations" / "token_losses.safetensors").is_file()
    report = write_report([folder]).read_text()
    analysis = json.loads((folder / "unseen_words-novel.json").read_text())["models"]
    assert set(analysis) == {"LSTM", "Mogrifier", "Transformer"}
    for label, result in analysis.items():
        unseen = result["groups"]["unseen"]
        assert result["level"] == "character" and unseen["occurrences"] > unseen["distinct"] > 0  # they recur
        assert {w for w, _ in result["repeated_unseen"]} <= {"moth", "swan", "gnat"}
        rows = _rows(report, label)
        assert any("| unseen in training |" in row for row in rows)
        assert any(row.rstrip(" |").endswith(("yes", ")")) or "| no: " in row for row in rows)
    assert "| model | kind | occurrence 1 |" in report and "![unseen_words](unseen_words-novel.png)" in report
    assert (folder / "unseen_words-novel.png").is_file()
    data.rename(data.with_suffix(".gone"))  # a corpus that cannot be read is one line, not a failure
    try:
        report = write_report([folder]).read_text()
    finally:
        data.with_suffix(".gone").rename(data)
    assert "Transformer: no unseen-word analysis: novel-transformer-s1: its corpus cannot be read: " in report


@pytest.mark.slow
def test_rounds_and_budget_at_smoke_scale(smoke):
    root, data = smoke
    folder = run_experiment("rounds", "smoke", root=root, data=str(data), progress=False, log=lambda s: None)
    report = write_report([folder]).read_text()
    assert all(_rows(report, f"r = {r}") for r in range(7))
    assert (folder / "sweep-tiny.png").is_file()
    budget = run_experiment("budget", "smoke", root=root, data=str(data), progress=False, log=lambda s: None)
    assert _rows(write_report([budget]).read_text(), "Mogrifier")


@pytest.mark.slow
def test_mlstm_size_sweeps_three_budgets_of_three_models_and_draws_one_line_each(smoke):
    specs = runs(load_experiment("mlstm-size"), "cpu")
    budgets = {(s.variant, run_config(s).model.num_params, s.x, s.series) for s in specs}
    assert ("mlstm-half", 1_000_000, 1_000_000, "mLSTM") in budgets and ("lstm-double", 4_000_000, 4_000_000, "LSTM") in budgets
    assert {run_config(s).model.architecture for s in specs} == {"multiplicative_lstm", "lstm", "mogrifier"}
    assert len({run_config(s).train.model_dump_json() for s in specs}) == 1  # the same training for every run
    root, data = smoke
    folder = run_experiment("mlstm-size", "smoke", root=root, data=str(data), progress=False, log=lambda s: None)
    report = write_report([folder]).read_text()
    for model in ("mLSTM", "LSTM", "Mogrifier"):
        assert _rows(report, model) and _rows(report, f"{model}, 1/2 budget") and _rows(report, f"{model}, 2x budget")
    assert (folder / "sweep-tiny.png").is_file()
    manifest = json.loads((folder / "experiment.json").read_text())
    assert sorted({r["x"] for r in manifest["runs"]}) == [50_000, 100_000, 200_000]


@pytest.mark.slow
def test_reverse_copy_tunes_then_trains_each_model_and_length(tmp_path):
    folder = run_experiment("reverse-copy", "smoke", root=tmp_path, progress=False, log=lambda s: None)
    report = write_report([folder]).read_text()
    for label in ("LSTM", "Mogrifier"):  # lengths 4 and 6, each with its score
        rows = [line for line in report.splitlines() if re.match(rf"\| [46] \| {label} \|", line)]
        assert len([r for r in rows if re.search(r"\[\d\.\d{4}\]\(\.\./runs/length[46]", r)]) == 2
    assert (folder / "length-reverse-copy.png").is_file()
    assert (tmp_path / "smoke" / "studies" / "length4-mogrifier-s1").is_dir()


@pytest.mark.slow
def test_a_rerun_resumes_and_trains_nothing_done(smoke):
    root, data = smoke
    seen: list[str] = []
    run_experiment("ablation", "smoke", root=root, data=str(data), progress=False, log=seen.append)
    assert not any("] step" in line for line in seen)


@pytest.mark.slow
def test_the_cli_lists_runs_reports_and_refuses_a_bad_scale(smoke, tmp_path):
    root, data = smoke
    cli = CliRunner()
    app = build_app()
    listed = cli.invoke(app, ["experiment", "list"])
    assert listed.exit_code == 0 and all(name in listed.output for name in EXPECTED)
    shown = cli.invoke(app, ["experiment", "status", "ablation", "--scale", "smoke", "--data", str(data),
                             "--root", str(root)])
    assert shown.exit_code == 0 and "tiny-mlstm-s1" in shown.output and "done" in shown.output
    bad = cli.invoke(app, ["experiment", "run", "ablation", "--scale", "huge"])
    assert bad.exit_code != 0 and "huge" in bad.output
    runs_dir = root / "smoke-tiny" / "runs"
    made = cli.invoke(app, ["report", str(runs_dir / "tiny-lstm-s1"), str(runs_dir / "tiny-mogrifier-s1"),
                            "--out", str(tmp_path / "out")])
    assert made.exit_code == 0, made.output
    text = (tmp_path / "out" / "report.md").read_text()
    assert _rows(text, "tiny-lstm-s1") and (tmp_path / "out" / "surprise-tiny.png").is_file()


def test_wikitext_lines_read_into_the_ptb_character_alphabet():
    from moglm.data.vocabulary import Vocabulary
    from moglm.experiments.out_of_domain import to_vocabulary

    vocab = Vocabulary(list("abcdefghijklmnopqrstuvwxyz") + ["_", "N", "-", "<", ">", "<eos>"], "ptb_char", eos="<eos>")
    ids, changed = to_vocabulary(" = Robert <unk> = \n In 2004 , the well @-@ known ( cat ) \n", vocab, "ptb_char")
    text = "".join(vocab.itos[i] if vocab.itos[i] != "<eos>" else "|" for i in ids)
    assert text == "robert_<unk>|in_N_the_well_-_known_cat|"
    assert changed == {"dropped_characters": 5, "unknown_words": 0, "tokens": len(ids)}  # = = , ( )
    words = Vocabulary(["the", "cat", "<unk>", "<eos>"], "word", unk="<unk>", eos="<eos>")
    ids, changed = to_vocabulary("the dog\ncat\n", words, "word")
    assert [words.itos[i] for i in ids] == ["the", "<unk>", "<eos>", "cat", "<eos>"] and changed["unknown_words"] == 1


@pytest.mark.slow
def test_out_of_domain_tunes_on_the_training_domain_and_scores_another_text(smoke, tmp_path):
    root, data = smoke
    target = tmp_path / "other.txt"
    target.write_text("a cat and a dog ran home from the far mat\n" * 30)
    spec = tmp_path / "ood.toml"
    spec.write_text(
        'format_version = 1\nname = "ood"\ndescription = "d"\nsource = "s"\nkind = "analysis"\n'
        'uses = "transformer-dyneval"\nevaluations = ["out_of_domain"]\n'
        f'[scales.smoke]\ntarget = "{target}"\neval_tokens = 200\nsearch_tokens = 150\n'
        f'[scales.cpu]\ntarget = "{target}"\n[scales.paper]\ntarget = "{target}"\n')
    folder = run_experiment(str(spec), "smoke", root=root, data=str(data), progress=False, log=lambda s: None)
    found = json.loads((root / "smoke-tiny" / "runs" / "tiny-transformer-s1" / "evaluations" /
                        "out_of_domain.json").read_text())
    assert found["search"]["tokens"] <= 152 and found["out_of_domain"]["static"]["tokens"] == 200
    assert found["changed"]["tokens"] == len(target.read_text())  # char level: every character is in the alphabet
    report = write_report([folder]).read_text()
    assert "### Out of domain" in report
    row = next(r for r in _rows(report, "Transformer") if "->" in r)  # its row of the out-of-domain table
    assert row.rstrip(" |").endswith(("yes", "no"))


@pytest.mark.slow
def test_music_trains_both_nades_scores_static_sgd_and_rms_and_reports_table_4_6(tmp_path):
    """Thesis table 4.6's protocol at smoke scale on generated songs: every run scores static, SGD and global-RMS
    dynamic evaluation (searched on valid), the report lays them out with the thesis's numbers and gains."""
    import random

    rng = random.Random(0)
    data = {split: [[sorted(rng.sample(range(48, 72), 3)) for _ in range(rng.randint(8, 16))] for _ in range(n)]
            for split, n in (("train", 8), ("valid", 3), ("test", 3))}
    corpus = tmp_path / "chorales.json"
    corpus.write_text(json.dumps(data))
    folder = run_experiment("music", "smoke", root=tmp_path / "root", data=str(corpus), progress=False,
                            log=lambda s: None)
    for variant in ("lstm-nade", "mogrifier-nade", "lstm-nade-sigmoid"):
        evaluations = tmp_path / "root" / "smoke-chorales" / "runs" / f"chorales-{variant}-s1" / "evaluations"
        static = json.loads((evaluations / "static.json").read_text())
        for rule in ("sgd", "rms"):
            dynamic = json.loads((evaluations / f"dynamic_{rule}.json").read_text())
            assert dynamic["rule"] == rule and dynamic["search"]  # searched on valid
            test = dynamic["splits"]["test"]
            assert test["static"]["log_likelihood_per_frame"] == pytest.approx(
                static["splits"]["test"]["log_likelihood_per_frame"], abs=1e-4)
            assert test["dynamic"]["frames"] == static["splits"]["test"]["frames"]
    report = write_report([folder]).read_text()
    assert "Log-likelihood per frame (table 4.6" in report and "log-likelihood per frame (nats)" in report
    assert "| LSTM-NADE |" in report and "| Mogrifier-NADE |" in report
    assert "source's order on test: dynamic (global RMS) > dynamic (SGD) > static" in report  # higher is better
    assert "Gain from dynamic evaluation" in report
    gains = [line for line in report.splitlines() if line.startswith("| chorales | ")]
    assert "| LSTM-NADE, sigmoid NADE |" in report  # the thesis's relu (eq. 2.62) beside Boulanger-Lewandowski's sigmoid
    assert len(gains) == 3 and all("lr=" in line for line in gains)  # each row names its searched settings
    assert "learning_curves-chorales.png" in report


def test_an_interrupted_run_stops_the_experiment_instead_of_going_on_to_the_next(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM during one run (the engine saves a checkpoint and raises TrainingInterrupted) stops the
    whole experiment: the next run does not start, and rerunning resumes."""
    from moglm.workloads import language_model
    from moglm.errors import TrainingInterrupted

    started = []

    def interrupted(spec, run_dir, progress, log):
        started.append(spec.name)
        raise TrainingInterrupted("interrupted at step 3; checkpoint saved, rerun the same command to resume")

    monkeypatch.setattr(language_model, "train_run_spec", interrupted)
    with pytest.raises(TrainingInterrupted):
        run_experiment("ablation", "smoke", root=tmp_path / "root", data=str(_tiny_text(tmp_path / "tiny.txt")),
                       progress=False, log=lambda s: None)
    assert len(started) == 1


def test_only_takes_names_repeated_or_separated_by_commas(tmp_path, monkeypatch):
    from moglm.experiments import runner

    seen = {}
    monkeypatch.setattr(runner, "run_experiment", lambda *a, **k: seen.update(only=k["only"]))
    runner_app = CliRunner()
    result = runner_app.invoke(build_app(), ["experiment", "run", "ablation", "--only", "a,b", "--only", "c"])
    assert result.exit_code == 0, result.output
    assert seen["only"] == ["a", "b", "c"]


def _real_corpus(name: str) -> None:
    """Skip unless the real corpus ``name`` is found (the working directory, $MOGLM_DATA, ../shared/data)."""
    from moglm.data.corpus import resolve_path

    try:
        resolve_path(name)
    except MoglmError:
        pytest.skip(f"the real {name} corpus is not here: set MOGLM_DATA to the folder that holds {name}/")


@pytest.mark.slow
def test_every_shipped_smoke_scale_sizes_its_models_for_the_real_vocabularies():
    """PTB word's 10k words and WikiText-2's 33k: every run of every smoke scale has a hidden size within its
    budget (the smallest rank-32 Mogrifier of PTB word alone is 425k parameters)."""
    from moglm.runs.build import load_data, resolve_hidden_size

    vocab_sizes: dict[tuple, int] = {}
    for name in shipped():
        exp = load_experiment(name)
        if exp.kind != "language_model":
            continue
        for spec in runs(exp, "smoke"):
            cfg = run_config(spec)
            key = (cfg.data.path, cfg.data.format)
            if key not in vocab_sizes:
                _real_corpus(cfg.data.path)
                vocab_sizes[key] = len(load_data(cfg.data).vocab)
            assert resolve_hidden_size(cfg.model, vocab_sizes[key]) >= 1, spec.name
            assert cfg.evaluation.max_tokens and cfg.train.eval_tokens, spec.name  # no split scored whole
    assert max(vocab_sizes.values()) > 30_000


@pytest.mark.slow
def test_a_smoke_run_on_the_real_ptb_word_corpus_trains(tmp_path):
    """The ablation's Mogrifier at smoke scale on PTB word: validation improves over its six steps and the final
    scores read the first 5,000 tokens of each split (under a minute on two shared cores)."""
    _real_corpus("ptb")
    run_experiment("ablation", "smoke", root=tmp_path, only=["ptb-word-mogrifier-s1"], progress=False,
                   log=lambda s: None)
    run_dir = tmp_path / "smoke" / "runs" / "ptb-word-mogrifier-s1"
    info = json.loads((run_dir / "model.json").read_text())
    assert info["vocab_size"] == 10_000 and info["num_params"] <= 450_000
    valid = [json.loads(line)["xent"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "valid"]
    assert len(valid) == 2 and valid[1] < valid[0]
    static = json.loads((run_dir / "evaluations" / "static.json").read_text())
    assert {split: block["tokens"] for split, block in static["splits"].items()} == {"valid": 5_000, "test": 5_000}
