"""Patch merge gather (`tpool_patch_merger`, docs/model.md §6): mean over frames, kh x kw gather.

Layout: `x [L, D]` (final-norm tokens of all packed items; within an item: frame, row, column),
`items [N, 5]` int32 rows `(t, h, w, token_offset, merged_offset)`
(`launch.item_table(grid_thws, (kh, kw))`), `out [M_total, kh·kw·D]`, exactly the row-major
`[M, kh·kw·D]` input of the projector's first GEMM (slot-major: column `slot·D + d`).

One kernel, `merge_gather_kernel`: one block per merged token m (global index; the item's
merged tokens are `merged_offset ... merged_offset + (h/kh)·(w/kw) − 1`). With the item-local
index `m' = i·(w/kw) + j`, the thread owning column `slot·D + d`, `slot = a·kw + b`, writes

    out[m, slot·D + d] = (1/t) · Σ_f x[token_offset + f·h·w + (kh·i + a)·w + (kw·j + b), d]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import launch
from ._cuda import cuda, float32
from .device_functions import find_item
from .launch import (
    ITEM_MERGED_OFFSET,
    ITEM_TOKEN_OFFSET,
    check_array,
    check_launch,
    check_positive,
    copy_back,
    device_array,
    threads_for,
    to_device,
)

SIGNATURE = "void(float32[:, ::1], int32[:, ::1], float32[:, ::1], int32, int32, int32, int32, int32)"


@cuda.jit
def merge_gather_kernel(x, items, out, n_items, M_total, D, kh, kw):
    m = cuda.blockIdx.x
    if m >= M_total:
        return
    item = find_item(items[:, ITEM_MERGED_OFFSET], n_items, m)
    if item < 0:
        return
    t = items[item, 0]
    h = items[item, 1]
    w = items[item, 2]
    local = m - items[item, ITEM_MERGED_OFFSET]
    i = local // (w // kw)
    j = local % (w // kw)
    frame0 = items[item, ITEM_TOKEN_OFFSET]
    inv_t = float32(1.0) / float32(t)
    for col in range(cuda.threadIdx.x, kh * kw * D, cuda.blockDim.x):
        slot = col // D
        d = col % D
        patch = (kh * i + slot // kw) * w + (kw * j + slot % kw)
        acc = float32(0.0)
        for f in range(t):
            acc += x[frame0 + f * h * w + patch, d]
        out[m, col] = acc * inv_t


def check_merge_table(items: np.ndarray, L: int, kh: int, kw: int) -> int:
    """Validate a host `items [N, 5]` table against L tokens and (kh, kw); returns M_total."""
    t, h, w = (items[:, k].astype(np.int64) for k in range(3))
    if np.any(items[:, :3] < 1):
        raise ValueError(f"items: every t, h, w must be >= 1, got {items[:, :3].tolist()}")
    if np.any(h % kh) or np.any(w % kw):
        raise ValueError(f"items: h must be divisible by {kh} and w by {kw}, got {items[:, :3].tolist()}")
    sizes, merged = t * h * w, (h // kh) * (w // kw)
    for col, counts, what in ((ITEM_TOKEN_OFFSET, sizes, "token"), (ITEM_MERGED_OFFSET, merged, "merged")):
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
        if not np.array_equal(items[:, col], offsets):
            raise ValueError(f"items: {what} offsets {items[:, col].tolist()} are not {offsets.tolist()}")
    if int(sizes.sum()) != L:
        raise ValueError(f"items cover {int(sizes.sum())} tokens but x holds L = {L}")
    return int(merged.sum())


def merge_gather(
    x: Any,
    items: Any,
    merge_kernel_size: tuple[int, int],
    m_total: int | None = None,
    out: Any = None,
    threads: int | None = None,
) -> Any:
    """Gather `x [L, D]` into `out [M_total, kh·kw·D]` (mean over frames), the projector's input.

    `items [N, 5]` int32 from `launch.item_table(grid_thws, merge_kernel_size)`. Returns the
    device array out. Arguments may be numba device arrays or NumPy arrays (copied to the
    device; a NumPy `out` also receives the result). A NumPy `items` table is checked against L
    and gives M_total. With a device table, `m_total` (or `out`'s rows) is trusted; without
    either, the table is copied back (a sync) to be checked and counted. `out` must not overlap `x`.
    """
    kh, kw = (check_positive("merge_kernel_size", k) for k in merge_kernel_size)
    L, D = check_array("x", x, ndim=2)
    N, _ = check_array("items", items, dtype=np.int32, shape=(None, 5))
    if m_total is None and out is not None:
        m_total = int(out.shape[0])
    if isinstance(items, np.ndarray) or m_total is None:
        # A device table is read back (N x 5 ints) only when nothing else gives M_total.
        counted = check_merge_table(items if isinstance(items, np.ndarray) else items.copy_to_host(), L, kh, kw)
        if m_total is not None and m_total != counted:
            raise ValueError(f"m_total={m_total} but items hold {counted} merged tokens")
        m_total = counted
    m_total = check_positive("m_total", m_total)
    threads = threads_for(kh * kw * D, max_threads=128) if threads is None else check_positive("threads", threads)
    check_launch(merge_gather_kernel, m_total, threads)
    if out is not None:
        check_array("out", out, shape=(m_total, kh * kw * D))
    out_d = out if launch.is_device_array(out) else device_array((m_total, kh * kw * D))
    merge_gather_kernel[m_total, threads](
        to_device(x), to_device(items), out_d, *(np.int32(v) for v in (N, m_total, D, kh, kw))
    )
    copy_back(out, out_d)
    return out_d
