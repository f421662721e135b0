"""Timing and tables: median of repeated calls, labelled bars of times, Markdown tables."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure


def median_seconds(
    fn: Callable[[], Any], repeat: int = 5, warmup: int = 1, synchronize: Callable[[], Any] | None = None
) -> dict[str, float]:
    """Wall-clock seconds of `fn()`: `warmup` untimed calls (compilation, caches), then `repeat`
    timed ones, each followed by `synchronize()` (e.g. `numba.cuda.synchronize`) so that
    asynchronous GPU work is inside the measurement. Returns `median`, `min`, `max`."""
    if repeat < 1 or warmup < 0:
        raise ValueError(f"repeat must be >= 1 and warmup >= 0, got {repeat}, {warmup}")
    sync = synchronize or (lambda: None)
    for _ in range(warmup):
        fn()
        sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return {"median": float(np.median(times)), "min": min(times), "max": max(times)}


def plot_timings(
    seconds: Mapping[str, float], where: str, unit: str = "ms", title: str = "", log: bool | None = None
) -> Figure:
    """Horizontal bars of measured times (`{label: seconds}`), labelled with where they ran.

    `log` puts the time axis on a log scale; by default it does when the times span more than a
    factor of 20 (so a 1 ms bar stays visible next to a 1 s one). The title is wrapped to the
    figure's width instead of being clipped.
    """
    import textwrap

    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    labels = list(seconds)
    values = np.array([seconds[k] for k in labels], dtype=np.float64) * scale
    positive = values[values > 0]
    if log is None:
        log = positive.size > 1 and positive.max() / positive.min() > 20
    fig = Figure(figsize=(7.5, 0.45 * len(labels) + 1.6), layout="constrained")
    ax = fig.subplots()
    ax.barh(labels, values, color="C0")
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.3g} {unit}", va="center", fontsize=8)
    ax.invert_yaxis()
    if log and positive.size:
        ax.set_xscale("log")
        ax.set_xlim(positive.min() / 2, positive.max() * 8)
        ax.set_xlabel(f"time ({unit}, log scale)")
    else:
        ax.set_xlim(0, values.max() * 1.25 if len(values) and values.max() > 0 else 1)
        ax.set_xlabel(f"time ({unit})")
    text = f"{title} — measured on {where}" if title else f"measured on {where}"
    ax.set_title("\n".join(textwrap.wrap(text, 70)), fontsize=10)
    return fig


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table: `header` names the columns, each row holds one value per column
    (ints get thousands separators, floats 4 significant digits, everything else `str`)."""

    def cell(v: Any) -> str:
        if isinstance(v, (bool, np.bool_)):
            return str(bool(v))
        if isinstance(v, (int, np.integer)):
            return f"{int(v):,}"
        if isinstance(v, (float, np.floating)):
            return f"{float(v):.4g}"
        return str(v).replace("|", "\\|")

    width = len(header)
    lines = ["| " + " | ".join(str(h) for h in header) + " |", "|" + "---|" * width]
    for i, row in enumerate(rows):
        if len(row) != width:
            raise ValueError(f"row {i} has {len(row)} values for {width} columns")
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines)
