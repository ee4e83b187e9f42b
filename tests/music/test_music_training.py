"""Training an RNN-NADE through the one engine on a tiny generated music corpus: it learns, resumes exactly after
a kill, dynamically evaluates song by song (SGD and global RMS), and the CLI trains, evaluates, adapts and samples
MIDI. Also every shipped music config loads."""

from __future__ import annotations

import json

import pytest
import torch

from moglm.cli import main
from moglm.dynamic_evaluation import Hyperparameters
from moglm.errors import MoglmError
from moglm.music.config import load_music_config, shipped_music_configs, validate_music
from moglm.music.dynamic_evaluation import dynamic_evaluate_songs, song_gradient_rms
from moglm.music.evaluation import evaluate_songs
from moglm.music.training import MusicRun, build_music_model, pieces, train_music
from moglm.runs import RunDirectory

from conftest import tiny_music_config as tiny_config, write_music_corpus as write_corpus  # noqa: E402


class Killed(Exception):
    pass


def test_an_rnn_nade_learns_the_corpus_and_resumes_exactly_after_a_kill(tmp_path):
    corpus = write_corpus(tmp_path / "songs.json")
    cfg = tiny_config(corpus, optimizer="sgd", learning_rate=0.05, momentum=0.5)
    _, straight = train_music(cfg, tmp_path / "a", progress=False, log=lambda s: None)

    def kill(step):
        if step == 6:
            raise Killed

    with pytest.raises(Killed):
        train_music(cfg, tmp_path / "b", progress=False, log=lambda s: None, on_step=kill)
    _, resumed = train_music(cfg, tmp_path / "b", progress=False, log=lambda s: None)
    records = [RunDirectory(tmp_path / d).read_metrics() for d in ("a", "b")]
    assert [(r["kind"], r["step"], r["xent"]) for r in records[0]] == [(r["kind"], r["step"], r["xent"]) for r in records[1]]
    assert {k: v for k, v in resumed.items() if k != "train_seconds"} == {
        k: v for k, v in straight.items() if k != "train_seconds"}
    valid = [r["xent"] for r in records[0] if r["kind"] == "valid"]
    assert valid[-1] < valid[0]  # it learned
    assert straight["splits"]["test"]["frames"] == sum(len(s) for s in json.loads(corpus.read_text())["test"])
    assert straight["splits"]["test"]["log_likelihood_per_frame"] == pytest.approx(
        -straight["splits"]["test"]["nll_per_frame"])


def test_a_run_refuses_another_config_and_reloads_its_best_model(tmp_path):
    corpus = write_corpus(tmp_path / "songs.json")
    train_music(tiny_config(corpus), tmp_path / "run", progress=False, log=lambda s: None)
    with pytest.raises(MoglmError, match="different config"):
        train_music(tiny_config(corpus, learning_rate=0.02), tmp_path / "run", progress=False, log=lambda s: None)
    model, cfg = MusicRun(tmp_path / "run").load_model("best")
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    from moglm.music.corpus import read_music

    again = evaluate_songs(model, read_music(corpus)["test"], 3)
    assert again.log_likelihood == pytest.approx(results["splits"]["test"]["log_likelihood_per_frame"], abs=1e-5)


def test_songs_of_a_step_visit_every_training_song_once_per_epoch(tmp_path):
    from moglm.music.corpus import read_music
    from moglm.music.training import MusicTask

    corpus = write_corpus(tmp_path / "songs.json", (10, 2, 2))
    cfg = tiny_config(corpus)
    task = MusicTask(cfg, read_music(corpus), build_music_model(cfg.model), torch.device("cpu"))
    epoch = [r for step in range(1, task.per_epoch + 1) for r in task.songs_of_step(step)]
    assert sorted(epoch) == list(range(10))
    assert task.songs_of_step(1) == task.songs_of_step(1)
    assert [len(p) for p in pieces([torch.zeros(7, 88)], 3)] == [3, 3, 1]


def test_song_by_song_dynamic_evaluation_resets_and_adapts_with_sgd_and_global_rms(tmp_path):
    from moglm.music.corpus import read_music

    corpus_path = write_corpus(tmp_path / "songs.json", (12, 4, 4))
    cfg = tiny_config(corpus_path, max_steps=40, eval_every=20)
    train_music(cfg, tmp_path / "run", progress=False, log=lambda s: None)
    model, _ = MusicRun(tmp_path / "run").load_model()
    corpus = read_music(corpus_path)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    static = evaluate_songs(model, corpus["test"])
    off = dynamic_evaluate_songs(model, corpus["test"], Hyperparameters(rule="sgd", lr=0.0, segment_length=3))
    assert off.dynamic.nll == pytest.approx(off.static.nll, rel=1e-5) == pytest.approx(static.nll, rel=1e-5)
    sgd = dynamic_evaluate_songs(model, corpus["test"], Hyperparameters(rule="sgd", lr=0.3, segment_length=2))
    assert sgd.gain > 0  # the songs repeat their motif: adapting to each pays
    rms = song_gradient_rms(model, corpus["train"], batch_size=4)
    assert set(rms) == {n for n, _ in model.named_parameters()}
    adapted = dynamic_evaluate_songs(model, corpus["test"], Hyperparameters(rule="rms", lr=3e-3, segment_length=2), rms)
    assert adapted.gain > 0 and adapted.hyperparameters.decay == 0.0
    # each song starts from the trained weights: scoring one song alone gives its score within the pass
    alone = dynamic_evaluate_songs(model, corpus["test"][2:3], Hyperparameters(rule="sgd", lr=0.3, segment_length=2))
    assert alone.dynamic_per_song[0] == pytest.approx(sgd.dynamic_per_song[2], rel=1e-5)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the model is left unchanged
    # a song no longer than one segment is scored before any update: whatever the learning rate, its score is static
    whole = dynamic_evaluate_songs(model, corpus["test"], Hyperparameters(rule="sgd", lr=50.0, segment_length=64))
    assert whole.dynamic_per_song == pytest.approx(whole.static_per_song, rel=1e-6)
    with pytest.raises(MoglmError, match="RMS statistics"):
        dynamic_evaluate_songs(model, corpus["test"], Hyperparameters(rule="rms"))


def test_the_cli_trains_evaluates_adapts_and_samples_midi_and_a_piano_roll(tmp_path, capsys):
    pytest.importorskip("pretty_midi")
    corpus = write_corpus(tmp_path / "songs.json")
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(corpus).to_toml())
    run = tmp_path / "run"
    assert main(["music", "train", str(config), "--run-dir", str(run), "--no-progress",
                 "--set", "sample.num_frames=8"]) == 0
    assert (run / "sample.mid").stat().st_size > 0 and (run / "sample.png").stat().st_size > 0
    assert main(["music", "evaluate", str(run), "--split", "test", "--no-progress"]) == 0
    assert "test: log-likelihood" in capsys.readouterr().out
    assert main(["music", "dyneval", str(run), "--rule", "sgd", "--no-search", "--learning-rate", "0.1",
                 "--segment-length", "4", "--no-progress"]) == 0
    saved = json.loads((run / "dyneval" / "music-sgd.json").read_text())
    assert saved["hyperparameters"]["lr"] == 0.1 and list(saved["splits"]) == ["test"]
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    row = next(line for line in report.splitlines() if line.startswith("| run |"))
    dynamic = f"{saved['splits']['test']['dynamic']['log_likelihood_per_frame']:.3f}"
    assert f"[{dynamic}](" in row and "dyneval/music-sgd.json" in row  # the dyneval file, linked
    out = tmp_path / "out" / "tune.mid"
    assert main(["sample", str(run), "--num-tokens", "6", "--seed", "3", "--output", str(out)]) == 0
    from moglm.music.midi import read_midi

    assert read_midi(out).shape[1] == 88 and out.with_suffix(".png").is_file()
    assert main(["sample", str(run), "--prompt", "x"]) == 1
    assert "samples from silence" in capsys.readouterr().err
    assert main(["sample", str(run), "--temperature", "-1"]) == 1
    assert "temperature must be a finite number > 0" in capsys.readouterr().err
    assert main(["evaluate", str(run)]) == 1 and "is a music run: use `moglm music evaluate`" in capsys.readouterr().err


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["music", "train", "no-such-config"]) == 1
    assert "no such config file or shipped music config" in capsys.readouterr().err
    lm_like = tmp_path / "lm"
    lm_like.mkdir()
    (lm_like / "config.toml").write_text('name = "x"\n')
    assert main(["music", "evaluate", str(lm_like)]) == 1
    assert "not a music run" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(shipped_music_configs()))
def test_every_shipped_music_config_loads_and_builds(name):
    cfg = load_music_config(name)
    assert cfg.kind == "music" and cfg.description
    model = build_music_model(cfg.model.model_copy(update={"backend": "reference"}))
    assert sum(p.numel() for p in model.parameters()) > 0


def test_a_bad_music_config_is_a_one_line_error_naming_the_key():
    with pytest.raises(MoglmError, match="model.nade_hidden"):
        validate_music({"kind": "music", "model": {"nade_hidden": 0}})
    with pytest.raises(MoglmError, match="architecture"):
        validate_music({"kind": "music", "model": {"architecture": "transformer"}})
