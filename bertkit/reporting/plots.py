"""Figures of bertkit-report: expected best dev score vs trials, and scores over seeds.

Drawn with matplotlib's object API on the Agg canvas (no pyplot, no display, no global
state), and saved atomically: a temp file in the target directory, then os.replace.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from bertkit.data.atomic_files import atomic_file


def save_figure_atomic(fig: Figure, path: str | os.PathLike) -> Path:
    """Write fig as a PNG to path; a reader never sees half a file."""
    FigureCanvasAgg(fig)
    with atomic_file(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=100)
    return Path(path)


def plot_expected_max(
    curves: Mapping[str, Sequence[float]], path: str | os.PathLike, title: str, ylabel: str
) -> Path:
    """One line per system: element k of a curve is the expected best for k + 1 trials."""
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    for label, curve in curves.items():
        trials = np.arange(1, len(curve) + 1)
        ax.plot(trials, curve, marker="o", markersize=3, label=label)
    ax.set_xlabel("number of trials (runs drawn without replacement)")
    ax.set_ylabel(f"expected best dev {ylabel}")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return save_figure_atomic(fig, path)


def plot_seeds(
    values: Mapping[str, Sequence[float]], path: str | os.PathLike, title: str, ylabel: str
) -> Path:
    """A box plot per system with every seed drawn over it as a point (strip plot).

    The horizontal spread of the points is a fixed pattern, not random jitter, so the same
    results always give the same picture.
    """
    fig = Figure(figsize=(max(4.0, 1.6 * len(values) + 2), 4), layout="constrained")
    ax = fig.add_subplot()
    labels = list(values)
    data = [np.asarray(values[label], dtype=float) for label in labels]
    positions = np.arange(1, len(labels) + 1)
    ax.boxplot(data, positions=positions, widths=0.5, showfliers=False)
    for pos, points in zip(positions, data, strict=True):
        offsets = np.linspace(-0.12, 0.12, len(points)) if len(points) > 1 else np.zeros(1)
        ax.scatter(pos + offsets, points, s=18, zorder=3, alpha=0.8)
    ax.set_xticks(positions, labels, rotation=15, ha="right", fontsize="small")
    ax.set_ylabel(f"dev {ylabel}")
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    return save_figure_atomic(fig, path)
