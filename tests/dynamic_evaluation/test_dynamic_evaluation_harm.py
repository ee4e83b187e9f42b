"""No silent harm from adaptation: dynamic evaluation that scores worse than static or rolls back says so in one
line with the numbers and leaves the run's saved settings alone; a short run never stands in for the full one;
a search keeps no setting whose gain is within its noise; the eps grid starts at 1e-6."""

from __future__ import annotations

import json

import pytest

from conftest import copied_run, tiny_trained_run
from moglm.cli import main
from moglm.dynamic_evaluation import Hyperparameters
from moglm.dynamic_evaluation.search import grid_for


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    return tiny_trained_run(tmp_path_factory.mktemp("harm"), max_steps=8, eval_every=4)


def test_a_harmful_setting_says_so_and_leaves_the_saved_settings_alone(tiny_run, tmp_path, capsys):
    run = copied_run(tiny_run, tmp_path)
    assert main(["dyneval", str(run), "--split", "valid", "--rule", "sgd", "--learning-rate", "0.05",
                 "--no-progress"]) == 0  # a full run with a gentle setting: the run's settings
    good = json.loads((run / "dyneval" / "full.json").read_text())
    capsys.readouterr()
    assert main(["dyneval", str(run), "--split", "valid", "--rule", "sgd", "--learning-rate", "1000",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    warning = [line for line in out.splitlines() if line.startswith("warning: dynamic evaluation")]
    assert len(warning) == 1 and ("scored worse than static" in warning[0] or "rolled back" in warning[0])
    assert "lr=1000" in warning[0]
    assert json.loads((run / "dyneval" / "full.json").read_text()) == good  # untouched
    rejected = json.loads((run / "dyneval" / "full-rejected.json").read_text())
    assert rejected["harmful"] and rejected["hyperparameters"]["lr"] == 1000


def test_a_short_run_never_overwrites_the_full_runs_settings(tiny_run, tmp_path):
    run = copied_run(tiny_run, tmp_path)
    (run / "dyneval").mkdir(exist_ok=True)
    (run / "dyneval" / "full.json").write_text('{"hyperparameters": {"rule": "sgd", "lr": 0.01}}')
    assert main(["dyneval", str(run), "--eval-tokens", "40", "--rule", "sgd", "--learning-rate", "0.05",
                 "--no-progress"]) == 0
    assert json.loads((run / "dyneval" / "full.json").read_text())["hyperparameters"]["lr"] == 0.01
    assert list((run / "dyneval").glob("full-first40*.json"))


def test_the_search_starts_eps_at_1e_6_as_asked_unless_an_eps_is_given():
    assert min(grid_for("eps", Hyperparameters())) == 1e-6
    assert Hyperparameters(eps=1e-8).eps == 1e-8  # still there to be asked for


def test_a_music_search_keeps_no_setting_whose_gain_is_within_the_songs_noise():
    from moglm.music.dynamic_evaluation import SongDynamicResult, gain_and_noise
    from moglm.music.evaluation import SongScores

    def result(per_song):
        return SongDynamicResult(SongScores(0.0, 40, 4), SongScores(sum(per_song), 40, 4), Hyperparameters(),
                                 [0.0] * 4, per_song)

    start = result([10.0, 10.0, 10.0, 10.0])
    noisy = result([8.0, 12.5, 7.5, 11.0])  # 1 nat better in all, songs disagree
    steady = result([9.0, 9.1, 8.9, 9.0])  # 4 nats better, every song
    gain, noise = gain_and_noise(noisy, start)
    assert gain == pytest.approx(1.0 / 40) and not gain > 2 * noise
    gain, noise = gain_and_noise(steady, start)
    assert gain == pytest.approx(4.0 / 40) and gain > 2 * noise


def test_a_language_model_search_gain_counts_only_beyond_its_block_standard_error():
    import numpy as np

    from moglm.dynamic_evaluation.run import gain_and_noise

    rng = np.random.default_rng(0)
    static = rng.normal(5.0, 1.0, 2000)
    steady = static - 0.3 + rng.normal(0, 0.05, 2000)  # 0.3 nats better everywhere
    gain, noise = gain_and_noise(static, steady)
    assert gain == pytest.approx(0.3, abs=0.01) and gain > 2 * noise
    noisy = static + rng.normal(0.0, 1.0, 2000) - 0.01  # 0.01 nats better on average, by chance
    gain, noise = gain_and_noise(static, noisy)
    assert abs(gain) < 2 * noise
    assert gain_and_noise(static[:60], steady[:60])[1] == float("inf")  # one block: no estimate, nothing kept


def test_a_search_whose_best_gain_is_within_noise_keeps_its_start(tiny_run, monkeypatch):
    from moglm.dynamic_evaluation import run as dyneval

    monkeypatch.setattr(dyneval, "gain_and_noise", lambda static, dynamic: (0.001, 0.01))
    report = dyneval.dyneval_run(dyneval.LanguageModelRun(tiny_run), ("valid",), Hyperparameters(rule="sgd", lr=0.03),
                                 search=True, search_tokens=100, eval_tokens=60, progress=False, log=lambda s: None,
                                 write=False)
    assert report["search"]["best"] != report["search"]["kept"]  # the search moved, and its move was not kept
    assert report["search"]["kept"] == Hyperparameters(rule="sgd", lr=0.03).as_dict()
    assert report["hyperparameters"] == report["search"]["kept"]
