"""Packing: how a batch of images and videos becomes one token sequence, and the index tables kernels read.

A batch is `grid_thws [N, 3]`: item i is t_i frames of h_i x w_i patches. Its tokens are packed
item after item, frame by frame, row by row, into one sequence of L = Σ t·h·w tokens
(docs/model.md, "Packing"). Every table here is a host int32 array computed from `grid_thws` alone;
the reference, both kernel backends, the exercises and gpu_check all take them from this module.

    grid_table(g)            [N, 3]  validated (t, h, w)
    cu_seqlens(g)            [N + 1] token offsets 0, t0·h0·w0, ..., L
    token_positions(g)       [L, 4]  (item, frame, row, col) of each token
    item_table(g[, (kh,kw)]) [N, 4|5] (t, h, w, token_offset[, merged_offset])
    merge_sources(g, (kh,kw)) [M, 4] (base, t, frame_stride, w) of each merged token

`validate_grid_thws(g, config)` checks a batch against a model's limits; `pack(g, config)` validates once
and computes every table once, as a `PackedBatch` that `MoonViT.forward` hands to its backend (each
backend's `forward` also takes a plain `grid_thws` and packs it itself: `as_batch`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import ROPE_MAX_SIDE, VisionConfig

INT32_MAX = np.iinfo(np.int32).max
ITEM_T, ITEM_H, ITEM_W, ITEM_TOKEN_OFFSET, ITEM_MERGED_OFFSET = range(5)


def grid_table(grid_thws: Any) -> np.ndarray:
    """`grid_thws [N, 3]` rows `(t, h, w)` as a validated int32 host array (all >= 1, L < 2^31)."""
    on_device = hasattr(grid_thws, "get") and not isinstance(grid_thws, np.ndarray)
    g = np.asarray(grid_thws.get() if on_device else grid_thws)
    if g.ndim == 1 and g.shape == (3,):
        g = g[None]
    if g.ndim != 2 or g.shape[1] != 3 or g.shape[0] == 0:
        raise ValueError(f"grid_thws: shape {g.shape} is not [N, 3] with N >= 1")
    if not np.issubdtype(g.dtype, np.integer):
        raise ValueError(f"grid_thws: dtype {g.dtype} is not an integer type")
    if np.any(g < 1):
        raise ValueError(f"grid_thws: every t, h, w must be >= 1, got {g.tolist()}")
    total = int(np.sum(np.prod(g.astype(np.int64), axis=1)))
    if total > INT32_MAX:
        raise ValueError(f"grid_thws: {total} tokens do not fit the kernels' int32 indices")
    return g.astype(np.int32)


def cu_seqlens(grid_thws: Any) -> np.ndarray:
    """Token offsets `[0, t0·h0·w0, ..., L]` of the packed items, int32 `[N + 1]`."""
    g = grid_table(grid_thws).astype(np.int64)
    return np.concatenate([[0], np.cumsum(np.prod(g, axis=1))]).astype(np.int32)


def token_positions(grid_thws: Any) -> np.ndarray:
    """`[L, 4]` int32 rows `(item, frame, row, col)`: where each packed token's patch sits.

    Tokens of item `(t, h, w)` run frame by frame, then row by row; every frame repeats the same
    (row, col) grid (RoPE and the position grid are per frame)."""
    parts = []
    for item, (t, h, w) in enumerate(grid_table(grid_thws).astype(np.int64).tolist()):
        idx = np.arange(t * h * w)
        frame, within = np.divmod(idx, h * w)
        row, col = np.divmod(within, w)
        parts.append(np.stack([np.full_like(idx, item), frame, row, col], axis=1))
    return np.ascontiguousarray(np.concatenate(parts, axis=0), dtype=np.int32)


def _merge_kernel(grid: np.ndarray, merge_kernel_size: Sequence[int]) -> tuple[int, int]:
    for k in merge_kernel_size:
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"merge_kernel_size must be a positive integer, got {k!r}")
    kh, kw = (int(k) for k in merge_kernel_size)
    for i, (t, h, w) in enumerate(grid.tolist()):
        if h % kh or w % kw:
            raise ValueError(f"grid_thws[{i}] = {(t, h, w)}: h must be divisible by {kh} and w by {kw}")
    return kh, kw


def item_table(grid_thws: Any, merge_kernel_size: Sequence[int] | None = None) -> np.ndarray:
    """Per-item int32 table for kernels that map a token (or merged token) to its media item.

    Columns `(t, h, w, token_offset)` -> `[N, 4]`; with `merge_kernel_size (kh, kw)` a fifth column
    `merged_offset` (the item's first merged token) -> `[N, 5]`, after checking h % kh == w % kw == 0."""
    g = grid_table(grid_thws)
    cols = [g, cu_seqlens(g)[:-1, None]]
    if merge_kernel_size is not None:
        kh, kw = _merge_kernel(g, merge_kernel_size)
        merged = (g[:, 1].astype(np.int64) // kh) * (g[:, 2] // kw)
        cols.append(np.concatenate([[0], np.cumsum(merged)[:-1]])[:, None])
    return np.ascontiguousarray(np.concatenate(cols, axis=1).astype(np.int32))


def merge_sources(grid_thws: Any, merge_kernel_size: Sequence[int]) -> np.ndarray:
    """`[M, 4]` int32 rows `(base, t, frame_stride, w)`, one per merged token (merge.cu reads them).

    Merged token `(i, j)` of item `(t, h, w)` starting at token `s`: `base = s + kh·i·w + kw·j` (slot
    (0, 0) of frame 0), `frame_stride = h·w`; slot `(a, b)` of frame `f` is token
    `base + f·h·w + a·w + b`. Merged tokens are numbered item by item, `m = i·(w/kw) + j`."""
    g = grid_table(grid_thws)
    kh, kw = _merge_kernel(g, merge_kernel_size)
    parts = []
    start = 0
    for t, h, w in g.astype(np.int64).tolist():
        i, j = np.divmod(np.arange((h // kh) * (w // kw)), w // kw)
        base = start + kh * i * w + kw * j
        parts.append(np.stack([base, np.full_like(base, t), np.full_like(base, h * w), np.full_like(base, w)], axis=1))
        start += t * h * w
    return np.ascontiguousarray(np.concatenate(parts, axis=0), dtype=np.int32)


# ============================================================================ a validated, packed batch
def _packing_key(config: VisionConfig) -> tuple[int, int, int]:
    """What `validate_grid_thws` checks a batch against: (init_pos_emb_time, kh, kw)."""
    kh, kw = config.merge_kernel_size
    return int(config.init_pos_emb_time), int(kh), int(kw)


@dataclass(frozen=True, eq=False)
class PackedBatch:
    """`grid_thws` validated for a model and every index table its kernels read, computed once (host arrays).

    grid [N, 3] int64 · grid32 [N, 3] int32 · cu_seqlens [N + 1] int32 · token_positions [L, 4] int32 ·
    item_table [N, 4] int32 · merge_item_table [N, 5] int32 (with each item's first merged token) ·
    merge_sources [M, 4] int32 · merged_sizes: merged tokens per item · packed_for: the limits checked."""

    grid: np.ndarray
    grid32: np.ndarray
    cu_seqlens: np.ndarray
    token_positions: np.ndarray
    item_table: np.ndarray
    merge_item_table: np.ndarray
    merge_sources: np.ndarray
    merged_sizes: tuple[int, ...]
    packed_for: tuple[int, int, int]

    @property
    def tokens(self) -> int:
        """L, the packed sequence's length."""
        return int(self.cu_seqlens[-1])


def pack(grid_thws: Any, config: VisionConfig) -> PackedBatch:
    """Validate `grid_thws [N, 3]` for `config` (`validate_grid_thws`) and compute every index table once."""
    grid = validate_grid_thws(grid_thws, config)
    mks = config.merge_kernel_size
    kh, kw = mks
    return PackedBatch(
        grid=grid,
        grid32=grid_table(grid),
        cu_seqlens=cu_seqlens(grid),
        token_positions=token_positions(grid),
        item_table=item_table(grid),
        merge_item_table=item_table(grid, mks),
        merge_sources=merge_sources(grid, mks),
        merged_sizes=tuple((h // kh) * (w // kw) for _, h, w in grid.tolist()),
        packed_for=_packing_key(config),
    )


def as_batch(grid_thws: Any, config: VisionConfig) -> PackedBatch:
    """`grid_thws` as a `PackedBatch` for `config`: a batch already packed for it is returned as it is (no
    second validation); anything else (a plain grid, a batch packed for other limits) is packed."""
    if isinstance(grid_thws, PackedBatch) and grid_thws.packed_for == _packing_key(config):
        return grid_thws
    return pack(grid_thws, config)


def validate_grid_thws(grid_thws: Any, config: VisionConfig) -> np.ndarray:
    """Check `grid_thws [N, 3]` rows `(t, h, w)` against `config` (frames, RoPE side, merge divisibility);
    returns an int64 copy (a `PackedBatch`'s own grid, already checked, when given one packed for `config`).
    ValueError naming the item and the rule it breaks."""
    if isinstance(grid_thws, PackedBatch) and grid_thws.packed_for == _packing_key(config):
        return grid_thws.grid
    if isinstance(grid_thws, PackedBatch):
        grid_thws = grid_thws.grid
    try:
        g = np.asarray(grid_thws)
    except ValueError as e:
        raise ValueError(f"grid_thws is not a rectangular array ({e})") from None
    if g.ndim == 1 and g.shape == (3,):
        g = g[None]
    if g.ndim != 2 or g.shape[1] != 3 or g.shape[0] == 0:
        raise ValueError(f"grid_thws shape {g.shape} is not [N, 3] with N >= 1")
    if not np.issubdtype(g.dtype, np.integer):
        if np.issubdtype(g.dtype, np.floating) and np.all(np.isfinite(g)) and np.all(g == np.round(g)):
            pass
        else:
            raise ValueError(f"grid_thws must hold integers, got dtype {g.dtype}")
    g = g.astype(np.int64)
    kh, kw = config.merge_kernel_size
    for i, (t, h, w) in enumerate(g.tolist()):
        if t < 1 or h < 1 or w < 1:
            raise ValueError(f"grid_thws[{i}] = {(t, h, w)}: t, h, w must all be >= 1")
        if t > config.init_pos_emb_time:
            raise ValueError(
                f"grid_thws[{i}] = {(t, h, w)}: t={t} frames exceeds init_pos_emb_time={config.init_pos_emb_time}"
            )
        if h > ROPE_MAX_SIDE or w > ROPE_MAX_SIDE:
            raise ValueError(f"grid_thws[{i}] = {(t, h, w)}: h and w must be <= {ROPE_MAX_SIDE} (RoPE grid limit)")
        if h % kh or w % kw:
            raise ValueError(
                f"grid_thws[{i}] = {(t, h, w)}: h must be divisible by {kh} and w by {kw} (merge_kernel_size)"
            )
    return g
