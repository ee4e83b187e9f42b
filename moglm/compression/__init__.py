"""Lossless compression of any file with a trained character- or byte-level run (``moglm compress`` /
``moglm decompress``): the model's predictions drive a range coder, optionally adapting as it codes."""

from .container import Report, compress, decompress, read_header, run_digest
from .layout import Layout

__all__ = ["Layout", "Report", "compress", "decompress", "read_header", "run_digest"]
