"""Plots: drawn on their own canvas (the user's matplotlib backend and pyplot untouched), the learning curve
in the console's unit with weight averaging marked where it started, readable study plots."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from moglm.train import learning_curve  # noqa: E402
from moglm.evaluation.scores import unit_for  # noqa: E402
from moglm.train.learning_curve import averaging_start, plot_learning_curve  # noqa: E402


def _records(averaging_from: int | None = 70) -> list[dict]:
    """A run logging every 10 steps (100 tokens a step) and validating every 50; averaging flagged on the
    train records from ``averaging_from`` on (started at step 70: a validation at step 70 is not one)."""
    records = []
    for step in range(10, 201, 10):
        averaging = averaging_from is not None and step > averaging_from
        records.append({"kind": "train", "step": step, "tokens": 100 * step, "xent": 3 - step / 100,
                        "averaging": averaging})
        if step % 50 == 0:
            records.append({"kind": "valid", "step": step, "tokens": 100 * step, "xent": 3.1 - step / 100})
    return records


@pytest.fixture
def drawn(monkeypatch):
    """The figures the learning curve saves, kept for inspection."""
    figures = []

    def keep(fig, path, dpi=110):
        figures.append(fig)
        return path

    monkeypatch.setattr(learning_curve, "save_figure", keep)
    return figures


@pytest.mark.parametrize("data_format,label,convert,best", [
    ("word", "perplexity", math.exp, "ppl 3.00"),
    ("char", "bits per character", lambda x: x / math.log(2), "1.5870 bpc"),
    ("byte", "bits per byte", lambda x: x / math.log(2), "1.5870 bpb"),
])
def test_the_learning_curve_is_in_the_unit_the_console_prints(data_format, label, convert, best, drawn, tmp_path):
    records = _records()
    plot_learning_curve(records, tmp_path / "c.png", "run", unit=data_format)
    ax = drawn[0].axes[0]
    assert label in ax.get_ylabel()
    lines = {line.get_label(): line for line in ax.get_lines()}
    valid = [r["xent"] for r in records if r["kind"] == "valid"]
    assert list(lines["valid"].get_ydata()) == pytest.approx([convert(x) for x in valid])
    assert any(name.startswith(f"best valid {best}") for name in lines)
    assert unit_for(data_format) in ("perplexity", "bpc", "bpb")


def test_the_best_label_is_in_the_legend_not_clipped_at_the_edge(drawn, tmp_path):
    plot_learning_curve(_records(), tmp_path / "c.png", "run", unit="bpc")
    ax = drawn[0].axes[0]
    assert not ax.texts  # no annotation beside the last point, where it would run off the axes
    assert any(t.get_text().startswith("best valid") for t in ax.get_legend().get_texts())


def test_weight_averaging_is_marked_at_the_step_it_started():
    records = _records(averaging_from=70)
    assert averaging_start(records) == 7000  # after the last record without averaging, not at the first with it
    assert averaging_start(records, averaging_since=75) == 7500  # the progress's step: exact
    assert averaging_start(records + [{"kind": "averaging", "step": 72, "tokens": 7200}]) == 7200
    assert averaging_start(_records(averaging_from=None)) is None


def test_a_long_title_is_wrapped_and_a_bad_unit_refused(drawn, tmp_path):
    title = "study trial 12: " + ", ".join(f"parameter_{i}=0.{i}" for i in range(12))
    plot_learning_curve(_records(), tmp_path / "c.png", title, unit="nats")
    assert "\n" in drawn[0].axes[0].get_title()
    with pytest.raises(ValueError, match="unit must be one of"):
        plot_learning_curve(_records(), tmp_path / "c.png", unit="furlongs")


@pytest.mark.slow
def test_plots_leave_the_users_backend_and_pyplot_alone(tmp_path):
    """A notebook's backend stays, and no figure is left open in pyplot (run apart: a fresh interpreter)."""
    script = textwrap.dedent(f"""
        import math, sys
        from pathlib import Path
        import matplotlib
        matplotlib.use("svg")
        import optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        from moglm.dynamic_evaluation.analysis import plot_profile
        from moglm.train.learning_curve import plot_learning_curve
        from moglm.tune.plots import plot_study
        from moglm.tune.search_space import validate_space
        out = Path({str(tmp_path)!r})
        records = [{{"kind": "valid", "step": s, "tokens": s, "xent": 2 - s / 100}} for s in (10, 20, 30)]
        plot_learning_curve(records, out / "curve.png", "run", unit="word")
        plot_profile({{"bin_start": [0, 5], "bin_width": 5, "static": [2, 1.9], "dynamic": [2, 1.8],
                      "static_cumulative": [2, 1.95], "dynamic_cumulative": [2, 1.9], "position": "t"}},
                     out / "profile.png", "p")
        a, b = "train.learning_rate", "model.tie_embeddings"
        space = validate_space({{"params": {{a: {{"low": 0.001, "high": 1, "log": True}},
                                             b: {{"choices": [True, False]}}}}}}, "s")
        study = optuna.create_study(study_name="s", sampler=optuna.samplers.RandomSampler(seed=0))
        study.optimize(lambda t: t.suggest_float(a, 0.001, 1, log=True) + t.suggest_categorical(b, [True, False]),
                       n_trials=6)
        plot_study(study, space, out)
        print(matplotlib.get_backend(), "matplotlib.pyplot" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["svg", "False"]
    for name in ("curve.png", "profile.png", "parallel_coordinate.png", "optimization_history.png",
                 "param_importances.png"):
        assert (tmp_path / name).stat().st_size > 1000, name
    assert not list(tmp_path.glob(".*.tmp.png"))


def test_the_parallel_coordinate_plot_is_readable(tmp_path, monkeypatch):
    import optuna

    from moglm.tune import plots
    from moglm.tune.search_space import validate_space

    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path, dpi=90: figures.append(fig) or path)
    space = validate_space({"params": {"train.learning_rate": {"low": 1e-4, "high": 1e-1, "log": True},
                                       "model.state_dropout": {"low": 0.0, "high": 0.5},
                                       "model.tie_embeddings": {"choices": [True, False]}}}, "s")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="my-study", sampler=optuna.samplers.RandomSampler(seed=1))
    study.optimize(lambda t: (math.log10(t.suggest_float("train.learning_rate", 1e-4, 1e-1, log=True)) + 2.5) ** 2
                   + t.suggest_float("model.state_dropout", 0.0, 0.5)
                   + 0.1 * t.suggest_categorical("model.tie_embeddings", [True, False]), n_trials=12)
    plots.plot_study(study, space, tmp_path)
    ax = figures[0].axes[0]
    title = ax.get_title()
    assert title.startswith("my-study: ") and "completed trials" in title  # one title, ours
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[:2] == ["train\nlearning_rate", "model\nstate_dropout"]  # short lines, no overlap
    lines = [line for line in ax.get_lines() if len(line.get_xdata()) == 4]  # the trials' polylines
    drawn_trials = int(title.split(": ")[1].split(" of ")[0])
    assert len(lines) == drawn_trials
    lightest = max(sum(line.get_color()[:3]) for line in lines if line.get_label().startswith("_"))
    assert lightest < 2.4  # the worst trial is not drawn near-white
    assert [line.get_label() for line in lines if not line.get_label().startswith("_")][0].startswith("best: trial")
