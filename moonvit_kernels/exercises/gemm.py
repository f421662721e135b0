"""Notebook 01's exercises: the GEMM ladder C[M, N] = A[M, K]·B[N, K]ᵀ, written by the learner."""

from __future__ import annotations

import numpy as np

from .core import OUT, Case, Exercise, Suspect, awkward, ceil_div, gemm_bound
from .perf import traffic_check

NB = "01_patch_embed_gemm"
TILE = 16


def gemm_case(
    rng: np.random.Generator, M: int, N: int, K: int, per_block: int, label: str, block: tuple[int, int] | None = None
) -> Case:
    """`C = A·Bᵀ` with blocks of 16×16 threads each owning `per_block`² outputs, or (one thread per output)
    blocks of `block` = (x, y) threads, each owning y×x outputs."""
    a = awkward(rng, (M, K))
    b = awkward(rng, (N, K))
    tile = (per_block, per_block) if block is None else (block[1], block[0])
    grid = (ceil_div(N, tile[1]), ceil_div(M, tile[0]))
    return Case(
        args=[a, b, OUT, np.int32(M), np.int32(N), np.int32(K)],
        out_shape=(M, N),
        grid=grid,
        block=(TILE, TILE) if block is None else block,
        expected=a.astype(np.float64) @ b.astype(np.float64).T,
        bound=gemm_bound(a, b),
        arg_names="A, B, C, M, N, K",
        axes=("rows m", "columns n"),
        label=f"M = {M}, N = {N}, K = {K}: {label}, a {grid[1]}×{grid[0]} grid (block rows × block columns)",
        out_tile=tile,
    )


def naive_cases(rng: np.random.Generator) -> list[Case]:
    return [
        gemm_case(rng, 29, 19, 35, TILE, "partial tiles everywhere"),
        gemm_case(rng, 40, 9, 21, TILE, "non-square, more block rows than block columns"),
        gemm_case(rng, 13, 37, 10, 0, "blocks of 4×32 threads, not 16×16: read blockDim", block=(32, 4)),
    ]


def tile_cases(rng: np.random.Generator) -> list[Case]:
    return [
        gemm_case(rng, 29, 19, 35, TILE, "K = 35 leaves a partial last K tile"),
        gemm_case(rng, 13, 16, 37, TILE, "one block, three K tiles (traced for coalescing)"),
    ]


def register_cases(rng: np.random.Generator) -> list[Case]:
    return [
        gemm_case(rng, 29, 19, 35, 2 * TILE, "32×32 outputs per block: one block"),
        gemm_case(rng, 45, 37, 20, 2 * TILE, "several blocks, none full"),
    ]


def _axes_swapped(case: Case) -> np.ndarray:
    """m from the x axis (blockIdx.x, threadIdx.x) and n from y: what lands inside C is right."""
    M, N = case.out_shape
    (gx, gy), (bx, by) = case.grid, case.block
    out = np.full((M, N), np.nan)
    out[: min(M, bx * gx), : min(N, by * gy)] = case.expected[: bx * gx, : by * gy]
    return out


def _fixed_block(case: Case) -> np.ndarray:
    """n = blockIdx.x·16 + threadIdx.x, m = blockIdx.y·16 + threadIdx.y: blockDim written as 16."""
    M, N = case.out_shape
    (gx, gy), (bx, by) = case.grid, case.block
    if (bx, by) == (TILE, TILE):
        raise ValueError("this case's block is 16×16: indistinguishable")
    n = (np.arange(gx)[:, None] * TILE + np.arange(bx)[None, :]).ravel()
    m = (np.arange(gy)[:, None] * TILE + np.arange(by)[None, :]).ravel()
    n, m = np.unique(n[n < N]), np.unique(m[m < M])
    out = np.full((M, N), np.nan)
    out[np.ix_(m, n)] = case.expected[np.ix_(m, n)]
    return out


EXERCISES = (
    Exercise(
        "gemm_naive",
        NB,
        "GEMM v1: one thread per output, C[m, n] = Σ_k A[m, k]·B[n, k]",
        naive_cases,
        (
            "Which output does a thread own? The grid is laid out like C: x (blockIdx.x, threadIdx.x) across "
            "the columns n, y down the rows m — and it overshoots both M and N.",
            "n = blockIdx.x·blockDim.x + threadIdx.x, m = blockIdx.y·blockDim.y + threadIdx.y; if m < M and "
            "n < N: acc = Σ_k A[m, k]·B[n, k] in float32, then C[m, n] = acc.",
        ),
        suspects=(
            Suspect(
                "a kernel with m and n swapped writes (m taken from the x axis, n from y): with M ≠ N the grid "
                "covers the wrong area — x runs along the columns n",
                _axes_swapped,
            ),
            Suspect(
                "a kernel that multiplies blockIdx by 16 instead of cuda.blockDim.x and cuda.blockDim.y writes: "
                "the block shape is the launch's choice (the third case's blocks are 4×32 threads: 4 rows of 32) "
                "— read it from blockDim",
                _fixed_block,
            ),
        ),
    ),
    Exercise(
        "gemm_tile_loads",
        NB,
        "GEMM v2: stage 16×16 tiles of A and B in shared memory, with coalesced loads",
        tile_cases,
        (
            "Per K step each thread (ty, tx) stages one element of each tile. Past the edge of A or B it stores "
            "0.0 (the last K tile is partial): a zero adds nothing to the dot products. For speed, neighbouring "
            "threads (tx) should read neighbouring addresses.",
            "a_tile[ty, tx] = A[m0 + ty, k0 + tx] and b_tile[ty, tx] = B[n0 + ty, k0 + tx], each 0.0 when the row "
            "or k0 + tx is outside. tx runs along k: a warp reads 2 rows × 16 consecutive floats.",
            "Staging a_tile[tx, ty] = A[m0 + tx, k0 + ty] gives the same tile but every lane of a warp reads a "
            "different row of A: K·4 bytes apart, one 32-byte sector per 4 useful bytes.",
        ),
        perf=traffic_check(global_arrays=("A", "B"), max_factor=2.0),
    ),
    Exercise(
        "gemm_register_tile",
        NB,
        "GEMM v3's idea: each thread accumulates a 2×2 patch of outputs in registers",
        register_cases,
        (
            "A block of 16×16 threads owns a 32×32 block of C, starting at row m0 = blockIdx.y·32, column "
            "n0 = blockIdx.x·32; each thread owns TM×TN = 2×2 outputs, held in acc.",
            "Per K tile: each thread stages rows ty and ty + 16 of the A tile and of the B tile (column tx, "
            "0.0 outside), cuda.syncthreads(), then for each kk: a_reg[i] = a_tile[ty·TM + i, kk], "
            "b_reg[j] = b_tile[tx·TN + j, kk], acc[i, j] += a_reg[i]·b_reg[j]; cuda.syncthreads().",
            "Store acc[i, j] at C[m0 + ty·TM + i, n0 + tx·TN + j] when inside C. TM·TN FMAs for TM + TN shared "
            "reads: that ratio is the point of register blocking.",
        ),
    ),
)
