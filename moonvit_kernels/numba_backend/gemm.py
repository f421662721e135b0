"""GEMM `C = A·Bᵀ` with a fused epilogue: the patch embedding and every linear layer (docs/model.md §1, §3, §7).

Layout: `A [M, K]` row-major (activations, one token per row), `B [N, K]` row-major (a weight in
checkpoint layout `[out, in]`, so no transpose is ever materialised), `C [M, N]`. Products are
accumulated in float32. Every kernel bounds-checks M, N and K, so no size needs to be a tile multiple.

Versions (llm.c style: each keeps the idea of the previous one and changes one thing):
  v1  naive: one thread per output `C[m, n]`, a K-loop reading A and B from global memory.
      Threads with consecutive x own consecutive columns n.
  v2  shared-memory tiling: a TILE x TILE block stages TILE-wide slabs of A and B in shared
      memory; each staged value is then reused TILE times. Tiles past the matrix edge are filled
      with zeros so they add nothing. B's tile is read "transposed" (b_tile[tx, kk]); one
      column of padding (TILE + 1) spreads those reads over distinct shared-memory banks.
  v3  register blocking: a block owns a BM x BN tile of C and stages BK-deep slabs (stored
      k-major); each thread computes TM x TN outputs held in registers (TM adjacent rows, TN
      columns 16 apart). Per k-step a thread loads TM values of A and TN values of B and does
      TM·TN FMAs, so each shared load feeds several FMAs instead of one. Slab rows are padded
      to BM + 2 floats so that no shared access is bank-conflicted (`V3_*` layout constants).

Hot loops are `while` loops over indices that start at 0 (or at a thread index), not `range` loops
(CONTRIBUTING.md, "Hot loops: `while`, not `range`"); v3's constant kk loop is then fully unrolled
(its per-FFMA budget is asserted by the compile tier, `compile_check.MAX_INSTRUCTIONS_PER_FFMA`).

Epilogues, selected at launch; each (version, epilogue) pair is its own kernel, built by a
factory with the epilogue id as a compile-time constant, so there is no per-element dispatch:
  none        C = A·Bᵀ
  gelu_tanh   C = gelu_tanh(A·Bᵀ)    encoder MLP fc0
  gelu_erf    C = gelu_erf(A·Bᵀ)     projector proj.0
  residual    C = A·Bᵀ + R           wo and fc1 (x = x + ...); C may alias R

Every kernel has the signature `(A, B, R, C, M, N, K)`; for epilogues other than `residual`,
R is never read (launchers pass C in its place).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._cuda import cuda, float32
from .launch import check_array, check_launch, copy_back, device_array, grid_2d, jit_named, to_device

EPILOGUES = ("none", "gelu_tanh", "gelu_erf", "residual")
VERSIONS = (1, 2, 3)

# v1 block and v2 tile edge.
TILE = 16
# v3: a block computes BM x BN outputs with (BN/TN) x (BM/TM) threads; slabs are BK deep.
BM, BN, BK = 64, 64, 16
TM, TN = 4, 4
V3_THREADS = (BM // TM) * (BN // TN)
# (rows, columns) of the output tile each version stages in shared memory (None: v1 stages nothing); the
# registry's traffic model reads the same numbers (tests/test_registry.py holds them equal)
TILES = {1: (None, None), 2: (TILE, TILE), 3: (BM, BN)}

SIGNATURE = "void(float32[:, ::1], float32[:, ::1], float32[:, ::1], float32[:, ::1], int32, int32, int32)"

_HALF = np.float32(0.5)
_ONE = np.float32(1.0)
_GELU_C = np.float32(math.sqrt(2.0 / math.pi))
_GELU_CUBIC = np.float32(0.044715)
_INV_SQRT2 = np.float32(1.0 / math.sqrt(2.0))


# ============================================================================ epilogues
# Ids baked into each specialisation as a compile-time constant: `apply_epilogue` is inlined
# into the kernel, so the compiler folds its `if epilogue == ...` chain and each kernel holds
# only its own epilogue code.
EPILOGUE_IDS = {name: i for i, name in enumerate(EPILOGUES)}
NONE, GELU_TANH, GELU_ERF, RESIDUAL = (EPILOGUE_IDS[name] for name in EPILOGUES)


@cuda.jit(device=True, inline="always")
def apply_epilogue(v, epilogue, R, m, n):
    """The epilogue with id `epilogue` applied to the accumulated `v = (A·Bᵀ)[m, n]`; R is read only for RESIDUAL."""
    if epilogue == GELU_TANH:  # 0.5·v·(1 + tanh(√(2/π)·v·(1 + 0.044715·v²)))
        return _HALF * v * (_ONE + math.tanh(_GELU_C * (v * (_ONE + _GELU_CUBIC * v * v))))
    if epilogue == GELU_ERF:  # 0.5·v·(1 + erf(v/√2))
        return _HALF * v * (_ONE + math.erf(v * _INV_SQRT2))
    if epilogue == RESIDUAL:
        return v + R[m, n]
    return v


# ============================================================================ v1: one thread per output
def _make_gemm_v1(epilogue: str) -> Any:
    EPILOGUE = EPILOGUE_IDS[epilogue]

    def gemm_v1(A, B, R, C, M, N, K):
        n = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        m = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
        if m < M and n < N:
            acc = float32(0.0)
            k = 0
            while k < K:
                acc += A[m, k] * B[n, k]
                k += 1
            C[m, n] = apply_epilogue(acc, EPILOGUE, R, m, n)

    return jit_named(gemm_v1, f"gemm_v1_{epilogue}")


# ============================================================================ v2: shared-memory tiles
def _make_gemm_v2(epilogue: str) -> Any:
    EPILOGUE = EPILOGUE_IDS[epilogue]
    T = TILE
    T_PADDED = TILE + 1

    def gemm_v2(A, B, R, C, M, N, K):
        a_tile = cuda.shared.array((T, T), float32)  # a_tile[r, kk] = A[m0 + r, k0 + kk]
        b_tile = cuda.shared.array((T, T_PADDED), float32)  # b_tile[r, kk] = B[n0 + r, k0 + kk]
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        m = cuda.blockIdx.y * T + ty
        n = cuda.blockIdx.x * T + tx
        n_load = cuda.blockIdx.x * T + ty  # the row of B this thread stages
        acc = float32(0.0)
        for k0 in range(0, K, T):
            k = k0 + tx
            a_tile[ty, tx] = A[m, k] if (m < M and k < K) else float32(0.0)
            b_tile[ty, tx] = B[n_load, k] if (n_load < N and k < K) else float32(0.0)
            cuda.syncthreads()
            for kk in range(T):
                acc += a_tile[ty, kk] * b_tile[tx, kk]
            cuda.syncthreads()
        if m < M and n < N:
            C[m, n] = apply_epilogue(acc, EPILOGUE, R, m, n)

    return jit_named(gemm_v2, f"gemm_v2_{epilogue}")


# ============================================================================ v3: register blocking
# Shared-memory layout and thread ownership of v3, in one place: the kernel uses these and the
# bank-conflict test (tests/stages/test_gemm.py) reads them.
V3_THREADS_X = BN // TN  # threads along n (threadIdx.x); BM // TM along m (threadIdx.y)
V3_LOADS_A = BM * BK // V3_THREADS  # slab elements each thread stages per k-step
V3_LOADS_B = BN * BK // V3_THREADS
# Row stride of the k-major slabs: BM + 2 ≡ 2 (mod 32 banks). A warp stages 16 consecutive k of
# two rows; with stride ≡ 2 the 32 words `kk·stride + r` fall in 32 distinct banks (stride 64
# would put them all in 2 banks: a 16-way conflict).
V3_PAD = 2
V3_A_SHAPE = (BK, BM + V3_PAD)  # a_tile[kk, r] = A[m0 + r, k0 + kk]
V3_B_SHAPE = (BK, BN + V3_PAD)  # b_tile[kk, c] = B[n0 + c, k0 + kk]


@cuda.jit(device=True, inline="always")
def v3_stage_coords(tid, s):
    """`(r, kk)` of the s-th slab element thread `tid` stages: tile row r, depth kk.

    Consecutive threads take consecutive kk of one row, so a warp reads 16 contiguous floats of
    two rows of A (or B) from global memory.
    """
    e = tid + s * V3_THREADS
    return e // BK, e % BK


@cuda.jit(device=True, inline="always")
def v3_row(ty, i):
    """Tile row of the i-th output row of thread row ty: a thread owns TM adjacent rows."""
    return ty * TM + i


@cuda.jit(device=True, inline="always")
def v3_col(tx, j):
    """Tile column of the j-th output column of thread column tx: columns tx, tx + 16, ... so that the
    16 threads of a half-warp read 16 consecutive words of b_tile (distinct banks) and store 16
    consecutive floats of C."""
    return tx + j * V3_THREADS_X


def _make_gemm_v3(epilogue: str) -> Any:
    EPILOGUE = EPILOGUE_IDS[epilogue]

    def gemm_v3(A, B, R, C, M, N, K):
        a_tile = cuda.shared.array(V3_A_SHAPE, float32)
        b_tile = cuda.shared.array(V3_B_SHAPE, float32)
        acc = cuda.local.array((TM, TN), float32)
        a_reg = cuda.local.array(TM, float32)
        b_reg = cuda.local.array(TN, float32)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        tid = ty * V3_THREADS_X + tx
        m0 = cuda.blockIdx.y * BM
        n0 = cuda.blockIdx.x * BN
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = float32(0.0)
        for k0 in range(0, K, BK):
            for s in range(V3_LOADS_A):
                r, kk = v3_stage_coords(tid, s)
                m = m0 + r
                k = k0 + kk
                a_tile[kk, r] = A[m, k] if (m < M and k < K) else float32(0.0)
            for s in range(V3_LOADS_B):
                r, kk = v3_stage_coords(tid, s)
                n = n0 + r
                k = k0 + kk
                b_tile[kk, r] = B[n, k] if (n < N and k < K) else float32(0.0)
            cuda.syncthreads()
            # `while` with a constant bound, not `range` (CONTRIBUTING.md, "Hot loops: `while`, not `range`")
            kk = 0
            while kk < BK:
                for i in range(TM):
                    a_reg[i] = a_tile[kk, v3_row(ty, i)]
                for j in range(TN):
                    b_reg[j] = b_tile[kk, v3_col(tx, j)]
                for i in range(TM):
                    for j in range(TN):
                        acc[i, j] += a_reg[i] * b_reg[j]
                kk += 1
            cuda.syncthreads()
        for i in range(TM):
            m = m0 + v3_row(ty, i)
            for j in range(TN):
                n = n0 + v3_col(tx, j)
                if m < M and n < N:
                    C[m, n] = apply_epilogue(acc[i, j], EPILOGUE, R, m, n)

    return jit_named(gemm_v3, f"gemm_v3_{epilogue}")


_MAKERS = {1: _make_gemm_v1, 2: _make_gemm_v2, 3: _make_gemm_v3}
# KERNELS[(version, epilogue)] -> the compiled-on-demand kernel.
KERNELS = {(v, ep): _MAKERS[v](ep) for v in VERSIONS for ep in EPILOGUES}


def launch_config(version: int, M: int, N: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """`(blocks, threads)` of a version for an M x N output; x runs over columns."""
    if version == 3:
        return grid_2d(M, N, BM, BN), (V3_THREADS_X, BM // TM)
    return grid_2d(M, N, TILE, TILE), (TILE, TILE)


# ============================================================================ launcher
def gemm(
    a: Any,
    b: Any,
    epilogue: str = "none",
    residual: Any = None,
    out: Any = None,
    version: int = 3,
) -> Any:
    """`C [M, N] = epilogue(A [M, K] · B [N, K]ᵀ)`, float32, row-major; returns the device array C.

    `epilogue` is one of `EPILOGUES`; `residual [M, N]` is required for (and only for)
    `"residual"`, and `out` may be the same array as `residual` (each element of R is read once,
    by the thread that then writes it). `out` must not overlap `a` or `b`. Arguments may be numba
    device arrays or NumPy arrays (copied to the device; a NumPy `out` also receives the result).
    `version` picks the kernel (1 naive, 2 shared tiles, 3 register blocking).
    """
    if epilogue not in EPILOGUES:
        raise ValueError(f"epilogue {epilogue!r} is not one of {EPILOGUES}")
    if version not in VERSIONS:
        raise ValueError(f"version {version!r} is not one of {VERSIONS}")
    M, K = check_array("a", a, ndim=2)
    N, _ = check_array("b", b, shape=(None, K))
    if epilogue == "residual":
        if residual is None:
            raise ValueError("epilogue 'residual' needs a residual array [M, N]")
        check_array("residual", residual, shape=(M, N))
    elif residual is not None:
        raise ValueError(f"residual given but epilogue is {epilogue!r}; use epilogue='residual'")
    if out is not None:
        check_array("out", out, shape=(M, N))

    kernel = KERNELS[(version, epilogue)]
    blocks, threads = check_launch(kernel, *launch_config(version, M, N))

    a_d, b_d = to_device(a), to_device(b)
    c_d = device_array((M, N)) if out is None else to_device(out)
    r_d = to_device(residual) if (residual is not None and residual is not out) else c_d
    kernel[blocks, threads](a_d, b_d, r_d, c_d, np.int32(M), np.int32(N), np.int32(K))
    if out is not None:
        copy_back(out, c_d)
    return c_d
