"""Loss against position in the text, static vs dynamic evaluation (Krause thesis 5.1, figure 5.2).

The thesis averages many sequences' losses position by position and smooths over segments of 100
characters. For one continuous stream (the usual language-modelling split) the position is the
number of tokens read so far (per stripe, averaged over stripes), in bins of ``ceil(L / points)``
tokens; in episodic mode it is the position inside each sequence, averaged over the sequences, as in
the figure. The cumulative curves show the timescale over which adaptation pays off.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor

from ..figures import new_figure, save_figure


def _binned(values: Tensor, counts: Tensor, width: int) -> list[float]:
    """Sums and counts ``[N]`` per position, pooled into bins of ``width`` positions -> bin means."""
    n = math.ceil(values.numel() / width) * width
    v = torch.nn.functional.pad(values, (0, n - values.numel())).view(-1, width).sum(1)  # [bins]
    c = torch.nn.functional.pad(counts, (0, n - counts.numel())).view(-1, width).sum(1)  # [bins]
    return (v / c.clamp(min=1)).tolist()


def position_profile(static: Tensor, dynamic: Tensor, episodes: list[int] | None = None, points: int = 100) -> dict:
    """Binned mean loss (nats / token) by position for both evaluations, and their cumulative means.

    ``static``, ``dynamic``: per-token losses ``[L, B]`` (stripes) or ``[N, 1]`` with ``episodes`` the
    sequence lengths (summing to N)."""
    static, dynamic = static.double(), dynamic.double()
    if episodes is None:
        sums = {"static": static.sum(1), "dynamic": dynamic.sum(1)}  # [L]
        counts = torch.full((static.shape[0],), float(static.shape[1]), dtype=torch.float64)  # [L]
        unit = "tokens read (per stream)"
    else:
        longest = max(episodes)
        counts = torch.zeros(longest, dtype=torch.float64)
        sums = {k: torch.zeros(longest, dtype=torch.float64) for k in ("static", "dynamic")}
        offsets = [0]
        for length in episodes:
            offsets.append(offsets[-1] + length)
        for (a, b) in zip(offsets[:-1], offsets[1:]):
            counts[: b - a] += 1
            sums["static"][: b - a] += static[a:b, 0]
            sums["dynamic"][: b - a] += dynamic[a:b, 0]
        unit = "position in the sequence"
    width = max(1, math.ceil(counts.numel() / points))
    profile = {"position": unit, "bin_width": width,
               "bin_start": list(range(0, counts.numel(), width))}
    for name, s in sums.items():
        profile[name] = _binned(s, counts, width)
        profile[f"{name}_cumulative"] = (s.cumsum(0) / counts.cumsum(0))[width - 1 :: width].tolist()
    if len(profile["static_cumulative"]) < len(profile["bin_start"]):  # the last, partial bin
        for name, s in sums.items():
            profile[f"{name}_cumulative"].append(float(s.sum() / counts.sum()))
    return profile


def plot_profile(profile: dict, path: Path, title: str = "") -> Path | None:
    """Two panels: binned loss by position, and the mean gain so far (the difference of the cumulative
    means, static - dynamic). ``None`` without matplotlib."""
    fig = new_figure((7, 6))
    if fig is None:
        return None
    x = [s + profile["bin_width"] / 2 for s in profile["bin_start"]]
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    top.plot(x, profile["static"], lw=1, label="static")
    top.plot(x, profile["dynamic"], lw=1, label="dynamic")
    top.set_ylabel(f"loss (nats / token), bins of {profile['bin_width']}")
    top.set_title(title)
    top.legend()
    top.grid(alpha=0.3)
    gain = [s - d for s, d in zip(profile["static_cumulative"], profile["dynamic_cumulative"])]
    bottom.plot(x, gain, color="tab:green", lw=1)
    bottom.axhline(0, color="grey", lw=0.5)
    bottom.set_ylabel("mean gain so far\n(nats / token)")
    bottom.set_xlabel(profile["position"])
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)
