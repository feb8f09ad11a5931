"""Figures of bertkit-report: expected best dev score vs trials, and scores over seeds.

Drawn with matplotlib's object API on the Agg canvas (no pyplot, no display, no global
state), and saved atomically: a temp file in the target directory, then os.replace.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from bertkit.data.atomic_files import atomic_file


def save_figure_atomic(fig: Figure, path: str | os.PathLike) -> Path:
    """Write fig as a PNG to path; a reader never sees half a file."""
    FigureCanvasAgg(fig)
    with atomic_file(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=100)
    return Path(path)


LABEL_WIDTH = 48  # characters of a system's name per line in a figure
MARKERS = "osD^vP*Xhp<>"


def styles(n: int) -> list[dict]:
    """n line styles that do not repeat: tab10's colours, then tab20's, then a colormap's,
    each with its own marker, so that rows stay apart past the tenth."""
    if n <= 10:
        colours = colormaps["tab10"].colors[:n]
    elif n <= 20:
        colours = colormaps["tab20"].colors[:n]
    else:
        colours = [colormaps["turbo"](i / (n - 1)) for i in range(n)]
    return [{"color": c, "marker": MARKERS[i % len(MARKERS)],
             "linestyle": ("-", "--", ":", "-.")[i // len(MARKERS) % 4]}
            for i, c in enumerate(colours)]


def wrapped(label: str) -> str:
    return "\n".join(textwrap.wrap(label, LABEL_WIDTH, break_on_hyphens=False)) or label


def plot_expected_max(
    curves: Mapping[str, Sequence[float]], path: str | os.PathLike, title: str, ylabel: str
) -> Path:
    """One line per system: element k of a curve is the expected best for k + 1 trials. The
    legend goes below the axes, where it covers no curve, whatever the number of systems."""
    lines = len(curves) + sum(wrapped(label).count("\n") for label in curves)
    fig = Figure(figsize=(7, 4 + 0.22 * lines), layout="constrained")
    ax = fig.add_subplot()
    for (label, curve), style in zip(curves.items(), styles(len(curves)), strict=True):
        trials = np.arange(1, len(curve) + 1)
        ax.plot(trials, curve, markersize=4, label=wrapped(label), **style)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # trials are whole numbers
    ax.set_xlabel("number of trials (runs drawn without replacement)")
    ax.set_ylabel(f"expected best dev {ylabel}")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.legend(loc="outside lower center", fontsize="small", ncols=1, frameon=False)
    return save_figure_atomic(fig, path)


def plot_seeds(
    values: Mapping[str, Sequence[float]], path: str | os.PathLike, title: str, ylabel: str
) -> Path:
    """A box per system, its seeds drawn over it as points (strip plot), one system per
    line so that long names are read whole, left of their box.

    The vertical spread of the points is a fixed pattern, not random jitter, so the same
    results always give the same picture.
    """
    labels = [wrapped(label) for label in values]
    height = sum(0.35 + 0.18 * label.count("\n") for label in labels)
    fig = Figure(figsize=(8, 1.6 + max(1.2, height)), layout="constrained")
    ax = fig.add_subplot()
    data = [np.asarray(v, dtype=float) for v in values.values()]
    positions = np.arange(len(labels), 0, -1)  # the first system on top
    ax.boxplot(data, positions=positions, widths=0.5, showfliers=False,
               orientation="horizontal")
    for pos, points, style in zip(positions, data, styles(len(data)), strict=True):
        offsets = np.linspace(-0.12, 0.12, len(points)) if len(points) > 1 else np.zeros(1)
        ax.scatter(points, pos + offsets, s=18, zorder=3, alpha=0.8, color=style["color"])
    ax.set_yticks(positions, labels, fontsize="small")
    ax.set_xlabel(f"dev {ylabel}")
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)
    return save_figure_atomic(fig, path)
