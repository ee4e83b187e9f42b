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
    """Two char-level runs of the same corpus, trained apart (a Mogrifier and an LSTM), a byte-level one, and a
    char-level LSTM half as wide."""
    return (tiny_format_run(tmp_path_factory.mktemp("mogrifier"), "char"),
            tiny_format_run(tmp_path_factory.mktemp("lstm"), "char", architecture="lstm", cell={}),
            tiny_format_run(tmp_path_factory.mktemp("byte"), "byte"),
            tiny_format_run(tmp_path_factory.mktemp("narrow"), "char", architecture="lstm", cell={}, hidden_size=12))


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
    mogrifier, lstm, byte = (str(r) for r in runs[:3])
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


ENTRY = {"run": "a", "architecture": "lstm", "factor": 1.0, "adapt": None, "adapt_digest": None}


@pytest.mark.parametrize("field", [
    {"lr": 0.005, "runs": []}, {"lr": 0.005, "runs": [{}]}, {"lr": 0.005}, {"lr": 0.005, "runs": [ENTRY] * 8},
    *({"lr": lr, "runs": [ENTRY]} for lr in (-1, float("nan"), float("inf"), True, "0.1")),
    *({"lr": 0.005, "runs": [ENTRY | {"factor": factor}]} for factor in (0, -1.0, float("inf"), float("nan"), 10**400)),
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


@pytest.mark.parametrize("forgery", [{"ensemble": [1]}, {"factor": 10**400}, {"factor": -1.0}, {"factor": True}])
def test_a_forged_header_field_of_the_runs_is_a_damaged_header(runs, forgery):
    first = load_run(runs[0])
    blob, _ = compress(TEXT, first.model, first.vocab, factor=first.temperature, progress=False)
    with pytest.raises(MoglmError, match="f.moglm has a damaged header"):
        decompress(forged(blob, **forgery), first.model, first.vocab, name="f.moglm", progress=False)


def test_runs_of_other_widths_share_one_cache_size_that_fits_them_all(runs, monkeypatch):
    """The caches' memory bound (STEP_CACHE_BYTES) cuts every run's cache to one size, from the runs' widths
    together, and the header's size is that one: the decoder's runs get the encoder's sizes, so a mixture of a wide
    and a narrow run still round-trips where the bound cuts."""
    from moglm.compression.run import CACHE
    from moglm.evaluation import neural_cache

    first, narrow = load_run(runs[0]), load_run(runs[3])
    rows = 4
    hidden = [24, 12]  # the two runs' widths: alone, the first's caches would have room for 45 positions
    monkeypatch.setattr(neural_cache, "STEP_CACHE_BYTES", 4 * rows * sum(hidden) * 30)  # together, for 30
    data = TEXT[: rows * 90]
    member = Member(narrow.model, narrow.vocab, narrow.temperature)
    blob, report = compress(data, first.model, first.vocab, factor=first.temperature, cache=CACHE,
                            block_size=90, progress=False, others=[member])
    assert report.blocks == rows and report.cache["size"] == 30
    assert decompress(blob, first.model, first.vocab, ensemble_for=lambda records: [member], progress=False) == data


def test_mixing_more_runs_than_a_file_may_record_or_a_member_unlike_its_record_is_a_one_line_error(runs):
    from moglm.compression.ensemble import MAX_RUNS

    first, second = (load_run(r) for r in runs[:2])
    member = Member(second.model, second.vocab, second.temperature)
    with pytest.raises(MoglmError, match=f"at most {MAX_RUNS} runs can be mixed"):
        compress(TEXT, first.model, first.vocab, progress=False, others=[member] * MAX_RUNS)
    blob, _ = compress(TEXT, first.model, first.vocab, factor=first.temperature, progress=False,
                       others=[member] * (MAX_RUNS - 1))
    assert decompress(blob, first.model, first.vocab, progress=False,
                      ensemble_for=lambda records: [member] * len(records)) == TEXT
    hp = Hyperparameters(rule="sgd", lr=0.3, segment_length=5)
    adapted = Member(second.model, second.vocab, second.temperature,
                     DynamicEvaluator(second.model, hp, factor=second.temperature), {"hyperparameters": hp.as_dict()})
    wrong = {"adapting": ([adapted], "was coded without adaptation, and is given with"),
             "factor": ([Member(second.model, second.vocab, second.temperature * 2)], "is given logit factor")}
    blob, _ = compress(TEXT, first.model, first.vocab, factor=first.temperature, progress=False, others=[member])
    for given, message in wrong.values():
        with pytest.raises(MoglmError, match=message):
            decompress(blob, first.model, first.vocab, progress=False, ensemble_for=lambda records: given)


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
