"""RMSNorm: how eps shrinks the output of low-variance rows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from matplotlib.figure import Figure


def rmsnorm_output_rms(row_rms: Any, eps: float) -> np.ndarray:
    """RMS of `rmsnorm(x, 1, eps)` for rows whose own RMS is `row_rms`: `r / sqrt(r² + eps)` (float64).

    1 means the row came out unit-RMS as intended; below 1, eps has swallowed part of the signal.
    """
    r = np.asarray(row_rms, dtype=np.float64)
    if np.any(r < 0) or not np.all(np.isfinite(r)):
        raise ValueError("row_rms must be finite and >= 0")
    return r / np.sqrt(r * r + float(eps))


def plot_eps_effect(eps_values: Mapping[str, float], row_rms: Any | None = None, measured: Any = None) -> Figure:
    """Output RMS vs input-row RMS (log x) for each named eps; `measured` optionally adds
    `{label: (row_rms, output_rms)}` points computed by a real kernel or the reference."""
    r = np.logspace(-5, 1, 300) if row_rms is None else np.asarray(row_rms, dtype=np.float64)
    fig = Figure(figsize=(7, 3.8), layout="constrained")
    ax = fig.subplots()
    for i, (label, eps) in enumerate(eps_values.items()):
        ax.semilogx(r, rmsnorm_output_rms(r, eps), color=f"C{i}", label=f"{label} (eps = {eps:.3g})")
        ax.axvline(np.sqrt(eps), color=f"C{i}", ls=":", lw=1)
    for j, (label, (xr, yr)) in enumerate((measured or {}).items()):
        ax.semilogx(xr, yr, "o", ms=4, color=f"C{j + len(eps_values)}", label=label)
    ax.set_xlabel("RMS of the input row")
    ax.set_ylabel("RMS of rmsnorm(row), weight = 1")
    ax.set_ylim(0, 1.08)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("eps matters once a row's RMS nears √eps (dotted lines)")
    return fig
