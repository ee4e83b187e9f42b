"""The block format of moglm.compression: a file cut into blocks coded side by side as one batch of streams
(character runs with gaps, byte runs without), blocks stored raw when their code is no shorter (random bytes
grow by the header at most), decoding exact across thread counts and a pure function of the file (an
interrupted decode writes nothing, the next one is exact), rows of the batch that do not mix without
adaptation, and every bad input a one-line error that touches no file."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest
import torch

pytest.importorskip("constriction", reason="the compress extra (constriction) is not installed")

from conftest import tiny_format_run  # noqa: E402
from moglm.cli import main  # noqa: E402
from moglm.compression import Layout, compress, decompress, read_header  # noqa: E402
from moglm.compression import coder, container  # noqa: E402
from moglm.dynamic_evaluation import DynamicEvaluator, Hyperparameters  # noqa: E402
from moglm.errors import MoglmError  # noqa: E402
from moglm.evaluation.neural_cache import StepCacheSettings  # noqa: E402
from moglm.runs.language_model import load_run  # noqa: E402
from test_compression import forged  # noqa: E402

TEXT = b"the cat sees the dog .\nthe owl hears the cow .\nthe fish likes the bird .\n" * 12  # 864 bytes
RANDOM = bytes(np.random.default_rng(1).integers(0, 256, 1000, dtype=np.uint8))
SGD = Hyperparameters(rule="sgd", lr=0.3, segment_length=5)
CACHE = StepCacheSettings(theta=0.5, size=50, lams=(0.0, 0.3, 0.6))


@pytest.fixture(scope="module")
def char_run(tmp_path_factory):
    return tiny_format_run(tmp_path_factory.mktemp("char"), "char")


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory):
    return tiny_format_run(tmp_path_factory.mktemp("byte"), "byte", hidden_size=16)


def _adapter(trained, hp=SGD):
    return DynamicEvaluator(trained.model, hp, factor=trained.temperature)


def _round_trip(run, data, block_size, *, hp=None, threads=1, cache=None, guard=None, warmup=0):
    """The container, its report and the decoded bytes (a fresh adapter on the decoding side); ``guard``: the
    divergence guard's margin the settings record (``None``: none, as in files written before it); ``warmup``:
    the tokens over which the step grows (0: none)."""
    trained = load_run(run)
    adapter = None if hp is None else _adapter(trained, hp)
    settings = None if hp is None else ({"hyperparameters": hp.as_dict()} | ({} if guard is None else {"guard": guard})
                                        | ({"warmup": warmup} if warmup else {}))
    blob, report = compress(data, trained.model, trained.vocab, factor=trained.temperature, adapter=adapter,
                            settings=settings, cache=cache, block_size=block_size, threads=threads, progress=False)
    restored = decompress(blob, trained.model, trained.vocab, progress=False,
                          adapter_for=lambda header: _adapter(trained, hp))
    return blob, report, restored


def _flags(blob):
    header, blocks = read_header(blob)
    return [isinstance(b, bytes) for b in blocks]


@pytest.mark.parametrize("run_name", ["char_run", "byte_run"])
@pytest.mark.parametrize("hp", [None, SGD], ids=["static", "dynamic"])
@pytest.mark.parametrize("cache", [None, CACHE], ids=["no-cache", "cache"])
def test_blocks_coded_side_by_side_round_trip_with_and_without_adaptation_and_cache(run_name, hp, cache, request):
    """A character run (gaps coded: the unseen capitals and the UTF-8) and a byte run (gapless) at one block
    and at many; with adaptation the blocks share the adapted weights; with the neural cache each block mixes
    its own positions' cache into its predictions (the header records its settings)."""
    run = request.getfixturevalue(run_name)
    data = TEXT + "Naïve Capitals ☃\n".encode() + TEXT[:301]
    for block_size in (0, 100):
        blob, report, restored = _round_trip(run, data, block_size, hp=hp, cache=cache)
        header, blocks = read_header(blob)
        assert restored == data
        assert header["cache"] == (None if cache is None else {**asdict(cache), "lams": list(cache.lams)})
        assert header["blocks"] == report.blocks == len(blocks) == (1 if block_size == 0 else -(-len(data) // 100))
        assert header["gaps"] is (run_name == "char_run") and header["block_size"] == block_size
        assert report.raw_blocks == sum(_flags(blob)) == 0  # text the model knows is never stored raw
        assert len(blob) == report.compressed_bytes and report.header_bytes < len(blob)


def test_blocks_share_the_tokens_out_evenly_and_cover_the_file():
    """Block b holds N // B tokens, one more for the first N % B; never more blocks than tokens, never none."""
    assert container.block_tokens(10, 4) == [3, 3, 2, 2] and container.block_tokens(0, 1) == [0]
    assert container.block_count(1000, 900, 100) == 10 and container.block_count(1000, 3, 100) == 3
    assert container.block_count(0, 0, 100) == 1 and container.block_count(5000, 4000, 0) == 1
    layout = Layout.of(load_vocab_of_bytes())
    data = bytes(range(256)) * 3
    blocks = container._cut(layout, data, 100)
    assert [len(b.tokens) for b in blocks] == container.block_tokens(len(data), 8)
    assert b"".join(layout.join(b.tokens, b.gaps) for b in blocks) == data


def test_a_byte_layout_splits_and_joins_by_table_lookup_as_the_character_loop_does():
    """A byte-level run's layout reads every byte as its token through one lookup; the tokens, the gaps and the
    bytes written back are the character loop's, and a token that spells no byte fails as the loop's lookup
    does (a ``KeyError``, which decompress turns into its one-line error)."""
    layout = Layout.of(load_vocab_of_bytes())
    data = bytes(np.random.default_rng(4).integers(0, 256, 5000, dtype=np.uint8)) + bytes(range(256))
    tokens, gaps = layout.split(data)
    assert tokens == [layout.ids[c] for c in layout.text(data)] and gaps == [""] * (len(data) + 1)
    assert layout.join(tokens, gaps) == data and layout.join([], [""]) == b""
    with pytest.raises(KeyError):
        layout.join([max(layout.chars) + 1], ["", ""])


def load_vocab_of_bytes():
    from moglm.data.vocabulary import Vocabulary

    return Vocabulary.bytes()


@pytest.mark.parametrize("run_name", ["char_run", "byte_run"])
def test_random_bytes_grow_by_the_header_at_most_and_an_empty_file_is_the_header(run_name, request):
    run = request.getfixturevalue(run_name)
    for block_size in (0, 256):
        blob, report, restored = _round_trip(run, RANDOM, block_size)
        assert restored == RANDOM and report.raw_blocks == report.blocks >= 1 and all(_flags(blob))
        assert len(blob) - report.header_bytes <= len(RANDOM), report.as_dict()
    blob, report, restored = _round_trip(run, b"", 256)
    assert restored == b"" and len(blob) == report.header_bytes and report.blocks == 1


@pytest.mark.parametrize("hp", [None, SGD], ids=["static", "dynamic"])
def test_raw_and_coded_blocks_in_one_file_round_trip(char_run, hp):
    """Text, random bytes, text: the random block is stored raw, and its row of the batch still reads its
    tokens, so the coded blocks beside it (and the shared adaptation) decode exactly."""
    noise = bytes(np.random.default_rng(2).integers(0, 256, 4000, dtype=np.uint8))  # a few blocks' worth of tokens
    data = TEXT + noise + TEXT
    blob, report, restored = _round_trip(char_run, data, 300, hp=hp)
    flags = _flags(blob)
    assert restored == data and any(flags) and not all(flags), flags
    assert report.raw_blocks == sum(flags) and len(blob) - report.header_bytes < len(data)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("hp", [None, SGD], ids=["static", "dynamic"])
def test_decoding_is_exact_at_the_headers_thread_count_whatever_the_callers(char_run, threads, hp):
    trained = load_run(char_run)
    data = TEXT * 2
    adapter = None if hp is None else _adapter(trained, hp)
    blob, _ = compress(data, trained.model, trained.vocab, factor=trained.temperature, adapter=adapter,
                       settings=None if hp is None else {"hyperparameters": hp.as_dict()}, block_size=200,
                       threads=threads, progress=False)
    assert read_header(blob)[0]["threads"] == threads
    saved = torch.get_num_threads()
    try:
        for caller in (1, 2, 3):  # the caller's own setting, restored afterwards
            torch.set_num_threads(caller)
            assert decompress(blob, trained.model, trained.vocab, progress=False,
                              adapter_for=lambda header: _adapter(trained, hp)) == data
            assert torch.get_num_threads() == caller
    finally:
        torch.set_num_threads(saved)


def test_decoding_is_a_pure_function_of_the_file_and_an_interrupted_decode_writes_nothing(
        char_run, tmp_path, capsys, monkeypatch):
    """The format keeps no decoder state to resume from, so a decode starts from the file alone: one interrupted
    half-way (Ctrl-C) leaves no output, and the next, like any other, gives the original exactly."""
    source = tmp_path / "text.txt"
    source.write_bytes(TEXT * 2)
    assert main(["compress", str(char_run), str(source), "-o", str(tmp_path / "t.moglm"), "--block-size", "300",
                 "--rule", "sgd", "--adapt-learning-rate", "0.3", "--no-progress"]) == 0
    calls = {"n": 0}
    advance = coder.Predictor.advance

    def interrupted(self, tokens):
        calls["n"] += 1
        if calls["n"] == 100:
            raise KeyboardInterrupt
        advance(self, tokens)

    with monkeypatch.context() as m:
        m.setattr(coder.Predictor, "advance", interrupted)
        assert main(["decompress", str(char_run), str(tmp_path / "t.moglm"), "-o", str(tmp_path / "out"),
                     "--no-progress"]) == 130
    assert not (tmp_path / "out").exists() and calls["n"] == 100
    outputs = []
    for name in ("first", "second"):
        assert main(["decompress", str(char_run), str(tmp_path / "t.moglm"), "-o", str(tmp_path / name),
                     "--no-progress"]) == 0
        outputs.append((tmp_path / name).read_bytes())
    assert outputs == [TEXT * 2] * 2


def test_without_adaptation_a_blocks_tokens_depend_on_its_own_bytes_only(char_run):
    """The rows of the batch do not mix, the neural cache's included (each block caches its own positions), without
    the match model (which reads every block's tokens): with another block read in row 0 (other text, as a raw
    block), every other block still decodes to its own tokens from its own bytes."""
    trained = load_run(char_run)
    layout = Layout.of(trained.vocab)
    data = TEXT * 2
    blob, _ = compress(data, trained.model, trained.vocab, factor=trained.temperature, block_size=300,
                       cache=CACHE, progress=False)
    header, stored = read_header(blob)
    counts = container.block_tokens(header["tokens"], header["blocks"])
    expected = container._cut(layout, data, 300)
    other = layout.split(b"fish " * 200)[0][: counts[0]]  # another text in row 0
    blocks = [coder.Block(other, [])] + [coder.Block() for _ in stored[1:]]
    with container.fixed_threads(1):
        predictor = coder.Predictor(trained.model, layout.start, len(blocks), trained.temperature, cache=CACHE)
        coder.decode(predictor, blocks, [None] + stored[1:], counts,
                     container._gap_model(layout, True, header["bytes"]), layout.start, progress=False)
    assert len(blocks) > 2
    for block, original in zip(blocks[1:], expected[1:]):
        assert (block.tokens, block.gaps) == (original.tokens, original.gaps)


def test_a_version_2_file_still_decodes_without_a_cache_and_its_header_not_deflated(char_run):
    """Version 2 (before the neural cache): the header's JSON stored as it is, with no cache field."""
    trained = load_run(char_run)
    blob, _ = compress(TEXT, trained.model, trained.vocab, factor=trained.temperature, block_size=300, progress=False)
    version_2 = forged(blob, version=2, drop=("cache", "match", "contexts"))
    assert version_2[6] == 2 and b'"cache"' not in version_2
    assert read_header(version_2)[0]["cache"] is None
    assert decompress(version_2, trained.model, trained.vocab, progress=False) == TEXT


def test_a_version_7_file_still_decodes_its_block_table_of_fixed_entries_and_crc_32s(char_run):
    """Version 7 (before the compact block table): 9 bytes a block, a CRC-32 each; version 8 takes 4-5."""
    trained = load_run(char_run)
    blob, _ = compress(TEXT, trained.model, trained.vocab, factor=trained.temperature, block_size=300, progress=False)
    header, blocks = read_header(blob)
    version_7 = forged(blob, version=7)
    assert version_7[6] == 7 and len(version_7) - len(blob) >= 4 * header["blocks"]
    assert read_header(version_7)[0] == header
    assert decompress(version_7, trained.model, trained.vocab, progress=False) == TEXT


@pytest.mark.parametrize("size", [0, 1, 63, 64, 127, 128, 8191, 8192, 1 << 20, (1 << 41) - 1])
def test_the_compact_block_table_reads_back_every_length_raw_flag_and_check(size):
    entries = [(size, 0, 0xBEEF), (size, container.RAW, 0), (3, 0, 0xFFFF)]
    table = container.pack_table(entries, container.VERSION)
    assert len(table) <= 3 * (2 + 7) and (size >= 64 or len(table) == 3 * 3)  # a length below 64: 1 byte
    blob = b"?" * 5 + table + b"\0" * 4
    assert container.unpack_table(blob, 5, 3, container.VERSION) == (entries, 5 + len(table))
    for cut in (len(table) - 1, len(table) + 3, 5 + 1):  # the table, or its CRC-32 after it, cut short
        with pytest.raises(MoglmError, match="damaged or truncated"):
            container.unpack_table(blob[: 5 + cut], 5, 3, container.VERSION)
    with pytest.raises(MoglmError, match="damaged or truncated"):
        container.unpack_table(blob, 5, 10**9, container.VERSION)  # a forged count of blocks: refused at once
    with pytest.raises(MoglmError, match="damaged \\(its block table\\)"):
        container.unpack_table(b"\xff" * 40, 0, 1, container.VERSION)  # a length longer than any block


def test_a_version_3_file_still_decodes_its_header_deflated_without_the_dictionary(char_run):
    """Version 3 (before the header's preset dictionary and the divergence guard): the header deflated on its
    own; a version 4 header is a third of its size on a small file."""
    trained = load_run(char_run)
    blob, report = compress(TEXT, trained.model, trained.vocab, factor=trained.temperature, block_size=300,
                            progress=False)
    version_3 = forged(blob, version=3)
    assert version_3[6] == 3 and len(version_3) > len(blob) + 100
    assert read_header(version_3)[0] == read_header(blob)[0]
    assert decompress(version_3, trained.model, trained.vocab, progress=False) == TEXT


#: each process-wide switch of the compiled windows that a later version turned on: (its context manager, whether it
#: is on now, the last version coded with it off, that version's header fields)
SWITCHES = {
    "flush": ("flush_denormals", lambda: container.compiled.flushes_denormals() == (
        container.compiled.available() and torch.ops.moglm.flush_denormals_supported()), 4, {"match": None}),
    "chunks": ("blocked_products", lambda: container.compiled.blocks_products() == container.compiled.available(),
               13, {}),
}


@pytest.mark.parametrize("switch", SWITCHES)
def test_an_older_file_decodes_with_the_windows_arithmetic_it_was_coded_with(switch, char_run, monkeypatch):
    """Version 5 on is coded with the compiled windows flushing subnormals to zero, version 14 on with their large
    per-step products summed in chunks; a file of an older version was coded with the switch off, so it decodes
    with it off (and it is back on after), and a version 14 file with it on."""
    name, back_on, old, fields = SWITCHES[switch]
    trained = load_run(char_run)
    blob, _ = compress(TEXT, trained.model, trained.vocab, factor=trained.temperature, block_size=300, progress=False)
    assert blob[6] == container.VERSION == 14
    asked = []
    real = getattr(container.compiled, name)

    def spy(on):
        asked.append(on)
        return real(on)

    monkeypatch.setattr(container.compiled, name, spy)
    assert decompress(forged(blob, version=old, **fields), trained.model, trained.vocab, progress=False) == TEXT
    assert decompress(blob, trained.model, trained.vocab, progress=False) == TEXT
    assert asked == [False, True]
    assert back_on()


def test_a_version_1_file_still_decodes_as_one_block(char_run):
    """Version 1 (before blocks): a little-endian payload of one stream, one thread, then a CRC-32 of it all."""
    import json
    import struct
    import zlib

    trained = load_run(char_run)
    blob, _ = compress(TEXT, trained.model, trained.vocab, factor=trained.temperature, block_size=0, progress=False)
    header, (words,) = read_header(blob)
    old = {k: v for k, v in header.items() if k not in ("blocks", "block_size", "gaps")}
    encoded = json.dumps(old).encode()
    body = container._PREFIX.pack(container.MAGIC, 1, len(encoded)) + encoded + words.astype("<u4").tobytes()
    version_1 = body + struct.pack("<I", zlib.crc32(body))
    assert read_header(version_1)[0]["blocks"] == 1
    assert decompress(version_1, trained.model, trained.vocab, progress=False) == TEXT


def _error(capsys, args):
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_every_bad_input_is_a_one_line_error_that_touches_no_file(char_run, tmp_path, capsys):
    """Truncated or altered blocks (coded and raw), a block table that points outside the file, a damaged header,
    trailing bytes, another block size, another --dynamic setting, a raw block that does not hold its tokens and
    a newer version, forged cache settings: each refused in one line, and the output, an existing file kept by
    --force, is untouched."""
    import json
    from moglm.compression.container import _PREFIX, unpack_table

    source = tmp_path / "text.txt"
    source.write_bytes(TEXT + bytes(np.random.default_rng(2).integers(0, 256, 4000, dtype=np.uint8)) + TEXT)
    good = tmp_path / "good.moglm"
    assert main(["compress", str(char_run), str(source), "-o", str(good), "--block-size", "300", "--no-progress"]) == 0
    assert capsys.readouterr().err.startswith("warning: the run's vocabulary has no token for ")  # random bytes
    blob = good.read_bytes()
    header, stored = read_header(blob)
    table = _PREFIX.size + _PREFIX.unpack_from(blob)[2]
    entries, _ = unpack_table(blob, table, header["blocks"], container.VERSION)
    raw = next(i for i, b in enumerate(stored) if isinstance(b, bytes))
    first = len(blob) - sum(e[0] for e in entries)  # where block 1's bytes start
    second = first + entries[0][0]

    def flip(position):
        return blob[:position] + bytes([blob[position] ^ 1]) + blob[position + 1:]

    outside = [list(e) for e in entries]
    outside[-1][0] += 50
    mixer = {"orders": [1, 2], "words": 1, "alpha": 0.5, "lr": 1e-3, "apm_lr": 0.02}  # settings, forged one field each
    cases = {
        "truncated.moglm": (blob[:-7], "damaged or truncated: its block table points outside the file"),
        "cut-in-the-header.moglm": (blob[: table // 2], "damaged or truncated"),
        "altered-block.moglm": (flip(second + 2), f"block 2 of {header['blocks']} does not match its CRC-16"),
        "altered-raw-block.moglm": (flip(first + sum(e[0] for e in entries[:raw]) + 5),
                                    f"block {raw + 1} of {header['blocks']} does not match its CRC-16"),
        "altered-header.moglm": (flip(_PREFIX.size + 3), "damaged"),
        "table-outside.moglm": (forged(blob, [tuple(e) for e in outside]), "points outside the file"),
        "trailing.moglm": (blob + b"\0" * 3, "3 bytes follow its last block"),
        "other-block-size.moglm": (forged(blob, block_size=100), f"damaged header: {header['blocks']} blocks, where "
                                                                 "its block size of 100 bytes cuts"),
        "raw-tokens.moglm": (forged(blob, tokens=header["tokens"] - header["blocks"]),
                             f"raw block {raw + 1} of {header['blocks']} does not hold the"),
        "newer-version.moglm": (blob[:6] + bytes([container.VERSION + 1]) + blob[7:],
                                f"a version {container.VERSION + 1} moglm-compressed file; this moglm reads"),
        "forged-match.moglm": (forged(blob, match={"min_length": 1}), "its header's match settings are not settings"),
        "forged-match-field.moglm": (forged(blob, match={"min_length": 5, "order": 2}),
                                     "its header's match settings are not settings"),
        "match-not-a-dict.moglm": (forged(blob, match=5), "damaged header"),
        "forged-path.moglm": (forged(blob, path={"backend": "gpu", "route": None, "weight_gradient_route": None}),
                              "its header's recurrence path is not one this moglm runs"),
        "unknown-route.moglm": (forged(blob, path={"backend": "compiled", "route": "abacus",
                                                   "weight_gradient_route": None}),
                                "its header's recurrence path is not one this moglm runs"),
        "path-not-a-dict.moglm": (forged(blob, path="compiled"), "damaged header"),
        "forged-ensemble.moglm": (forged(blob, ensemble={"lr": 0.005, "runs": [{"run": "a"}]}),
                                  "its header's ensemble is not one"),
        "ensemble-not-a-dict.moglm": (forged(blob, ensemble="lstm"), "damaged header"),
        "forged-contexts.moglm": (forged(blob, contexts=mixer | {"orders": [3, 1]}),
                                  "its header's contexts settings are not settings"),
        "forged-contexts-alpha.moglm": (forged(blob, contexts=mixer | {"alpha": -1}),
                                        "its header's contexts settings are not settings"),
        "forged-contexts-words.moglm": (forged(blob, contexts=mixer | {"words": 7}),
                                        "its header's contexts settings are not settings"),
        "forged-contexts-field.moglm": (forged(blob, contexts=mixer | {"bits": 9}),
                                        "its header's contexts settings are not settings"),
        "contexts-not-a-dict.moglm": (forged(blob, contexts=[1, 2]), "damaged header"),
        "forged-cache.moglm": (forged(blob, cache={"theta": 0.5, "lams": [1.5], "size": 10}),
                               "its header's cache settings are not settings"),
        "forged-cache-lams.moglm": (forged(blob, cache={"theta": 0.5, "lams": "0.5", "size": 10}),
                                    "its header's cache settings are not settings"),
        "forged-cache-many-lams.moglm": (forged(blob, cache={"theta": 0.5, "lams": [0.1] * 100, "size": 10}),
                                         "its header's cache settings are not settings"),
        "forged-cache-size.moglm": (forged(blob, cache={"theta": 0.5, "lams": [0.1], "size": 10**9}),
                                    "its header's cache settings are not settings"),
        "forged-cache-empty.moglm": (forged(blob, cache={}), "its header's cache settings are not settings"),
        "version-0.moglm": (blob[:6] + b"\x00" + blob[7:], "a version 0 moglm-compressed file"),
        "header-not-deflated.moglm": (forged(blob, version=2)[:6] + b"\x05" + forged(blob, version=2)[7:],
                                      "damaged"),
    }
    out = tmp_path / "out.txt"
    out.write_bytes(b"keep me")
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        err = _error(capsys, ["decompress", str(char_run), str(tmp_path / name), "-o", str(out), "--force",
                              "--no-progress"])
        assert message in err, (name, err)
        assert out.read_bytes() == b"keep me"
    flags = {("--block-size", "100"): "was compressed with --block-size 300, not 100",
             ("--dynamic",): "was compressed without --dynamic: its header decides"}
    for args, message in flags.items():
        assert message in _error(capsys, ["decompress", str(char_run), str(good), "-o", str(out), "--force", *args])
        assert out.read_bytes() == b"keep me"
    adapted = tmp_path / "adapted.moglm"
    assert main(["compress", str(char_run), str(source), "-o", str(adapted), "--rule", "sgd",
                 "--adapt-learning-rate", "0.3", "--no-progress"]) == 0
    capsys.readouterr()  # the coverage warning of the random bytes
    assert "was compressed with --dynamic" in _error(capsys, ["decompress", str(char_run), str(adapted), "-o",
                                                              str(out), "--force", "--no-dynamic"])
    assert out.read_bytes() == b"keep me"
    # the header decides: the same flags as the header's, or none, decode
    assert main(["decompress", str(char_run), str(good), "-o", str(out), "--force", "--block-size", "300",
                 "--no-dynamic", "--no-progress"]) == 0
    assert out.read_bytes() == source.read_bytes()


def test_a_file_compressed_by_another_run_is_refused_before_decoding(char_run, byte_run, tmp_path, capsys):
    source = tmp_path / "text.txt"
    source.write_bytes(TEXT)
    assert main(["compress", str(char_run), str(source), "-o", str(tmp_path / "t.moglm"), "--block-size", "100",
                 "--no-progress"]) == 0
    err = _error(capsys, ["decompress", str(byte_run), str(tmp_path / "t.moglm"), "-o", str(tmp_path / "out"),
                          "--no-progress"])
    assert "compressed with another run" in err and not (tmp_path / "out").exists()


def test_bad_block_options_are_one_line_errors(char_run, tmp_path, capsys):
    trained = load_run(char_run)
    for options in ({"block_size": -1}, {"threads": 0}, {"threads": True}):
        with pytest.raises(MoglmError, match="block size|threads"):
            compress(TEXT, trained.model, trained.vocab, progress=False, **options)
    source = tmp_path / "text.txt"
    source.write_bytes(TEXT)
    for option in ("--threads", "--block-size"):
        assert main(["compress", str(char_run), str(source), option, "-1"]) == 2  # a usage error, in one line
        err = capsys.readouterr().err.strip()
        assert option in err and len(err.splitlines()) == 1
        assert not (tmp_path / "text.txt.moglm").exists()


@pytest.mark.parametrize("hp, most", [(None, 0.8), (SGD, 0.95)], ids=["static", "dynamic"])
def test_the_neural_cache_codes_a_text_that_repeats_itself_smaller(byte_run, hp, most):
    """A sentence the tiny model never read, repeated: its cache has seen the sentence after one reading, so
    the file comes out smaller with the cache than without (by over a fifth statically; adapting, the model
    learns the repeats itself and the cache adds less), and both round-trip."""
    data = b"quizzical zebras jumped over vexing walls.\n" * 12
    sizes = {}
    for cache in (None, CACHE):
        blob, report, restored = _round_trip(byte_run, data, 0, hp=hp, cache=cache)
        assert restored == data
        sizes[cache] = report.compressed_bytes - report.header_bytes
    assert sizes[CACHE] < most * sizes[None], sizes


def test_the_caches_of_many_blocks_are_cut_to_fit_in_memory_and_the_header_records_the_size_used(char_run,
                                                                                                  monkeypatch):
    """A file of many blocks gets shorter caches (all of them together within STEP_CACHE_BYTES of features); the
    header records the size coded with, and the decoder, fitting it again, uses the same."""
    from moglm.evaluation import neural_cache

    trained = load_run(char_run)
    hidden = trained.model.rnn.cells[-1].hidden_size
    blocks = -(-len(TEXT) * 2 // 100)
    monkeypatch.setattr(neural_cache, "STEP_CACHE_BYTES", 4 * blocks * hidden * 7)  # room for 7 positions each
    blob, report, restored = _round_trip(char_run, TEXT * 2, 100, cache=CACHE)
    assert restored == TEXT * 2 and report.blocks == blocks
    assert read_header(blob)[0]["cache"] == {"theta": CACHE.theta, "size": 7, "lams": list(CACHE.lams)}


def test_the_divergence_guard_rolls_a_runaway_adaptation_back_below_the_static_code_and_decodes_exactly(byte_run):
    """One stream adapting at a step far too large (SGD at 10): without the guard its code is over 50 times the
    trained model's; with the header's margin, every segment is also scored by the trained model, the weights roll
    back and the step halves until the adaptation codes no worse than the trained model, and the decoder, reading
    the margin from the header, replays the same rollbacks."""
    data = b"quizzical zebras jumped over vexing walls.\n" * 12
    _, static, _ = _round_trip(byte_run, data, 0)
    runaway = Hyperparameters(rule="sgd", lr=10.0, segment_length=5)
    _, unguarded, restored = _round_trip(byte_run, data, 0, hp=runaway)
    assert restored == data and unguarded.rollbacks == 0
    assert unguarded.model_bits > 50 * static.model_bits
    blob, guarded, restored = _round_trip(byte_run, data, 0, hp=runaway, guard=0.1)
    assert restored == data and read_header(blob)[0]["adapt"]["guard"] == 0.1
    assert guarded.rollbacks > 0 and "the adaptation rolled back" in guarded.summary()
    assert guarded.model_bits < static.model_bits


def test_the_step_warms_up_over_the_headers_tokens_and_the_decoder_replays_it(byte_run):
    """The runaway step again, now growing from 0 over more tokens than the file has: every update is small, so
    the code stays within a tenth of the trained model's without a rollback, and the decoder, reading the warm-up
    from the header, decodes it exactly."""
    data = b"quizzical zebras jumped over vexing walls.\n" * 12
    _, static, _ = _round_trip(byte_run, data, 0)
    runaway = Hyperparameters(rule="sgd", lr=10.0, segment_length=5)
    blob, warmed, restored = _round_trip(byte_run, data, 0, hp=runaway, warmup=100_000)
    assert restored == data and read_header(blob)[0]["adapt"]["warmup"] == 100_000
    assert warmed.rollbacks == 0 and warmed.model_bits < 1.1 * static.model_bits


@pytest.mark.parametrize("field, value, message", [
    *(("guard", v, "is not a positive number") for v in ["0.1", -1.0, 0, float("inf"), True, [0.1]]),
    *(("warmup", v, "is not a number of tokens") for v in [-1, 2.5, "10", True, 10**13]),
])
def test_a_forged_guard_margin_or_warmup_is_a_one_line_error(byte_run, field, value, message):
    trained = load_run(byte_run)
    blob, _, _ = _round_trip(byte_run, TEXT[:200], 0, hp=SGD, guard=0.1)
    header = read_header(blob)[0]
    bad = forged(blob, adapt={**header["adapt"], field: value})
    with pytest.raises(MoglmError, match=message):
        decompress(bad, trained.model, trained.vocab, progress=False, adapter_for=lambda header: _adapter(trained))


@pytest.mark.slow  # several processes
def test_the_shards_benchmark_cuts_at_characters_and_both_ways_restore_the_file(char_run, tmp_path, monkeypatch):
    """benchmarks/compression_shards.py: the file cut into shards where characters start, each coded by a process
    of its own; both ways round-trip (checked inside), the shards' files together are what the row reports, and a
    single shard, no repeat or a shard without a character start is a one-line error."""
    import importlib.util
    import json
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "compression_shards.py"
    spec = importlib.util.spec_from_file_location("compression_shards", path)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "compression_shards", bench)  # the pool sends its functions by name
    spec.loader.exec_module(bench)
    accented = "ééé".encode()  # 6 bytes: halving at byte 3 would split the second character
    assert bench.cut(accented, 2) == ["éé".encode(), "é".encode()]
    assert b"".join(bench.cut(TEXT, 3)) == TEXT and len(bench.cut(TEXT, 3)) == 3
    text = tmp_path / "text.txt"
    text.write_bytes(TEXT)
    saved = torch.get_num_threads()
    report = bench.main([str(char_run), str(text), "--shards", "2", "--repeats", "1", "--block-size", "128",
                         "--out", str(tmp_path / "shards.json")])
    assert torch.get_num_threads() == saved
    assert json.loads((tmp_path / "shards.json").read_text())["rows"] == report["rows"]
    one, split = report["rows"]
    assert (one["way"], one["threads_each"], split["way"], split["processes"]) == ("one process", 2, "shards", 2)
    assert sum(report["shard_bytes"]) == len(TEXT) and all(r["bytes"] > 0 for r in report["rows"])
    assert report["size_ratio"] == pytest.approx(split["bytes"] / one["bytes"])
    assert all(r["kilobytes_per_second"] > 0 and r["decompress_kilobytes_per_second"] > 0 for r in report["rows"])
    with pytest.raises(SystemExit, match="at least 2"):
        bench.main([str(char_run), str(text), "--shards", "1"])
    with pytest.raises(SystemExit, match="--repeats must be at least 1"):
        bench.main([str(char_run), str(text), "--repeats", "0"])
    text.write_bytes(accented[:2])  # one character: no second shard can start one
    with pytest.raises(SystemExit, match="cannot make 2 shards"):
        bench.main([str(char_run), str(text)])
