"""Figures: each on its own Agg canvas, saved atomically. matplotlib is optional.

A figure is a :class:`matplotlib.figure.Figure` with a ``FigureCanvasAgg`` of its own: pyplot is never
imported, so drawing a plot neither switches the user's backend (a notebook's inline backend stays) nor
leaves a figure open in pyplot's registry. Saving goes through a temporary file and a rename, so a reader,
such as an image viewer refreshing a learning curve during training, never sees half a PNG.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .atomic import atomic_write


def new_figure(figsize: tuple[float, float] = (7, 4.2)) -> Any | None:
    """An empty figure of ``figsize`` inches on its own Agg canvas (draw with ``fig.subplots()``), or ``None``
    when matplotlib is not installed."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Any, path: Path, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` (PNG) atomically (:mod:`moglm.atomic`): a viewer refreshing it never
    sees half an image."""
    return atomic_write(Path(path), lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"))
