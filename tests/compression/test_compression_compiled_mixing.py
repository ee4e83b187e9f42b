"""The context mixer's compiled step (:mod:`moglm.compression.compiled_mixing`): its parity with the plain loop is
tested beside the numpy mixer's (test_compression_context_mixing.py); here, what the files and the machines see:
the same bits whatever the threads, the numpy arithmetic where the library is not built, and files of version 10
and older decoding with numpy's."""

from __future__ import annotations

import mmap
from dataclasses import replace

import numpy as np
import pytest
import torch

pytest.importorskip("constriction", reason="the compress extra (constriction) is not installed")

from conftest import coded_round_trip, tiny_format_run  # noqa: E402
from moglm.compression import compiled_mixing, read_header  # noqa: E402
from moglm.compression.compiled_mixing import CompiledContextMixer, context_mixer, usable  # noqa: E402
from moglm.compression.context_mixing import ContextMixer, ContextSettings, zeroed  # noqa: E402
from moglm.compression.run import CONTEXTS  # noqa: E402
from moglm.errors import MoglmError  # noqa: E402

needs_kernel = pytest.mark.skipif(not compiled_mixing.kernel_available(), reason="the compiled library cannot be "
                                  "built here")
TEXT = b"The compiled step mixes what each row counted,\n  and the rest is the model's own.\n" * 8


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory):
    return tiny_format_run(tmp_path_factory.mktemp("byte"), "byte", hidden_size=16)


def _mixtures(threads: int, streams: int = 37, steps: int = 60) -> list[np.ndarray]:
    """Every step's mixed distributions of a byte-level mixer of ``streams`` blocks reading ``TEXT``, with the
    compiled step running on ``threads`` threads."""
    rng = np.random.default_rng(3)
    mixer = CompiledContextMixer(CONTEXTS, streams, 256, {i: chr(i) for i in range(256)})
    out, saved = [], torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for t in range(steps):
            p = rng.random((streams, 256)) ** 4
            out.append(mixer.mix(p))
            mixer.append(np.frombuffer(TEXT, np.uint8)[(np.arange(streams) * 7 + t) % len(TEXT)])
    finally:
        torch.set_num_threads(saved)
    return out


@needs_kernel
def test_the_compiled_step_gives_the_same_bits_on_one_thread_and_two():
    """The blocks are shared out between the threads, and each block's arithmetic is the same whichever runs it:
    the encoder and the decoder agree whatever the header's thread count."""
    for one, two in zip(_mixtures(1), _mixtures(2), strict=True):
        assert np.array_equal(one, two)
        np.testing.assert_allclose(one.sum(axis=1), 1.0, rtol=1e-12)


@needs_kernel
@pytest.mark.parametrize("vocab", [256, 300])
def test_the_compiled_and_the_numpy_arithmetic_agree_on_a_byte_level_step_of_many_blocks(vocab):
    """One step of the default mixer from the same state (40 steps read by both): the two arithmetics round
    differently, so the files differ, but the distributions agree to 1e-12 (numpy's is the reference twin). A
    vocabulary of 300 is not a whole number of the kernel's 16-cell reads of a row's counts."""
    rng = np.random.default_rng(4)
    chars = {i: chr(i) for i in range(256)}
    fast = context_mixer(CONTEXTS, 29, vocab, chars)
    slow = ContextMixer(replace(CONTEXTS, kernel="numpy"), 29, vocab, chars)
    assert type(fast) is CompiledContextMixer and type(slow) is ContextMixer
    data = np.frombuffer(TEXT, np.uint8).astype(np.int64) + (vocab - 256)  # the top tokens too
    for t in range(41):
        p = rng.random((29, vocab)) ** 3
        a, b = fast.mix(p), slow.mix(p)
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-13)
        tokens = data[(np.arange(29) * 11 + t) % len(data)]
        fast.append(tokens)
        slow.append(tokens)
    np.testing.assert_allclose(fast._weights, slow._weights, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(fast._corrections, slow._corrections, rtol=1e-9, atol=1e-12)
    assert np.array_equal(fast._tables, slow._tables)


@needs_kernel
@pytest.mark.parametrize("settings", [CONTEXTS, replace(CONTEXTS, orders=(2, 5), words=1, mixers=("word", "token"),
                                                        sparse=("skip",)),
                                      replace(CONTEXTS, orders=(1,), words=0, mixers=("kinds", "order2"),
                                              sparse=("above_pair", "above")),
                                      replace(CONTEXTS, orders=(1,), words=0, mixers=(), sparse=())],
                         ids=["shipped", "some", "one-token-back", "fewest"])
def test_the_compiled_contexts_hash_choose_and_move_on_as_the_numpy_twin_does(settings):
    """Every step, the compiled ops' table rows and weight rows equal the numpy mixer's own code on the same state
    (its ``_rows`` and ``_chosen_rows``), and after the tokens every context (last tokens, line and the line above
    past the remembered width, words, kinds, word lengths) equals numpy's moving on; text with long lines, words,
    digits and line ends, in 13 blocks."""
    line = b"word 12 Word, " * 30  # 420 bytes: past the 256 columns remembered
    text = np.frombuffer(line + b"\n" + b"ab cd\n" * 5 + line[:50] + b"\n\n", np.uint8)
    chars = {i: chr(i) for i in range(256)}
    fast = CompiledContextMixer(settings, 13, 256, chars)
    twin = ContextMixer(replace(settings, kernel="numpy"), 13, 256, chars)
    rng, kinds, wide = np.random.default_rng(5), set(), False
    for t in range(700):
        rows = fast._rows()
        assert np.array_equal(rows, twin._rows())
        fast.mix(rng.random((13, 256)) + 0.01)
        totals = fast._tables[np.arange(len(rows))[:, None], rows].sum(axis=2, dtype=np.int64)  # [K, B]
        for got, expected in zip(fast._chosen, twin._chosen_rows(totals), strict=True):
            assert np.array_equal(got.numpy(), expected)
        tokens = text[(np.arange(13) * 37 + t) % len(text)].astype(np.int64)
        fast.append(tokens)
        twin._move_on(tokens)  # the numpy twin's own code
        for name in ("_recent", "_word", "_column", "_line", "_above", "_last", "_last2", "_before", "_before2",
                     "_word_length"):
            assert np.array_equal(getattr(fast, name), getattr(twin, name)), (t, name)
        kinds |= set(twin._last.tolist())
        wide |= bool(twin._line[:, 255].any() and (twin._column > 256).any())
    assert kinds == {0, 1, 2, 3, 4}  # letters, spaces, line ends, digits and the rest were read
    assert wide == bool(settings.sparse)  # lines longer than the columns remembered (with the sparse contexts)
    assert twin._word[:, 1].any() == (settings.words > 0)  # a word that ended is remembered


@needs_kernel
def test_the_default_codes_with_the_compiled_step_and_the_header_says_so(byte_run):
    blob, report = coded_round_trip(byte_run, TEXT, contexts=CONTEXTS)
    assert read_header(blob)[0]["contexts"]["kernel"] == "compiled" == report.contexts["kernel"]


def test_without_the_compiled_library_compress_codes_with_numpy_and_a_compiled_file_is_refused_in_one_line(
        byte_run, monkeypatch):
    from moglm.compression import decompress
    from moglm.runs.language_model import load_run

    compiled_file = coded_round_trip(byte_run, TEXT, contexts=CONTEXTS)[0] if compiled_mixing.kernel_available() \
        else None
    monkeypatch.setattr(compiled_mixing, "kernel_available", lambda: False)
    assert usable(CONTEXTS) == replace(CONTEXTS, kernel="numpy") and usable(None) is None
    blob, report = coded_round_trip(byte_run, TEXT, contexts=CONTEXTS)
    assert read_header(blob)[0]["contexts"]["kernel"] == "numpy" == report.contexts["kernel"]
    with pytest.raises(MoglmError, match="coded with the compiled context mixer, which cannot be built here"):
        CompiledContextMixer(CONTEXTS, 2, 256)
    if compiled_file is not None:
        trained = load_run(byte_run)
        with pytest.raises(MoglmError, match="compiled context mixer"):
            decompress(compiled_file, trained.model, trained.vocab, progress=False)


def test_an_unknown_kernel_is_a_one_line_error():
    with pytest.raises(MoglmError, match="kernel must be one of numpy, compiled"):
        ContextSettings(kernel="cuda")


@pytest.mark.parametrize("populate", [False, True])
def test_the_tables_memory_is_zeros_that_can_be_written_whether_mapped_at_once_or_not(populate):
    table = zeroed((3, 64, 256), np.uint16, populate)
    assert table.shape == (3, 64, 256) and table.dtype == np.uint16 and not table.any()
    table[2, 5, 7] += 3
    assert table.sum() == 3


@pytest.mark.skipif(not hasattr(mmap, "MAP_POPULATE"), reason="this OS cannot map memory at once")
def test_a_large_file_maps_the_tables_at_once_and_a_small_one_does_not():
    def owner(array):
        while isinstance(array, np.ndarray) and array.base is not None:
            array = array.base
        return array.obj if isinstance(array, memoryview) else array

    settings = ContextSettings(orders=(1,), words=0)
    small, large = ContextMixer(settings, 1, 256, tokens=10), ContextMixer(settings, 1, 256, tokens=1 << 20)
    assert isinstance(owner(small._tables), np.ndarray) and isinstance(owner(large._tables), mmap.mmap)


@needs_kernel
def test_the_speed_benchmark_times_both_kernels_in_one_run_and_writes_json(tmp_path):
    """benchmarks/context_mixing_speed.py: a row per kernel, their ratio and the largest difference between the
    two mixtures, which stays at rounding's size; and a file too short for its blocks is a one-line error."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "context_mixing_speed.py"
    spec = importlib.util.spec_from_file_location("context_mixing_speed", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    text = tmp_path / "text.txt"
    text.write_bytes(TEXT)
    saved = torch.get_num_threads()
    try:
        report = bench.main([str(text), "--blocks", "5", "--threads", "1", "--steps", "30",
                             "--out", str(tmp_path / "speed.json")])
        assert json.loads((tmp_path / "speed.json").read_text())["rows"] == report["rows"]
        assert [r["kernel"] for r in report["rows"]] == ["numpy", "compiled"] and report["steps"] == 30
        assert all(r["step_ms"] > 0 for r in report["rows"]) and report["speedup"] > 0
        assert 0 < report["largest_difference"] < 1e-9
        with pytest.raises(SystemExit, match="cannot fill 5000 blocks"):
            bench.main([str(text), "--blocks", "5000", "--threads", "1"])
    finally:
        torch.set_num_threads(saved)


def test_a_byte_level_file_whose_header_claims_more_tokens_than_its_payload_holds_stops_in_one_line(byte_run):
    """A gapless layout checks every block's decoded symbols against its payload once a step, for all the blocks at
    once: a header forged to claim a million tokens is stopped long before it, in one line (no mixer or match
    model, whose confident predictions would make the range decoder fail first)."""
    from moglm.compression import decompress
    from moglm.runs.language_model import load_run

    from test_compression import forged

    blob, _ = coded_round_trip(byte_run, TEXT, block_size=0)
    assert read_header(blob)[0]["gaps"] is False and read_header(blob)[0]["blocks"] == 1
    trained = load_run(byte_run)
    with pytest.raises(MoglmError, match="claims more tokens than its") as caught:
        decompress(forged(blob, tokens=10**6, bytes=10**6), trained.model, trained.vocab, progress=False)
    assert "rounds differently" not in str(caught.value)


def test_a_decoding_error_names_what_differs_from_where_the_file_was_compressed(byte_run):
    """A model that rounds differently (another recurrence, torch or moglm) desynchronises the range decoder, which
    then looks like damaged data: the one-line error says what differs, as the SHA-256 mismatch's does."""
    from moglm.compression import decompress
    from moglm.runs.language_model import load_run

    from test_compression import forged

    blob, _ = coded_round_trip(byte_run, TEXT, block_size=0)
    trained = load_run(byte_run)
    with pytest.raises(MoglmError, match="claims more tokens than its .*rounds differently: torch 0.0 there, "
                                         "[^ ]+ here, recurrence elsewhere there, [^ ]+ here\\)$"):
        decompress(forged(blob, tokens=10**6, bytes=10**6, recurrence="elsewhere", torch="0.0"), trained.model,
                   trained.vocab, progress=False)


@needs_kernel
def test_the_kernels_own_exp_and_log_agree_with_the_c_librarys_to_a_few_units_in_the_last_place():
    """The compiled step's exp and log are its own polynomials (so that they round the same whatever the C
    library): within 4e-16 relative of numpy's over the ranges the mixer uses, exp 0 below -708, log floored at
    1e-300 as the mixer floors probabilities."""
    x = torch.cat([torch.linspace(-708, 709, 200_001, dtype=torch.float64),
                   torch.tensor([-745.0, -709.0, -1e6, 0.0, -0.0, 1e-300, 5e-17])])
    e, _ = torch.ops.moglm.context_exp_log(x)
    expected = np.exp(x.numpy())
    inside = x.numpy() >= -708
    assert np.max(np.abs(e.numpy()[inside] - expected[inside]) / expected[inside]) < 4e-16
    assert (e.numpy()[~inside] == 0).all() and e.numpy()[-4] == 1.0
    y = torch.cat([torch.logspace(-300, 300, 200_001, dtype=torch.float64),
                   torch.tensor([1.0, 2.0, 0.5, 1.4142135623730951, 1.4142135623730950, 0.0, 1e-320])])
    _, log = torch.ops.moglm.context_exp_log(y)
    expected = np.log(np.maximum(y.numpy(), 1e-300))
    scale = np.maximum(np.abs(expected), 1.0)
    assert np.max(np.abs(log.numpy() - expected) / scale) < 4e-16
    assert log.numpy()[-7] == 0.0 and log.numpy()[-2] == log.numpy()[-1]
    assert abs(log.numpy()[-1] / np.log(1e-300) - 1) < 4e-16


@pytest.mark.parametrize("kernel", ["numpy", "compiled"])
def test_a_token_outside_the_vocabulary_is_refused_before_any_count_is_written(kernel):
    if kernel == "compiled" and not compiled_mixing.kernel_available():
        pytest.skip("the compiled library cannot be built here")
    mixer = context_mixer(replace(CONTEXTS, kernel=kernel), 2, 8)
    mixer.mix(np.ones((2, 8)))
    mixer.append(np.array([3, 5]))
    before = mixer._tables.copy()
    for bad in ([8, 1], [1, -1])[: 2 if kernel == "compiled" else 1]:  # numpy reads -1 as the last token
        with pytest.raises((IndexError, RuntimeError)):
            mixer.append(np.array(bad))  # no mix before it: nothing else has looked at the tokens
        assert np.array_equal(mixer._tables, before)


@needs_kernel
def test_a_row_whose_probabilities_sum_to_a_subnormal_is_normalised_as_numpy_does():
    """The compiled step computes with subnormals as IEEE 754 says on every thread (even where the compiled windows'
    flush is on), as numpy does."""
    p = np.zeros((1, 16))
    p[0, 3] = 1e-320
    for kernel, flush in (("numpy", False), ("compiled", False), ("compiled", True)):
        if flush and not torch.set_flush_denormal(True):  # this thread's FTZ/DAZ, where the CPU has them
            continue
        try:
            mixed = context_mixer(replace(CONTEXTS, kernel=kernel), 1, 16).mix(p)
        finally:
            torch.set_flush_denormal(False)
        assert mixed[0].argmax() == 3 and mixed[0, 3] > 0.99 and np.isfinite(mixed).all()
