"""Packed, block-diagonal, non-causal softmax attention (docs/model.md §5, `o = attention(q, k, v)`).

Layout (every version):
  in   `qkv [L, 3·Q]` float32, C-contiguous: the wqkv GEMM output after RoPE, read in place.
       Column `s·Q + head·hd + d` holds slot s (0 = q, 1 = k, 2 = v) of `head`, dim `d`.
       `cu_seqlens [N + 1]` int32: item i owns tokens `cu_seqlens[i]:cu_seqlens[i+1]`;
       starts at 0, never decreases, ends at L. Items never attend to each other.
  out  `o [L, Q]` float32, column `head·hd + d` (what the wo GEMM reads), and
       `lse [L, H]` float32, the natural-log log-sum-exp of the scaled scores of each row.
Maths: scores `s_j = (q · scale) · k_j` with `scale = 1/sqrt(hd)`, `o = Σ_j softmax(s)_j · v_j`,
all in float32.

Versions (llm.c style: each keeps the idea of the previous one and changes one thing):
  v1  naive: one thread block per (query row, head). The block's threads compute the row's
      scores key by key (thread t takes keys t, t + threads, ...) into a shared-memory row of
      at most V1_MAX_KEYS scores, find the row max and the sum of exponentials with
      shared-memory tree reductions, then thread t computes output dims t, t + threads, ...
      as Σ_j p_j · v_j. Two passes over the keys, each K/V value read from global memory by
      every query row; items longer than V1_MAX_KEYS are rejected.
  v2  tiled, flash-style online softmax: one thread block per (query tile, head). A tile of
      BLOCK_Q query rows of one item stays in shared memory; K and V of that item stream
      through shared memory BLOCK_K keys at a time, so each K/V value is read once per query
      tile instead of once per query row. Thread (ty, tx) computes score (query ty, key tx) of
      the tile; each row keeps a running max m and sum l, and when a new tile raises the max
      the accumulated output and sum are rescaled by exp(m_old − m_new). No L x L (or L-long)
      buffer exists: any item length works. Query tiles never straddle items: the launcher
      builds a host table of (item, first query row) per tile. Partial tiles are masked
      (missing query rows are zero and never written, missing keys get score −inf).
      head_dim, BLOCK_Q and BLOCK_K are compile-time constants of a kernel made by a cached
      factory (shared arrays need compile-time sizes): one compiled kernel per (hd, tiles).
      Q and K tile rows are padded by one float (`v2_shared_shapes`): no shared access is
      worse than 2-way bank-conflicted. The QK and PV loops are `while` loops with constant
      bounds, which the compiler unrolls (sm_90 SASS at hd 128: 3.4 and 2.5 instructions per
      FFMA; numba `range` loops cost 24 and 9).

Launches are checked on the host (`launch.check_launch`): block size against the kernel's
registers (v1 at hd 24 uses ~128 per thread, so at most 384 threads), and grid limits.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import launch_rules
from ._cuda import cuda, float32
from .device_functions import REDUCE_MAX, REDUCE_SUM, block_reduce, find_item
from .launch import ceil_div, check_array, check_launch, check_positive, copy_back, device_array, to_device

VERSIONS = (1, 2)

# v1: threads per block (a power of two, for the tree reductions) and the longest item whose
# row of scores fits the shared-memory buffer (8192 float32 = 32 KiB).
V1_THREADS = 128
V1_MAX_KEYS = 8192
# v2: query rows and keys per tile; a block has BLOCK_K x BLOCK_Q threads.
V2_BLOCK_Q = 32
V2_BLOCK_K = 16
# Static shared memory a numba kernel may declare per block.
MAX_STATIC_SHARED_BYTES = 48 * 1024

SIGNATURE_V1 = "void(float32[:, ::1], int32[::1], float32[:, ::1], float32[:, ::1], float32)"
SIGNATURE_V2 = "void(float32[:, ::1], int32[::1], int32[:, ::1], float32[:, ::1], float32[:, ::1], float32)"

_NEG_INF = np.float32(-np.inf)
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)


def _named(fn: Callable, name: str) -> Callable:
    """Give a factory-made kernel a name that says its compile-time constants (PTX, profilers, tables)."""
    fn.__name__ = name
    fn.__qualname__ = name
    return fn


# ============================================================================ v1: naive
def make_attention_v1(head_dim: int, threads: int) -> Callable:
    """The Python function of kernel v1 for one (head_dim, threads) pair (compile with cuda.jit).

    Launch: grid `(L, H)` (blockIdx.x = query row, blockIdx.y = head), `threads` threads.
    Arguments `(qkv [L, 3Q], cu_seqlens [N+1] int32, o [L, Q], lse [L, H], scale)`.
    """
    HD = head_dim

    def attention_v1(qkv, cu_seqlens, o, lse, scale):
        row = cuda.blockIdx.x
        head = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        nt = cuda.blockDim.x
        q_width = o.shape[1]
        q_col = head * HD
        k_col = q_width + head * HD
        v_col = 2 * q_width + head * HD

        item = find_item(cu_seqlens, cu_seqlens.shape[0] - 1, row)
        kv_start = cu_seqlens[item]
        n_keys = cu_seqlens[item + 1] - kv_start

        q_s = cuda.shared.array(HD, float32)
        scores = cuda.shared.array(V1_MAX_KEYS, float32)
        red = cuda.shared.array(threads, float32)

        for d in range(tid, HD, nt):
            q_s[d] = qkv[row, q_col + d] * scale
        cuda.syncthreads()

        # 1. scores s_j = (q·scale)·k_j, and their max
        m_local = _NEG_INF
        for j in range(tid, n_keys, nt):
            s = _ZERO
            d = 0
            while d < HD:  # not `range`: CONTRIBUTING.md, "Hot loops: `while`, not `range`"
                s += q_s[d] * qkv[kv_start + j, k_col + d]
                d += 1
            scores[j] = s
            m_local = max(m_local, s)
        m = block_reduce(red, m_local, REDUCE_MAX)

        # 2. p_j = exp(s_j − m) in place, and their sum
        l_local = _ZERO
        for j in range(tid, n_keys, nt):
            p = math.exp(scores[j] - m)
            scores[j] = p
            l_local += p
        l_sum = block_reduce(red, l_local, REDUCE_SUM)  # its syncs also publish every p_j to the block

        # 3. o[d] = Σ_j p_j · v_j[d] / l
        inv_l = _ONE / l_sum
        for d in range(tid, HD, nt):
            acc = _ZERO
            j = 0
            while j < n_keys:
                acc += scores[j] * qkv[kv_start + j, v_col + d]
                j += 1
            o[row, q_col + d] = acc * inv_l
        if tid == 0:
            lse[row, head] = m + math.log(l_sum)

    return _named(attention_v1, f"attention_v1_hd{head_dim}_t{threads}")


@functools.cache
def attention_v1_kernel(head_dim: int, threads: int = V1_THREADS) -> Any:
    """The compiled (lazily, on first launch) v1 kernel for one (head_dim, threads) pair."""
    return cuda.jit(make_attention_v1(head_dim, threads))


# ============================================================================ v2: flash-style
def make_attention_v2(head_dim: int, block_q: int, block_k: int) -> Callable:
    """The Python function of kernel v2 for one (head_dim, block_q, block_k) (compile with cuda.jit).

    Launch: grid `(tiles, H)`, block `(block_k, block_q)` threads (x runs over keys).
    Arguments `(qkv [L, 3Q], cu_seqlens [N+1] int32, tiles [T, 2] int32 (item, first query row),
    o [L, Q], lse [L, H], scale)`.
    """
    HD, BQ, BK = head_dim, block_q, block_k
    DIMS_PER_THREAD = ceil_div(HD, BK)  # output dims tx, tx + BK, ... of row ty
    Q_SHAPE, K_SHAPE, V_SHAPE, S_SHAPE = v2_shared_shapes(head_dim, block_q, block_k)

    def attention_v2(qkv, cu_seqlens, tiles, o, lse, scale):
        tile = cuda.blockIdx.x
        head = cuda.blockIdx.y
        tx = cuda.threadIdx.x  # key of the score tile; output dims tx, tx + BK, ...
        ty = cuda.threadIdx.y  # query row of the tile
        tid = ty * BK + tx
        nt = BQ * BK
        item = tiles[tile, 0]
        q_start = tiles[tile, 1]
        kv_start = cu_seqlens[item]
        kv_end = cu_seqlens[item + 1]
        q_width = o.shape[1]
        q_col = head * HD
        k_col = q_width + head * HD
        v_col = 2 * q_width + head * HD

        q_s = cuda.shared.array(Q_SHAPE, float32)
        k_s = cuda.shared.array(K_SHAPE, float32)
        v_s = cuda.shared.array(V_SHAPE, float32)
        s_s = cuda.shared.array(S_SHAPE, float32)
        p_s = cuda.shared.array(S_SHAPE, float32)

        # The query tile, pre-scaled; rows past the item's end are zeros (computed, never written).
        for idx in range(tid, BQ * HD, nt):
            r = idx // HD
            d = idx - r * HD
            if q_start + r < kv_end:
                q_s[r, d] = qkv[q_start + r, q_col + d] * scale
            else:
                q_s[r, d] = _ZERO

        m_i = _NEG_INF  # running max of row ty (every thread of the row holds the same value)
        l_i = _ZERO  # running Σ exp(s − m_i)
        acc = cuda.local.array(DIMS_PER_THREAD, float32)
        for k in range(DIMS_PER_THREAD):
            acc[k] = _ZERO

        for k0 in range(kv_start, kv_end, BK):
            cuda.syncthreads()  # the previous tile's K/V/P are no longer read (and q_s is loaded)
            for idx in range(tid, BK * HD, nt):
                c = idx // HD
                d = idx - c * HD
                if k0 + c < kv_end:
                    k_s[c, d] = qkv[k0 + c, k_col + d]
                    v_s[c, d] = qkv[k0 + c, v_col + d]
                else:
                    k_s[c, d] = _ZERO
                    v_s[c, d] = _ZERO
            cuda.syncthreads()

            # hot loops: `while` with constant bounds, not `range` (CONTRIBUTING.md, "Hot loops: `while`, not `range`")
            s = _ZERO
            d = 0
            while d < HD:
                s += q_s[ty, d] * k_s[tx, d]
                d += 1
            if k0 + tx >= kv_end:
                s = _NEG_INF
            s_s[ty, tx] = s
            cuda.syncthreads()

            # Online softmax: the new running max, then rescale what was accumulated under the old one.
            m_new = m_i
            for j in range(BK):
                m_new = max(m_new, s_s[ty, j])
            p_s[ty, tx] = math.exp(s - m_new)  # masked keys: exp(−inf) = 0
            alpha = math.exp(m_i - m_new)  # first tile: exp(−inf) = 0
            cuda.syncthreads()

            row_sum = _ZERO
            for k in range(DIMS_PER_THREAD):
                acc[k] *= alpha
            j = 0
            while j < BK:
                p = p_s[ty, j]
                row_sum += p
                k = 0
                while k < DIMS_PER_THREAD:
                    d = tx + k * BK
                    if HD % BK == 0 or d < HD:  # a compile-time True when BK divides HD
                        acc[k] += p * v_s[j, d]
                    k += 1
                j += 1
            l_i = l_i * alpha + row_sum
            m_i = m_new

        row = q_start + ty
        if row < kv_end:
            inv_l = _ONE / l_i
            for k in range(DIMS_PER_THREAD):
                d = tx + k * BK
                if d < HD:
                    o[row, q_col + d] = acc[k] * inv_l
            if tx == 0:
                lse[row, head] = m_i + math.log(l_i)

    return _named(attention_v2, f"attention_v2_hd{head_dim}_q{block_q}_k{block_k}")


@functools.cache
def attention_v2_kernel(head_dim: int, block_q: int = V2_BLOCK_Q, block_k: int = V2_BLOCK_K) -> Any:
    """The compiled (lazily, on first launch) v2 kernel for one (head_dim, block_q, block_k)."""
    return cuda.jit(make_attention_v2(head_dim, block_q, block_k))


def v2_shared_shapes(
    head_dim: int, block_q: int, block_k: int
) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], tuple[int, int]]:
    """Shapes of the v2 shared arrays `(q_s, k_s, v_s, s_s)` (p_s has s_s's shape), float32, row-major.

    q_s and k_s rows are padded by one float: the QK loop reads q_s[ty, d] (two rows per warp) and
    k_s[tx, d] (16 rows per warp) at one d, and an unpadded row stride that is a multiple of 32
    words (head_dim 128) would put those rows in one bank. v_s is read along rows (v_s[j, tx + ...]),
    s_s/p_s rows are block_k = 16 words: both conflict-free unpadded.
    """
    return (block_q, head_dim + 1), (block_k, head_dim + 1), (block_k, head_dim), (block_q, block_k)


def v2_shared_bytes(head_dim: int, block_q: int, block_k: int) -> int:
    """Static shared memory of a v2 kernel: padded Q and K tiles, V tile, scores and probabilities."""
    q, k, v, s = v2_shared_shapes(head_dim, block_q, block_k)
    return 4 * (q[0] * q[1] + k[0] * k[1] + v[0] * v[1] + 2 * s[0] * s[1])


def v1_shared_bytes(head_dim: int, threads: int) -> int:
    """Static shared memory of a v1 kernel: the query row, the score row and the reduction buffer."""
    return 4 * (head_dim + V1_MAX_KEYS + threads)


def register_limit(threads_per_block: int) -> int:
    """Most registers per thread that still let one block of this size launch (`launch_rules`, <= 255)."""
    return launch_rules.max_registers_for(threads_per_block)


# ============================================================================ host-side tables and checks
def check_cu_seqlens(cu_seqlens: Any, num_tokens: int) -> np.ndarray:
    """Validate `cu_seqlens [N + 1]` int32 (starts at 0, never decreases, ends at `num_tokens`); host copy."""
    check_array("cu_seqlens", cu_seqlens, dtype=np.int32, ndim=1)
    host = cu_seqlens if isinstance(cu_seqlens, np.ndarray) else cu_seqlens.copy_to_host()
    if host.shape[0] < 2:
        raise ValueError(f"cu_seqlens: shape {host.shape} needs at least 2 entries [0, ..., L]")
    if host[0] != 0:
        raise ValueError(f"cu_seqlens: must start at 0, starts at {int(host[0])}")
    if np.any(np.diff(host) < 0):
        i = int(np.argmax(np.diff(host) < 0))
        raise ValueError(f"cu_seqlens: decreases at index {i + 1} ({int(host[i])} -> {int(host[i + 1])})")
    if host[-1] != num_tokens:
        raise ValueError(f"cu_seqlens: ends at {int(host[-1])} but qkv has L = {num_tokens} rows")
    return host


def query_tiles(cu_seqlens: np.ndarray, block_q: int) -> np.ndarray:
    """The v2 tile table `[T, 2]` int32: `(item, first query row)` of every block_q-row query tile.

    Each item is tiled on its own, so a tile never holds rows of two items; empty items get none.
    """
    rows = [
        (item, q0)
        for item, (start, end) in enumerate(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist(), strict=True))
        for q0 in range(start, end, block_q)
    ]
    return np.ascontiguousarray(np.array(rows, dtype=np.int32).reshape(-1, 2))


def pack_qkv(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Pack `q, k, v [L, H, hd]` into the float32 `qkv [L, 3·Q]` layout the kernels read (columns q | k | v)."""
    L = q.shape[0]
    return np.ascontiguousarray(np.concatenate([a.reshape(L, -1) for a in (q, k, v)], axis=1), dtype=np.float32)


def _check_power_of_two(name: str, value: Any, largest: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1 or value & (value - 1):
        raise ValueError(f"{name} must be a power of two, got {value!r}")
    if value > largest:
        raise ValueError(f"{name}={value} exceeds {largest}")
    return int(value)


@dataclass(frozen=True)
class AttentionTables:
    """`cu_seqlens [N + 1]` and the v2 tile table `[T, 2]` of one packing, checked, on the host and on
    the device. Build it once per forward (`attention_tables`) and pass it as `cu_seqlens` to every
    layer's `attention` call: no table is re-validated or re-uploaded per layer."""

    cu_host: np.ndarray
    cu: Any
    block_q: int
    tiles_host: np.ndarray
    tiles: Any


def attention_tables(cu_seqlens: Any, num_tokens: int, block_q: int = V2_BLOCK_Q) -> AttentionTables:
    """Validate `cu_seqlens` against `num_tokens` and upload it with the v2 tile table for `block_q`."""
    cu_host = check_cu_seqlens(cu_seqlens, num_tokens)
    block_q = check_positive("block_q", block_q)
    tiles_host = query_tiles(cu_host, block_q)
    cu = cu_seqlens if not isinstance(cu_seqlens, np.ndarray) else to_device(cu_host)
    return AttentionTables(cu_host, cu, block_q, tiles_host, to_device(tiles_host))


# ============================================================================ launcher
def attention(
    qkv: Any,
    cu_seqlens: Any,
    num_heads: int,
    version: int = 2,
    *,
    threads: int = V1_THREADS,
    block_q: int = V2_BLOCK_Q,
    block_k: int = V2_BLOCK_K,
    out: Any = None,
    lse: Any = None,
) -> tuple[Any, Any]:
    """Packed attention of `qkv [L, 3·Q]` (q | k | v, column `s·Q + head·hd + d`, RoPE applied).

    `cu_seqlens [N + 1]` int32 bounds the items (or an `AttentionTables` from `attention_tables`,
    built with this `block_q`); `num_heads` = H, `hd = Q / H`. `version` 1 (naive, `threads` per
    block, items up to V1_MAX_KEYS tokens) or 2 (flash-style, `block_q` x `block_k` tiles, any
    length). Returns device arrays `o [L, Q]` (column `head·hd + d`) and `lse [L, H]`, written into
    `out` and `lse` when given (device arrays to reuse). Raises ValueError on a wrong dtype, shape,
    layout, item table or launch shape.
    """
    if version not in VERSIONS:
        raise ValueError(f"attention version must be one of {VERSIONS}, got {version!r}")
    L, width = check_array("qkv", qkv, dtype=np.float32, ndim=2)
    if width % 3:
        raise ValueError(f"qkv: width {width} is not 3·Q (q | k | v columns)")
    q_width = width // 3
    H = check_positive("num_heads", num_heads)
    if q_width % H:
        raise ValueError(f"qkv: Q = {q_width} is not divisible by num_heads = {H}")
    hd = q_width // H
    if isinstance(cu_seqlens, AttentionTables):
        tables = cu_seqlens
        if int(tables.cu_host[-1]) != L:
            raise ValueError(f"attention tables cover {int(tables.cu_host[-1])} tokens but qkv has L = {L} rows")
        if version == 2 and tables.block_q != block_q:
            raise ValueError(f"attention tables were built for block_q={tables.block_q}, launch uses {block_q}")
        cu_host = tables.cu_host
    else:
        tables = None
        cu_host = check_cu_seqlens(cu_seqlens, L)
    if out is not None:
        check_array("out", out, shape=(L, q_width))
    if lse is not None:
        check_array("lse", lse, shape=(L, H))
    scale = np.float32(1.0 / math.sqrt(hd))

    if version == 1:
        threads = _check_power_of_two("threads", threads, 1024)
        longest = int(np.max(np.diff(cu_host)))
        if longest > V1_MAX_KEYS:
            raise ValueError(
                f"attention v1 holds at most V1_MAX_KEYS = {V1_MAX_KEYS} keys per item, the longest item has "
                f"{longest}: use version 2"
            )
        shared = v1_shared_bytes(hd, threads)
    else:
        block_q = check_positive("block_q", block_q)
        block_k = check_positive("block_k", block_k)
        if block_q * block_k > 1024:
            raise ValueError(f"block_q x block_k = {block_q * block_k} threads exceeds 1024 per block")
        shared = v2_shared_bytes(hd, block_q, block_k)
    if shared > MAX_STATIC_SHARED_BYTES:
        raise ValueError(
            f"attention v{version} (head_dim={hd}, threads={threads}, block_q={block_q}, block_k={block_k}) needs "
            f"{shared} bytes of shared memory, more than {MAX_STATIC_SHARED_BYTES}: use version 2 with smaller tiles"
        )

    if version == 1:
        kernel = attention_v1_kernel(hd, threads)
        # `threads` only sizes the shared reduction buffer: registers are those of the default block.
        launch = check_launch(kernel, (L, H), threads, registers_of=f"attention_v1_hd{hd}_t{V1_THREADS}")
    else:
        kernel = attention_v2_kernel(hd, block_q, block_k)
        tiles_host = query_tiles(cu_host, block_q) if tables is None else tables.tiles_host
        launch = check_launch(kernel, (tiles_host.shape[0], H), (block_k, block_q))

    qkv_d = to_device(qkv)
    cu_d = to_device(cu_host) if tables is None else tables.cu
    o_d = device_array((L, q_width)) if out is None else to_device(out)
    lse_d = device_array((L, H)) if lse is None else to_device(lse)
    if version == 1:
        kernel[launch](qkv_d, cu_d, o_d, lse_d, scale)
    else:
        tiles_d = to_device(tiles_host) if tables is None else tables.tiles
        kernel[launch](qkv_d, cu_d, tiles_d, o_d, lse_d, scale)
    copy_back(out, o_d)
    copy_back(lse, lse_d)
    return o_d, lse_d
