"""The on-ramp (notebook 00a): seven warm-ups in the spirit of GPU-Puzzles, each a NumPy one-liner as a kernel.

map → guard → 2-D blocks → shared memory → block reduction → scan → a transpose that must also be fast.
"""

from __future__ import annotations

import numpy as np

from .core import FP32_EPS, OUT, Case, Exercise, Suspect, awkward, ceil_div
from .perf import traffic_check

NB = "00a_warmups"


def _v(rng: np.random.Generator, n: int) -> np.ndarray:
    return awkward(rng, (n,))


# ============================================================================ 1 map
def _map_case(rng: np.random.Generator, n: int, label: str) -> Case:
    a = _v(rng, n)
    want = 2 * a.astype(np.float64) + 1
    return Case(
        [a, OUT, np.int32(n)], (n,), 1, n, want, 4 * FP32_EPS * (np.abs(want) + 1), "a, out, n", ("elements", "-"),
        label=label,
    )  # fmt: skip


def map_cases(rng: np.random.Generator) -> list[Case]:
    return [
        _map_case(rng, 32, "one block of 32 threads, n = 32"),
        _map_case(rng, 13, "one block of 13 threads, n = 13"),
    ]


# ============================================================================ 2 guard
def _guard_case(rng: np.random.Generator, n: int, blocks: int, threads: int, label: str) -> Case:
    a, b = _v(rng, n), _v(rng, n)
    want = a.astype(np.float64) + b
    return Case(
        [a, b, OUT, np.int32(n)], (n,), blocks, threads, want, 2 * FP32_EPS * np.abs(want) + 1e-30, "a, b, out, n",
        ("elements", "-"), label=label,
    )  # fmt: skip


def guard_cases(rng: np.random.Generator) -> list[Case]:
    return [
        _guard_case(rng, 37, 1, 64, "one block of 64 threads for n = 37 elements"),
        _guard_case(rng, 45, 3, 16, "3 blocks of 16 threads for n = 45 elements"),
        _guard_case(rng, 100, 4, 32, "4 blocks of 32 threads for n = 100: blockDim.x differs per case, read it"),
    ]


def _guard_fixed_block(size: int) -> Suspect:
    """i = blockIdx.x·size + threadIdx.x with the block size written as a number, not cuda.blockDim.x."""

    def model(case: Case) -> np.ndarray:
        n, threads = case.out_shape[0], int(case.block)
        if threads == size:
            raise ValueError("the fixed size is this case's own: indistinguishable")
        out = np.full(n, np.nan)
        i = (np.arange(int(case.grid))[:, None] * size + np.arange(threads)[None, :]).ravel()
        i = i[i < n]
        out[i] = case.expected[i]
        return out

    return Suspect(
        f"a kernel that multiplies blockIdx.x by a fixed {size} instead of cuda.blockDim.x writes: the block size "
        "is the launch's choice and differs between the cases — read it from cuda.blockDim.x (or use cuda.grid(1))",
        model,
    )


# ============================================================================ 3 broadcast over 2-D blocks
BCAST_BLOCK = (8, 4)  # (x along columns, y along rows)


def _bcast_case(rng: np.random.Generator, rows: int, cols: int, block: tuple[int, int] = BCAST_BLOCK) -> Case:
    a, b = _v(rng, rows), _v(rng, cols)
    want = a.astype(np.float64)[:, None] * b.astype(np.float64)[None, :]
    grid = (ceil_div(cols, block[0]), ceil_div(rows, block[1]))
    return Case(
        [a, b, OUT, np.int32(rows), np.int32(cols)], (rows, cols), grid, block, want,
        2 * FP32_EPS * np.abs(want) + 1e-30, "a, b, out, rows, cols", ("rows r", "columns c"),
        label=f"{rows} rows × {cols} columns, a {grid[1]}×{grid[0]} grid of {block[1]}×{block[0]}-thread blocks",
        out_tile=(block[1], block[0]),
    )  # fmt: skip


def broadcast_cases(rng: np.random.Generator) -> list[Case]:
    # The second case's blocks are 2×16, not 4×8: a kernel must read blockDim, not the first case's numbers.
    return [_bcast_case(rng, 11, 19), _bcast_case(rng, 3, 22, (16, 2))]


def _bcast_swapped(case: Case) -> np.ndarray:
    """r from the x axis (blockIdx.x·blockDim.x + threadIdx.x), c from y: the outputs inside both ranges."""
    rows, cols = case.out_shape
    gx, gy = case.grid
    bx, by = case.block
    out = np.full((rows, cols), np.nan)
    r_max, c_max = min(rows, gx * bx), min(cols, gy * by)
    out[:r_max, :c_max] = case.expected[:r_max, :c_max]
    return out


def _bcast_fixed_block(case: Case) -> np.ndarray:
    """c = blockIdx.x·8 + threadIdx.x, r = blockIdx.y·4 + threadIdx.y: the first case's block as numbers."""
    rows, cols = case.out_shape
    (gx, gy), (bx, by) = case.grid, case.block
    if (bx, by) == BCAST_BLOCK:
        raise ValueError("this case's block is the fixed one: indistinguishable")
    c = (np.arange(gx)[:, None] * BCAST_BLOCK[0] + np.arange(bx)[None, :]).ravel()
    r = (np.arange(gy)[:, None] * BCAST_BLOCK[1] + np.arange(by)[None, :]).ravel()
    c, r = np.unique(c[c < cols]), np.unique(r[r < rows])
    out = np.full((rows, cols), np.nan)
    out[np.ix_(r, c)] = case.expected[np.ix_(r, c)]
    return out


# ============================================================================ 4 shared memory: a 3-point window
WINDOW_THREADS = 16


def _window_case(rng: np.random.Generator, n: int) -> Case:
    a = _v(rng, n)
    p = np.concatenate([[0.0], a.astype(np.float64), [0.0]])
    want = p[:-2] + p[1:-1] + p[2:]
    bound = 4 * FP32_EPS * (np.abs(p[:-2]) + np.abs(p[1:-1]) + np.abs(p[2:])) + 1e-30
    blocks = ceil_div(n, WINDOW_THREADS)
    return Case(
        [a, OUT, np.int32(n)], (n,), blocks, WINDOW_THREADS, want, bound, "a, out, n", ("elements", "-"),
        label=f"n = {n}: {blocks} block{'s' if blocks > 1 else ''} of {WINDOW_THREADS} threads",
    )  # fmt: skip


def window_cases(rng: np.random.Generator) -> list[Case]:
    return [_window_case(rng, 45), _window_case(rng, 16)]


def _window_no_halo(case: Case) -> np.ndarray:
    """Each block sees zeros instead of the neighbours owned by the blocks before and after it."""
    a = case.args[0].astype(np.float64)
    n = a.size
    out = np.empty(n)
    for s in range(0, n, WINDOW_THREADS):
        seg = np.concatenate([[0.0], a[s : s + WINDOW_THREADS], [0.0]])
        out[s : s + WINDOW_THREADS] = (seg[:-2] + seg[1:-1] + seg[2:])[: min(WINDOW_THREADS, n - s)]
    return out


# ============================================================================ 5 block reduction
SUM_THREADS = 32
SUM_PER_BLOCK = 2 * SUM_THREADS  # each thread first adds two elements


def _sum_case(rng: np.random.Generator, n: int) -> Case:
    a = _v(rng, n)
    blocks = ceil_div(n, SUM_PER_BLOCK)
    pad = np.zeros(blocks * SUM_PER_BLOCK)
    pad[:n] = a
    want = pad.reshape(blocks, SUM_PER_BLOCK).sum(axis=1)
    bound = 8 * FP32_EPS * 8 * np.abs(np.abs(pad).reshape(blocks, -1)).sum(axis=1) + 1e-30
    return Case(
        [a, OUT, np.int32(n)], (blocks,), blocks, SUM_THREADS, want, bound, "a, out, n", ("blocks", "-"),
        label=f"n = {n}: {blocks} block{'s' if blocks > 1 else ''} of {SUM_THREADS} threads, "
        f"{SUM_PER_BLOCK} elements per block",
    )  # fmt: skip


def block_sum_cases(rng: np.random.Generator) -> list[Case]:
    return [_sum_case(rng, 150), _sum_case(rng, 40)]


def _sum_of(case: Case, used: np.ndarray) -> np.ndarray:
    """Each block's sum over the positions (of its 64) marked in `used`."""
    a = case.args[0].astype(np.float64)
    blocks = case.out_shape[0]
    pad = np.zeros(blocks * SUM_PER_BLOCK)
    pad[: a.size] = a
    return (pad.reshape(blocks, SUM_PER_BLOCK) * used).sum(axis=1)


def _sum_half_tree(case: Case) -> np.ndarray:
    t = np.arange(SUM_PER_BLOCK) % SUM_THREADS
    return _sum_of(case, t < SUM_THREADS // 2)


def _sum_one_each(case: Case) -> np.ndarray:
    return _sum_of(case, np.arange(SUM_PER_BLOCK) < SUM_THREADS)


# ============================================================================ 6 scan
SCAN_THREADS = 32


def _scan_case(rng: np.random.Generator, n: int) -> Case:
    a = _v(rng, n)
    a64 = a.astype(np.float64)
    want = np.concatenate([np.cumsum(a64[s : s + SCAN_THREADS]) for s in range(0, n, SCAN_THREADS)])
    absum = np.concatenate([np.cumsum(np.abs(a64[s : s + SCAN_THREADS])) for s in range(0, n, SCAN_THREADS)])
    blocks = ceil_div(n, SCAN_THREADS)
    return Case(
        [a, OUT, np.int32(n)], (n,), blocks, SCAN_THREADS, want, 8 * FP32_EPS * absum + 1e-30, "a, out, n",
        ("elements", "-"), label=f"n = {n}: {blocks} block{'s' if blocks > 1 else ''} of {SCAN_THREADS} threads",
        row_groups=[(s, min(n, s + SCAN_THREADS), f"block {s // SCAN_THREADS}") for s in range(0, n, SCAN_THREADS)],
    )  # fmt: skip


def scan_cases(rng: np.random.Generator) -> list[Case]:
    return [_scan_case(rng, 45), _scan_case(rng, 20)]


def _scan_window(case: Case, width: int = SCAN_THREADS // 2) -> np.ndarray:
    """Each output sums only the last `width` values of its block (a scan that stops one step early)."""
    a = case.args[0].astype(np.float64)
    out = np.empty(a.size)
    for i in range(a.size):
        start = max(i - width + 1, i - i % SCAN_THREADS)
        out[i] = a[start : i + 1].sum()
    return out


def _scan_exclusive(case: Case) -> np.ndarray:
    a = case.args[0].astype(np.float64)
    out = np.empty(a.size)
    for s in range(0, a.size, SCAN_THREADS):
        seg = a[s : s + SCAN_THREADS]
        out[s : s + seg.size] = np.concatenate([[0.0], np.cumsum(seg)[:-1]])
    return out


# ============================================================================ 7 transpose, coalesced and conflict-free
T_TILE, T_ROWS = 32, 8  # a 32×32 tile per block of 32×8 threads: each thread moves 4 elements


def _transpose_case(rng: np.random.Generator, rows: int, cols: int) -> Case:
    a = awkward(rng, (rows, cols))
    grid = (ceil_div(cols, T_TILE), ceil_div(rows, T_TILE))
    return Case(
        [a, OUT, np.int32(rows), np.int32(cols)], (cols, rows), grid, (T_TILE, T_ROWS), a.T.astype(np.float64), 0.0,
        "a, out, rows, cols", ("out rows (= columns of a)", "out columns (= rows of a)"),
        label=f"a is {rows}×{cols}: {grid[1]}×{grid[0]} tiles of 32×32, blocks of 32×8 threads",
        out_tile=(T_TILE, T_TILE),
    )  # fmt: skip


def transpose_cases(rng: np.random.Generator) -> list[Case]:
    return [_transpose_case(rng, 40, 37), _transpose_case(rng, 32, 20)]


EXERCISES = (
    Exercise(
        "warm_map",
        NB,
        "map: one thread per element, out[i] = 2·a[i] + 1",
        map_cases,
        (
            "Each thread handles the element with its own index: cuda.threadIdx.x.",
            "i = cuda.threadIdx.x; out[i] = 2·a[i] + 1 (the launch has exactly n threads: no test needed yet).",
        ),
    ),
    Exercise(
        "warm_guard",
        NB,
        "guard: more threads than elements, over several blocks, out[i] = a[i] + b[i]",
        guard_cases,
        (
            "The launch starts more threads than there are elements, and thread indices restart at 0 in every "
            "block: a thread's element is its place in the whole grid.",
            "i = cuda.blockIdx.x·cuda.blockDim.x + cuda.threadIdx.x (= cuda.grid(1)); only if i < n: "
            "out[i] = a[i] + b[i].",
        ),
        suspects=tuple(_guard_fixed_block(size) for size in (16, 32, 64)),
    ),
    Exercise(
        "warm_broadcast_2d",
        NB,
        "2-D blocks: out[r, c] = a[r]·b[c], an outer product over a 2-D grid",
        broadcast_cases,
        (
            "x is the fast axis: let threadIdx.x / blockIdx.x run along the columns c (so a warp writes one row's "
            "neighbouring elements), y along the rows r.",
            "c = blockIdx.x·blockDim.x + threadIdx.x, r = blockIdx.y·blockDim.y + threadIdx.y; "
            "if r < rows and c < cols: out[r, c] = a[r]·b[c].",
        ),
        suspects=(
            Suspect(
                "a kernel with r and c swapped writes (r taken from the x axis, c from y): it covers an area of "
                "the wrong shape — x (blockIdx.x, threadIdx.x) should run along the columns",
                _bcast_swapped,
            ),
            Suspect(
                "a kernel that multiplies blockIdx.x by 8 and blockIdx.y by 4 (the first case's block) instead of "
                "cuda.blockDim.x and cuda.blockDim.y writes: the block shape is the launch's choice and differs "
                "between the cases",
                _bcast_fixed_block,
            ),
        ),
    ),
    Exercise(
        "warm_shared_window",
        NB,
        "shared memory: out[i] = a[i−1] + a[i] + a[i+1] (0 outside), each value loaded once per block",
        window_cases,
        (
            "Stage the block's 16 values and their two neighbours (the halo: one before, one after the block) in "
            "shared memory, wait for the whole block, then read all three from shared memory.",
            "tile[t + 1] = a[i] (0 past n); thread 0 also loads tile[0] = a[i − 1] (0 if i = 0), and thread "
            "blockDim.x − 1 (or the block's last valid thread) tile[blockDim.x + 1] = a[i + 1] (0 past n); "
            "cuda.syncthreads(); out[i] = tile[t] + tile[t + 1] + tile[t + 2].",
            "The halo of block b comes from blocks b − 1 and b + 1: a block that fills it with 0 is wrong at its "
            "first and last element.",
        ),
        suspects=(
            Suspect(
                "a kernel that never loads the halo produces (each block's first and last output miss the "
                "neighbour that belongs to the block before or after)",
                _window_no_halo,
            ),
        ),
    ),
    Exercise(
        "warm_block_sum",
        NB,
        "block reduction: out[b] = the sum of block b's 64 elements, by a tree in shared memory",
        block_sum_cases,
        (
            "Each of the 32 threads first adds its two elements (0 past n), stores the sum in shared memory, and "
            "then the block halves the number of partial sums until one is left.",
            "partial[t] = a[b·64 + t] + a[b·64 + 32 + t] (each 0 past n); then for stride = 16, 8, 4, 2, 1: "
            "cuda.syncthreads(), and threads t < stride add partial[t + stride] into partial[t]; thread 0 writes "
            "out[b] = partial[0] after a last barrier.",
        ),
        suspects=(
            Suspect(
                "a tree that starts at stride 8 writes (it adds only partial[0..15]): the first stride is half the "
                "number of partial sums, 16",
                _sum_half_tree,
            ),
            Suspect(
                "a kernel whose threads add only one element each writes (the first 32 of the block's 64): thread t "
                "also owns element b·64 + 32 + t",
                _sum_one_each,
            ),
        ),
    ),
    Exercise(
        "warm_scan",
        NB,
        "scan: out[i] = a[block start] + … + a[i], an inclusive prefix sum inside each block of 32",
        scan_cases,
        (
            "Hillis–Steele: after the step with offset d, each slot holds the sum of its last 2d values. Every "
            "step reads the old values before any thread writes the new ones: two barriers per step.",
            "buf[t] = a[i] (0 past n); for d = 1, 2, 4, 8, 16: cuda.syncthreads(); v = buf[t − d] if t >= d else 0; "
            "cuda.syncthreads(); buf[t] += v. Then out[i] = buf[t] for i < n.",
        ),
        suspects=(
            Suspect(
                "an exclusive scan writes (out[i] = the sum of the elements BEFORE i): include a[i] itself",
                _scan_exclusive,
            ),
            Suspect(
                "a scan that stops after offset 8 writes (each output sums only the last 16 values): the offsets "
                "run 1, 2, 4, 8, 16 — while d < 32",
                _scan_window,
            ),
        ),
    ),
    Exercise(
        "warm_transpose",
        NB,
        "transpose, fast: out[c, r] = a[r, c] with coalesced reads AND writes, through a padded shared tile",
        transpose_cases,
        (
            "Writing out[c, r] straight from a[r, c] is correct, but one of the two sides then walks down a "
            "column: a warp's 32 lanes hit 32 different rows, one 32-byte sector each. Go through a shared 32×32 "
            "tile: read a tile of a row by row, write the tile of out row by row.",
            "Block (bx, by) owns a[by·32 …, bx·32 …]. Read: tile[ty + j, tx] = a[by·32 + ty + j, bx·32 + tx] for "
            "j = 0, 8, 16, 24. cuda.syncthreads(). Write: out[bx·32 + ty + j, by·32 + tx] = tile[tx, ty + j]. "
            "Test both indices against the bounds.",
            "tile[tx, …] walks down a column of the tile: with 32 floats per row every lane hits the same bank "
            "(32-way conflict). Declare the tile (32, 33): the extra column shifts each row by one bank.",
        ),
        perf=traffic_check(global_arrays=("a", "out"), shared_arrays=("*",), max_factor=2.0, max_shared_factor=1.0),
    ),
)
