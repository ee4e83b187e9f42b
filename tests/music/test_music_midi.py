"""MIDI files and pictures of piano rolls: the exact round trip roll -> MIDI -> roll, folders of MIDI files as a
corpus, one-line errors, and the PNG of a roll."""

from __future__ import annotations

import pytest
import torch

from moglm.errors import MoglmError
from moglm.music.corpus import read_music
from moglm.music.frames import PITCHES, from_roll, to_roll
from moglm.music.midi import read_midi, write_midi
from moglm.music.piano_roll import plot_piano_roll

pretty_midi = pytest.importorskip("pretty_midi")


def _random_roll(frames: int, seed: int, density: float = 0.06) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    roll = (torch.rand(frames, PITCHES, generator=g) < density).float()  # [T, 88]
    roll[frames // 3: frames // 3 + 5, 39] = 1  # C4 held over five frames
    roll[frames // 3 + 5, 39] = 0
    roll[frames // 3 + 6, 39] = 1  # then struck again after one frame of rest
    roll[-1] = 0  # a silent final frame
    return roll


def _file(notes, path, *, resolution=220, tempo=120.0, drums=(), end=None):
    """A MIDI file of (pitch, start, end) notes in seconds on a piano, and of ``drums`` on a drum kit."""
    midi = pretty_midi.PrettyMIDI(resolution=resolution, initial_tempo=tempo)
    for is_drum, group in ((False, notes), (True, drums)):
        inst = pretty_midi.Instrument(program=0, is_drum=is_drum)
        inst.notes = [pretty_midi.Note(velocity=90, pitch=p, start=a, end=b) for p, a, b in group]
        midi.instruments.append(inst)
    if end is not None:
        midi.text_events.append(pretty_midi.Text("end", end))
    midi.write(str(path))
    return path


@pytest.mark.parametrize("seconds_per_frame", [0.5, 0.37, 1.2])
@pytest.mark.parametrize("seed", [0, 1])
def test_roll_to_midi_to_roll_is_exact_with_held_notes_and_trailing_silence(tmp_path, seconds_per_frame, seed):
    roll = _random_roll(40 + seed, seed)
    roll[-3:] = 0  # three silent frames at the end survive through the end marker
    path = write_midi(roll, tmp_path / "song.mid", seconds_per_frame=seconds_per_frame)
    assert torch.equal(read_midi(path), roll)
    assert not list(tmp_path.glob(".*"))  # the atomic write left no temporary file
    notes = pretty_midi.PrettyMIDI(str(path)).instruments[0].notes
    runs = int((torch.diff(torch.nn.functional.pad(roll, (0, 0, 1, 0)), dim=0) == 1).sum())
    assert len(notes) == runs  # a run of 1s is one held note
    c4 = sorted((n.start, n.end) for n in notes if n.pitch == 60)
    t = 40 // 3
    assert (pytest.approx(t * seconds_per_frame, abs=1e-3), pytest.approx((t + 5) * seconds_per_frame, abs=1e-3)) \
        in [(a, b) for a, b in c4]


def test_more_frames_per_beat_repeat_each_quarter_note_frame(tmp_path):
    roll = to_roll([(60, 64), (60,), (), (67,)])
    path = write_midi(roll, tmp_path / "s.mid")
    assert torch.equal(read_midi(path, frames_per_beat=2), roll.repeat_interleave(2, dim=0))


def test_read_follows_the_beat_grid_and_leaves_drums_out(tmp_path):
    # 90 quarter notes a minute: a beat is 2/3 s. A note from beat 1 to beat 3, one struck 30 ms late on beat 0.
    beat = 60 / 90
    path = _file([(64, beat, 3 * beat), (48, 0.03, beat)], tmp_path / "f.mid", tempo=90.0,
                 drums=[(36, 0.0, 5 * beat)])
    # the drums are not in the roll, which still lasts as long as the file: two silent frames at the end
    assert from_roll(read_midi(path)) == [(48,), (64,), (64,), (), ()]


def test_out_of_range_notes_are_an_error_or_dropped_with_clip(tmp_path):
    path = _file([(60, 0.0, 0.5), (110, 0.5, 1.0)], tmp_path / "high.mid")
    with pytest.raises(MoglmError, match=r"high.mid: a note of pitch 110 at 0.50 s is outside the piano's 21-108 "
                                         r"\(A0-C8\)") as e:
        read_midi(path)
    assert "\n" not in str(e.value)
    assert from_roll(read_midi(path, clip=True)) == [(60,), ()]


def test_files_without_notes_and_damaged_files_are_one_line_errors(tmp_path):
    with pytest.raises(MoglmError, match="silent.mid: no notes"):
        read_midi(_file([], tmp_path / "silent.mid", drums=[(36, 0.0, 1.0)], end=2.0))
    (tmp_path / "junk.mid").write_bytes(b"MThd not really")
    with pytest.raises(MoglmError, match="junk.mid: not a readable MIDI file") as e:
        read_midi(tmp_path / "junk.mid")
    assert "\n" not in str(e.value)
    with pytest.raises(MoglmError, match="no such file"):
        read_midi(tmp_path / "missing.mid")
    with pytest.raises(MoglmError, match=r"must be \[T, 88\]"):
        write_midi(torch.zeros(4, 12), tmp_path / "x.mid")
    with pytest.raises(MoglmError, match="only 0s and 1s"):
        write_midi(torch.full((4, 88), 0.5), tmp_path / "x.mid")
    with pytest.raises(MoglmError, match="frames_per_beat must be a positive integer"):
        read_midi(tmp_path / "silent.mid", frames_per_beat=0)


def test_a_folder_of_midi_files_is_a_corpus(tmp_path):
    rolls = {}
    for i, split in enumerate(("train", "valid", "test")):
        rolls[split] = [_random_roll(12 + j, 10 * i + j, density=0.1) for j in range(2 + (split == "train"))]
        for j, roll in enumerate(rolls[split]):
            write_midi(roll, tmp_path / "mine" / split / f"{j:02d}.mid")
    (tmp_path / "mine" / "train" / "notes.txt").write_text("not music")  # other files are passed over
    corpus = read_music(tmp_path / "mine")
    for split, expected in rolls.items():
        assert len(corpus[split]) == len(expected)
        assert all(torch.equal(a, b) for a, b in zip(corpus[split], expected))
    for f in (tmp_path / "mine" / "test").iterdir():
        f.unlink()
    with pytest.raises(MoglmError, match="test: no .mid or .midi files"):
        read_music(tmp_path / "mine")
    (tmp_path / "mine" / "test").rmdir()
    with pytest.raises(MoglmError, match="no test/ folder"):
        read_music(tmp_path / "mine")


def test_plot_piano_roll_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    roll = _random_roll(64, 3)
    path = plot_piano_roll(roll, tmp_path / "roll.png", title="a random roll")
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 1000
    assert plot_piano_roll(torch.zeros(5, PITCHES), tmp_path / "silent.png").stat().st_size > 0
    with pytest.raises(MoglmError, match=r"must be \[T, 88\]"):
        plot_piano_roll(torch.zeros(5), tmp_path / "bad.png")
