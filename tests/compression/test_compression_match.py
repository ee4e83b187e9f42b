"""The match model (:mod:`moglm.compression.match`): what followed the last occurrence of a block's recent tokens,
in any block, read so far; and files coded with it."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("constriction", reason="the compress extra (constriction) is not installed")

from conftest import coded_round_trip, tiny_format_run  # noqa: E402
from moglm.compression import read_header  # noqa: E402
from moglm.compression import match as match_module  # noqa: E402
from moglm.compression.match import CompiledMatchModel, MatchModel, MatchSettings, match_model, table_bits  # noqa: E402
from moglm.recurrence import compiled  # noqa: E402
from moglm.dynamic_evaluation import Hyperparameters  # noqa: E402
from moglm.errors import MoglmError  # noqa: E402

V = 8  # the tiny vocabulary of the unit tests


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory):
    return tiny_format_run(tmp_path_factory.mktemp("byte"), "byte", hidden_size=16)


def _read(model: MatchModel, columns) -> list[np.ndarray]:
    """Feed ``columns`` (each ``[B]``) with uniform distributions; the mixed distributions of every step."""
    out = []
    for column in columns:
        out.append(model.mix(np.full((model.streams, V), 1.0)))
        model.append(np.asarray(column))
    return out


def test_a_block_predicts_what_followed_its_context_earlier_in_another_block():
    """Block 0 reads 0 1 2 3 4 while block 1 reads 7 7 7; when block 1 then reads 0 1 2 it is predicted 3 (the
    token that followed 0 1 2 in block 0), and its probability rises above the uniform 1/8."""
    model = MatchModel(MatchSettings(min_length=3), 2)
    _read(model, [[0, 7], [1, 7], [2, 7], [3, 7], [4, 0], [5, 1], [6, 2]])
    rows, tokens = model.predicted()
    assert rows.tolist() == [1] and tokens.tolist() == [3]
    p = model.mix(np.full((2, V), 1.0))
    assert p[1, 3] > 1 / V and p[0].tolist() == [1 / V] * V  # block 0 has no match: its row is only normalised
    assert np.allclose(p.sum(axis=1), 1.0)


def test_a_match_that_keeps_coming_true_is_given_more_probability_and_one_that_fails_is_dropped():
    model = MatchModel(MatchSettings(min_length=2), 1)
    cycle = [0, 1, 2, 3, 4, 5]
    mixed = _read(model, [[t] for t in cycle * 20])
    predicted_probability = [p[0, (cycle * 21)[i]] for i, p in enumerate(mixed)]
    assert predicted_probability[-1] > 0.9 > 1 / V == predicted_probability[0]
    assert model.predicted()[0].tolist() == [0]
    model.append(np.array([7]))  # the cycle predicted 0 here
    assert model.predicted()[0].tolist() == []  # the match failed, and 5 7 never occurred before


def test_a_pointer_only_ever_names_a_token_already_read_by_every_block():
    """The decoder knows at step t every block's tokens before t only: on random text with many repeats, no
    prediction ever reads a position at or past the tokens read."""
    rng = np.random.default_rng(0)
    model = MatchModel(MatchSettings(min_length=2), 5)
    seen = 0
    for _ in range(400):
        rows, _ = model.predicted()
        assert (model._position[rows] < model._length).all()
        seen += len(rows)
        model.mix(rng.random((5, V)) + 0.01)
        model.append(rng.integers(0, 3, 5))
    assert seen > 500  # three symbols: matches are everywhere


def _reference_matches(history: np.ndarray, n: int, pointers: dict) -> dict:
    """The reference twin of a step's lookups, a plain loop: for every block without a pointer, the most recent
    earlier position (in block order within a step) whose preceding ``n`` tokens equal its last ``n``, and how
    many tokens back, up to 32, the two agree. ``history`` ``[B, L]``: the tokens read so far."""
    blocks, length = history.shape
    out = dict(pointers)
    for b in range(blocks):
        if b in pointers or length < n:
            continue
        best = None
        for pos in range(n, length):  # position pos follows the context history[c, pos - n : pos]
            for c in range(blocks):
                if np.array_equal(history[c, pos - n : pos], history[b, length - n :]):
                    best = (c, pos)
        if best is not None:
            c, pos = best
            k = 0
            while k < 32 and pos - 1 - k >= 0 and history[c, pos - 1 - k] == history[b, length - 1 - k]:
                k += 1
            out[b] = (c, pos, k)
    return out


def test_the_lookups_agree_with_a_plain_loop_over_every_earlier_position():
    """Where the hash table has no collision (a table of 2^13 slots for 30-token contexts over 3 symbols is
    nearly free of them at these sizes), every new pointer and its match length are the reference loop's."""
    rng = np.random.default_rng(3)
    model = MatchModel(MatchSettings(min_length=3), 4)
    for _ in range(60):
        before = {b: (int(model._source[b]), int(model._position[b]), int(model._matched[b]))
                  for b in range(4) if model._source[b] >= 0}
        model.mix(np.full((4, V), 1.0))
        column = rng.integers(0, 3, 4)
        # the pointers that survive this token, as append moves them on
        kept = {b: (c, pos + 1, k + 1) for b, (c, pos, k) in before.items() if model._history[c, pos] == column[b]}
        model.append(column)
        history = model._history[:, : model._length]
        expected = _reference_matches(history, 3, kept)
        got = {b: (int(model._source[b]), int(model._position[b]), int(model._matched[b]))
               for b in range(4) if model._source[b] >= 0}
        assert got == expected


def test_the_table_grows_with_the_blocks_within_its_bounds_and_bad_settings_are_one_line_errors():
    assert table_bits(1) == 13 and table_bits(25) == 18 and table_bits(10**6) == 22
    for bad in (1, 33, 2.5, True, "5"):
        with pytest.raises(MoglmError, match="min_length must be an integer from 2 to 32"):
            MatchSettings(min_length=bad)


@pytest.mark.parametrize("hp", [None, Hyperparameters(rule="sgd", lr=0.3, segment_length=5)],
                         ids=["static", "dynamic"])
def test_text_repeated_across_blocks_codes_smaller_with_the_match_model_and_round_trips(byte_run, hp):
    """Eight blocks of 64 bytes, the second half of the file repeating the first 16 bytes later: the match model
    finds in the later blocks what the earlier ones read 16 steps before, which no block's own history holds (a
    repeat at the same offset in two blocks is read at the same step, too late to predict); the header records
    it."""
    rng = np.random.default_rng(1)
    half = rng.choice(np.frombuffer(b"abcdefgh .", dtype=np.uint8), 256).tobytes()
    data = half + half[16:] + half[:16]
    with_match, matched = coded_round_trip(byte_run, data, hp, match=MatchSettings())
    without, plain = coded_round_trip(byte_run, data, hp, match=None)
    assert matched.blocks == plain.blocks == 8
    assert matched.model_bits < 0.8 * plain.model_bits
    assert read_header(with_match)[0]["match"] == {"min_length": 5} and read_header(without)[0]["match"] is None
    assert matched.match == {"min_length": 5} and plain.match is None


needs_library = pytest.mark.skipif(not compiled.available(), reason="the compiled library cannot be built here")


@needs_library
@pytest.mark.parametrize("min_length, streams, vocab, steps", [(2, 1, 5, 1500), (5, 7, 8, 1200), (3, 37, 4, 700),
                                                               (32, 3, 3, 900), (5, 198, 256, 120)])
def test_the_compiled_step_gives_the_numpy_twins_bits_at_every_step(min_length, streams, vocab, steps):
    """Text that mostly repeats (so matches start, hold, fail and collide in the table) through both twins: every
    step's mixed distributions and, at the end, every piece of state (history past its first growth, table,
    pointers, the hit counts) are bitwise equal. Some rows give the predicted token all the probability, where
    the other tokens' scale is cut at its floor."""
    rng = np.random.default_rng(min_length * 1000 + streams)
    text = rng.integers(0, vocab, 60)
    twin, fast = MatchModel(MatchSettings(min_length), streams), CompiledMatchModel(MatchSettings(min_length), streams)
    for t in range(steps):
        p = rng.random((streams, vocab)) ** 3
        if t % 7 == 0:
            p[0] = np.eye(vocab)[t % vocab]
        if t % 11 == 0:  # a probability on a bin's edge
            p[-1, :2] = [0.05, 0.95]
            p[-1, 2:] = 0.0
        expected, got = twin.mix(p.copy()), fast.mix(p.copy())
        assert np.array_equal(expected, got), f"step {t}"
        tokens = np.where(rng.random(streams) < 0.85, text[(t + 13 * np.arange(streams)) % 60],
                          rng.integers(0, vocab, streams))
        twin.append(tokens)
        fast.append(tokens)
    assert twin._history.shape[1] > 1024 or steps < 1024
    assert (twin._trials > 1).sum() >= 3  # several bins saw predictions
    for name in ("_history", "_table", "_source", "_position", "_matched", "_hits", "_trials"):
        assert np.array_equal(getattr(twin, name), getattr(fast, name)), name


def test_without_the_compiled_library_the_numpy_twin_codes_the_same_file(byte_run, monkeypatch):
    """A file does not say which twin coded it: one coded with the compiled step decodes with numpy's, and the
    two code the same bytes."""
    from moglm.compression import decompress
    from moglm.runs.language_model import load_run

    rng = np.random.default_rng(1)
    half = rng.choice(np.frombuffer(b"abcdefgh .", dtype=np.uint8), 256).tobytes()
    data = half + half[16:] + half[:16]
    fast = coded_round_trip(byte_run, data, match=MatchSettings())[0] if compiled.available() else None
    monkeypatch.setattr(match_module, "kernel_available", lambda: False)
    assert type(match_model(MatchSettings(), 2)) is MatchModel
    with pytest.raises(MoglmError, match="compiled match model cannot be built here"):
        CompiledMatchModel(MatchSettings(), 2)
    plain = coded_round_trip(byte_run, data, match=MatchSettings())[0]
    if fast is not None:
        assert fast == plain
        trained = load_run(byte_run)
        assert decompress(fast, trained.model, trained.vocab, progress=False) == data
