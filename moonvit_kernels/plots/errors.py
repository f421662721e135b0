"""Errors: |got − ref| heat maps, and a backend comparison (`compare.StageReport`) per stage."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure


def error_matrix(got: np.ndarray, ref: np.ndarray, relative: bool = False) -> np.ndarray:
    """The 2-D float64 array `error_heatmap` draws: `|got − ref|` (relative if asked), `[rows, rest]`."""
    err = np.abs(got - ref)
    if relative:
        err = err / np.maximum(np.abs(ref), np.finfo(np.float64).tiny)
    if err.ndim == 0:
        return err.reshape(1, 1)
    if err.ndim == 1:
        return err[None, :]
    return err.reshape(err.shape[0], -1)


def error_heatmap(
    got: Any,
    ref: Any,
    title: str = "",
    relative: bool = False,
    bound: Any = None,
    scale: tuple[float, float] = (1e-3, 1e3),
) -> Figure:
    """Heat map of `|got − ref|` (or `/ max(|ref|, tiny)` with `relative`) as `[rows, rest]`:
    1-D arrays become one row, N-D arrays are flattened after their first axis. NaN shows as
    the colormap's 'bad' colour and is counted in the title.

    With `bound` (an array broadcastable to `ref`, or a number: the allowed error per element), the
    map shows `|got − ref| / bound` on a fixed logarithmic colour scale `scale` (values outside are
    clipped) with a diverging colormap centred on 1, so pictures of different kernels compare
    directly: blue is within the bound, red beyond it.
    """
    from matplotlib.colors import LogNorm

    g = np.asarray(got, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if g.shape != r.shape:
        raise ValueError(f"got shape {g.shape} != reference shape {r.shape}")
    err = error_matrix(g, r, relative)
    fig = Figure(figsize=(7, 3.6), layout="constrained")
    ax = fig.subplots()
    if bound is None:
        im = ax.imshow(err, aspect="auto", interpolation="nearest", cmap="magma")
        label = "relative error" if relative else "|got − ref|"
    else:
        lo, hi = scale
        if not 0 < lo < 1 < hi:
            raise ValueError(f"scale must satisfy 0 < low < 1 < high, got {scale}")
        b = np.broadcast_to(np.asarray(bound, dtype=np.float64), r.shape).reshape(err.shape)
        if np.any(b <= 0):
            raise ValueError("bound must be positive everywhere")
        err = err / b
        im = ax.imshow(
            np.clip(err, lo, hi), aspect="auto", interpolation="nearest", cmap="coolwarm", norm=LogNorm(lo, hi)
        )
        label = "error / bound  (> 1: beyond the bound)"
    fig.colorbar(im, ax=ax, label=label)
    finite = np.isfinite(err)
    worst = float(err[finite].max()) if finite.any() else float("nan")
    bad = int((~finite).sum())
    ax.set_xlabel("flattened trailing axes" if g.ndim > 2 else "column")
    ax.set_ylabel("row")
    what = f"max error/bound {worst:.3g}" if bound is not None else f"max {worst:.3e}"
    ax.set_title(f"{title + ': ' if title else ''}{what}" + (f", {bad} NaN/Inf" if bad else ""))
    return fig


def stage_report_series(report: Any) -> dict[str, np.ndarray]:
    """Arrays for a `compare.StageReport`: `stage` names, `max_rel` errors, `tolerance`, `ok`."""
    rows = list(report.rows)
    return {
        "stage": np.array([r.stage for r in rows]),
        "max_rel": np.array([r.max_rel for r in rows], dtype=np.float64),
        "tolerance": np.array([r.tolerance for r in rows], dtype=np.float64),
        "ok": np.array([r.ok for r in rows], dtype=bool),
    }


def plot_stage_report(report: Any, title: str | None = None) -> Figure:
    """Relative error per stage (log scale) against its tolerance; stages beyond it in red."""
    s = stage_report_series(report)
    x = np.arange(len(s["stage"]))
    floor = 1e-18  # an exact stage (error 0) still gets a visible bar on a log axis
    fig = Figure(figsize=(max(6, 0.6 * len(x) + 2), 3.8), layout="constrained")
    ax = fig.subplots()
    ax.bar(x, np.maximum(s["max_rel"], floor), color=np.where(s["ok"], "C2", "C3"), label="max|a−b| / max|b|")
    ax.step(np.append(x, x[-1] + 1) - 0.5, np.append(s["tolerance"], s["tolerance"][-1]), where="post", color="k")
    ax.plot([], [], color="k", label="tolerance")
    ax.set_yscale("log")
    ax.set_xticks(x, s["stage"], rotation=45, ha="right")
    ax.set_ylabel("relative error")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(title or f"{getattr(report, 'candidate', 'candidate')} vs {getattr(report, 'reference', 'reference')}")
    return fig
