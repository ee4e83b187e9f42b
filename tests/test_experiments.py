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

from moglm.cli import _build_app  # noqa: E402
from moglm.errors import MoglmError  # noqa: E402
from moglm.experiments import load_experiment, runs, shipped  # noqa: E402
from moglm.experiments.language_model import run_config  # noqa: E402
from moglm.experiments.runner import run_experiment, status  # noqa: E402
from moglm.report import write_report  # noqa: E402

EXPECTED = {"ablation", "rounds", "headline", "reverse-copy", "surprise", "budget", "transformer-dyneval"}


def _tiny_text(path: Path) -> Path:
    import random

    rng = random.Random(0)
    words = "the cat sat on a mat and dog ran far away from home".split()
    path.write_text("\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(600))
                    + "\n")
    return path


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One root for every smoke run of this module, as a user's would be (runs are shared)."""
    base = tmp_path_factory.mktemp("experiments")
    return base / "root", _tiny_text(base / "tiny.txt")


def test_the_shipped_experiments_are_the_papers():
    assert EXPECTED <= set(shipped())


@pytest.mark.parametrize("name", sorted(EXPECTED))
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


def test_report_numbers_are_the_run_files_numbers(smoke):
    root, data = smoke
    folder = root / "smoke-tiny" / "ablation"
    run_dir = root / "smoke-tiny" / "runs" / "tiny-mogrifier-s1"
    static = json.loads((run_dir / "evaluations" / "static.json").read_text())
    report = write_report([folder]).read_text()
    row = _rows(report, "Mogrifier")[0]
    assert f"[{static['splits']['valid']['bits_per_token']:.3f}]" in row
    assert f"[{static['splits']['test']['bits_per_token']:.3f}]" in row


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


def test_mc_dropout_evaluations_repeat_exactly_whatever_ran_before_them(smoke):
    """Their dropout masks come from the run's seed, not from the random state a process happens to have."""
    from moglm.experiments.language_model import evaluate_run_spec
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


def test_rounds_and_budget_at_smoke_scale(smoke):
    root, data = smoke
    folder = run_experiment("rounds", "smoke", root=root, data=str(data), progress=False, log=lambda s: None)
    report = write_report([folder]).read_text()
    assert all(_rows(report, f"r = {r}") for r in range(7))
    assert (folder / "sweep-tiny.png").is_file()
    budget = run_experiment("budget", "smoke", root=root, data=str(data), progress=False, log=lambda s: None)
    assert _rows(write_report([budget]).read_text(), "Mogrifier")


def test_reverse_copy_tunes_then_trains_each_model_and_length(tmp_path):
    folder = run_experiment("reverse-copy", "smoke", root=tmp_path, progress=False, log=lambda s: None)
    report = write_report([folder]).read_text()
    for label in ("LSTM", "Mogrifier"):  # lengths 4 and 6, each with its score
        rows = [line for line in report.splitlines() if re.match(rf"\| [46] \| {label} \|", line)]
        assert len([r for r in rows if re.search(r"\[\d\.\d{4}\]\(\.\./runs/length[46]", r)]) == 2
    assert (folder / "length-reverse-copy.png").is_file()
    assert (tmp_path / "smoke" / "studies" / "length4-mogrifier-s1").is_dir()


def test_a_rerun_resumes_and_trains_nothing_done(smoke):
    root, data = smoke
    seen: list[str] = []
    run_experiment("ablation", "smoke", root=root, data=str(data), progress=False, log=seen.append)
    assert not any("] step" in line for line in seen)


def test_the_cli_lists_runs_reports_and_refuses_a_bad_scale(smoke, tmp_path):
    root, data = smoke
    cli = CliRunner()
    app = _build_app()
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
