"""Music corpora: piano rolls from JSON and pickles (read without running code), folder resolution, one-line
errors naming the file, split, song, frame and pitch, and the real JSB Chorales when $MOGLM_DATA has them."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from moglm.errors import MoglmError
from moglm.music.corpus import MusicCorpus, RestrictedUnpickler, read_music
from moglm.music.frames import PITCHES, from_roll, note_name, to_roll

TINY = {
    "train": [[(60, 64, 67), (60, 64, 67), (), (21, 108)], [(62,), (62, 65)]],
    "valid": [[(55, 59)], [(), (72,), (72, 76, 79)]],
    "test": [[(48,), (50,), (52,)]],
}


def _json(path: Path, data=TINY) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def _pickle(path: Path, data=TINY, numpy_ints=True, protocol=2) -> Path:
    """The corpus as a pickle of tuples of ``np.int64`` pitches (as the Boulanger-Lewandowski files hold), or of
    plain ints."""
    to = np.int64 if numpy_ints else int
    data = {s: [[tuple(to(p) for p in frame) for frame in song] for song in songs] for s, songs in data.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(data, protocol=protocol))
    return path


def _rolls_equal(a: MusicCorpus, b: MusicCorpus) -> bool:
    return all(len(a[s]) == len(b[s]) and all(torch.equal(x, y) for x, y in zip(a[s], b[s])) for s in a.songs)


def test_rolls_map_pitch_p_to_column_p_minus_21_and_back():
    roll = to_roll([(21, 60), (), (108,)])
    assert roll.shape == (3, PITCHES) and roll.dtype == torch.float32
    assert roll.nonzero().tolist() == [[0, 0], [0, 39], [2, 87]]
    assert from_roll(roll) == [(21, 60), (), (108,)]
    assert [note_name(p) for p in (21, 60, 61, 108)] == ["A0", "C4", "C#4", "C8"]


def test_json_corpus_reads_every_split_with_stats(tmp_path):
    c = read_music(_json(tmp_path / "tiny.json"))
    assert [len(c[s]) for s in ("train", "valid", "test")] == [2, 2, 1]
    assert [c.frames(s) for s in ("train", "valid", "test")] == [6, 4, 3]
    assert from_roll(c["train"][0]) == [(60, 64, 67), (60, 64, 67), (), (21, 108)]
    stats = c.stats()
    assert stats["train"] == {"songs": 2, "frames": 6, "notes_per_frame": 11 / 6, "lowest": 21, "highest": 108}
    assert (stats["test"]["lowest"], stats["test"]["highest"]) == (48, 52)
    assert c.source == str(tmp_path / "tiny.json") and "valid 2 songs" in c.summary()
    with pytest.raises(MoglmError, match="split must be one of"):
        c["training"]


@pytest.mark.parametrize("pitch, message", [
    (110, r"tiny.json: train song 1, frame 1 has pitch 110, outside the piano's 21-108 \(A0-C8\)"),
    (20, "train song 1, frame 1 has pitch 20, outside"),
    (60.5, "train song 1, frame 1 has pitch 60.5, not an integer MIDI pitch"),
    ("C4", "train song 1, frame 1 has pitch 'C4', not an integer"),
    (True, "train song 1, frame 1 has pitch True, not an integer"),
])
def test_a_bad_pitch_names_file_split_song_frame_and_pitch(tmp_path, pitch, message):
    data = json.loads(json.dumps(TINY))
    data["train"][1][1].append(pitch)
    with pytest.raises(MoglmError, match=message) as e:
        read_music(_json(tmp_path / "tiny.json", data))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("change, message", [
    (lambda d: [d], "expected a dict with keys train, valid, test, found list"),
    (lambda d: {k: v for k, v in d.items() if k != "valid"}, "no 'valid' split \\(its keys: test, train\\)"),
    (lambda d: {**d, "test": []}, "the test split has no songs"),
    (lambda d: {**d, "test": {"a": 1}}, "the test split is dict, not a list of songs"),
    (lambda d: {**d, "valid": [[(60,)], []]}, "valid song 1 has no frames"),
    (lambda d: {**d, "valid": [[(60,)], "abc"]}, "valid song 1 is str, not a list of frames"),
    (lambda d: {**d, "valid": [[(60,), 60]]}, "valid song 0, frame 1 is 60, not a list of pitches"),
])
def test_malformed_corpora_give_one_line_errors(tmp_path, change, message):
    with pytest.raises(MoglmError, match=message) as e:
        read_music(_json(tmp_path / "bad.json", change(json.loads(json.dumps(TINY)))))
    assert "\n" not in str(e.value) and "bad.json" in str(e.value)


def test_unreadable_and_missing_files_are_one_line_errors(tmp_path):
    (tmp_path / "broken.json").write_text('{"train": [[[60]]')
    with pytest.raises(MoglmError, match="broken.json: not valid JSON"):
        read_music(tmp_path / "broken.json")
    (tmp_path / "broken.pkl").write_bytes(pickle.dumps(TINY)[:-20])
    with pytest.raises(MoglmError, match="broken.pkl: not a readable pickle"):
        read_music(tmp_path / "broken.pkl")
    with pytest.raises(MoglmError, match="not found"):
        read_music(tmp_path / "nope.json")
    (tmp_path / "notes.txt").write_text("60 64 67")
    with pytest.raises(MoglmError, match="notes.txt: not a music corpus"):
        read_music(tmp_path / "notes.txt")


def test_a_folder_resolves_to_its_corpus_preferring_json_over_the_same_pickle(tmp_path):
    d = tmp_path / "jsb"
    _json(d / "chorales.json")
    other = json.loads(json.dumps(TINY))
    other["test"] = [[(40,)]]
    _pickle(d / "chorales.pkl", other)  # a pickle that differs, to see which one was read
    c = read_music(d)
    assert c.source.endswith("chorales.json") and from_roll(c["test"][0]) == [(48,), (50,), (52,)]
    (d / "chorales.json").unlink()
    assert read_music(d).source.endswith("chorales.pkl")
    _json(d / "other.json")
    with pytest.raises(MoglmError, match="holds several corpora"):
        read_music(d)
    (tmp_path / "empty").mkdir()
    with pytest.raises(MoglmError, match="no .json, .pkl or .pickle corpus file"):
        read_music(tmp_path / "empty")


def test_a_relative_path_is_looked_up_under_moglm_data(tmp_path, monkeypatch):
    _json(tmp_path / "data" / "tiny" / "tiny.json")
    monkeypatch.setenv("MOGLM_DATA", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    assert read_music("tiny").frames("train") == 6


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
@pytest.mark.parametrize("numpy_ints", [True, False])
def test_pickles_of_numpy_or_plain_integers_read_as_the_json_does(tmp_path, numpy_ints, protocol):
    expected = read_music(_json(tmp_path / "tiny.json"))
    got = read_music(_pickle(tmp_path / "tiny.pkl", numpy_ints=numpy_ints, protocol=protocol))
    assert _rolls_equal(got, expected)


def test_numpy_scalars_are_decoded_from_their_bytes_without_calling_numpy():
    """Big-endian and unsigned integers and floats come back as Python numbers; numpy's own ``scalar`` is never
    the callable handed back."""
    import io

    values = [np.int64(60), np.int32(-3), np.uint8(200), np.dtype(">i8").type(72), np.float64(0.5)]
    for protocol in (2, 5):
        blob = pickle.dumps(values, protocol=protocol)
        got = RestrictedUnpickler(io.BytesIO(blob), encoding="latin1").load()
        assert got == [60, -3, 200, 72, 0.5] and [type(v) for v in got] == [int, int, int, int, float]
    try:
        from numpy._core import multiarray  # numpy 2
    except ImportError:
        from numpy.core import multiarray  # numpy 1

    unpickler = RestrictedUnpickler(io.BytesIO(b""), encoding="latin1")
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        assert unpickler.find_class(module, "scalar") is not multiarray.scalar
    assert unpickler.find_class("numpy", "dtype") is not np.dtype


class _Exploit:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


class _Eval:
    def __reduce__(self):
        return eval, ("1 + 1",)


def test_a_malicious_pickle_is_refused_and_never_runs(tmp_path):
    proof = tmp_path / "pwned"
    data = {"train": [[(60,)]], "valid": [[(60,)]], "test": [[(60,)]], "x": _Exploit(f"echo pwned > {proof}")}
    (tmp_path / "evil.pkl").write_bytes(pickle.dumps(data, protocol=2))
    with pytest.raises(MoglmError, match=r"evil.pkl: the pickle asks for (posix|os|nt)\.system, refused") as e:
        read_music(tmp_path / "evil.pkl")
    assert "\n" not in str(e.value)
    assert not proof.exists()
    (tmp_path / "eval.pkl").write_bytes(pickle.dumps({"train": _Eval()}))
    with pytest.raises(MoglmError, match=r"asks for builtins\.eval, refused"):
        read_music(tmp_path / "eval.pkl")


@pytest.mark.parametrize("make, message", [
    (lambda: [np.array([60, 64])], "asks for numpy.*_reconstruct, refused"),
    (lambda: [np.str_("abc")], "dtype '(U3|<U3)'"),
    (lambda: [np.bool_(True)], "dtype 'b1'"),
    (lambda: [Path("x")], "asks for pathlib.*, refused"),
])
def test_anything_but_plain_data_and_numeric_scalars_is_refused(tmp_path, make, message):
    (tmp_path / "x.pkl").write_bytes(pickle.dumps({"train": make()}))
    with pytest.raises(MoglmError, match=message):
        read_music(tmp_path / "x.pkl")


SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


def _jsb_folder() -> Path | None:
    """``$MOGLM_DATA/jsb-chorales``, else the one in ``shared/data`` beside the checkout (as the corpus tests)."""
    roots = [Path(os.environ["MOGLM_DATA"])] if os.environ.get("MOGLM_DATA") else []
    for folder in (root / "jsb-chorales" for root in [*roots, SHARED]):
        if (folder / "jsb-chorales-quarter.json").is_file() and (folder / "jsb-chorales-quarter.pkl").is_file():
            return folder
    return None


@pytest.mark.skipif(_jsb_folder() is None, reason="JSB Chorales not found: set MOGLM_DATA to a folder holding "
                    "jsb-chorales/jsb-chorales-quarter.json and .pkl")
def test_the_real_jsb_chorales_match_the_published_split_in_both_forms():
    folder = _jsb_folder()
    from_json = read_music(folder / "jsb-chorales-quarter.json")
    from_pickle = read_music(folder / "jsb-chorales-quarter.pkl")
    assert [len(from_json[s]) for s in ("train", "valid", "test")] == [229, 76, 77]
    assert [from_json.frames(s) for s in ("train", "valid", "test")] == [13_807, 4_602, 4_725]
    stats = from_json.stats()
    assert [(stats[s]["lowest"], stats[s]["highest"]) for s in ("train", "valid", "test")] == [(43, 96), (48, 96),
                                                                                           (45, 96)]
    assert _rolls_equal(from_pickle, from_json)
    assert read_music(folder).source.endswith(".json")
