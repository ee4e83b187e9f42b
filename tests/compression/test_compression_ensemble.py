"""Runs mixed while coding (moglm.compression.ensemble, ``moglm compress --ensemble``, container version 13): the
geometric mixture and its weights' step against a plain loop, round trips of two runs static and adapting through the
API and the CLI, the header's record of them, and every way of decoding with the wrong runs as a one-line error
that writes nothing."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("constriction", reason="the compress extra (constriction) is not installed")

from conftest import tiny_format_run  # noqa: E402
from moglm.cli import main  # noqa: E402
from moglm.compression import compress, container, decompress, read_header  # noqa: E402
from moglm.compression.ensemble import (ENSEMBLE_LR, FLOOR, Ensemble, EnsembleSettings, Member,  # noqa: E402
                                        recorded)
from moglm.dynamic_evaluation import DynamicEvaluator, Hyperparameters  # noqa: E402
from moglm.errors import MoglmError  # noqa: E402
from moglm.runs.language_model import load_run  # noqa: E402
from test_compression import TEXT, forged  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two char-level runs of the same corpus, trained apart (a Mogrifier and an LSTM), and a byte-level one."""
    return (tiny_format_run(tmp_path_factory.mktemp("mogrifier"), "char"),
            tiny_format_run(tmp_path_factory.mktemp("lstm"), "char", architecture="lstm", cell={}),
            tiny_format_run(tmp_path_factory.mktemp("byte"), "byte"))


def _distributions(rng, runs: int, rows: int, vocab: int) -> list[np.ndarray]:
    return [rng.dirichlet(np.full(vocab, 0.3), size=rows) * rng.uniform(0.5, 2.0) for _ in range(runs)]


def test_the_mixture_and_its_step_equal_a_plain_loop_in_float64():
    """Each row's mixture is exp(sum_m w_m log p_m(v)) normalised, from each run's normalised distribution floored
    at FLOOR; each step adds lr times the blocks' mean of log p_m(y) - sum_v p(v) log p_m(v) to w_m."""
    rng = np.random.default_rng(0)
    runs, rows, vocab = 3, 5, 7
    ensemble = Ensemble(EnsembleSettings(lr=0.05), runs)
    weights = np.full(runs, 1 / runs)
    for _ in range(4):
        ps = _distributions(rng, runs, rows, vocab)
        ps[1][0, 2] = 0.0  # a run's zero is floored, not -inf
        tokens = rng.integers(0, vocab, rows)
        mixed = ensemble.mix(ps)
        gradient = np.zeros(runs)
        for b in range(rows):
            logs = [[np.log(max(p[b, v] / p[b].sum(), FLOOR)) for v in range(vocab)] for p in ps]
            score = [sum(weights[m] * logs[m][v] for m in range(runs)) for v in range(vocab)]
            top = max(score)
            unnormalised = [np.exp(s - top) for s in score]
            expected = [u / sum(unnormalised) for u in unnormalised]
            assert np.allclose(mixed[b], expected, rtol=1e-12, atol=0)
            for m in range(runs):
                gradient[m] += (logs[m][tokens[b]] - sum(expected[v] * logs[m][v] for v in range(vocab))) / rows
        ensemble.learn(tokens)
        weights = weights + 0.05 * gradient
        assert np.allclose(ensemble.weights, weights, rtol=1e-12, atol=1e-15)


def test_the_weights_move_towards_the_run_that_predicts_the_tokens():
    ensemble = Ensemble(EnsembleSettings(), 2)
    good, bad = np.full((4, 5), 0.05), np.full((4, 5), 0.05)
    good[:, 3], bad[:, 1] = 0.8, 0.8
    for _ in range(50):
        ensemble.mix([good.copy(), bad.copy()])
        ensemble.learn(np.full(4, 3))
    assert ensemble.weights[0] > 0.5 + 50 * ENSEMBLE_LR * 0.5 and ensemble.weights[1] < 0.5


@pytest.mark.parametrize("adapting", [False, True])
def test_two_runs_mixed_round_trip_and_the_header_records_the_second(runs, adapting):
    first, second = (load_run(r) for r in runs[:2])
    hp = Hyperparameters(rule="sgd", lr=0.3, segment_length=5)
    settings = {"hyperparameters": hp.as_dict()} if adapting else None

    def member(record=None):
        adapter = DynamicEvaluator(second.model, hp, factor=second.temperature) if adapting else None
        return Member(second.model, second.vocab, second.temperature, adapter, settings)

    def adapter(header=None):
        return DynamicEvaluator(first.model, hp, factor=first.temperature) if adapting else None

    data = TEXT * 2
    blob, report = compress(data, first.model, first.vocab, factor=first.temperature, adapter=adapter(),
                            settings=settings, block_size=100, progress=False, others=[member()])
    alone, _ = compress(data, first.model, first.vocab, factor=first.temperature, adapter=adapter(),
                        settings=settings, block_size=100, progress=False)
    assert report.runs == 2 and "2 runs mixed" in report.summary() and blob != alone
    header, _ = read_header(blob)
    entry = {"run": container.run_digest(second.model, second.vocab), "architecture": "lstm",
             "factor": second.temperature, "adapt": settings,
             "adapt_digest": container.adapter_digest(member().adapter)}
    assert header["ensemble"] == {"lr": ENSEMBLE_LR, "runs": [entry]} and read_header(alone)[0]["ensemble"] is None
    seen = []

    def ensemble_for(records):
        seen.append(records)
        return [member()]

    assert decompress(blob, first.model, first.vocab, adapter_for=adapter, ensemble_for=ensemble_for,
                      progress=False) == data
    assert seen == [[entry]]


def test_the_cli_mixes_runs_and_every_wrong_ensemble_is_a_one_line_error_that_writes_nothing(runs, tmp_path, capsys):
    mogrifier, lstm, byte = (str(r) for r in runs)
    source = tmp_path / "text.txt"
    source.write_bytes(TEXT * 2)
    mixed, single, out = tmp_path / "mixed.moglm", tmp_path / "single.moglm", tmp_path / "out.txt"
    common = ["--block-size", "100", "--no-progress"]
    assert main(["compress", mogrifier, str(source), "-o", str(mixed), "--ensemble", lstm, "--rule", "sgd",
                 "--adapt-learning-rate", "0.3", *common]) == 0
    assert "2 runs mixed" in capsys.readouterr().out
    assert main(["compress", mogrifier, str(source), "-o", str(single), *common]) == 0
    assert main(["decompress", mogrifier, str(mixed), "-o", str(out), "--ensemble", lstm, "--no-progress"]) == 0
    assert out.read_bytes() == source.read_bytes()
    out.write_bytes(b"keep me")
    cases = [
        (["decompress", mogrifier, str(mixed)], "was compressed with 2 runs mixed, not 1: give the other 1 with "
                                                "--ensemble"),
        (["decompress", mogrifier, str(mixed), "--ensemble", lstm, "--ensemble", lstm], "with 2 runs mixed, not 3"),
        (["decompress", mogrifier, str(mixed), "--ensemble", mogrifier], "run 2 of its ensemble was another run"),
        (["decompress", mogrifier, str(single), "--ensemble", lstm], "was compressed with one run, not 2 mixed: drop "
                                                                     "--ensemble"),
        (["decompress", mogrifier, str(mixed), "--ensemble", byte], "its vocabulary is not the first run's"),
    ]
    for args, message in cases:
        capsys.readouterr()
        assert main([*args, "-o", str(out), "--force", "--no-progress"]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, (args, err)
        assert out.read_bytes() == b"keep me"
    for args, message in [(["--ensemble", byte], "its vocabulary is not the first run's"),
                          (["--ensemble", lstm, "--from-scratch", "1"], "--from-scratch codes with weights drawn")]:
        target = tmp_path / "refused.moglm"
        assert main(["compress", mogrifier, str(source), "-o", str(target), *args, *common]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err and not target.exists(), err


@pytest.mark.parametrize("field", [
    {"lr": 0.005, "runs": []}, {"lr": -1, "runs": [{}]}, {"lr": 0.005},
    {"lr": 0.005, "runs": [{"run": "a", "architecture": "lstm", "factor": 1.0, "adapt": None}]},
    {"lr": 0.005, "runs": [{"run": 1, "architecture": "lstm", "factor": 1.0, "adapt": None, "adapt_digest": None}]},
    {"lr": 0.005, "runs": [{"run": "a", "architecture": "lstm", "factor": True, "adapt": None,
                            "adapt_digest": None}]},
    {"lr": 0.005, "runs": "abc"}])
def test_a_forged_ensemble_is_a_one_line_error(runs, field):
    first = load_run(runs[0])
    blob, _ = compress(TEXT, first.model, first.vocab, factor=first.temperature, progress=False)
    with pytest.raises(MoglmError, match="f.moglm: its header's ensemble is not one"):
        decompress(forged(blob, ensemble=field), first.model, first.vocab, name="f.moglm", progress=False)
    with pytest.raises(MoglmError, match="damaged header"):
        decompress(forged(blob, ensemble=[1]), first.model, first.vocab, name="f.moglm", progress=False)


def test_a_file_before_version_13_has_no_ensemble_and_decodes_with_its_one_run(runs):
    first = load_run(runs[0])
    blob, _ = compress(TEXT, first.model, first.vocab, factor=first.temperature, progress=False)
    old = forged(blob, version=12, drop=("ensemble",))
    assert read_header(old)[0]["ensemble"] is None and recorded(read_header(old)[0]) is None
    assert decompress(old, first.model, first.vocab, progress=False) == TEXT


def test_bench_compress_codes_every_row_with_the_ensemble_and_names_it(runs, tmp_path, capsys):
    """``moglm bench compress --ensemble RUN``: the static and the adapting row both mix the run in (adapting where
    the row adapts), round-trip, and say so in the JSON and the table."""
    import json

    mogrifier, lstm = (str(r) for r in runs[:2])
    source = tmp_path / "text.txt"
    source.write_bytes(TEXT * 2)
    out = tmp_path / "compression.json"
    assert main(["bench", "compress", mogrifier, str(source), "--ensemble", lstm, "--rule", "sgd",
                 "--adapt-learning-rate", "0.3", "--block-size", "128", "--no-progress", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["ensemble"] for r in rows] == [[runs[1].name]] * 2 and [r["runs"] for r in rows] == [2, 2]
    assert [r["dynamic"] is None for r in rows] == [True, False]
    table = capsys.readouterr().out
    assert f"--block-size 128 --dynamic (sgd) --ensemble {runs[1].name} |" in table
