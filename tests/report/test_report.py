"""The report reads run directories only: hand-made runs give exactly their files' numbers; the surprise
analysis finds the right positions and recovery on a hand-made loss sequence."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from moglm.errors import MoglmError
from moglm.report import write_report
from moglm.report.surprise import analyse, recovery_curve, surprising_positions


def _run(path, level, valid, test, metrics=()):
    path.mkdir(parents=True)
    fmt = {"word": "word", "char": "char"}[level]
    (path / "config.toml").write_text(f'name = "{path.name}"\n[data]\nformat = "{fmt}"\n')
    key = "perplexity" if level == "word" else "bits_per_token"
    splits = {s: {key: v, "xent": math.log(v) if level == "word" else v * math.log(2)}
              for s, v in (("valid", valid), ("test", test))}
    (path / "results.json").write_text(json.dumps({"level": level, "temperature": 1.0, "splits": splits}))
    (path / "model.json").write_text(json.dumps({"num_params": 1234, "hidden_size": 7}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return path


def test_report_on_hand_made_runs_gives_their_numbers(tmp_path):
    a = _run(tmp_path / "word-a", "word", 91.234, 88.5, [{"kind": "valid", "tokens": 10, "perplexity": 120.0,
                                                          "xent": math.log(120.0)}])
    b = _run(tmp_path / "word-b", "word", 87.0, 85.25)
    text = write_report([a, b], tmp_path / "out").read_text()
    assert "| word-a | [91.23](../word-a/results.json" in text
    assert "[88.50](../word-a/results.json" in text and "[85.25](../word-b/results.json" in text
    assert "perplexity" in text and (tmp_path / "out" / "learning_curves-default.png").is_file()


def test_report_gives_bits_per_character_with_three_decimals(tmp_path):
    c = _run(tmp_path / "char", "char", 1.23456, 1.2)
    text = write_report([c], tmp_path / "out").read_text()
    assert "[1.235](../char/results.json" in text and "bits per character" in text


def test_report_refuses_what_is_not_a_run(tmp_path):
    with pytest.raises(MoglmError, match="not a run directory"):
        write_report([tmp_path], tmp_path / "out")


def test_the_length_figure_joins_each_models_runs_at_every_length():
    """Reverse copy trains one run per model and length; the figure's curve of a model has all of them."""
    from moglm.report.plots import length_curves
    from moglm.report.runs import Run

    def run(label, length, xent):
        test = {"xent": xent, "by_length": {str(length): {"xent": xent}}}
        return Run(Path(f"{label}{length}"), f"{label}{length}", label, "rc", config={"length": length},
                   evaluations={"static": {"splits": {"test": test}}})

    curves = length_curves([run("LSTM", 20, 3.9), run("LSTM", 10, 2.8), run("Mogrifier", 10, 2.2),
                            run("Mogrifier", 20, 3.5)])
    assert curves == {"LSTM": ([10, 20], [2.8, 3.9]), "Mogrifier": ([10, 20], [2.2, 3.5])}


def test_surprising_positions_are_the_largest_mean_losses():
    losses = torch.tensor([[1.0, 9.0, 1.0, 1.0, 8.0, 1.0, 1.0, 1.0, 1.0, 1.0],
                           [1.0, 7.0, 1.0, 1.0, 9.0, 1.0, 1.0, 2.0, 1.0, 1.0]])  # [2 models, 10 tokens]
    assert surprising_positions(losses, 0.2).tolist() == [1, 4]
    assert surprising_positions(losses, 0.1).tolist() == [4]  # mean 8.5 beats 8.0


def test_recovery_curve_averages_the_tokens_after_each_surprise():
    seq = torch.tensor([0.0, 10.0, 4.0, 2.0, 1.0, 10.0, 6.0, 3.0])
    curve = recovery_curve(seq, torch.tensor([1, 5]), 3)
    assert curve == pytest.approx([(4 + 6) / 2, (2 + 3) / 2, 1.0])  # +3 after 5 is past the end
    assert math.isnan(recovery_curve(seq, torch.tensor([7]), 1)[0])


def test_analyse_reports_each_models_average_and_curve():
    fast = torch.tensor([1.0, 9.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    slow = torch.tensor([1.0, 9.0, 5.0, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    result = analyse({"fast": fast, "slow": slow}, fraction=0.1, horizon=2)
    assert result["surprising"] == 1 and result["threshold"] == 9.0
    assert result["models"]["fast"]["after"] == [1.0, 1.0]
    assert result["models"]["slow"]["after"] == [5.0, 3.0]
    assert result["models"]["slow"]["average"] == pytest.approx(2.4)
    with pytest.raises(ValueError, match="different numbers"):
        analyse({"a": fast, "b": fast[:5]})


def test_recovery_over_seeds_is_the_excess_over_each_models_average_with_its_spread(tmp_path):
    """Every seed is a model of its own; the summary groups them by variant, subtracts each model's average loss,
    and calls the faster recovery at +1 only where the gap exceeds the two spreads."""
    import json

    from moglm.report.markdown import surprise_lines

    def model(average, first):
        return {"average": average, "at_surprise": 9.0, "after": [first, average]}

    models = {"LSTM (seed 1)": model(5.0, 5.40), "LSTM (seed 2)": model(5.2, 5.58),
              "Mogrifier (seed 1)": model(4.8, 5.30), "Mogrifier (seed 2)": model(4.9, 5.42)}
    path = tmp_path / "surprise.json"
    path.write_text(json.dumps({"static": {"surprising": 1, "tokens": 10, "threshold": 9.0, "horizon": 2,
                                           "models": models}}))
    text = "\n".join(surprise_lines(path))
    assert "| LSTM (n = 2) | 0.390 ± 0.014 | 0.000 ± 0.000 |" in text  # 0.40 and 0.38 above their averages
    assert "| Mogrifier (n = 2) | 0.510 ± 0.014 | 0.000 ± 0.000 |" in text
    assert "Fastest recovery first at +1 (`<` where the gap exceeds the spread): LSTM < Mogrifier" in text
    models["Mogrifier (seed 2)"] = model(4.9, 5.30)  # 0.50 and 0.40: a spread of 0.07 swallows the gap
    path.write_text(json.dumps({"static": {"surprising": 1, "tokens": 10, "threshold": 9.0, "horizon": 2,
                                           "models": models}}))
    assert "LSTM ≈ Mogrifier" in "\n".join(surprise_lines(path))
    one_seed = {k.split(" (")[0]: v for k, v in list(models.items())[::2]}
    path.write_text(json.dumps({"static": {"surprising": 1, "tokens": 10, "threshold": 9.0, "horizon": 2,
                                           "models": one_seed}}))
    assert "mean ± std over" not in "\n".join(surprise_lines(path))
