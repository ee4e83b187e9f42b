"""``moglm compress`` / ``moglm decompress``: a file coded with a trained run's predictions, in a container
that says what it needs to be decoded, and refuses anything else with a one-line error.

The file is cut into B blocks of about ``block_size`` bytes (its tokens shared out evenly, so the blocks are
read in step), coded side by side as one batch of B streams (:mod:`.coder`), one range-coder state per block.
A block whose model code is no shorter than its bytes is stored raw and flagged, so no file grows by more than
the header. Container, version 13 (little-endian)::

    b"MOGLMZ" | version (1 byte) | header length (4 bytes)
    | header (compact JSON, UTF-8, zlib-deflated with the preset dictionary header_dictionary(13))
    | block table: per block, its stored length times 2 plus 1 if it is raw (a LEB128 varint: 2 bytes for a
      block of up to 8 KB stored), then the CRC-16 of its stored bytes (2 bytes; CCITT, ``binascii.crc_hqx``)
    | CRC-32 of everything before it (4 bytes) | the blocks' stored bytes, in order

A coded block's stored bytes are its range coder's uint32 words, big-endian, with trailing zero bytes dropped
(the decoder reads zeros past them); a raw block's are its bytes. The header records the run's digest (its
vocabulary and every weight), the architecture, the dtype, the logit factor, the dynamic-evaluation settings
and a digest of their statistics (or none), the neural cache's settings (or none), the context mixer's settings
(:mod:`.context_mixing`, or none), the match model's settings (:mod:`.match`, or none), the number of tokens,
blocks and the block size, whether gaps are coded, the original length and its SHA-256, the threads and the
library versions. Decoding checks the header's CRC, that the block table stays inside the file, every block's
CRC (a damaged or truncated file, named by its block), the run's digest (another run, or a changed one) and,
at the end, the output's SHA-256 and length before anything is written: a wrong output is never produced.
Version 14 is version 13 computed with the compiled windows' per-step products summing a large left operand in
chunks (:func:`moglm.recurrence.compiled.blocked_products`); a version 13 file or older decodes with them summed
whole, as it was coded.
Version 13 records the further runs of an ensemble (the header's ``ensemble``: the weights' step and each run's
digest, architecture, factor and adaptation, :mod:`.ensemble`; ``None``: one run, as in every file of version 12 or
older) and deflates the header with :data:`HEADER_DICTIONARY_13`.
Version 12 records the path of the model's recurrence (the header's ``path``: the compiled window on its GEMM
route, or the Python fused one; :mod:`.paths`), which the decoder takes whatever its own machine would choose, and
deflates the header with :data:`HEADER_DICTIONARY_12`; a file of version 11 or older decodes with ``auto``'s choice,
as it was coded.
Version 11 records the context mixer's arithmetic (the header's ``contexts`` gains ``kernel``: ``compiled``, the C++
step of :mod:`.compiled_mixing`, or ``numpy``, its reference twin, where the compiled library cannot be built; a file
of version 10 or older was coded with numpy's) and deflates the header with :data:`HEADER_DICTIONARY_11`.
Version 10 records the context mixer's sparse contexts (the header's ``contexts`` gains ``sparse``; a file of
version 9 or older has none) and deflates the header with :data:`HEADER_DICTIONARY_10`. Version 9 records the
context mixer's further weight sets and second layer (the header's ``contexts`` gains
``mixers`` and ``final_lr``; a file of version 8 or older has none: one set, as it was coded) and deflates the header
with :data:`HEADER_DICTIONARY_9`. Version 8 writes the block table compactly, about 4 bytes a block where version
7's took 9 (a stored length of 4 bytes, flags of 1, a CRC-32 of 4), which is 0.5% of the test text's code
(docs/guides/compression.md); a block's
CRC-16 names a damaged block, and the output's SHA-256 still checks every byte. Version 7 added the context
mixer (the header's ``contexts``; a file of version 6 or older has none) and deflates
the header with a longer preset dictionary (:data:`HEADER_DICTIONARY_7`); version 6 added the match model (the
header's ``match``; a file of version 5 or older has none). Version 5 is
version 4 computed with the compiled windows flushing subnormal floats to zero
(:func:`moglm.recurrence.compiled.flush_denormals`); a version 4 file or older decodes with them kept, as it was
coded. Version 3 (the header deflated without a dictionary), version 2 (the header not deflated, no cache) and
version 1 (one stream, no table, a CRC-32 after the little-endian payload) still decode, version 1 as one block.

Determinism (docs/method.md, "Compression"): both sides run one loop (:mod:`.coder`) on the CPU in float32 with
the header's number of torch threads, on the same ``[1, B]`` batch every step, so the same machine decodes what
it encoded, whatever its own thread setting. Another CPU, another torch or another build of the compiled
recurrence may round differently; the header names the versions, and a mismatch surfaces as an SHA-256 error,
not as wrong output. Every block has its own coder state, bytes and CRC: without adaptation, the context mixer
and the match model the rows of the batch do not mix, so a block's tokens depend on its own bytes only; with
``--dynamic`` the blocks share the adapted weights (as ``moglm dyneval --streams`` does), and the context mixer
and the match model predict a block from every block's earlier tokens, so then they decode together.
"""

from __future__ import annotations

import binascii
import hashlib
import json
import math
import struct
import time
import zlib
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..errors import MoglmError
from ..evaluation.neural_cache import StepCacheSettings
from ..recurrence import compiled
from .coder import Block, GapModel, Predictor, decode, encode
from .layout import Layout
from .compiled_mixing import usable
from .context_mixing import ContextSettings
from .ensemble import EnsembleSettings, Member, check_runs, recorded as recorded_ensemble, valid_factor
from .ensemble import record as ensemble_record
from .match import MatchSettings
from .paths import check_path, coding_path, pinned, recorded_path
from .run import ADAPTING_BLOCKS, guard_margin, warmup_tokens

MAGIC = b"MOGLMZ"
VERSION = 14
#: the context mixer's settings that later versions added, by the first version that records them, with what a
#: header of an older version leaves out, as it was coded: version 9's further weight sets and second layer (one set
#: before), version 10's sparse contexts (none before), version 11's arithmetic (numpy's before)
CONTEXT_FIELDS = {9: {"mixers": [], "final_lr": 0.0}, 10: {"sparse": []}, 11: {"kernel": "numpy"}}
#: the first version whose block table is compact (varint lengths with the raw flag, CRC-16s)
COMPACT_FROM = 8
#: the header fields that later versions added, and the first version that records each (an older file has none)
ADDED_FIELDS = {"cache": 3, "match": 6, "contexts": 7, "path": 12, "ensemble": 13}
#: the first version coded with the compiled windows flushing subnormals to zero (before it they were kept)
FLUSHED_FROM = 5
#: the first version coded with the compiled windows' large per-step products summed in chunks (before it: whole)
BLOCKED_FROM = 14
#: version 4's header is deflated with this preset dictionary (zlib's ``zdict``): a typical header, so that what
#: every header repeats (its field names, the usual settings) costs a few bytes, which matters on small files.
#: Part of the format: never changed (a new dictionary is a new version).
HEADER_DICTIONARY = (
    b'"architecture":"lstm","architecture":"mlstm","rule":"sgd","rule":"rmsprop","from_scratch":1,'
    b'"recurrence":"python","recurrence":"brgemm","recurrence":"blas","recurrence":"aten","recurrence":"panels",'
    b'{"run":"","architecture":"mogrifier","dtype":"float32","factor":1.0,"adapt":null,"adapt_digest":null,'
    b'"cache":null,"tokens":,"bytes":,"blocks":1,"block_size":0,"gaps":true,'
    b'{"run":"","architecture":"mogrifier","dtype":"float32","factor":0.9,"adapt":{"hyperparameters":'
    b'{"rule":"rms-rmsdecay","lr":0.005,"decay":0.0,"eps":0.001,"segment_length":20},"statistics":'
    b'{"fraction":0.01,"batch_size":8,"bptt":70},"guard":0.1},"adapt_digest":"","cache":{"theta":0.5,'
    b'"size":2000,"lams":[0.0,0.1,0.2,0.3,0.4,0.5,0.6,0.7]},"tokens":1,"bytes":1,"blocks":1,"block_size":4096,'
    b'"gaps":false,"sha256":"","moglm":"0.1.0","torch":"2.13.0+cpu","constriction":"0.5.0","threads":1,'
    b'"recurrence":"mkl_packed"}'
)
#: version 7's dictionary (version 8's too): version 4's, then the context mixer's and the match model's default
#: settings as a header spells them (without it they would cost about 40 bytes more, which matters on files of a
#: few KB)
HEADER_DICTIONARY_7 = HEADER_DICTIONARY + (
    b'"contexts":{"orders":[1,2,3,4,6],"words":2,"alpha":0.25,"lr":0.001,"apm_lr":0.02},"match":{"min_length":5},'
    b'"tokens":'
)
#: version 9's dictionary: version 7's, then the context mixer's default settings with its weight sets, as a header
#: spells them
HEADER_DICTIONARY_9 = HEADER_DICTIONARY_7 + (
    b'"contexts":{"orders":[1,2,3,4,6],"words":2,"alpha":0.25,"lr":0.004,"apm_lr":0.02,'
    b'"mixers":["token","order2","kinds","word"],"final_lr":0.005},"match":{"min_length":5},"tokens":'
)
#: version 10's dictionary: version 9's, then the context mixer's default settings with its sparse contexts
HEADER_DICTIONARY_10 = HEADER_DICTIONARY_9 + (
    b'"contexts":{"orders":[1,2,3,4,6],"words":2,"alpha":0.25,"lr":0.004,"apm_lr":0.02,'
    b'"mixers":["token","order2","kinds","word"],"final_lr":0.005,"sparse":["above","above_pair","skip"]},'
    b'"match":{"min_length":5},"tokens":'
)
#: version 11's dictionary: version 10's, then the context mixer's default settings with its compiled arithmetic
HEADER_DICTIONARY_11 = HEADER_DICTIONARY_10 + (
    b'"contexts":{"orders":[1,2,3,4,6],"words":2,"alpha":0.25,"lr":0.004,"apm_lr":0.02,'
    b'"mixers":["token","order2","kinds","word"],"final_lr":0.005,"sparse":["above","above_pair","skip"],'
    b'"kernel":"compiled"},"match":{"min_length":5},"tokens":'
)
#: version 12's dictionary: version 11's, then the recurrence's paths as a header spells them (the routes the
#: probes chose most on the machines measured: the gates' route, then the rounds' where it is another)
HEADER_DICTIONARY_12 = HEADER_DICTIONARY_11 + (
    b'"path":{"backend":"fused","route":null,"weight_gradient_route":null},"route":"mkl_packed",'
    b'"route":"panels:brgemm","route":"brgemm:mkl_packed","route":"brgemm:panels","weight_gradient_route":"aten",'
    b'"weight_gradient_route":"brgemm","path":{"backend":"compiled","route":"brgemm","weight_gradient_route":null},'
)
#: version 13's dictionary: version 12's, then an ensemble's field as a header spells it, with one run's and none
HEADER_DICTIONARY_13 = HEADER_DICTIONARY_12 + (
    b'"ensemble":{"lr":0.005,"runs":[{"run":"","architecture":"mogrifier","factor":1.0,"adapt":{"hyperparameters":'
    b'{"rule":"rms-rmsdecay","lr":0.005,"decay":0.0,"eps":0.001,"segment_length":20},"statistics":'
    b'{"fraction":0.01,"batch_size":8,"bptt":70},"guard":0.1},"adapt_digest":""}]},"ensemble":null,'
)
MAX_HEADER = 1 << 20  # bytes of JSON an inflated header may have (a forged one cannot exhaust memory)
BLOCK_SIZE = 4_096  # bytes per block, about (0: the whole file in one block); measured in docs/guides/compression.md
THREADS = 1  # torch threads of both sides, unless compress is told otherwise (the header records it)
MAX_THREADS = 256
SUFFIX = ".moglm"
RAW = 1  # a block table flag: the block's bytes are stored as they are
_PREFIX = struct.Struct("<6sBI")  # magic, version, header length
_ENTRY = struct.Struct("<IBI")  # a block before version 8: stored length, flags, CRC-32 of its stored bytes
_CRC16 = struct.Struct("<H")  # a block's CRC-16 from version 8
_CRC = struct.Struct("<I")


def run_digest(model: torch.nn.Module, vocab) -> str:
    """The identity of a trained model: its vocabulary and every tensor of its state, in name order."""
    h = hashlib.sha256(vocab.to_json().encode())
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def adapter_digest(adapter) -> str | None:
    """The identity of the adaptation's per-parameter coefficients (from the RMS statistics), or None."""
    if adapter is None:
        return None
    h = hashlib.sha256()
    rule = adapter.rule
    for group in (rule.step_scale or [], rule.decay_weight if isinstance(rule.decay_weight, list) else []):
        for t in group:
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


@contextmanager
def fixed_threads(threads: int = THREADS):
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def block_count(size: int, tokens: int, block_size: int) -> int:
    """How many blocks a file of ``size`` bytes and ``tokens`` tokens is cut into: one per ``block_size``
    bytes (0: one in all), at least one, and no more than its tokens."""
    wanted = 1 if block_size == 0 else math.ceil(size / block_size)
    return max(1, min(wanted, tokens))


def default_block_size(size: int, adapting: bool) -> int:
    """``moglm compress``'s bytes per block for a file of ``size`` bytes: :data:`BLOCK_SIZE`, or adapting
    (``run.ADAPTING_BLOCKS``) as many more as keep the file to that many blocks."""
    return max(BLOCK_SIZE, math.ceil(size / ADAPTING_BLOCKS)) if adapting else BLOCK_SIZE


def streams(data: bytes, vocab, block_size: int = BLOCK_SIZE) -> int:
    """How many blocks :func:`compress` cuts ``data`` into with ``vocab``'s layout: the streams coded side by side."""
    return block_count(len(data), len(Layout.of(vocab).split(data)[0]), block_size)


def block_tokens(tokens: int, blocks: int) -> list[int]:
    """How many tokens each block holds: the file's shared out evenly, the first ones taking one more."""
    return [tokens // blocks + (b < tokens % blocks) for b in range(blocks)]


@dataclass
class Report:
    """What a compression did: sizes in bytes, ideal code lengths in bits, wall seconds."""

    original_bytes: int
    compressed_bytes: int
    header_bytes: int  # prefix, header, block table and CRC: everything but the blocks' stored bytes
    tokens: int
    model_bits: float  # the model's cross-entropy on all the tokens, with the probabilities the coder used
    gap_bits: float  # the ideal code length of all the gaps
    seconds: float
    blocks: int = 1
    raw_blocks: int = 0
    threads: int = THREADS
    coded_bytes: int = 0  # the stored bytes of the blocks kept coded
    coded_ideal_bits: float = 0.0  # the ideal code length of what those blocks coded
    cpu_seconds: float = 0.0  # this process's CPU time (all its threads): the cost on a machine other jobs share
    cache: dict[str, Any] | None = None  # the neural cache's settings as coded (the header's), or none
    rollbacks: int = 0  # times the adaptation's divergence guard rolled the weights back and halved the step
    match: dict[str, Any] | None = None  # the match model's settings as coded (the header's), or none
    contexts: dict[str, Any] | None = None  # the context mixer's settings as coded (the header's), or none
    runs: int = 1  # runs mixed (an ensemble: more than one)

    @property
    def payload_bits(self) -> int:
        return 8 * (self.compressed_bytes - self.header_bytes)

    @property
    def coding_overhead(self) -> float:
        """The coded blocks' bytes against the ideal code length of what they coded (0.001 = 0.1% more; below 0
        where the model gave tokens less than the coder's floor of about 2^-24, which caps a token's cost)."""
        return 8 * self.coded_bytes / self.coded_ideal_bits - 1 if self.coded_ideal_bits else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**vars(self), "payload_bits": self.payload_bits, "coding_overhead": self.coding_overhead,
                "bits_per_byte": 8 * self.compressed_bytes / max(1, self.original_bytes),
                "model_bits_per_token": self.model_bits / max(1, self.tokens),
                "kilobytes_per_second": self.original_bytes / 1e3 / max(self.seconds, 1e-9)}

    def summary(self) -> str:
        d = self.as_dict()
        blocks = (f"{self.blocks} block{'s' if self.blocks > 1 else ''}"
                  + (f", {self.raw_blocks} stored raw" if self.raw_blocks else "") + f", {self.threads} thread"
                  + ("s" if self.threads > 1 else "")
                  + (f", {self.runs} runs mixed" if self.runs > 1 else "")
                  + (f", the adaptation rolled back {self.rollbacks} time{'s' if self.rollbacks > 1 else ''}"
                     if self.rollbacks else ""))
        if not self.original_bytes:  # nothing to code: no rate or overhead to speak of
            return (f"an empty file -> {self.compressed_bytes:,} bytes (the header, {self.header_bytes} bytes, and "
                    f"{self.compressed_bytes - self.header_bytes} bytes of coder state) in {self.seconds:.1f}s")
        return (f"{self.original_bytes:,} -> {self.compressed_bytes:,} bytes ({d['bits_per_byte']:.4f} bits per byte; "
                f"{self.tokens:,} tokens at {d['model_bits_per_token']:.4f} bits each by the model's cross-entropy; "
                f"coded blocks {100 * self.coding_overhead:+.4f}% against the ideal code length; header "
                f"{self.header_bytes} bytes; {blocks}) in {self.seconds:.1f}s, {d['kilobytes_per_second']:.2f} KB/s")


def _environment(threads: int) -> dict[str, Any]:
    """What the probabilities' rounding depends on besides the weights (named in a mismatch's error)."""
    from importlib.metadata import version

    from .. import __version__

    return {"moglm": __version__, "torch": torch.__version__, "constriction": version("constriction"),
            "threads": threads, "recurrence": compiled.info().get("gemm_route") if compiled.available() else "python"}


def _environments(header: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The environment the header records (:func:`_environment`'s fields) and this machine's, at its threads."""
    now = _environment(header["threads"])
    return {k: header.get(k) for k in now}, now


def _elsewhere(header: dict[str, Any]) -> str:
    """Where the header's environment differs from this machine's: what to add to a decoding error (a model that
    rounds differently desynchronises the range decoder, which then looks like damaged data), else nothing."""
    then, now = _environments(header)
    differ = [k for k in now if then[k] != now[k]]
    if not differ:
        return ""
    return (" (or it was compressed where the model rounds differently: "
            + ", ".join(f"{k} {then[k]} there, {now[k]} here" for k in differ) + ")")


def _gap_model(layout: Layout, gaps: bool, limit: int | None = None) -> Callable[[], GapModel] | None:
    return (lambda: GapModel(layout.gap_bytes, layout.gap_text, limit)) if gaps else None


def _cut(layout: Layout, data: bytes, block_size: int) -> list[Block]:
    """The file as blocks: block b holds its share of the tokens and the gaps before them; the last one also
    the gap after the file's last token (the others end on a token: their last gap is empty)."""
    tokens, gaps = layout.split(data)
    blocks, first = [], 0
    counts = block_tokens(len(tokens), block_count(len(data), len(tokens), block_size))
    for b, n in enumerate(counts):
        end = first + n
        last_gap = gaps[-1] if b == len(counts) - 1 else ""
        blocks.append(Block(tokens[first:end], gaps[first:end] + [last_gap]))
        first = end
    return blocks


def _stored(layout: Layout, block: Block) -> tuple[int, bytes]:
    """A coded block's flags and stored bytes: raw if its code is no shorter than its bytes (and the raw bytes
    read back as the same tokens, which the decoder needs to replay its row; never seen otherwise)."""
    code = block.words.astype(">u4").tobytes().rstrip(b"\0")
    raw = layout.join(block.tokens, block.gaps)
    if len(code) >= len(raw) and layout.split(raw) == (block.tokens, block.gaps):
        return RAW, raw
    return 0, code


def compress(data: bytes, model, vocab, *, factor: float = 1.0, adapter=None, settings: dict | None = None,
             cache: StepCacheSettings | None = None, block_size: int = BLOCK_SIZE, threads: int = THREADS,
             progress: bool = True, match: MatchSettings | None = None,
             contexts: ContextSettings | None = None, others: Sequence[Member] = (),
             ensemble: EnsembleSettings | None = None) -> tuple[bytes, Report]:
    """``data`` coded with ``model`` (eval mode, CPU, float32); returns the container and its report.
    ``adapter``: adapt while coding; ``settings``: what rebuilds it for decoding (recorded in the header);
    ``cache``: mix the neural cache into the predictions (recorded in the header); ``contexts``: then the context
    mixer's statistics (:mod:`.context_mixing`; recorded in the header); ``match``: then the match model's
    prediction (:mod:`.match`; recorded in the header); ``block_size``: bytes per
    block, about (0: one block); ``threads``: torch threads of both sides; ``others``: further runs of the same
    vocabulary mixed with this one (:mod:`.ensemble`; each recorded in the header by its digest), with the weights'
    ``ensemble`` settings."""
    if any((a is None) != (s is None) for a, s in [(adapter, settings), *((m.adapter, m.settings) for m in others)]):
        raise ValueError("an adapter and the settings that rebuild it come together")
    _check_options(block_size, threads)
    layout = Layout.of(vocab)
    _check_model(model)
    check_runs(1 + len(others))
    members = [_member_record(m, vocab, i + 2) for i, m in enumerate(others)]
    contexts = usable(contexts)
    start, cpu = time.perf_counter(), time.process_time()
    blocks = _cut(layout, data, block_size)
    gaps, tokens = not layout.gapless, sum(len(b.tokens) for b in blocks)
    with fixed_threads(threads), compiled.flush_denormals(True), compiled.blocked_products(True):
        nets = [model if adapter is None else adapter.model] + [m.model if m.adapter is None else m.adapter.model
                                                                for m in others]
        path = coding_path(nets, len(blocks), layout.start,
                           adapter is not None or any(m.adapter is not None for m in others))
        with pinned(path):  # every step, the adaptation's included, on the path the header records
            predictor = Predictor(model, layout.start, len(blocks), factor, adapter, cache,
                                  guard=guard_margin(settings), warmup=warmup_tokens(settings), match=match,
                                  contexts=contexts, chars=layout.chars, tokens=tokens, others=others,
                                  ensemble=ensemble)
            encode(predictor, blocks, _gap_model(layout, gaps), layout.start, progress)
    stored = [_stored(layout, block) for block in blocks]
    header = {"run": run_digest(model, vocab), "architecture": model.architecture, "dtype": "float32",
              "factor": factor, "adapt": settings, "adapt_digest": adapter_digest(adapter),
              "cache": None if predictor.cache is None else asdict(predictor.cache.settings),
              "contexts": None if contexts is None else asdict(contexts),
              "match": None if match is None else asdict(match), "tokens": tokens,
              "bytes": len(data), "blocks": len(blocks), "block_size": block_size, "gaps": gaps,
              "sha256": hashlib.sha256(data).hexdigest(), "path": path,
              "ensemble": ensemble_record(predictor.ensemble.settings, members) if members else None,
              **_environment(threads)}
    deflate = zlib.compressobj(9, zdict=header_dictionary(VERSION))
    encoded = deflate.compress(json.dumps(header, separators=(",", ":")).encode()) + deflate.flush()
    head = _PREFIX.pack(MAGIC, VERSION, len(encoded)) + encoded + pack_table(
        [(len(content), flags, block_crc(content, VERSION)) for flags, content in stored], VERSION)
    head += _CRC.pack(zlib.crc32(head))
    blob = head + b"".join(content for _, content in stored)
    coded = [(block, content) for block, (flags, content) in zip(blocks, stored) if not flags & RAW]
    report = Report(len(data), len(blob), len(head), tokens, sum(b.model_bits for b in blocks),
                    sum(b.gap_bits for b in blocks), time.perf_counter() - start, len(blocks),
                    len(blocks) - len(coded), threads, sum(len(c) for _, c in coded),
                    sum(b.model_bits + b.gap_bits for b, _ in coded), time.process_time() - cpu, header["cache"],
                    predictor.rollbacks, header["match"], header["contexts"], 1 + len(members))
    return blob, report


def _member_record(member: Member, vocab, number: int) -> dict[str, Any]:
    """What the header records of an ensemble's further run (its ``number``, from 2, names it in an error)."""
    _check_model(member.model)
    if member.vocab.to_json() != vocab.to_json():
        raise MoglmError(f"run {number} of the ensemble has another vocabulary than the first: runs mixed must read "
                         "the same tokens")
    return {"run": run_digest(member.model, vocab),
            "architecture": member.model.architecture, "factor": member.factor, "adapt": member.settings,
            "adapt_digest": adapter_digest(member.adapter)}


def _check_options(block_size: int, threads: int) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 0:
        raise MoglmError(f"the block size is a number of bytes >= 0 (0: one block), not {block_size!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS:
        raise MoglmError(f"threads must be an integer from 1 to {MAX_THREADS}, not {threads!r}")


_TYPES = {"run": str, "factor": (int, float), "adapt": (dict, type(None)), "adapt_digest": (str, type(None)),
          "cache": (dict, type(None)), "match": (dict, type(None)), "contexts": (dict, type(None)),
          "path": (dict, type(None)), "ensemble": (dict, type(None)), "tokens": int, "bytes": int, "sha256": str,
          "blocks": int, "block_size": int, "threads": int, "gaps": bool}


def read_header(blob: bytes, name: str = "the file") -> tuple[dict[str, Any], list[np.ndarray | bytes]]:
    """The header and the blocks of a container (a coded block as its range coder's uint32 words, a raw one
    as its bytes), or a one-line error saying what is wrong with it."""
    if len(blob) < _PREFIX.size or not blob.startswith(MAGIC):
        raise MoglmError(f"{name} is not a moglm-compressed file")
    magic, version, length = _PREFIX.unpack_from(blob)
    if version == 1:
        return _read_version_1(blob, length, name)
    if version > VERSION or version < 1:
        made = "a newer moglm made it" if version > VERSION else "no moglm writes it: damaged or forged"
        raise MoglmError(f"{name} is a version {version} moglm-compressed file; this moglm reads versions 1 to "
                         f"{VERSION} ({made})")
    table = _PREFIX.size + length
    if len(blob) < table:
        raise MoglmError(f"{name} is damaged or truncated (shorter than its header says)")
    header = _parse_header(_header_json(blob[_PREFIX.size : table], version), name, version)
    entries, end = unpack_table(blob, table, header["blocks"], version, name)
    if zlib.crc32(blob[:end]) != _CRC.unpack_from(blob, end)[0]:
        raise MoglmError(f"{name} is damaged (the CRC-32 of its header and block table does not match)")
    blocks, offset = [], end + _CRC.size
    for b, (size, flags, crc) in enumerate(entries):
        where = f"block {b + 1} of {header['blocks']}"
        if offset + size > len(blob):
            raise MoglmError(f"{name} is damaged or truncated: its block table points outside the file ({where} "
                             f"ends at byte {offset + size:,} of {len(blob):,})")
        content = blob[offset : offset + size]
        if flags & ~RAW:
            raise MoglmError(f"{name} is damaged: {where} has unknown flags {flags:#x}")
        if block_crc(content, version) != crc:
            kind = "CRC-32" if version < COMPACT_FROM else "CRC-16"
            raise MoglmError(f"{name} is damaged: {where} does not match its {kind} (altered or truncated)")
        blocks.append(content if flags & RAW else _words(content + b"\0" * (-size % 4), ">u4"))
        offset += size
    if offset != len(blob):
        raise MoglmError(f"{name} is damaged: {len(blob) - offset:,} bytes follow its last block")
    return header, blocks


def block_crc(content: bytes, version: int) -> int:
    """A block's check in the table of a ``version`` file: CRC-32 before :data:`COMPACT_FROM`, CRC-16 from it."""
    return zlib.crc32(content) if version < COMPACT_FROM else binascii.crc_hqx(content, 0)


def pack_table(entries: list[tuple[int, int, int]], version: int) -> bytes:
    """The block table of a ``version`` file, from each block's (stored length, flags, check)."""
    if version < COMPACT_FROM:
        return b"".join(_ENTRY.pack(*entry) for entry in entries)
    out = bytearray()
    for size, flags, crc in entries:
        value = size << 1 | (flags & RAW)
        while value >= 0x80:  # LEB128: seven bits a byte, the high bit set on all but the last
            out.append(value & 0x7F | 0x80)
            value >>= 7
        out.append(value)
        out += _CRC16.pack(crc)
    return bytes(out)


def unpack_table(blob: bytes, start: int, blocks: int, version: int,
                 name: str = "the file") -> tuple[list[tuple[int, int, int]], int]:
    """The (stored length, flags, check) of ``blocks`` blocks in the table of a ``version`` file from byte
    ``start``, and where the table ends (its CRC-32 follows), or a one-line error if the file ends first."""
    short = MoglmError(f"{name} is damaged or truncated (shorter than its header and block table)")
    if version < COMPACT_FROM:
        end = start + blocks * _ENTRY.size
        if len(blob) < end + _CRC.size:
            raise short
        return [_ENTRY.unpack_from(blob, start + b * _ENTRY.size) for b in range(blocks)], end
    if len(blob) < start + blocks * (1 + _CRC16.size) + _CRC.size:  # an entry takes 3 bytes at least
        raise short
    entries, at = [], start
    for _ in range(blocks):
        value, shift = 0, 0
        while True:
            if at >= len(blob):
                raise short
            if shift > 42:  # a length longer than any block (2^42 bytes)
                raise MoglmError(f"{name} is damaged (its block table)")
            byte = blob[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        if len(blob) < at + _CRC16.size + _CRC.size:
            raise short
        entries.append((value >> 1, value & RAW, _CRC16.unpack_from(blob, at)[0]))
        at += _CRC16.size
    return entries, at


def _words(content: bytes, dtype: str) -> np.ndarray:
    return np.frombuffer(content, dtype=dtype).astype(np.uint32)


def header_dictionary(version: int) -> bytes:
    """The preset dictionary a header of ``version`` (4 or later) is deflated with."""
    return (HEADER_DICTIONARY_13 if version >= 13 else HEADER_DICTIONARY_12 if version >= 12
            else HEADER_DICTIONARY_11 if version >= 11
            else HEADER_DICTIONARY_10 if version >= 10
            else HEADER_DICTIONARY_9 if version >= 9
            else HEADER_DICTIONARY_7 if version >= 7 else HEADER_DICTIONARY)


def _header_json(stored: bytes, version: int) -> bytes | None:
    """The header's JSON: stored as it is up to version 2, deflated (zlib) in version 3, deflated with
    :func:`header_dictionary` from version 4 (``None``: not inflatable, or longer than any header)."""
    if version < 3:
        return stored
    inflate = zlib.decompressobj(zdict=header_dictionary(version)) if version >= 4 else zlib.decompressobj()
    try:
        encoded = inflate.decompress(stored, MAX_HEADER)
    except zlib.error:
        return None
    return encoded if inflate.eof and not inflate.unconsumed_tail else None


def _parse_header(encoded: bytes | None, name: str, version: int) -> dict[str, Any]:
    """The header's fields, type-checked and consistent with each other, or a one-line error (a header of a
    ``version`` before a field of :data:`ADDED_FIELDS` has none: it is set to ``None``)."""
    try:
        header = json.loads(encoded)
    except (TypeError, ValueError, RecursionError):  # RecursionError: JSON nested deeper than Python recurses
        header = None
    if isinstance(header, dict):
        for key, first in ADDED_FIELDS.items():
            if version < first:
                header.setdefault(key, None)
        for first, before in CONTEXT_FIELDS.items():
            if version < first and isinstance(header.get("contexts"), dict):
                header["contexts"] = {**before, **header["contexts"]}
    if not isinstance(header, dict) or any(not isinstance(header.get(k, ...), t) for k, t in _TYPES.items()) \
            or not valid_factor(header["factor"]) \
            or not 0 <= header["tokens"] <= header["bytes"] \
            or not 1 <= header["threads"] <= MAX_THREADS or header["block_size"] < 0:  # a token spells >= 1 byte
        raise MoglmError(f"{name} has a damaged header")
    expected = block_count(header["bytes"], header["tokens"], header["block_size"])
    if header["blocks"] != expected:
        raise MoglmError(f"{name} has a damaged header: {header['blocks']} blocks, where its block size of "
                         f"{header['block_size']:,} bytes cuts its {header['bytes']:,} bytes into {expected}")
    return header


def _read_version_1(blob: bytes, length: int, name: str) -> tuple[dict[str, Any], list[np.ndarray | bytes]]:
    """A version 1 file (before blocks: one stream, one thread, gaps coded, a CRC-32 over all before it) as
    a later version's header and one coded block."""
    payload_end = len(blob) - _CRC.size
    if payload_end < _PREFIX.size + length or (payload_end - _PREFIX.size - length) % 4:
        raise MoglmError(f"{name} is damaged or truncated (shorter than its header says)")
    if zlib.crc32(blob[:payload_end]) != _CRC.unpack_from(blob, payload_end)[0]:
        raise MoglmError(f"{name} is damaged or truncated (its CRC-32 does not match)")
    try:
        header = json.loads(blob[_PREFIX.size : _PREFIX.size + length])
        header = {**header, "blocks": 1, "block_size": 0, "threads": 1, "gaps": True}
    except (ValueError, TypeError):
        header = None
    header = _parse_header(json.dumps(header).encode(), name, 1)
    return header, [_words(blob[_PREFIX.size + length : payload_end], "<u4")]


def check_settings(header: dict[str, Any], name: str = "the file", *, dynamic: bool | None = None,
                   block_size: int | None = None, runs: int | None = None) -> None:
    """What a decoder was told, against the header, which decides: a file made otherwise is a one-line error.
    ``runs``: how many runs the decoder has (the first and those of ``--ensemble``)."""
    recorded = recorded_ensemble(header, name)
    coded = 1 + (len(recorded[1]) if recorded else 0)
    if runs is not None and runs != coded:
        if coded == 1:
            raise MoglmError(f"{name} was compressed with one run, not {runs} mixed: drop --ensemble")
        raise MoglmError(f"{name} was compressed with {coded} runs mixed, not {runs}: give the other {coded - 1} with "
                         "--ensemble, in the order compress had them")
    made = header["adapt"] is not None
    if dynamic is not None and dynamic != made:
        raise MoglmError(f"{name} was compressed {'with' if made else 'without'} --dynamic: its header decides how "
                         f"it decodes (drop --{'no-' if dynamic is False else ''}dynamic)")
    if block_size is not None and block_size != header["block_size"]:
        raise MoglmError(f"{name} was compressed with --block-size {header['block_size']}, not {block_size}: its "
                         "header decides how it decodes (drop --block-size)")


def _recorded(header: dict[str, Any], key: str, kind, name: str):
    """The settings of ``kind`` (a dataclass) a file was coded with, from its header's ``key`` (``None``: none),
    or a one-line error where they are not such settings."""
    recorded = header[key]
    if recorded is None:
        return None
    try:
        if set(recorded) != {f.name for f in dataclass_fields(kind)}:
            raise TypeError
        return kind(**recorded)
    except (TypeError, MoglmError):
        raise MoglmError(f"{name}: its header's {key} settings are not settings ({recorded!r}): damaged or "
                         "forged") from None


def recorded_cache(header: dict[str, Any], name: str = "the file") -> StepCacheSettings | None:
    """The neural cache a file was coded with (``None``: none)."""
    return _recorded(header, "cache", StepCacheSettings, name)


def recorded_match(header: dict[str, Any], name: str = "the file") -> MatchSettings | None:
    """The match model a file was coded with (``None``: none)."""
    return _recorded(header, "match", MatchSettings, name)


def recorded_contexts(header: dict[str, Any], name: str = "the file") -> ContextSettings | None:
    """The context mixer a file was coded with (``None``: none)."""
    return _recorded(header, "contexts", ContextSettings, name)


def scratch_seed(header: dict[str, Any], name: str = "the file") -> int | None:
    """The seed of a file coded ``--from-scratch`` (its weights drawn afresh), else ``None``."""
    seed = (header["adapt"] or {}).get("from_scratch")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise MoglmError(f"{name}: its header's from-scratch seed is not a seed ({seed!r}): damaged or forged")
    return seed


def decompress(blob: bytes, model, vocab, *, adapter_for: Callable[[dict], Any] | None = None,
               name: str = "the file", progress: bool = True,
               ensemble_for: Callable[[list[dict]], list[Member]] | None = None) -> bytes:
    """The original bytes of a container made by :func:`compress` with this ``model``. ``adapter_for``:
    builds the adapter from the header's settings (needed when the file was coded with adaptation);
    ``ensemble_for``: the further runs of a file coded by an ensemble, from the header's records of them (each
    with the adapter its record's ``adapt`` settings rebuild)."""
    header, stored = read_header(blob, name)
    layout = Layout.of(vocab)
    _check_model(model)
    digest = run_digest(model, vocab)
    if header["run"] != digest:
        raise MoglmError(f"{name} was compressed with another run or checkpoint (model digest {header['run']}; "
                         f"this one's is {digest}): decompress it with the run and --checkpoint that compressed it")
    path = recorded_path(header, name)
    recorded = recorded_ensemble(header, name)
    others = [] if recorded is None else _members(recorded[1], ensemble_for, vocab, name)
    adapting = header["adapt"] is not None or any(m.adapter is not None for m in others)
    if adapting or not all(isinstance(content, bytes) for content in stored):
        check_path(path, name)  # raw blocks without adaptation do not depend on how the model rounds
    adapter = None
    if header["adapt"] is not None:
        if adapter_for is None:
            raise MoglmError(f"{name} was compressed with dynamic evaluation: its run's adaptation is needed")
        adapter = adapter_for(header)
        if adapter_digest(adapter) != header["adapt_digest"]:
            raise MoglmError(f"{name} was compressed with other RMS statistics than this run's "
                             "(dyneval/rms-*.safetensors changed or was recollected)")
    counts = block_tokens(header["tokens"], header["blocks"])
    blocks = [_raw_block(layout, content, n, b, len(counts), name) if isinstance(content, bytes) else Block()
              for b, (content, n) in enumerate(zip(stored, counts))]
    payloads = [None if isinstance(content, bytes) else content for content in stored]
    version = _PREFIX.unpack_from(blob)[1]
    with (fixed_threads(header["threads"]), compiled.flush_denormals(version >= FLUSHED_FROM),
          compiled.blocked_products(version >= BLOCKED_FROM), pinned(path)):
        predictor = Predictor(model, layout.start, len(blocks), float(header["factor"]), adapter,
                              recorded_cache(header, name), guard=guard_margin(header["adapt"]),
                              warmup=warmup_tokens(header["adapt"]), match=recorded_match(header, name),
                              contexts=recorded_contexts(header, name), chars=layout.chars, tokens=header["tokens"],
                              others=others, ensemble=None if recorded is None else recorded[0])
        try:
            decode(predictor, blocks, payloads, counts, _gap_model(layout, header["gaps"], header["bytes"]),
                   layout.start, progress)
        except MoglmError as error:
            raise MoglmError(f"{error}{_elsewhere(header)}") from None
    try:
        data = b"".join(c if isinstance(c, bytes) else layout.join(b.tokens, b.gaps) for b, c in zip(blocks, stored))
    except (KeyError, UnicodeError):
        data = None
    if data is None or len(data) != header["bytes"] or hashlib.sha256(data).hexdigest() != header["sha256"]:
        then, now = _environments(header)
        raise MoglmError(f"{name}: the decoded output does not match the original's SHA-256, so nothing was "
                         f"written (compressed with {then}, decoded with {now}: another "
                         "CPU or library can round the model's probabilities differently)")
    return data


def _members(records: list[dict[str, Any]], ensemble_for: Callable[[list[dict]], list[Member]] | None, vocab,
             name: str) -> list[Member]:
    """The further runs of an ensemble's file, checked against the header's ``records`` of them."""
    if ensemble_for is None:
        raise MoglmError(f"{name} was compressed with {1 + len(records)} runs mixed: give the other {len(records)} "
                         "with --ensemble, in the order compress had them")
    members = ensemble_for(records)
    if len(members) != len(records):
        raise MoglmError(f"{name} was compressed with {1 + len(records)} runs mixed, not {1 + len(members)}")
    for number, (member, record) in enumerate(zip(members, records), start=2):
        given = _member_record(member, vocab, number)
        if given["run"] != record["run"]:
            raise MoglmError(f"{name}: run {number} of its ensemble was another run or checkpoint (model digest "
                             f"{record['run']}; this one's is {given['run']}): give the runs compress had, in order")
        if float(member.factor) != float(record["factor"]):
            raise MoglmError(f"{name}: run {number} of its ensemble is given logit factor {member.factor}, where the "
                             f"file was coded with {record['factor']}")
        if (record["adapt"] is None) != (member.adapter is None):
            raise MoglmError(f"{name}: run {number} of its ensemble was coded "
                             f"{'with' if record['adapt'] is not None else 'without'} adaptation, and is given "
                             f"{'without' if member.adapter is None else 'with'}")
        if given["adapt_digest"] != record["adapt_digest"]:
            raise MoglmError(f"{name}: run {number} of its ensemble was compressed with other RMS statistics than "
                             "this run's (dyneval/rms-*.safetensors changed or was recollected)")
    return members


def _raw_block(layout: Layout, content: bytes, count: int, b: int, blocks: int, name: str) -> Block:
    """A raw block's tokens, which its row of the batch reads as the encoder's did."""
    try:
        tokens, gaps = layout.split(content)
    except UnicodeError:
        tokens = None
    if tokens is None or len(tokens) != count:
        raise MoglmError(f"{name} is damaged: raw block {b + 1} of {blocks} does not hold the {count:,} tokens "
                         "its header gives it")
    return Block(tokens, gaps)


def _check_model(model) -> None:
    p = next(model.parameters())
    if p.device.type != "cpu" or p.dtype != torch.float32:
        raise MoglmError(f"compression runs the model in float32 on the CPU, not {p.dtype} on {p.device}")
    if model.training:
        raise MoglmError("compression needs the model in eval mode (dropout would differ between the two sides)")


def output_path(source: Path, out: Path | None, compressing: bool) -> Path:
    """Where the result goes: ``out``, else ``FILE.moglm`` / ``FILE`` without ``.moglm``."""
    if out is not None:
        return out
    if compressing:
        return source.with_name(source.name + SUFFIX)
    if source.suffix != SUFFIX:
        raise MoglmError(f"{source} does not end in {SUFFIX}: name the output with --output")
    return source.with_suffix("")
