"""Absolute position embedding, added in place to packed patch tokens (docs/model.md §2).

Layout: `x [L, D]` (tokens of all media items, packed; within an item: frame, row, column),
`pos_weight [H0, W0, D]` (the learned grid), `time [T0, D]` (the sin/cos frame table,
`time_table`), `items [N, 4]` int32 rows `(t, h, w, token_offset)` (`launch.item_table`).

One kernel per interpolation mode (`KERNELS["bilinear"]`, `KERNELS["bicubic"]`): one block per
token. Each thread finds the token's item, its frame f and patch (r, c), computes the
interpolation taps of r along H0 and of c along W0 (the separable 1-D resampling of
`F.interpolate(align_corners=False)`), then for its columns d adds

    x[l, d] += Σ_b wc[b] · Σ_a wr[a] · pos_weight[ir[a], ic[b], d]   (+ time[f, d] if t > 1)

Per axis (in -> out samples): same size is the identity; otherwise the source coordinate is
`s = (o + 0.5)·(in/out) − 0.5`. Bilinear: `s = max(s, 0)`, taps `i0 = min(floor(s), in−1)` and
`min(i0+1, in−1)` with weights `1−λ, λ` (λ = s − i0). Bicubic: taps `floor(s)−1 … floor(s)+2`
clamped to `[0, in−1]`, Keys weights with A = −0.75. All in float32.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import reference
from ._cuda import cuda, float32, int32
from .device_functions import find_item
from .launch import (
    ITEM_TOKEN_OFFSET,
    check_array,
    check_launch,
    check_positive,
    copy_back,
    jit_named,
    threads_for,
    to_device,
)

MODES = ("bilinear", "bicubic")
BILINEAR, BICUBIC = 0, 1
SIGNATURE = (
    "void(float32[:, ::1], float32[:, :, ::1], float32[:, ::1], int32[:, ::1], int32, int32, int32, int32, int32)"
)

_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_HALF = np.float32(0.5)
# Keys cubic kernel with A = -0.75 (torch; not -0.5), as float32 constants:
# |d| <= 1: ((A+2)|d| − (A+3))·d² + 1;   1 < |d| < 2: ((A|d| − 5A)|d| + 8A)|d| − 4A
_A = np.float32(-0.75)
_A_PLUS_2, _A_PLUS_3 = np.float32(-0.75 + 2), np.float32(-0.75 + 3)
_5A, _8A, _4A = np.float32(5 * -0.75), np.float32(8 * -0.75), np.float32(4 * -0.75)


def time_table(dim: int, num_frames: int) -> np.ndarray:
    """The sin/cos frame table `[num_frames, dim]` float32 (`reference.time_sincos_table`), to upload once."""
    return reference.time_sincos_table(dim, num_frames).astype(np.float32)


def _make_kernel(mode: str) -> Any:
    MODE = BICUBIC if mode == "bicubic" else BILINEAR
    N_TAPS = 4 if MODE == BICUBIC else 2

    def add_pos_emb(x, pos, time, items, n_items, L, D, H0, W0):
        l = cuda.blockIdx.x
        if l >= L:
            return
        item = find_item(items[:, ITEM_TOKEN_OFFSET], n_items, l)
        if item < 0:
            return
        t = items[item, 0]
        h = items[item, 1]
        w = items[item, 2]
        local = l - items[item, ITEM_TOKEN_OFFSET]
        f = local // (h * w)
        p = local % (h * w)

        # taps[axis, k] and weights[axis, k]: axis 0 resamples row r (H0 -> h), axis 1 column c (W0 -> w)
        taps = cuda.local.array((2, 4), int32)
        weights = cuda.local.array((2, 4), float32)
        for axis in range(2):
            if axis == 0:
                o, n_in, n_out = p // w, H0, h
            else:
                o, n_in, n_out = p % w, W0, w
            for k in range(4):
                taps[axis, k] = 0
                weights[axis, k] = _ZERO
            if n_in == n_out:
                taps[axis, 0] = o
                weights[axis, 0] = _ONE
                continue
            s = (float32(o) + _HALF) * (float32(n_in) / float32(n_out)) - _HALF
            if MODE == BILINEAR:
                s = max(s, _ZERO)
                i0 = min(int32(math.floor(s)), n_in - 1)
                lam = s - float32(i0)
                taps[axis, 0] = i0
                taps[axis, 1] = min(i0 + 1, n_in - 1)
                weights[axis, 0] = _ONE - lam
                weights[axis, 1] = lam
            else:
                i0 = int32(math.floor(s))
                u = s - float32(i0)  # in [0, 1): taps at distances u+1, u, 1-u, 2-u
                for k in range(4):
                    dist = abs(u - float32(k - 1))
                    if dist <= _ONE:
                        weights[axis, k] = (_A_PLUS_2 * dist - _A_PLUS_3) * dist * dist + _ONE
                    else:
                        weights[axis, k] = ((_A * dist - _5A) * dist + _8A) * dist - _4A
                    taps[axis, k] = min(max(i0 - 1 + k, 0), n_in - 1)

        for d in range(cuda.threadIdx.x, D, cuda.blockDim.x):
            v = _ZERO
            for b in range(N_TAPS):
                column = _ZERO
                for a in range(N_TAPS):
                    column += weights[0, a] * pos[taps[0, a], taps[1, b], d]
                v += weights[1, b] * column
            if t > 1:
                v += time[f, d]
            x[l, d] += v

    return jit_named(add_pos_emb, f"add_pos_emb_{mode}")


KERNELS = {mode: _make_kernel(mode) for mode in MODES}


def check_item_table(items: Any, L: int, max_frames: int) -> None:
    """Validate a host `items [N, 4]` table against L tokens: t, h, w >= 1, t <= max_frames,
    offsets packed back to back from 0 and covering exactly L tokens."""
    sizes = items[:, 0].astype(np.int64) * items[:, 1] * items[:, 2]
    if np.any(items[:, :3] < 1):
        raise ValueError(f"items: every t, h, w must be >= 1, got {items[:, :3].tolist()}")
    if np.any(items[:, 0] > max_frames):
        raise ValueError(f"items: t = {int(items[:, 0].max())} frames exceeds the time table's {max_frames} rows")
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    if not np.array_equal(items[:, ITEM_TOKEN_OFFSET], offsets):
        raise ValueError(f"items: token offsets {items[:, ITEM_TOKEN_OFFSET].tolist()} are not {offsets.tolist()}")
    if int(sizes.sum()) != L:
        raise ValueError(f"items cover {int(sizes.sum())} tokens but x holds L = {L}")


def add_position_embedding(
    x: Any,
    pos_weight: Any,
    time: Any,
    items: Any,
    mode: str = "bilinear",
    threads: int | None = None,
) -> Any:
    """Add the (interpolated) position grid, plus `time[f]` for frames of videos, to `x [L, D]` in place.

    `pos_weight [H0, W0, D]`, `time [T0, D]` (`time_table(D, T0)`), `items [N, 4]` int32
    `(t, h, w, token_offset)` (`launch.item_table(grid_thws)`), float32 everywhere else.
    Returns the device array holding x. Arguments may be numba device arrays or NumPy arrays
    (copied to the device; a NumPy x is updated in place). A NumPy `items` table is checked
    against L and T0; a device one only for dtype and shape (build it with `launch.item_table`).
    """
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    L, D = check_array("x", x, ndim=2)
    H0, W0, _ = check_array("pos_weight", pos_weight, shape=(None, None, D))
    T0, _ = check_array("time", time, shape=(None, D))
    N, _ = check_array("items", items, dtype=np.int32, shape=(None, 4))
    if isinstance(items, np.ndarray):
        check_item_table(items, L, T0)
    threads = threads_for(D, max_threads=128) if threads is None else check_positive("threads", threads)
    check_launch(KERNELS[mode], L, threads)

    x_d = to_device(x)
    KERNELS[mode][L, threads](
        x_d, to_device(pos_weight), to_device(time), to_device(items), *(np.int32(v) for v in (N, L, D, H0, W0))
    )
    copy_back(x, x_d)
    return x_d
