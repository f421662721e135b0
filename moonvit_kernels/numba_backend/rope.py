"""2D RoPE applied in place to the q and k parts of the packed qkv buffer (docs/model.md §4).

Layout: `qkv [L, 3·Q]` row-major, column `s·Q + head·hd + d` with s = 0 (q), 1 (k), 2 (v);
`grid_thws [N, 3]` int32 rows `(t, h, w)` and `cu_seqlens [N + 1]` int32 token offsets of the
packed media items (`launch.grid_table`, `launch.cu_seqlens_table`). v is never touched.

One kernel, `rope2d_kernel`: one block per token. The block finds the token's item and its
patch (row r, column c) within its frame (every frame of a video reuses the same 2D positions).
Each value is rotated with the other value of its interleaved pair (NOT rotate-half), with
`f_i = 10000^(−4i/hd)` computed in float32 on the device:

    dims (4i, 4i+1)   by angle c·f_i   (width)
    dims (4i+2, 4i+3) by angle r·f_i   (height)
    (a, b) -> (a·cos − b·sin, a·sin + b·cos)

Threads map to single values, not pairs, so that a warp's loads and stores cover consecutive
floats (4 sectors of 32 bytes per 32 lanes: fully coalesced). The block is 2D: `threadIdx.x` is the
dim d within a head, `threadIdx.y` a head; the q and k heads are consecutive in a row of qkv,
`s·Q + head·hd = (s·H + head)·hd`, so consecutive threads hold consecutive columns. The angle
depends on d only, so a thread computes its cos and sin once and reuses them for every head. A
thread writes its value in place but also reads its partner's (column `j ^ 1`), which the partner
thread overwrites: a barrier between the reads and the writes of each pass keeps that race out
(the launcher makes `blockDim.x` even so that a pair never straddles two passes).

Indices and positions are uint32, the loops `while` loops (CONTRIBUTING.md, "Hot loops: `while`, not
`range`"): the `uint32(...)` around each sum keeps it one 32-bit instruction and every value
non-negative, and a `%` stays a 32-bit operation instead of a 64-bit division routine. The compile
tier bounds the SASS of a pass (`compile_check.MAX_PASS_INSTRUCTIONS`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..config import ROPE_MAX_SIDE, ROPE_THETA
from ._cuda import cuda, float32, uint32
from .device_functions import find_item
from .launch import (
    MAX_THREADS_PER_BLOCK,
    check_array,
    check_launch,
    check_positive,
    copy_back,
    threads_for,
    to_device,
)

SIGNATURE = "void(float32[:, ::1], int32[:, ::1], int32[::1], int32, int32, int32, int32)"

_THETA = np.float32(ROPE_THETA)
_ONE = np.float32(1.0)


@cuda.jit
def rope2d_kernel(qkv, grid_thws, cu_seqlens, n_items, L, heads, head_dim):
    l = cuda.blockIdx.x
    if l >= L:
        return
    item = find_item(cu_seqlens, n_items, l)
    if item < 0:
        return
    # uint32 from here on (see the module docstring)
    h = uint32(grid_thws[item, 1])
    w = uint32(grid_thws[item, 2])
    p = uint32(l - cu_seqlens[item]) % uint32(h * w)  # position within the frame
    row = float32(p // w)
    col = float32(p % w)

    token = uint32(l)  # this token's row of qkv
    dims = uint32(head_dim)
    columns = uint32(2 * heads * head_dim)  # the q heads, then the k heads
    column_step = uint32(cuda.blockDim.y * head_dim)  # a pass moves on by blockDim.y heads
    d0 = uint32(0)
    while d0 < dims:  # the same trip counts in every thread (a barrier is inside)
        d = uint32(d0 + cuda.threadIdx.x)  # this thread's dim within a head
        i = d // 4
        freq = _ONE / _THETA ** (float32(4 * i) / float32(head_dim))
        angle = (col if d % 4 < 2 else row) * freq  # dims 4i, 4i+1: width; 4i+2, 4i+3: height
        cos = math.cos(angle)
        sin = math.sin(angle)
        if d % 2 == 0:  # first value of its pair: a·cos − b·sin (the second: b·cos + a·sin)
            sin = -sin
        j0 = uint32(0)  # the pass's first column
        j = uint32(cuda.threadIdx.y * head_dim + d)  # (s·H + head)·hd + d: consecutive threads, columns
        while j0 < columns:  # j0 is the same in every thread, j its thread's column
            active = d < dims and j < columns
            value = float32(0.0)
            if active:
                mine = qkv[token, j]
                partner = qkv[token, j ^ 1]  # the other value of the pair
                value = mine * cos + partner * sin
            cuda.syncthreads()  # every thread has read its pair before any value is overwritten
            if active:
                qkv[token, j] = value
            j0 = uint32(j0 + column_step)
            j = uint32(j + column_step)
        d0 = uint32(d0 + cuda.blockDim.x)


def check_packed_tables(grid_thws: np.ndarray, cu_seqlens: np.ndarray, L: int) -> None:
    """Validate host tables: t, h, w >= 1, h, w <= 512 (the RoPE grid limit), cu_seqlens the
    running sum of t·h·w from 0, ending at L."""
    if np.any(grid_thws < 1):
        raise ValueError(f"grid_thws: every t, h, w must be >= 1, got {grid_thws.tolist()}")
    if np.any(grid_thws[:, 1:] > ROPE_MAX_SIDE):
        raise ValueError(f"grid_thws: h and w must be <= {ROPE_MAX_SIDE} (RoPE grid limit), got {grid_thws.tolist()}")
    expected = np.concatenate([[0], np.cumsum(np.prod(grid_thws.astype(np.int64), axis=1))])
    if not np.array_equal(cu_seqlens, expected):
        raise ValueError(f"cu_seqlens {cu_seqlens.tolist()} does not match grid_thws (expected {expected.tolist()})")
    if int(expected[-1]) != L:
        raise ValueError(f"grid_thws covers {int(expected[-1])} tokens but qkv holds L = {L}")


def block_shape(heads: int, head_dim: int, threads: int) -> tuple[int, int]:
    """The 2D block of at most `threads` threads: (one thread per dim of a head, heads per pass).

    x covers `min(head_dim, threads)` dims and must be even (a pair is rotated in one pass);
    y takes as many heads as fit, at most the 2·heads of q and k.
    """
    if threads > MAX_THREADS_PER_BLOCK:
        raise ValueError(f"threads={threads} is more than a block can hold ({MAX_THREADS_PER_BLOCK})")
    x = min(head_dim, threads)
    if x % 2:
        raise ValueError(
            f"threads={threads} is odd and below head_dim={head_dim}: a pass would split a pair; use an even count"
        )
    return x, max(1, min(threads // x, 2 * heads))


def rope2d(
    qkv: Any,
    grid_thws: Any,
    cu_seqlens: Any,
    heads: int,
    head_dim: int,
    threads: int | None = None,
) -> Any:
    """Rotate q and k of `qkv [L, 3·heads·head_dim]` in place by the 2D RoPE of each token's patch.

    `grid_thws [N, 3]`, `cu_seqlens [N + 1]` int32. Returns the device array holding qkv.
    Arguments may be numba device arrays or NumPy arrays (copied to the device; a NumPy qkv is
    updated in place). NumPy tables are checked against each other and L; device tables only
    for dtype and shape (build them with `launch.grid_table` / `launch.cu_seqlens_table`).
    `threads`: at most this many threads per block (default: up to 128), shaped by `block_shape`.
    """
    heads = check_positive("heads", heads)
    head_dim = check_positive("head_dim", head_dim)
    if head_dim % 4:
        raise ValueError(f"head_dim={head_dim} must be a multiple of 4 (width and height pairs)")
    L, _ = check_array("qkv", qkv, shape=(None, 3 * heads * head_dim))
    N, _ = check_array("grid_thws", grid_thws, dtype=np.int32, shape=(None, 3))
    check_array("cu_seqlens", cu_seqlens, dtype=np.int32, shape=(N + 1,))
    if isinstance(grid_thws, np.ndarray) and isinstance(cu_seqlens, np.ndarray):
        check_packed_tables(grid_thws, cu_seqlens, L)
    if threads is None:
        threads = threads_for(2 * heads * head_dim, max_threads=128)
    block = block_shape(heads, head_dim, check_positive("threads", threads))
    check_launch(rope2d_kernel, L, block)

    qkv_d = to_device(qkv)
    rope2d_kernel[L, block](
        qkv_d, to_device(grid_thws), to_device(cu_seqlens), *(np.int32(v) for v in (N, L, heads, head_dim))
    )
    copy_back(qkv, qkv_d)
    return qkv_d
