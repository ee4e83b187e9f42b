"""The learning-curve plot of a run: training and validation cross-entropy against tokens seen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..figures import pyplot, save_figure


def plot_learning_curve(records: list[dict[str, Any]], path: Path, title: str = "") -> Path | None:
    """Draw ``metrics.jsonl`` records to ``path`` (PNG); returns ``None`` when matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        return None
    train = [r for r in records if r.get("kind") == "train"]
    valid = [r for r in records if r.get("kind") == "valid"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    if train:
        ax.plot([r["tokens"] for r in train], [r["xent"] for r in train], lw=0.8, alpha=0.6, label="train")
    if valid:
        ax.plot([r["tokens"] for r in valid], [r["xent"] for r in valid], "o-", ms=3, label="valid")
        best = min(valid, key=lambda r: r["xent"])
        ax.axhline(best["xent"], color="grey", lw=0.5, ls=":")
        ax.annotate(f"best {best['xent']:.3f}", (best["tokens"], best["xent"]), textcoords="offset points",
                    xytext=(0, -12), fontsize=8, ha="center")
    start = next((r for r in train if r.get("averaging")), None)
    if start is not None:
        ax.axvline(start["tokens"], color="tab:red", lw=0.8, ls="--", label="weight averaging")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return save_figure(fig, path)
