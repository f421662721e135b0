"""Patch merge: which merged token and slot each source patch lands in, merged tokens back on the grid."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from .. import reference


def merge_index_table(h: int, w: int, merge_kernel_size: Sequence[int] = (2, 2)) -> tuple[np.ndarray, np.ndarray]:
    """`(merged [h, w], slot [h, w])` int64: the merged token and slot each source patch lands in.

    Read off `reference.tpool_patch_merger` applied to the patch numbers themselves.
    """
    kh, kw = (int(k) for k in merge_kernel_size)
    if h % kh or w % kw:
        raise ValueError(f"grid {h}×{w} is not divisible by merge_kernel_size ({kh}, {kw})")
    ids = np.arange(h * w, dtype=np.float64)[:, None]
    (gathered,) = reference.tpool_patch_merger(ids, np.array([[1, h, w]]), (kh, kw))  # [M, kh·kw, 1]
    source = gathered[..., 0].astype(np.int64)
    merged = np.empty(h * w, dtype=np.int64)
    slot = np.empty(h * w, dtype=np.int64)
    M, S = source.shape
    merged[source.ravel()] = np.repeat(np.arange(M), S)
    slot[source.ravel()] = np.tile(np.arange(S), M)
    return merged.reshape(h, w), slot.reshape(h, w)


def merge_index_map(h: int, w: int, merge_kernel_size: Sequence[int] = (2, 2)) -> Figure:
    """Two maps over the h × w patch grid: merged token index, and slot inside the merged token."""
    merged, slot = merge_index_table(h, w, merge_kernel_size)
    fig = Figure(figsize=(9, 4.2 * h / max(w, 1) + 0.8), layout="constrained")
    axes = fig.subplots(1, 2)
    panels = ((merged, "merged token m", "tab20"), (slot, "slot a·kw + b", "Set2"))
    for ax, (data, name, cmap) in zip(axes, panels, strict=True):
        ax.imshow(data, cmap=cmap, interpolation="nearest")
        ax.set_title(name)
        ax.set_xlabel("patch column")
        ax.set_ylabel("patch row")
        if h * w <= 400:
            for (r, c), v in np.ndenumerate(data):
                ax.text(c, r, str(v), ha="center", va="center", fontsize=7)
    fig.suptitle(f"patch merge {tuple(merge_kernel_size)} on a {h}×{w} grid", fontsize=9)
    return fig


def merged_to_grid(merged: Any, h: int, w: int, merge_kernel_size: Sequence[int] = (2, 2)) -> np.ndarray:
    """Lay the merged tokens of one item back on its patch grid: `[M, kh·kw·D]` -> `[h, w, D]`.

    The inverse of the gather in `reference.tpool_patch_merger` (merged token `m = i·(w/kw) + j`,
    slot `a·kw + b` holds patch `(kh·i + a, kw·j + b)`); for a video it returns the frame mean.
    """
    kh, kw = (int(k) for k in merge_kernel_size)
    a = np.asarray(merged)
    if h % kh or w % kw:
        raise ValueError(f"grid {h}×{w} is not divisible by merge_kernel_size ({kh}, {kw})")
    M = (h // kh) * (w // kw)
    if a.ndim != 2 or a.shape[0] != M or a.shape[1] % (kh * kw):
        raise ValueError(f"merged shape {a.shape} is not [M = {M}, kh·kw·D] for a {h}×{w} grid")
    D = a.shape[1] // (kh * kw)
    return a.reshape(h // kh, w // kw, kh, kw, D).transpose(0, 2, 1, 3, 4).reshape(h, w, D)
