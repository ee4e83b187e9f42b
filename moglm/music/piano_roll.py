"""A piano roll as a picture (Krause thesis 4.8): time in frames across, pitch up, one dark cell per note
sounding, on its own Agg canvas and saved atomically (:mod:`moglm.figures`)."""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from ..errors import MoglmError
from ..figures import new_figure, save_figure
from .frames import HIGHEST_PITCH, LOWEST_PITCH, check_roll, note_name


def plot_piano_roll(roll: Tensor, path: str | Path, *, title: str | None = None) -> Path:
    """Draw ``roll`` ``[T, 88]`` to the PNG ``path``: frames on x, pitch on y labelled at every C (C2, C3, ...),
    the pitch axis cut to the octaves the roll uses (the whole keyboard when it is silent)."""
    roll = check_roll(roll)  # [T, 88]
    fig = new_figure((min(max(roll.shape[0] / 25, 6.0), 20.0), 4.2))
    if fig is None:
        raise MoglmError("plotting needs matplotlib: pip install 'moglm[cli]'")
    used = roll.amax(0).nonzero().flatten() + LOWEST_PITCH  # [keys used] as MIDI pitches
    low, high = (LOWEST_PITCH, HIGHEST_PITCH) if len(used) == 0 else (int(used[0]), int(used[-1]))
    low, high = max(low - low % 12, LOWEST_PITCH), min(high + (-high) % 12, HIGHEST_PITCH)  # whole octaves, C to C
    ax = fig.subplots()
    rows = roll[:, low - LOWEST_PITCH:high - LOWEST_PITCH + 1].T.numpy()  # [pitches shown, T]
    ax.imshow(rows, origin="lower", aspect="auto", cmap="Greys", vmin=0, vmax=1, interpolation="nearest",
              extent=(-0.5, roll.shape[0] - 0.5, low - 0.5, high + 0.5))
    cs = [p for p in range(low, high + 1) if p % 12 == 0]
    ax.set_yticks(cs, [note_name(p) for p in cs])
    ax.grid(axis="y", color="0.85", linewidth=0.5)
    ax.set_axisbelow(True)
    ax.set_xlabel("frame")
    ax.set_ylabel("pitch")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return save_figure(fig, Path(path))
