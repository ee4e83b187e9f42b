"""Lossless compression with a trained run (moglm.compression): any file round-trips bit for bit, with and
without dynamic evaluation; the payload is within 0.1% of the model's cross-entropy; a damaged file or
another run is a one-line error, never a wrong output. Blocks, raw blocks, threads and every bad input of
the block format: test_compression_blocks.py."""

from __future__ import annotations

import math
import os
import shutil

import numpy as np
import pytest
import torch

pytest.importorskip("constriction", reason="the compress extra (constriction) is not installed")

from conftest import tiny_format_run  # noqa: E402
from moglm.cli import main  # noqa: E402
from moglm.compression import Layout, compress, decompress, read_header  # noqa: E402
from moglm.compression.container import default_block_size  # noqa: E402
from moglm.compression.run import (ADAPTING_BLOCKS, CACHE, COMPRESSION_LR, GUARD_MARGIN,  # noqa: E402
                                   SEGMENT_RANGE, UPDATE_TOKENS, segment_length, step_scale)
from moglm.evaluation.neural_cache import StepCacheSettings  # noqa: E402
from moglm.data.vocabulary import Vocabulary  # noqa: E402
from moglm.dynamic_evaluation import DynamicEvaluator, Hyperparameters  # noqa: E402
from moglm.errors import MoglmError  # noqa: E402
from moglm.runs.language_model import load_run  # noqa: E402


@pytest.fixture(scope="module")
def char_run(tmp_path_factory):
    return tiny_format_run(tmp_path_factory.mktemp("char"), "char")


@pytest.fixture(scope="module")
def ptb_char_run(tmp_path_factory):
    return tiny_format_run(tmp_path_factory.mktemp("ptb-char"), "ptb_char", architecture="lstm", cell={})


TEXT = b"the cat sees the dog .\nthe owl hears the cow .\nthe fish likes the bird .\n" * 6


def _round_trip(run, data, adapter=None, **options):
    trained = load_run(run)
    settings = None if adapter is None else {"hyperparameters": adapter.hp.as_dict()}
    blob, report = compress(data, trained.model, trained.vocab, factor=trained.temperature, adapter=adapter,
                            settings=settings, progress=False, **options)
    fresh = None if adapter is None else DynamicEvaluator(trained.model, adapter.hp, factor=trained.temperature)
    restored = decompress(blob, trained.model, trained.vocab, adapter_for=lambda header: fresh, progress=False)
    return blob, report, restored


RANDOM = bytes(np.random.default_rng(0).integers(0, 256, 700, dtype=np.uint8))


@pytest.mark.parametrize("data", [b"", b"t", bytes(range(256)) * 3, RANDOM, TEXT,
                                  "naïve café: ünïcödé ☃ and 中文\n".encode() * 3 + b"\xff\xfe broken utf-8 \xc3"],
                         ids=["empty", "one-byte", "all-bytes", "random", "text", "unicode-and-bad-utf8"])
def test_any_file_round_trips_exactly(char_run, data):
    blob, report, restored = _round_trip(char_run, data)
    assert restored == data
    assert read_header(blob)[0]["bytes"] == len(data)


@pytest.mark.slow
def test_text_compresses_to_the_models_cross_entropy(char_run):
    """One stream's payload is the range coder's output: within 0.1% of the ideal code length (the model's
    cross-entropy on the tokens plus the gaps' code length), and text the model knows is far smaller than the
    file. In blocks, each block's coder adds at most a flush of two words."""
    long = TEXT * 20
    _, report, restored = _round_trip(char_run, long, block_size=0)
    assert restored == long
    assert report.tokens == len(long) and report.gap_bits < 64  # every character is a token; gaps stay empty
    assert abs(report.coding_overhead) < 1e-3, report.as_dict()
    assert report.compressed_bytes < 0.35 * len(long)
    _, blocks, restored = _round_trip(char_run, long, block_size=1024)
    assert restored == long and blocks.blocks == 9 and blocks.raw_blocks == 0
    assert 8 * blocks.coded_bytes - blocks.coded_ideal_bits < blocks.blocks * 64, blocks.as_dict()


@pytest.mark.slow
def test_dynamic_evaluation_round_trips_and_compresses_repeated_text_better(char_run):
    trained = load_run(char_run)
    long = TEXT * 10
    hp = Hyperparameters(rule="sgd", lr=0.3, segment_length=12)
    blob, adapted, restored = _round_trip(char_run, long, DynamicEvaluator(trained.model, hp,
                                                                               factor=trained.temperature))
    assert restored == long
    _, static, _ = _round_trip(char_run, long)
    assert adapted.compressed_bytes < static.compressed_bytes
    assert read_header(blob)[0]["adapt"] == {"hyperparameters": hp.as_dict()}


def test_an_adaptation_that_diverges_is_rolled_back_identically_on_both_sides(char_run):
    """SGD at a learning rate that makes the weights non-finite: the divergence guard rolls back (and halves the
    rate) on both sides alike, the state carries on from the rescored pass, and the file comes back exactly."""
    trained = load_run(char_run)
    hp = Hyperparameters(rule="sgd", lr=1e30, segment_length=3)
    adapter = DynamicEvaluator(trained.model, hp, factor=trained.temperature)
    _, report, restored = _round_trip(char_run, TEXT, adapter)
    assert restored == TEXT and adapter.rollbacks > 0


def test_a_file_that_is_mostly_gaps_keeps_the_gap_table_bounded(char_run):
    """Every character outside the vocabulary is a gap; distinct gaps beyond the table's size are spelled out
    each time, on both sides alike."""
    from moglm.compression import coder

    data = "".join(f"t{chr(0x4E00 + i)}" for i in range(coder.MAX_GAPS + 40)).encode()  # distinct unseen gaps
    _, report, restored = _round_trip(char_run, data)
    assert restored == data and report.tokens == coder.MAX_GAPS + 40


def test_ptb_char_spaces_are_gaps_and_cost_almost_nothing(ptb_char_run):
    trained = load_run(ptb_char_run)
    layout = Layout.of(trained.vocab)
    data = (ptb_char_run.parent / "tiny" / "test.txt").read_bytes()
    tokens, gaps = layout.split(data)
    assert set(gaps[1:-1]) == {" "} and layout.join(tokens, gaps) == data
    _, report, restored = _round_trip(ptb_char_run, data)
    # the first space is spelled out once; after that each costs about 1 / (its count) bits: a few dozen in all
    assert restored == data and report.gap_bits < 64 and report.tokens == len(tokens)


def test_a_word_level_run_is_refused():
    with pytest.raises(MoglmError, match="word-level"):
        Layout.of(Vocabulary(["the", "cat"], "word"))


@pytest.mark.slow
def test_command_line_round_trip_with_and_without_adaptation(char_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(char_run, run)
    source = tmp_path / "text.txt"
    source.write_bytes(TEXT * 3)
    assert main(["compress", str(run), str(source), "--no-progress", "--report", str(tmp_path / "r.json")]) == 0
    assert "bits per byte" in capsys.readouterr().out
    packed = tmp_path / "text.txt.moglm"
    os.replace(source, tmp_path / "original.txt")
    assert main(["decompress", str(run), str(packed), "--no-progress"]) == 0
    assert source.read_bytes() == (tmp_path / "original.txt").read_bytes()
    # with adaptation, to other names: the default rule (global RMS statistics from the training split, cached
    # in the run, read again by the decoder), and SGD with a learning rate far too high (rolled back, still exact)
    for name, args in (("rms", ["--dynamic"]), ("sgd", ["--rule", "sgd", "--adapt-learning-rate", "30"])):
        assert main(["compress", str(run), str(source), "-o", str(tmp_path / f"{name}.moglm"), *args,
                     "--no-progress"]) == 0
        assert main(["decompress", str(run), str(tmp_path / f"{name}.moglm"), "-o", str(tmp_path / f"{name}.txt"),
                     "--no-progress"]) == 0
        assert (tmp_path / f"{name}.txt").read_bytes() == source.read_bytes()
        assert read_header((tmp_path / f"{name}.moglm").read_bytes())[0]["adapt"]["hyperparameters"]["rule"] == (
            "rms-rmsdecay" if name == "rms" else "sgd")


def test_a_file_the_vocabulary_does_not_cover_is_warned_of_in_one_line_and_still_round_trips(char_run, ptb_char_run,
                                                                                            tmp_path, capsys):
    covered, uncovered = tmp_path / "covered.txt", tmp_path / "uncovered.txt"
    covered.write_bytes(TEXT)
    uncovered.write_bytes(TEXT + "Zürich ZZ\t!\n".encode())  # Z, ü, tab and ! never occur in the tiny corpus
    assert main(["compress", str(char_run), str(covered), "--no-progress"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["compress", str(char_run), str(uncovered), "--no-progress"]) == 0
    [warning] = capsys.readouterr().err.splitlines()
    assert warning.startswith("warning: the run's vocabulary has no token for 4 distinct characters of ")
    assert "(6 of its " in warning and "commonest 'Z'" in warning
    os.replace(uncovered, tmp_path / "original.txt")
    assert main(["decompress", str(char_run), str(tmp_path / "uncovered.txt.moglm"), "--no-progress"]) == 0
    assert uncovered.read_bytes() == (tmp_path / "original.txt").read_bytes()
    # PTB char's separating spaces are gaps by design, not characters the vocabulary lacks
    ptb = tmp_path / "ptb.txt"
    ptb.write_bytes(b" t h e _ c a t \n")
    assert Layout.of(load_run(ptb_char_run).vocab).uncovered(ptb.read_bytes()) == {}


def _error(capsys, args):
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_damaged_truncated_or_foreign_files_and_another_run_are_one_line_errors(char_run, ptb_char_run, tmp_path,
                                                                                 capsys):
    source = tmp_path / "text.txt"
    source.write_bytes(TEXT)
    assert main(["compress", str(char_run), str(source), "-o", str(tmp_path / "t.moglm"), "--no-progress"]) == 0
    blob = (tmp_path / "t.moglm").read_bytes()
    cases = {
        "flipped.moglm": blob[:40] + bytes([blob[40] ^ 1]) + blob[41:],
        "truncated.moglm": blob[: len(blob) // 2],
        "payload-cut.moglm": blob[:-9] + blob[-4:],
        "foreign.moglm": b"PK\x03\x04 not ours at all",
    }
    messages = {"flipped.moglm": "damaged", "truncated.moglm": "damaged or truncated",
                "payload-cut.moglm": "damaged or truncated", "foreign.moglm": "not a moglm-compressed file"}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        err = _error(capsys, ["decompress", str(char_run), str(tmp_path / name), "-o", str(tmp_path / "out"),
                              "--no-progress"])
        assert messages[name] in err
        assert not (tmp_path / "out").exists()
    err = _error(capsys, ["decompress", str(ptb_char_run), str(tmp_path / "t.moglm"), "-o", str(tmp_path / "out"),
                          "--no-progress"])
    assert "compressed with another run" in err and not (tmp_path / "out").exists()
    # an existing output is kept unless --force; a missing input and a bad name are clear
    assert "exists: give --force" in _error(capsys, ["compress", str(char_run), str(source), "-o",
                                                     str(tmp_path / "t.moglm"), "--no-progress"])
    assert "no such file" in _error(capsys, ["compress", str(char_run), str(tmp_path / "nothing")])
    assert "does not end in .moglm" in _error(capsys, ["decompress", str(char_run), str(source)])


def test_a_decoder_that_rounds_differently_writes_nothing(char_run, monkeypatch):
    """If the decoding side's probabilities differ (another CPU or library), the output's SHA-256 catches
    it: an error, never a wrong file."""
    trained = load_run(char_run)
    blob, _ = compress(TEXT, trained.model, trained.vocab, factor=trained.temperature, progress=False)
    from moglm.compression import coder

    original = coder.Predictor.probabilities
    monkeypatch.setattr(coder.Predictor, "probabilities", lambda self: original(self) ** 0.5)
    with pytest.raises(MoglmError, match="does not match the original's SHA-256|damaged"):
        decompress(blob, trained.model, trained.vocab, progress=False)


def test_compression_refuses_a_model_in_training_mode_or_float64(char_run):
    trained = load_run(char_run)
    with pytest.raises(MoglmError, match="eval mode"):
        compress(TEXT, trained.model.train(), trained.vocab, progress=False)
    with pytest.raises(MoglmError, match="float32 on the CPU"):
        compress(TEXT, trained.model.eval().to(torch.float64), trained.vocab, progress=False)


@pytest.mark.slow
def test_bench_compress_puts_the_model_beside_gzip_bzip2_and_xz(char_run, tmp_path, capsys):
    import json

    source = tmp_path / "text.txt"
    source.write_bytes(TEXT * 4)
    out = tmp_path / "compression.json"
    assert main(["bench", "compress", str(char_run), str(source), "--rule", "sgd", "--adapt-learning-rate", "0.3",
                 "--block-size", "0", "256", "--threads", "2", "--no-progress", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["dynamic"] is None for r in rows] == [True, False, True, False]
    blocks = -(-len(TEXT) * 4 // 256)  # one per 256 bytes
    assert [r["blocks"] for r in rows] == [1, 1, blocks, blocks] and {r["threads"] for r in rows} == {2}
    for r in rows:
        assert set(r["baselines"]) == {"gzip -9", "bzip2 -9", "xz -9"} and r["original_bytes"] == len(TEXT) * 4
        assert r["against"]["xz -9"] == pytest.approx(r["compressed_bytes"] / r["baselines"]["xz -9"] - 1)
        assert r["kilobytes_per_second"] > 0 and r["decompress_kilobytes_per_second"] > 0
        assert r["cpu_seconds"] > 0 and r["decompress_cpu_seconds"] > 0
    table = capsys.readouterr().out
    assert "| xz -9 |" in table and f"| moglm compress --block-size 256 --dynamic (sgd) | {blocks} (0) |" in table
    # each block size's adaptation has segments sized to its streams, as moglm compress sizes them
    assert [r["dynamic"]["hyperparameters"]["segment_length"] for r in rows if r["dynamic"]] == [
        segment_length(1), segment_length(blocks)]


def test_bench_compress_repeats_each_round_trip_and_reports_the_median_speed(char_run, tmp_path):
    """--repeats 3: three checked round trips of the row, the same bytes each time; the speeds are the medians
    of the three, whose seconds are all kept."""
    import json
    import statistics

    from moglm.bench.compression import run_compression

    source = tmp_path / "text.txt"
    source.write_bytes(TEXT)
    out = tmp_path / "compression.json"
    assert main(["bench", "compress", str(char_run), str(source), "--block-size", "256", "--repeats", "3",
                 "--no-progress", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["repeats"] == 3 and len(row["seconds_runs"]) == len(row["decompress_seconds_runs"]) == 3
    assert row["path"]["backend"] in ("compiled", "fused")  # the recurrence path the header records
    assert row["seconds"] == statistics.median(row["seconds_runs"]) > 0
    assert row["kilobytes_per_second"] == pytest.approx(len(TEXT) / 1e3 / row["seconds"])
    assert row["decompress_kilobytes_per_second"] == pytest.approx(len(TEXT) / 1e3 / row["decompress_seconds"])
    with pytest.raises(MoglmError, match="repeats must be a whole number >= 1"):
        run_compression(char_run, source, None, 256, 1, repeats=0)


def test_the_adaptations_segments_hold_about_the_same_tokens_however_many_blocks_share_them(char_run, tmp_path):
    """One update reads n steps of every block: moglm compress --dynamic sizes n to about UPDATE_TOKENS tokens
    across the blocks (20 steps for one stream, fewer for many, never under 2), and the header records it."""
    assert [segment_length(b) for b in (1, 12, 24, 90, 180, 10_000)] == [20, 20, 10, 3, 2, 2]
    assert segment_length(24) * 24 == UPDATE_TOKENS
    source = tmp_path / "text.txt"
    source.write_bytes(TEXT * 3)
    for block_size, blocks in ((0, 1), (64, -(-len(TEXT) * 3 // 64))):
        out = tmp_path / f"{block_size}.moglm"
        assert main(["compress", str(char_run), str(source), "--dynamic", "--block-size", str(block_size), "-o",
                     str(out), "--no-progress"]) == 0
        header = read_header(out.read_bytes())[0]
        assert len(read_header(out.read_bytes())[1]) == blocks
        assert header["adapt"]["hyperparameters"]["segment_length"] == segment_length(blocks)
        assert header["adapt"]["hyperparameters"]["lr"] == float(f"{COMPRESSION_LR * step_scale(blocks):.3g}")
        assert header["adapt"]["guard"] == GUARD_MARGIN  # the divergence guard is on by default
        assert StepCacheSettings(**header["cache"]) == CACHE  # the neural cache is on by default


def test_adapting_codes_at_most_twelve_blocks_unless_the_block_size_is_given(char_run, tmp_path, monkeypatch):
    """At 12 blocks the adaptation's segments reach 20 steps; a larger file adapting gets larger blocks (static,
    blocks of BLOCK_SIZE for speed), in moglm compress and in both rows of moglm bench compress; --block-size
    still decides. BLOCK_SIZE is made 64 bytes here, so that a file of 1,314 bytes passes 12 of them."""
    import json

    from moglm.compression import container
    from moglm.compression.container import BLOCK_SIZE, block_count

    assert ADAPTING_BLOCKS * SEGMENT_RANGE[1] == UPDATE_TOKENS
    assert default_block_size(100_000, False) == BLOCK_SIZE and default_block_size(10_000, True) == BLOCK_SIZE
    assert [block_count(n, n, default_block_size(n, True)) for n in (49_152, 49_153, 101_334, 494_213)] == [12] * 4
    monkeypatch.setattr(container, "BLOCK_SIZE", 64)
    source = tmp_path / "text.txt"
    source.write_bytes(TEXT * 3)
    for args, blocks in (([], 21), (["--dynamic"], 12), (["--dynamic", "--block-size", "64"], 21)):
        out = tmp_path / f"{len(args)}.moglm"
        assert main(["compress", str(char_run), str(source), "-o", str(out), "--no-progress", *args]) == 0
        header = read_header(out.read_bytes())[0]
        assert header["blocks"] == blocks, args
        if args:
            assert header["adapt"]["hyperparameters"]["segment_length"] == segment_length(blocks)
    report = tmp_path / "bench.json"
    assert main(["bench", "compress", str(char_run), str(source), "--dynamic", "--no-progress", "--out",
                 str(report)]) == 0
    rows = json.loads(report.read_text())["rows"]
    assert [(r["block_size"], r["blocks"]) for r in rows] == [(64, 21), (math.ceil(len(TEXT) * 3 / 12), 12)]


def test_fewer_blocks_than_fill_an_update_take_a_step_smaller_by_the_square_root_of_their_tokens():
    """Up to 12 blocks an update reads 20 steps of each, fewer than UPDATE_TOKENS tokens: the step shrinks as the
    square root of the tokens (one block: 20 of 240), and from 12 blocks on it is the searched step itself."""
    assert step_scale(1) == pytest.approx(math.sqrt(20 / UPDATE_TOKENS))
    assert step_scale(4) == pytest.approx(math.sqrt(80 / UPDATE_TOKENS))
    assert [step_scale(b) for b in (12, 13, 23, 24, 90, 10_000)] == [1.0] * 6
    scales = [step_scale(b) for b in range(1, 13)]
    assert scales == sorted(scales)


def test_compress_mixes_in_the_neural_cache_unless_told_not_to_and_the_header_decides_the_decode(char_run, tmp_path):
    """By default moglm compress codes with the neural cache (its settings in the header); --no-cache codes with
    the model alone; decompress takes no cache option: the header decides."""
    source = tmp_path / "text.txt"
    source.write_bytes(TEXT * 2)
    for args, expected in (([], CACHE), (["--no-cache"], None)):
        out = tmp_path / f"{len(args)}.moglm"
        assert main(["compress", str(char_run), str(source), "-o", str(out), "--no-progress", *args]) == 0
        recorded = read_header(out.read_bytes())[0]["cache"]
        assert (recorded and StepCacheSettings(**recorded)) == expected
        assert main(["decompress", str(char_run), str(out), "-o", str(tmp_path / "back.txt"), "--force",
                     "--no-progress"]) == 0
        assert (tmp_path / "back.txt").read_bytes() == TEXT * 2


def test_an_empty_file_round_trips_and_reports_no_rate(char_run, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert main(["compress", str(char_run), str(empty), "-o", str(tmp_path / "e.moglm"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "an empty file ->" in out and "bits per byte" not in out and "%" not in out
    assert main(["decompress", str(char_run), str(tmp_path / "e.moglm"), "-o", str(tmp_path / "e.txt"),
                 "--no-progress"]) == 0
    assert (tmp_path / "e.txt").read_bytes() == b""


def test_a_forged_header_claiming_a_billion_tokens_stops_in_seconds_not_at_a_kill(char_run, tmp_path, capsys):
    """The header's token count is bounded by the payload: decoding past it is stopped as soon as the symbols
    decoded would have needed more bits than the block holds (the CRC is recomputed, so only that catches it).
    With the match model and the context mixer (the defaults), whose confident predictions leave the range
    decoder's state invalid soon after the payload, the decoder's own failure stops it first, as the same one-line
    error."""
    import time

    from moglm.compression.container import read_header

    source = tmp_path / "text.txt"
    source.write_bytes(TEXT)
    for mixers, message in ((["--no-match", "--no-contexts"], "claims more tokens than its"),
                            (["--match", "--contexts"], "the compressed data is damaged")):
        assert main(["compress", str(char_run), str(source), "-o", str(tmp_path / "t.moglm"), "--block-size", "0",
                     "--no-progress", "--force", *mixers]) == 0
        blob = (tmp_path / "t.moglm").read_bytes()
        assert read_header(blob)[0]["blocks"] == 1
        (tmp_path / "forged.moglm").write_bytes(forged(blob, tokens=10**9, bytes=10**9))
        started = time.monotonic()
        err = _error(capsys, ["decompress", str(char_run), str(tmp_path / "forged.moglm"), "-o",
                              str(tmp_path / "f.txt"), "--no-progress"])
        assert message in err and time.monotonic() - started < 60
        assert not (tmp_path / "f.txt").exists()
    assert main(["decompress", str(char_run), str(tmp_path / "t.moglm"), "-o", str(tmp_path / "t.txt"),
                 "--no-progress"]) == 0  # an honest file still decodes
    assert (tmp_path / "t.txt").read_bytes() == TEXT


def forged(blob: bytes, table=None, version=None, drop=(), **fields) -> bytes:
    """A container with header ``fields`` replaced and the header fields ``drop`` left out (and its block table,
    a list of ``(stored length, flags, check)``, if given), its header CRC recomputed so that only the other
    checks see it; ``version``: written as that format version (2: the header's JSON stored as it is, not
    deflated; 3: deflated without the preset dictionary; before 8, the blocks' checks become CRC-32s)."""
    import json
    import zlib

    from moglm.compression.container import (_CRC, _PREFIX, _header_json, block_crc, header_dictionary,
                                             pack_table, unpack_table)

    magic, stored_version, length = _PREFIX.unpack_from(blob)
    stored = blob[_PREFIX.size : _PREFIX.size + length]
    header = json.loads(_header_json(stored, stored_version))
    entries, end = unpack_table(blob, _PREFIX.size + length, header["blocks"], stored_version)
    version = stored_version if version is None else version
    if table is None:  # the same blocks, each with its check as the version computes it
        offsets = np.cumsum([end + _CRC.size] + [size for size, _, _ in entries])
        table = [(size, flags, block_crc(blob[offsets[b] : offsets[b + 1]], version))
                 for b, (size, flags, _) in enumerate(entries)]
    header = {k: v for k, v in {**header, **fields}.items() if k not in drop}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    if version == 3:
        encoded = zlib.compress(encoded, 9)
    elif version > 3:
        deflate = zlib.compressobj(9, zdict=header_dictionary(version))
        encoded = deflate.compress(encoded) + deflate.flush()
    head = _PREFIX.pack(magic, version, len(encoded)) + encoded + pack_table(table, version)
    return head + _CRC.pack(zlib.crc32(head)) + blob[end + _CRC.size :]


def test_from_scratch_codes_with_weights_drawn_from_its_seed_and_the_decoder_draws_them_again(char_run, tmp_path,
                                                                                               capsys):
    """NNCP's way: the run's architecture and vocabulary, weights initialised afresh from the seed in the header,
    learnt while coding; the decoder rebuilds the same weights (the header's digest checks them) and replays."""
    import json

    from moglm.compression import run_digest
    from moglm.runs.language_model import LanguageModelRun

    source = tmp_path / "text.txt"
    source.write_bytes(TEXT * 2)
    packed = tmp_path / "scratch.moglm"
    assert main(["compress", str(char_run), str(source), "-o", str(packed), "--from-scratch", "5",
                 "--no-progress"]) == 0
    header = read_header(packed.read_bytes())[0]
    assert header["adapt"]["from_scratch"] == 5
    assert (header["adapt"]["hyperparameters"]["rule"], header["adapt"]["hyperparameters"]["lr"]) == ("rmsprop", 1e-2)
    trained, fresh = load_run(char_run), LanguageModelRun(char_run).fresh_model(5)
    assert header["run"] == run_digest(*fresh) != run_digest(trained.model, trained.vocab)
    assert run_digest(*LanguageModelRun(char_run).fresh_model(6)) != header["run"]  # another seed, other weights
    assert main(["decompress", str(char_run), str(packed), "-o", str(tmp_path / "back.txt"), "--no-progress"]) == 0
    assert (tmp_path / "back.txt").read_bytes() == source.read_bytes()
    capsys.readouterr()
    err = _error(capsys, ["compress", str(char_run), str(source), "-o", str(tmp_path / "x.moglm"), "--from-scratch",
                          "5", "--rule", "rms-rmsdecay", "--no-progress"])
    assert err.startswith("error: --from-scratch learns without training statistics")
    out = tmp_path / "bench.json"
    assert main(["bench", "compress", str(char_run), str(source), "--from-scratch", "5", "--block-size", "256",
                 "--no-progress", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["dynamic"] is None for r in rows] == [True, False] and rows[1]["dynamic"]["from_scratch"] == 5
    assert "--from-scratch 5 (rmsprop, lr 0.01)" in capsys.readouterr().out


def _search_module():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "compression_search.py"
    spec = importlib.util.spec_from_file_location("compression_search", path)
    search = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(search)
    return search


def test_the_compression_search_reads_context_mixer_settings_and_refuses_others_in_one_line():
    from moglm.compression.context_mixing import ContextSettings
    from moglm.compression.run import CONTEXTS

    search = _search_module()
    assert search._mixer("1,3/1/0.5/2e-3/0") == ContextSettings((1, 3), 1, 0.5, 2e-3, 0.0, kernel=CONTEXTS.kernel)
    assert search._mixer("off") is None and search._mixer("default") == CONTEXTS
    assert search._spelled(CONTEXTS) == ("1,2,3,4,6/2/0.25/0.004/0.02/token,order2,kinds,word/0.005/"
                                         "above,above_pair,skip")
    assert search._spelled(ContextSettings()) == "1,2,3,4,6/2/0.25/0.001/0.02" and search._spelled(None) == "off"
    assert search._mixer(search._spelled(CONTEXTS)) == CONTEXTS
    assert search._mixer("1/0/1/1e-3/0/word/0.1") == ContextSettings((1,), 0, 1.0, 1e-3, 0.0, ("word",), 0.1,
                                                                      kernel=CONTEXTS.kernel)
    assert search._mixer("1/0/1/1e-3/0//0.1/skip") == ContextSettings((1,), 0, 1.0, 1e-3, 0.0, (), 0.1, ("skip",),
                                                                       CONTEXTS.kernel)
    assert search._spelled(ContextSettings((1,), 0, 1.0, 1e-3, 0.0, sparse=("skip",))) == "1/0/1/0.001/0//0.005/skip"
    for bad in ("1,2/2/0.5", "3,1/2/0.5/1e-3/0.02", "1/9/0.5/1e-3/0.02", "a/2/0.5/1e-3/0.02",
                "1/0/1/1e-3/0/word", "1/0/1/1e-3/0/order9/0.1", "1/0/1/1e-3/0//0.1/column"):
        with pytest.raises(SystemExit, match="is not ORDERS/WORDS/ALPHA/LR/APM_LR"):
            search._mixer(bad)


def test_the_compression_search_scores_every_learning_rate_both_ways(char_run, tmp_path):
    """benchmarks/compression_search.py: one row per setting, the run's weights and from scratch, sizes that
    are moglm compress's own."""
    import json

    search = _search_module()
    source = tmp_path / "text.txt"
    source.write_bytes(TEXT)
    out = tmp_path / "search.json"
    search.main([str(char_run), str(source), "--lr", "0.001", "0.01", "--scratch-lr", "0.003", "--seed", "2",
                 "--out", str(out)])
    report = json.loads(out.read_text())
    assert [(r["weights"], r["rule"], r["lr"], r["match_min_length"]) for r in report["rows"]] == [
        ("run's weights", "rms-rmsdecay", 0.001, 5), ("run's weights", "rms-rmsdecay", 0.01, 5),
        ("from scratch (seed 2)", "rmsprop", 0.003, 5)]
    assert report["bytes"] == len(TEXT) and report["xz -9"] > 0
    assert all(r["compressed_bytes"] > 0 and r["bits_per_byte"] == 8 * r["compressed_bytes"] / len(TEXT)
               for r in report["rows"])
    # the row of the run's weights at 0.01 is moglm compress's own size with those settings
    assert main(["compress", str(char_run), str(source), "-o", str(tmp_path / "c.moglm"), "--dynamic",
                 "--adapt-learning-rate", "0.01", "--no-progress"]) == 0
    assert (tmp_path / "c.moglm").stat().st_size == report["rows"][1]["compressed_bytes"]
    # --static adds the rows without adaptation first, one per min_length of the match model (0: none)
    search.main([str(char_run), str(source), "--lr", "0.01", "--scratch-lr", "--static", "--match-min-length", "0",
                 "5", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["weights"], r["lr"], r["match_min_length"]) for r in rows] == [
        ("run's weights, static", None, 0), ("run's weights, static", None, 5), ("run's weights", 0.01, 0),
        ("run's weights", 0.01, 5)]
    for no, match in (("--no-match", 0), ("--match", 1)):  # the static rows are moglm compress's own sizes
        assert main(["compress", str(char_run), str(source), "-o", str(tmp_path / "c.moglm"), "--force", no,
                     "--no-progress"]) == 0
        assert (tmp_path / "c.moglm").stat().st_size == rows[match]["compressed_bytes"]


def test_the_cache_search_scores_the_grid_on_the_blocks_static_and_adapting(char_run, tmp_path):
    """benchmarks/compression_cache_search.py: for each pass (static, adapting with compress's segments) and
    cache size, the best theta and lambda of the grid and the rate with and without the cache, on the file cut
    into compress's blocks."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "compression_cache_search.py"
    spec = importlib.util.spec_from_file_location("compression_cache_search", path)
    search = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(search)
    source = tmp_path / "text.txt"
    source.write_bytes(TEXT * 2)
    out = tmp_path / "cache.json"
    search.main([str(char_run), str(source), "--block-size", "200", "--sizes", "8", "40", "--out", str(out)])
    report = json.loads(out.read_text())
    blocks = -(-len(TEXT) * 2 // 200)
    assert [(r["pass"], r["size"]) for r in report["rows"]] == [("static", 8), ("static", 40), ("dynamic", 8),
                                                               ("dynamic", 40)]
    for r in report["rows"]:
        assert r["blocks"] == blocks and r["theta"] in search.THETAS and r["lam"] in search.LAMS
        assert len(r["trials"]) == len(search.THETAS) * len(search.LAMS)
        best = min(r["trials"], key=lambda t: t["xent"])  # the row's rate is its best trial's
        assert (best["theta"], best["lam"], best["size"]) == (r["theta"], r["lam"], r["size"])
        assert r["bits_per_byte"] * len(TEXT) * 2 == pytest.approx(best["xent"] / math.log(2) * blocks * (
            len(TEXT) * 2 // blocks))
    static, dynamic = report["rows"][:2], report["rows"][2:]
    assert static[0]["bits_per_byte_without"] == static[1]["bits_per_byte_without"] != dynamic[0][
        "bits_per_byte_without"]
    assert report["rows"][2]["segment_length"] == segment_length(blocks)


def test_bench_compress_puts_each_row_beside_itself_without_the_cache_the_mixer_or_the_match_model(char_run,
                                                                                                   tmp_path, capsys):
    import json

    from moglm.compression.context_mixing import ContextSettings
    from moglm.compression.run import CONTEXTS, MATCH

    source = tmp_path / "text.txt"
    source.write_bytes(TEXT * 2)
    out = tmp_path / "compression.json"
    assert main(["bench", "compress", str(char_run), str(source), "--without-cache", "--without-contexts",
                 "--without-match", "--no-progress", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert StepCacheSettings(**rows[0]["cache"]) == CACHE and rows[1]["cache"] is None
    assert ContextSettings(**rows[0]["contexts"]) == CONTEXTS and rows[2]["contexts"] is None
    assert rows[1]["contexts"] == rows[3]["contexts"] == rows[0]["contexts"]
    assert rows[0]["match"] == rows[1]["match"] == rows[2]["match"] == {"min_length": MATCH.min_length}
    assert rows[3]["match"] is None and rows[2]["cache"] == rows[3]["cache"] == rows[0]["cache"]
    assert {r["original_bytes"] for r in rows} == {len(TEXT) * 2}
    table = capsys.readouterr().out
    assert "| moglm compress --block-size 4096 |" in table
    assert "| moglm compress --block-size 4096 --no-cache |" in table
    assert "| moglm compress --block-size 4096 --no-contexts |" in table
    assert "| moglm compress --block-size 4096 --no-match |" in table


def test_compress_fast_codes_with_the_lighter_mixer_and_the_header_decides_the_decode(char_run, tmp_path, capsys):
    """--fast codes with FAST_CONTEXTS (recorded in the header, so decompress takes no option and restores the file),
    a different code from the default mixer's; with --no-contexts it is a one-line error that writes nothing."""
    from moglm.compression.context_mixing import ContextSettings
    from moglm.compression.run import CONTEXTS, FAST_CONTEXTS

    source = tmp_path / "text.txt"
    source.write_bytes(TEXT * 2)
    blobs = {}
    for args, expected in (([], CONTEXTS), (["--fast"], FAST_CONTEXTS)):
        out = tmp_path / f"{len(args)}.moglm"
        assert main(["compress", str(char_run), str(source), "-o", str(out), "--no-progress", *args]) == 0
        recorded = read_header(out.read_bytes())[0]["contexts"]
        assert ContextSettings(**{**recorded, "kernel": expected.kernel}) == expected
        assert main(["decompress", str(char_run), str(out), "-o", str(tmp_path / "back.txt"), "--force",
                     "--no-progress"]) == 0
        assert (tmp_path / "back.txt").read_bytes() == TEXT * 2
        blobs[len(args)] = out.read_bytes()
    assert blobs[0] != blobs[1]
    assert FAST_CONTEXTS.orders < CONTEXTS.orders and not FAST_CONTEXTS.mixers and not FAST_CONTEXTS.sparse
    err = _error(capsys, ["compress", str(char_run), str(source), "-o", str(tmp_path / "none.moglm"), "--fast",
                          "--no-contexts", "--no-progress"])
    assert "--fast" in err and "--no-contexts" in err and not (tmp_path / "none.moglm").exists()


def test_bench_compress_with_fast_puts_the_lighter_mixers_row_beside_the_default(char_run, tmp_path, capsys):
    import json

    from moglm.compression.context_mixing import ContextSettings
    from moglm.compression.run import CONTEXTS, FAST_CONTEXTS

    source = tmp_path / "text.txt"
    source.write_bytes(TEXT * 2)
    out = tmp_path / "compression.json"
    assert main(["bench", "compress", str(char_run), str(source), "--with-fast", "--no-progress", "--out",
                 str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["fast"] for r in rows] == [False, True]
    assert [ContextSettings(**r["contexts"]).orders for r in rows] == [CONTEXTS.orders, FAST_CONTEXTS.orders]
    assert "| moglm compress --block-size 4096 --fast |" in capsys.readouterr().out
    err = _error(capsys, ["bench", "compress", str(char_run), str(source), "--fast", "--no-contexts",
                          "--no-progress", "--out", str(tmp_path / "none.json")])
    assert "--no-contexts" in err and not (tmp_path / "none.json").exists()


@pytest.mark.parametrize("enabled", [True, False])
def test_the_garbage_collector_is_paused_while_coding_and_left_as_it_was(enabled, monkeypatch):
    """Both loops run with the cyclic collector off, and leave it on or off as they found it, an error too."""
    import gc

    from moglm.compression import coder

    seen = []
    monkeypatch.setattr(coder.Predictor, "probabilities",
                        lambda self: seen.append(gc.isenabled()) or np.full((1, 256), 1.0))
    monkeypatch.setattr(coder.Predictor, "advance", lambda self, tokens: None)
    predictor = coder.Predictor.__new__(coder.Predictor)
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        coder.encode(predictor, [coder.Block(tokens=[1, 2, 3])], None, 0, progress=False)
        assert gc.isenabled() == enabled
        with pytest.raises(MoglmError):
            coder.decode(predictor, [coder.Block()], [np.zeros(0, np.uint32)], [10**6], None, 0, progress=False)
        assert gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert seen and not any(seen)


def test_a_row_that_is_not_a_finite_distribution_is_read_as_uniform_and_the_others_as_they_are():
    """A model gone non-finite (a NaN, an infinite logit) or one whose row underflows to all zeros gives that row
    1 everywhere (uniform once normalised); a finite row is exp of its log-probabilities, untouched."""
    from moglm.compression import coder

    reader = coder.Reader.__new__(coder.Reader)
    reader.cache = None
    log_p = torch.log_softmax(torch.randn(5, 7), dim=1)
    log_p[1, 3] = float("nan")
    log_p[2, 0] = float("inf")
    log_p[3] = float("-inf")
    reader.log_p = log_p
    p = reader.probabilities()
    assert (p[1:4] == 1.0).all()
    assert np.array_equal(p[[0, 4]], log_p[[0, 4]].double().exp().numpy())
