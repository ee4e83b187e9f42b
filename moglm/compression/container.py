"""``moglm compress`` / ``moglm decompress``: a file coded with a trained run's predictions, in a container
that says what it needs to be decoded, and refuses anything else with a one-line error.

Container (little-endian)::

    b"MOGLMZ" | version (1 byte) | header length (4 bytes) | header (compact JSON, UTF-8)
    | payload (the range coder's uint32 words) | CRC-32 of everything before it (4 bytes)

The header records the run's digest (its vocabulary and every weight), the architecture, the dtype, the
logit factor, the dynamic-evaluation settings and a digest of their statistics (or none), the number of
tokens, the original length and the original's SHA-256, the threads and the library versions. Decoding
checks the CRC (a damaged or truncated file), the run's digest (another run, or a changed one) and, at the
end, the output's SHA-256 and length before anything is written: a wrong output is never produced.

Determinism (docs/method.md, "Compression"): both sides run one loop (:mod:`.coder`) on the CPU in
float32 with ``THREADS`` torch thread(s), one token at a time, so the same machine decodes what it encoded.
Another CPU, another torch or another build of the compiled recurrence may round differently; the header
names the versions, and a mismatch surfaces as an SHA-256 error, not as wrong output.
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ..errors import MoglmError
from .coder import GapModel, Predictor, decode, encode
from .layout import Layout

MAGIC = b"MOGLMZ"
VERSION = 1
THREADS = 1
SUFFIX = ".moglm"
_PREFIX = struct.Struct("<6sBI")  # magic, version, header length


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


@dataclass
class Report:
    """What a compression did: sizes in bytes, ideal code lengths in bits, wall seconds."""

    original_bytes: int
    compressed_bytes: int
    header_bytes: int
    tokens: int
    model_bits: float  # the model's cross-entropy on the tokens, with the probabilities the coder used
    gap_bits: float  # the ideal code length of the gaps
    seconds: float

    @property
    def payload_bits(self) -> int:
        return 8 * (self.compressed_bytes - self.header_bytes)

    @property
    def coding_overhead(self) -> float:
        """Payload against the ideal code length of everything coded (0.001 = 0.1% more)."""
        ideal = self.model_bits + self.gap_bits
        return self.payload_bits / ideal - 1 if ideal else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**vars(self), "payload_bits": self.payload_bits, "coding_overhead": self.coding_overhead,
                "bits_per_byte": 8 * self.compressed_bytes / max(1, self.original_bytes),
                "model_bits_per_token": self.model_bits / max(1, self.tokens),
                "kilobytes_per_second": self.original_bytes / 1e3 / max(self.seconds, 1e-9)}

    def summary(self) -> str:
        d = self.as_dict()
        if not self.original_bytes:  # nothing to code: no rate or overhead to speak of
            return (f"an empty file -> {self.compressed_bytes:,} bytes (the header, {self.header_bytes} bytes, and "
                    f"{self.compressed_bytes - self.header_bytes} bytes of coder state) in {self.seconds:.1f}s")
        return (f"{self.original_bytes:,} -> {self.compressed_bytes:,} bytes ({d['bits_per_byte']:.4f} bits per byte; "
                f"{self.tokens:,} tokens at {d['model_bits_per_token']:.4f} bits each by the model's cross-entropy; "
                f"payload {100 * self.coding_overhead:+.4f}% against the ideal code length; header "
                f"{self.header_bytes} bytes) in {self.seconds:.1f}s, {d['kilobytes_per_second']:.2f} KB/s")


def _environment() -> dict[str, Any]:
    """What the probabilities' rounding depends on besides the weights (named in a mismatch's error)."""
    from importlib.metadata import version

    from .. import __version__
    from ..recurrence import compiled

    return {"moglm": __version__, "torch": torch.__version__, "constriction": version("constriction"),
            "threads": THREADS, "recurrence": compiled.info().get("gemm_route") if compiled.available() else "python"}


def compress(data: bytes, model, vocab, *, factor: float = 1.0, adapter=None, settings: dict | None = None,
             progress: bool = True) -> tuple[bytes, Report]:
    """``data`` coded with ``model`` (eval mode, CPU, float32); returns the container and its report.
    ``adapter``: adapt while coding; ``settings``: what rebuilds it for decoding (recorded in the header)."""
    if (adapter is None) != (settings is None):
        raise ValueError("an adapter and the settings that rebuild it come together")
    layout = Layout.of(vocab)
    _check_model(model)
    start = time.perf_counter()
    tokens, gap_list = layout.split(data)
    gaps = GapModel(layout.gap_bytes, layout.gap_text)
    with fixed_threads():
        predictor = Predictor(model, layout.start, factor, adapter)
        words, model_bits = encode(predictor, gaps, tokens, gap_list, progress)
    header = {"run": run_digest(model, vocab), "architecture": model.architecture, "dtype": "float32",
              "factor": factor, "adapt": settings,
              "adapt_digest": adapter_digest(adapter), "tokens": len(tokens), "bytes": len(data),
              "sha256": hashlib.sha256(data).hexdigest(), **_environment()}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    body = _PREFIX.pack(MAGIC, VERSION, len(encoded)) + encoded + words.astype("<u4").tobytes()
    blob = body + struct.pack("<I", zlib.crc32(body))
    report = Report(len(data), len(blob), _PREFIX.size + len(encoded) + 4, len(tokens), model_bits, gaps.bits,
                    time.perf_counter() - start)
    return blob, report


def read_header(blob: bytes, name: str = "the file") -> tuple[dict[str, Any], np.ndarray]:
    """The header and the payload words of a container, or a one-line error saying what is wrong with it."""
    if len(blob) < _PREFIX.size or not blob.startswith(MAGIC):
        raise MoglmError(f"{name} is not a moglm-compressed file")
    magic, version, length = _PREFIX.unpack_from(blob)
    if version != VERSION:
        raise MoglmError(f"{name} is a version {version} moglm-compressed file; this moglm reads version {VERSION}")
    payload_end = len(blob) - 4
    if payload_end < _PREFIX.size + length or (payload_end - _PREFIX.size - length) % 4:
        raise MoglmError(f"{name} is damaged or truncated (shorter than its header says)")
    if zlib.crc32(blob[:payload_end]) != struct.unpack_from("<I", blob, payload_end)[0]:
        raise MoglmError(f"{name} is damaged or truncated (its CRC-32 does not match)")
    try:
        header = json.loads(blob[_PREFIX.size : _PREFIX.size + length])
    except ValueError:
        header = None
    types = {"run": str, "factor": (int, float), "adapt": (dict, type(None)), "adapt_digest": (str, type(None)),
             "tokens": int, "bytes": int, "sha256": str}
    if not isinstance(header, dict) or any(not isinstance(header.get(k, ...), t) for k, t in types.items()) \
            or not 0 <= header["tokens"] <= header["bytes"]:  # every token spells at least one byte
        raise MoglmError(f"{name} has a damaged header")
    words = np.frombuffer(blob[_PREFIX.size + length : payload_end], dtype="<u4").astype(np.uint32)
    return header, words


def decompress(blob: bytes, model, vocab, *, adapter_for: Callable[[dict], Any] | None = None,
               name: str = "the file", progress: bool = True) -> bytes:
    """The original bytes of a container made by :func:`compress` with this ``model``. ``adapter_for``:
    builds the adapter from the header's settings (needed when the file was coded with adaptation)."""
    header, words = read_header(blob, name)
    layout = Layout.of(vocab)
    _check_model(model)
    digest = run_digest(model, vocab)
    if header["run"] != digest:
        raise MoglmError(f"{name} was compressed with another run or checkpoint (model digest {header['run']}; "
                         f"this one's is {digest}): decompress it with the run and --checkpoint that compressed it")
    adapter = None
    if header["adapt"] is not None:
        if adapter_for is None:
            raise MoglmError(f"{name} was compressed with dynamic evaluation: its run's adaptation is needed")
        adapter = adapter_for(header)
        if adapter_digest(adapter) != header["adapt_digest"]:
            raise MoglmError(f"{name} was compressed with other RMS statistics than this run's "
                             "(dyneval/rms-*.safetensors changed or was recollected)")
    gaps = GapModel(layout.gap_bytes, layout.gap_text, limit=header["bytes"])
    with fixed_threads():
        predictor = Predictor(model, layout.start, float(header["factor"]), adapter)
        tokens, gap_list = decode(predictor, gaps, words, int(header["tokens"]), progress)
    try:
        data = layout.join(tokens, gap_list)
    except (KeyError, UnicodeError):
        data = None
    if data is None or len(data) != header["bytes"] or hashlib.sha256(data).hexdigest() != header["sha256"]:
        env = {k: header.get(k) for k in _environment()}
        raise MoglmError(f"{name}: the decoded output does not match the original's SHA-256, so nothing was "
                         f"written (compressed with {env}, decoded with {_environment()}: another CPU or library "
                         "can round the model's probabilities differently)")
    return data


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
