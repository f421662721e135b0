"""Launches: which block and thread of a 2-D grid owns each element of an output."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure


def launch_owners(rows: int, cols: int, block: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For a launch with x along columns and y along rows, blocks of `block = (x, y)` threads, over a
    `rows × cols` output: `(block id [R, C], threadIdx.x [R, C], threadIdx.y [R, C])` int64, where
    `R, C` are the grid's extent (rounded up to whole blocks) and block id = blockIdx.y·gridDim.x + blockIdx.x."""
    bx, by = block
    if min(rows, cols, bx, by) < 1:
        raise ValueError(f"rows, cols and block sizes must be >= 1, got {rows}, {cols}, {block}")
    gx, gy = -(-cols // bx), -(-rows // by)
    r, c = np.mgrid[0 : gy * by, 0 : gx * bx]
    return (r // by) * gx + c // bx, c % bx, r % by


def plot_launch_map(rows: int, cols: int, block: tuple[int, int]) -> Figure:
    """The grid of a 2-D launch over a `rows × cols` output: each cell coloured by its block, labelled with
    its (threadIdx.y, threadIdx.x); cells outside the output (the overshoot a bounds test skips) hatched."""
    from matplotlib.patches import Rectangle

    ids, tx, ty = launch_owners(rows, cols, block)
    R, C = ids.shape
    fig = Figure(figsize=(min(14, 0.52 * C + 1.5), min(9, 0.45 * R + 1.2)), layout="constrained")
    ax = fig.subplots()
    ax.imshow(ids % 10, cmap="tab10", vmin=0, vmax=9, alpha=0.55)
    for r in range(R):
        for c in range(C):
            ax.text(c, r, f"{ty[r, c]},{tx[r, c]}", ha="center", va="center", fontsize=5.5)
    ax.add_patch(Rectangle((-0.5, -0.5), cols, rows, fill=False, lw=2, color="k"))
    if R > rows:
        ax.add_patch(Rectangle((-0.5, rows - 0.5), C, R - rows, hatch="///", fill=False, lw=0, color="0.3"))
    if C > cols:
        ax.add_patch(Rectangle((cols - 0.5, -0.5), C - cols, rows, hatch="///", fill=False, lw=0, color="0.3"))
    ax.set_xticks(range(0, C, block[0]))
    ax.set_yticks(range(0, R, block[1]))
    ax.set_xlabel("column c = blockIdx.x·blockDim.x + threadIdx.x")
    ax.set_ylabel("row r = blockIdx.y·blockDim.y + threadIdx.y")
    ax.set_title(
        f"{rows}×{cols} output, blocks of {block[1]}×{block[0]} threads (y × x): a {R // block[1]}×{C // block[0]} "
        "grid; colour = block, label = (threadIdx.y, threadIdx.x), hatched = outside the output",
        fontsize=9,
    )
    return fig
