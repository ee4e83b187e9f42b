"""Figures: matplotlib with the non-interactive Agg backend, saved atomically (a reader, such as an image
viewer refreshing a learning curve during training, never sees half a PNG). matplotlib is optional."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any | None:
    """``matplotlib.pyplot`` on the Agg backend, or ``None`` when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_figure(fig: Any, path: Path, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` (PNG) through a temporary file and a rename, then close it."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=dpi)
    plt.close(fig)
    tmp.replace(path)
    return path
