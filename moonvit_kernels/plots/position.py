"""Absolute position embedding: the learned grid resized to several patch grids."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure


def position_grids(
    pos_weight: Any, sizes: Sequence[tuple[int, int]], mode: str = "bilinear", channel: int = 0
) -> list[np.ndarray]:
    """One channel of the learned grid `pos_weight [H0, W0, D]` resized to each `(h, w)` in `sizes`
    (`reference.interpolate_pos_grid`, float64): the term each patch of such an item gets."""
    grid = np.asarray(pos_weight, dtype=np.float64)
    if grid.ndim != 3 or not 0 <= channel < grid.shape[2]:
        raise ValueError(f"pos_weight shape {grid.shape} is not [H0, W0, D] with channel {channel} < D")
    from ..reference import interpolate_pos_grid

    return [interpolate_pos_grid(grid, int(h), int(w), mode)[:, :, channel] for h, w in sizes]


def plot_position_grids(
    pos_weight: Any, sizes: Sequence[tuple[int, int]], mode: str = "bilinear", channel: int = 0
) -> Figure:
    """The learned grid (first panel) and its resized versions, one channel, on one colour scale."""
    H0, W0 = np.shape(pos_weight)[:2]
    panels = position_grids(pos_weight, [(H0, W0), *sizes], mode, channel)
    lo = min(float(p.min()) for p in panels)
    hi = max(float(p.max()) for p in panels)
    fig = Figure(figsize=(2.6 * len(panels) + 0.8, 2.8), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(panels)))
    for k, (ax, panel) in enumerate(zip(axes, panels, strict=True)):
        im = ax.imshow(panel, vmin=lo, vmax=hi, cmap="viridis", interpolation="nearest")
        ax.set_title(("learned " if k == 0 else f"{mode} → ") + f"{panel.shape[0]}×{panel.shape[1]}", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(im, ax=list(axes), shrink=0.8, label=f"channel {channel}")
    return fig
