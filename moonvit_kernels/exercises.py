""" "Your turn" exercises of the workbook: run a learner's kernel, compare it with NumPy, say what is wrong.

Each exercise is a small numba.cuda kernel the learner completes in a notebook cell; `check(name,
kernel)` launches it (on the CUDA simulator without a GPU, on the GPU where there is one) on random,
non-uniform inputs of awkward sizes (no dimension a multiple of the block), compares the output with
a float64 NumPy reference under an elementwise error bound, and prints a verdict in plain words:
which output rows and columns are wrong, NaN/Inf, elements never written, writes past the end, an
out-of-bounds index, or results that change between two identical runs (a race is suspected).

`check` returns a `CheckResult` and never raises for a wrong kernel (the committed notebooks keep
the stubs), unless `strict=True`. The kernel object is passed in, so re-running the learner's cell
after an edit checks the new kernel: nothing is cached by name.

Solutions live in `notebooks/solutions/NN_<name>.py`; `solution(name)` prints one, and
`load_solution(name)` compiles it (the tests check every solution passes and every stub fails).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import reference

FP32_EPS = float(np.finfo(np.float32).eps)
# Every output element starts as this value (float) or INT_SENTINEL (int32): what still holds it was
# never written.
SENTINEL = np.float32(-7.77e37)
INT_SENTINEL = np.int32(-999_999)
GUARD_ROWS = 2  # extra rows after the output, filled with the sentinel: a write there is out of bounds
SOLUTIONS_DIR = Path(__file__).resolve().parents[1] / "notebooks" / "solutions"
ROPE_THETA = np.float32(10000.0)


@dataclass
class Case:
    """One launch of an exercise: arguments in order (`OUT` marks the output), grid, block, reference."""

    args: list[Any]
    out_shape: tuple[int, ...]
    grid: tuple[int, ...] | int
    block: tuple[int, ...] | int
    expected: np.ndarray  # float64 (or int) reference of the output
    bound: np.ndarray | float  # allowed |got − expected|, elementwise or one number
    arg_names: str  # the launch as the learner reads it, e.g. "A, B, C, M, N, K"
    axes: tuple[str, str] = ("rows", "columns")  # plural names of the output's two axes
    out_dtype: Any = np.float32


OUT = object()  # placeholder for the output array in Case.args


@dataclass(frozen=True)
class Exercise:
    """A "your turn" kernel: its notebook, what it computes, how to build a case, a hint on failure."""

    name: str
    notebook: str
    task: str
    make_case: Callable[[np.random.Generator], Case]
    hint: str


@dataclass
class CheckResult:
    """The verdict of `check`: `passed`, the explanation `message`, and the arrays compared."""

    name: str
    passed: bool
    message: str
    got: np.ndarray | None = None
    expected: np.ndarray | None = None
    problems: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return f"CheckResult({self.name!r}, passed={self.passed})"


class ExerciseFailed(AssertionError):
    """Raised by `check(..., strict=True)` when the kernel is wrong; the message says why."""


# ============================================================================ helpers for the cases
def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _gemm_bound(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`8·eps·√K · (|A|·|B|ᵀ)`: the fp32 error bound of a length-K dot product, elementwise."""
    k = a.shape[1]
    return 8 * FP32_EPS * math.sqrt(k) * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T) + 1e-30


def _awkward(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
    """Non-uniform random float32 values: normal, scaled, shifted, with a few larger entries."""
    x = rng.standard_normal(shape) * scale + rng.uniform(-0.3, 0.3) * scale
    x.flat[rng.integers(0, x.size, max(1, x.size // 20))] *= 4
    return x.astype(np.float32)


# ============================================================================ 01 GEMM
GEMM_M, GEMM_N, GEMM_K, GEMM_TILE = 29, 19, 35, 16


def _gemm_case(rng: np.random.Generator) -> Case:
    a = _awkward(rng, (GEMM_M, GEMM_K))
    b = _awkward(rng, (GEMM_N, GEMM_K))
    grid = (_ceil(GEMM_N, GEMM_TILE), _ceil(GEMM_M, GEMM_TILE))
    return Case(
        args=[a, b, OUT, np.int32(GEMM_M), np.int32(GEMM_N), np.int32(GEMM_K)],
        out_shape=(GEMM_M, GEMM_N),
        grid=grid,
        block=(GEMM_TILE, GEMM_TILE),
        expected=a.astype(np.float64) @ b.astype(np.float64).T,
        bound=_gemm_bound(a, b),
        arg_names="A, B, C, M, N, K",
        axes=("rows m", "columns n"),
    )


def _gemm_register_case(rng: np.random.Generator) -> Case:
    case = _gemm_case(rng)
    case.grid = (_ceil(GEMM_N, 2 * GEMM_TILE), _ceil(GEMM_M, 2 * GEMM_TILE))  # 32×32 outputs per block
    return case


# ============================================================================ 02 RMSNorm
NORM_ROWS, NORM_COLS, NORM_THREADS, NORM_EPS = 7, 75, 32, 1e-5


def _rmsnorm_case(rng: np.random.Generator) -> Case:
    x = _awkward(rng, (NORM_ROWS, NORM_COLS), scale=2.0)
    x[3] *= 1e-3  # one nearly-zero row: eps matters there
    weight = (1.0 + 0.3 * rng.standard_normal(NORM_COLS)).astype(np.float32)
    want, rstd = reference.rmsnorm(x.astype(np.float64), weight.astype(np.float64), NORM_EPS, return_rstd=True)
    bound = 8 * FP32_EPS * math.sqrt(NORM_COLS) * np.abs(x) * rstd[:, None] * np.abs(weight) + 1e-30
    return Case(
        args=[x, weight, OUT, np.int32(NORM_ROWS), np.int32(NORM_COLS), np.float32(NORM_EPS)],
        out_shape=(NORM_ROWS, NORM_COLS),
        grid=NORM_ROWS,
        block=NORM_THREADS,
        expected=want,
        bound=bound,
        arg_names="x, weight, out, rows, cols, eps",
        axes=("rows", "columns"),
    )


# ============================================================================ 03 RoPE
ROPE_H, ROPE_W, ROPE_HD = 5, 7, 16
ROPE_ITEMS = ((2, 3, 5), (1, 4, 3))  # packed (t, h, w): a 2-frame video, then an image


def _rope_rotate_case(rng: np.random.Generator) -> Case:
    L = ROPE_H * ROPE_W
    x = _awkward(rng, (L, ROPE_HD))
    rows, cols = (v.astype(np.int32) for v in np.divmod(np.arange(L), ROPE_W))
    angles = reference.rope_angles(ROPE_H, ROPE_W, ROPE_HD).astype(np.float64)  # fp32 frequencies, as the kernel
    want = reference.apply_rope(x.astype(np.float64)[:, None, :], angles)[:, 0, :]
    pair = np.abs(x[:, 0::2]) + np.abs(x[:, 1::2])
    bound = np.repeat(32 * FP32_EPS * (1 + angles) * pair, 2, axis=1) + 1e-30
    return Case(
        args=[x, rows, cols, OUT, np.int32(ROPE_HD)],
        out_shape=(L, ROPE_HD),
        grid=L,
        block=ROPE_HD // 4,
        expected=want,
        bound=bound,
        arg_names="x, rows, cols, out, head_dim",
        axes=("tokens", "dims"),
    )


def _rope_position_case(rng: np.random.Generator) -> Case:
    grid_thws = np.array(ROPE_ITEMS, dtype=np.int32)
    sizes = np.prod(grid_thws.astype(np.int64), axis=1)
    cu = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    L = int(cu[-1])
    want = np.concatenate([np.tile(np.stack(np.divmod(np.arange(h * w), w), axis=1), (t, 1)) for t, h, w in ROPE_ITEMS])
    return Case(
        args=[grid_thws, cu, np.int32(len(ROPE_ITEMS)), OUT, np.int32(L)],
        out_shape=(L, 2),
        grid=_ceil(L, 32),
        block=32,
        expected=want,
        bound=0.0,
        arg_names="grid_thws, cu_seqlens, n_items, pos, L",
        axes=("tokens", "entries (0 = row, 1 = col)"),
        out_dtype=np.int32,
    )


FUSED_H, FUSED_W, FUSED_HEADS, FUSED_HD, FUSED_DIN = 3, 5, 2, 8, 20


def _rope_fused_case(rng: np.random.Generator) -> Case:
    L, Q = FUSED_H * FUSED_W, FUSED_HEADS * FUSED_HD
    x = _awkward(rng, (L, FUSED_DIN))
    w = _awkward(rng, (3 * Q, FUSED_DIN), scale=0.3)
    rows, cols = (v.astype(np.int32) for v in np.divmod(np.arange(L), FUSED_W))
    plain = x.astype(np.float64) @ w.astype(np.float64).T
    angles = reference.rope_angles(FUSED_H, FUSED_W, FUSED_HD).astype(np.float64)
    want = plain.copy()
    for s in (0, 1):  # q and k are rotated, v is not
        part = plain[:, s * Q : (s + 1) * Q].reshape(L, FUSED_HEADS, FUSED_HD)
        want[:, s * Q : (s + 1) * Q] = reference.apply_rope(part, angles).reshape(L, Q)
    g = _gemm_bound(x, w)
    pair_g = np.repeat(np.maximum(g[:, 0::2], g[:, 1::2]), 2, axis=1)
    pair_abs = np.repeat(np.abs(plain[:, 0::2]) + np.abs(plain[:, 1::2]), 2, axis=1)
    bound = 2 * pair_g + 32 * FP32_EPS * (1 + angles.max()) * pair_abs + 1e-30
    pairs = 3 * Q // 2
    return Case(
        args=[x, w, rows, cols, OUT, np.int32(L), np.int32(FUSED_DIN), np.int32(FUSED_HEADS), np.int32(FUSED_HD)],
        out_shape=(L, 3 * Q),
        grid=(_ceil(pairs, GEMM_TILE), _ceil(L, GEMM_TILE)),
        block=(GEMM_TILE, GEMM_TILE),
        expected=want,
        bound=bound,
        arg_names="x, W, rows, cols, qkv, L, Din, heads, head_dim",
        axes=("tokens", "columns (q | k | v)"),
    )


# ============================================================================ 04 attention
ATT_L, ATT_HD = 23, 16


def _attention_case(rng: np.random.Generator) -> Case:
    q = _awkward(rng, (ATT_L, ATT_HD), scale=4.0)  # scores reach ±100: exp without the max overflows fp32
    k = _awkward(rng, (ATT_L, ATT_HD), scale=4.0)
    v = _awkward(rng, (ATT_L, ATT_HD))
    scale = np.float32(1.0 / math.sqrt(ATT_HD))
    s = (q.astype(np.float64) @ k.astype(np.float64).T) * float(scale)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    want = p @ v.astype(np.float64)
    smax = np.abs(s).max(axis=1, keepdims=True)
    bound = 16 * FP32_EPS * (1 + smax) * math.sqrt(ATT_L) * (p @ np.abs(v.astype(np.float64))) + 1e-6 * FP32_EPS
    return Case(
        args=[q, k, v, OUT, np.int32(ATT_L), scale],
        out_shape=(ATT_L, ATT_HD),
        grid=1,
        block=32,
        expected=want,
        bound=bound,
        arg_names="q, k, v, out, L, scale",
        axes=("queries", "dims"),
    )


# ============================================================================ 05 merge and projector
MERGE_T, MERGE_H, MERGE_W, MERGE_D, MERGE_K = 2, 6, 4, 5, 2
PROJ_N = 13


def _merged(x: np.ndarray) -> np.ndarray:
    grid = np.array([[MERGE_T, MERGE_H, MERGE_W]])
    (m,) = reference.tpool_patch_merger(x.astype(np.float64), grid, (MERGE_K, MERGE_K))
    return m.reshape(m.shape[0], -1)


def _merge_case(rng: np.random.Generator) -> Case:
    x = _awkward(rng, (MERGE_T * MERGE_H * MERGE_W, MERGE_D))
    want = _merged(x)
    return Case(
        args=[x, OUT, np.int32(MERGE_T), np.int32(MERGE_H), np.int32(MERGE_W), np.int32(MERGE_D)],
        out_shape=want.shape,
        grid=want.shape[0],
        block=32,
        expected=want,
        bound=4 * FP32_EPS * np.abs(want) + 4 * FP32_EPS * np.abs(x).max(),
        arg_names="x, out, t, h, w, D",
        axes=("merged tokens", "columns (slot·D + d)"),
    )


def _fused_gather_case(rng: np.random.Generator) -> Case:
    x = _awkward(rng, (MERGE_T * MERGE_H * MERGE_W, MERGE_D))
    a = _merged(x)
    b = _awkward(rng, (PROJ_N, a.shape[1]))
    M = a.shape[0]
    return Case(
        args=[x, b, OUT, np.int32(MERGE_T), np.int32(MERGE_H), np.int32(MERGE_W), np.int32(MERGE_D), np.int32(PROJ_N)],
        out_shape=(M, PROJ_N),
        grid=(_ceil(PROJ_N, GEMM_TILE), _ceil(M, GEMM_TILE)),
        block=(GEMM_TILE, GEMM_TILE),
        expected=a @ b.astype(np.float64).T,
        bound=_gemm_bound(a, b) * 2,
        arg_names="x, B, C, t, h, w, D, N",
        axes=("merged tokens m", "columns n"),
    )


# ============================================================================ 06 full encoder
POS_H0, POS_W0, POS_H, POS_W, POS_D = 6, 6, 4, 9, 7
MLP_M, MLP_N, MLP_K = 23, 19, 30


def _pos_bilinear_case(rng: np.random.Generator) -> Case:
    grid = _awkward(rng, (POS_H0, POS_W0, POS_D))
    want = reference.interpolate_pos_grid(grid.astype(np.float64), POS_H, POS_W, "bilinear").reshape(POS_H * POS_W, -1)
    bound = np.full(want.shape, 16 * FP32_EPS * np.abs(grid).max())  # a convex mix of 4 values
    return Case(
        args=[grid, OUT, np.int32(POS_H), np.int32(POS_W)],
        out_shape=want.shape,
        grid=POS_H * POS_W,
        block=32,
        expected=want,
        bound=bound,
        arg_names="grid, out, h, w",
        axes=("patches (row·w + col)", "channels"),
    )


def _gelu_epilogue_case(rng: np.random.Generator) -> Case:
    a = _awkward(rng, (MLP_M, MLP_K))
    b = _awkward(rng, (MLP_N, MLP_K), scale=0.5)
    prod = a.astype(np.float64) @ b.astype(np.float64).T
    want = reference.gelu_tanh(prod)
    bound = 2 * _gemm_bound(a, b) + 8 * FP32_EPS * np.abs(prod)
    return Case(
        args=[a, b, OUT, np.int32(MLP_M), np.int32(MLP_N), np.int32(MLP_K)],
        out_shape=(MLP_M, MLP_N),
        grid=(_ceil(MLP_N, GEMM_TILE), _ceil(MLP_M, GEMM_TILE)),
        block=(GEMM_TILE, GEMM_TILE),
        expected=want,
        bound=bound,
        arg_names="A, B, C, M, N, K",
        axes=("rows m", "columns n"),
    )


# ============================================================================ 08 Hopper
SWIZZLE_ROWS, SWIZZLE_BASE = 21, 0x800  # a tile of 21 rows x 64 bf16 (128-byte rows) at a 1024-aligned address


def _swizzle_case(rng: np.random.Generator) -> Case:
    """Byte address of element (r, k) of a K-major bf16 tile under the 128-byte swizzle (PTX ISA figure):
    16-byte chunk j of row r is stored at chunk position j XOR (r mod 8)."""
    r = np.arange(SWIZZLE_ROWS)[:, None]
    byte = 2 * np.arange(64)[None, :]
    want = SWIZZLE_BASE + 128 * r + 16 * ((byte // 16) ^ (r % 8)) + byte % 16
    return Case(
        args=[np.int32(SWIZZLE_BASE), OUT],
        out_shape=(SWIZZLE_ROWS, 64),
        grid=1,
        block=32,
        expected=want,
        bound=0.0,
        arg_names="base, out",
        axes=("tile rows r", "columns k"),
        out_dtype=np.int32,
    )


def _descriptor_params() -> np.ndarray:
    """(shared address, LBO bytes, SBO bytes, swizzle code) of descriptors the sm90 kernels build, and a few more."""
    base = 0x800  # the 1024-aligned start of the GEMM's ring in the emulator's shared memory
    rows = [(base + s * 16384 + m * 128 + kk * 32, 16, 1024, 1) for s in (0, 3) for m in (0, 64) for kk in range(4)]
    rows += [(base + 65536 + s * 16384 + kk * 32, 16, 1024, 1) for s in (0, 3) for kk in range(4)]  # B
    rows += [(base + 8192 + kk * 32, 16, 1024, 1) for kk in range(4)]  # attention's 2nd 64-dim block of Q
    rows += [(0x1230, 128, 256, 0), (0x2040, 16, 512, 2), (0x3020, 16, 256, 3)]  # no swizzle, 64B, 32B
    return np.array(rows, dtype=np.int32)


def _descriptor_case(rng: np.random.Generator) -> Case:
    """wgmma's 64-bit matrix descriptor as four 16-bit words (PTX ISA, "Matrix Descriptor Format")."""
    p = _descriptor_params().astype(np.int64)
    want = np.stack([(p[:, 0] & 0x3FFFF) >> 4, (p[:, 1] >> 4) & 0x3FFF, (p[:, 2] >> 4) & 0x3FFF, p[:, 3] << 14], 1)
    return Case(
        args=[_descriptor_params(), OUT],
        out_shape=want.shape,
        grid=1,
        block=32,
        expected=want,
        bound=0.0,
        arg_names="params, out",
        axes=("descriptors", "16-bit words (0 start, 1 LBO, 2 SBO, 3 mode)"),
        out_dtype=np.int32,
    )


# ============================================================================ the catalogue
EXERCISES: dict[str, Exercise] = {
    e.name: e
    for e in (
        Exercise(
            "gemm_naive",
            "01_patch_embed_gemm",
            "one thread per output: C[m, n] = Σ_k A[m, k]·B[n, k]",
            _gemm_case,
            "Each thread owns one (m, n): skip threads outside C (the grid overshoots M and N), loop k over all of "
            "K, and store the float32 sum in C[m, n].",
        ),
        Exercise(
            "gemm_tile_loads",
            "01_patch_embed_gemm",
            "GEMM v2: stage 16×16 tiles of A and B in shared memory",
            _gemm_case,
            "Thread (ty, tx) stages a_tile[ty, tx] = A[m, k0 + tx] and b_tile[ty, tx] = B[n_load, k0 + tx]; past the "
            "edge of A or B it must store 0.0 (the last K tile is partial: K = 35). Consecutive tx read consecutive "
            "k: coalesced.",
        ),
        Exercise(
            "gemm_register_tile",
            "01_patch_embed_gemm",
            "GEMM v3's idea: each thread accumulates a 2×2 patch of outputs in registers",
            _gemm_register_case,
            "For each kk of the tile: load a_reg[i] = a_tile[ty·TM + i, kk] (i < TM) and b_reg[j] = "
            "b_tile[tx·TN + j, kk] (j < TN) into registers, then acc[i, j] += a_reg[i]·b_reg[j] — TM·TN FMAs for "
            "TM + TN shared-memory reads.",
        ),
        Exercise(
            "rmsnorm_reduction",
            "02_rmsnorm",
            "the shared-memory tree that adds the block's 32 partial sums",
            _rmsnorm_case,
            "Halve `stride` from THREADS/2 down to 1; threads tid < stride add partial[tid + stride] into "
            "partial[tid]; every thread must reach a cuda.syncthreads() after each step (keep it outside the if).",
        ),
        Exercise(
            "rmsnorm_sum_and_scale",
            "02_rmsnorm",
            "the strided loops: each thread sums x² over its columns, then scales them",
            _rmsnorm_case,
            "A block of 32 threads covers 75 columns: thread tid takes j = tid, tid + 32, tid + 64 "
            "(range(tid, cols, THREADS)). After the reduction, write out[row, j] = x[row, j]·r·weight[j] "
            "over the same columns.",
        ),
        Exercise(
            "rope_rotate_pairs",
            "03_rope_2d",
            "rotate the width pair (4i, 4i+1) by col·f_i and the height pair (4i+2, 4i+3) by row·f_i",
            _rope_rotate_case,
            "(a, b) -> (a·cos − b·sin, a·sin + b·cos); the pair (4i, 4i+1) turns by cols[l]·f_i, the pair "
            "(4i+2, 4i+3) by rows[l]·f_i. Token 0 sits at (0, 0): a kernel that copies x is right only there.",
        ),
        Exercise(
            "rope_token_position",
            "03_rope_2d",
            "the (row, col) of token l of a packed batch: find its item, then its place in the frame",
            _rope_position_case,
            "Find the item n with cu_seqlens[n] <= l < cu_seqlens[n + 1]; p = (l − cu_seqlens[n]) mod (h·w) "
            "(every frame of a video restarts at (0, 0)); row = p // w, col = p mod w.",
        ),
        Exercise(
            "rope_qkv_epilogue",
            "03_rope_2d",
            "fusion: the wqkv GEMM rotates q and k in its epilogue, before the store",
            _rope_fused_case,
            "Column c = 2p of q or k (c < 2·Q) sits at dim d = c mod head_dim of its head: frequency i = d // 4, "
            "and it turns by cols[m]·f_i when d mod 4 < 2 (width pair), by rows[m]·f_i otherwise (height pair). "
            "Rotate (c0, c1) -> (c0·cos − c1·sin, c0·sin + c1·cos); v columns (c >= 2·Q) are stored as they are.",
        ),
        Exercise(
            "attention_softmax",
            "04_attention",
            "one thread per query: the row maximum, then the exp-weights and their sum",
            _attention_case,
            "Pass 1: m = max over keys of the scores. Pass 2: p = exp(s − m), l += p, acc[d] += p·v[j, d]. "
            "Without subtracting m, exp overflows: the scores here reach ±100 and fp32 exp overflows above 88.",
        ),
        Exercise(
            "online_softmax_rescale",
            "04_attention",
            "one pass over the keys: rescale the running sums whenever the maximum grows",
            _attention_case,
            "When the running maximum grows from m to m_new, everything accumulated so far was weighted by "
            "exp(s − m): multiply l and acc by alpha = exp(m − m_new) before adding the new key's p = exp(s − m_new).",
        ),
        Exercise(
            "merge_index",
            "05_merge_and_projector",
            "which patch slot (a, b) of merged token m = i·(w/2) + j comes from",
            _merge_case,
            "Merged token m covers rows 2i, 2i+1 and columns 2j, 2j+1 of the patch grid, with i = m // (w/2), "
            "j = m mod (w/2); slot = a·2 + b reads patch (2i + a)·w + (2j + b) of each frame.",
        ),
        Exercise(
            "fused_gather_gemm",
            "05_merge_and_projector",
            "the projector GEMM reading its A operand straight from x through the merge index",
            _fused_gather_case,
            "Column k of the merged row m is slot = k // D, d = k mod D: A[m, k] is the frame mean of "
            "x[f·h·w + patch, d] with patch from the merge index. x has only D columns: x[m, k] runs past them.",
        ),
        Exercise(
            "pos_emb_bilinear",
            "06_full_encoder",
            "resize the learned position grid bilinearly, F.interpolate(align_corners=False)",
            _pos_bilinear_case,
            "Source row sy = (r + 0.5)·(H0/h) − 0.5, clamped at 0; y0 = floor(sy) (at most H0 − 1), "
            "y1 = min(y0 + 1, H0 − 1), weight sy − y0 on y1; the same along columns with W0/w; sum the 4 taps. "
            "The placeholder uses align_corners=True, r·(H0 − 1)/(h − 1): a different sampling grid that shifts "
            "almost every sample.",
        ),
        Exercise(
            "gelu_tanh_epilogue",
            "06_full_encoder",
            "the MLP's fc0 GEMM with its GELU (tanh form) fused into the store",
            _gelu_epilogue_case,
            "gelu_tanh(v) = 0.5·v·(1 + tanh(√(2/π)·(v + 0.044715·v³))), applied to the float32 sum just before "
            "C[m, n] is written (not the erf form: that one is the projector's).",
        ),
        Exercise(
            "swizzle_128b",
            "08_hopper",
            "the shared-memory address of element (r, k) of a tile stored with the 128-byte swizzle",
            _swizzle_case,
            "Row r is 128 bytes: base + 128·r. Byte b = 2·k of the row lies in 16-byte chunk j = b // 16 at "
            "offset b mod 16; the swizzle stores chunk j at chunk position j XOR (r mod 8). Rows 0, 8, 16 are "
            "not permuted, which is why only they are right without the XOR.",
        ),
        Exercise(
            "wgmma_desc",
            "08_hopper",
            "wgmma's shared-memory matrix descriptor, field by field",
            _descriptor_case,
            "Addresses and offsets are stored in 16-byte units: word 0 = (address & 0x3FFFF) >> 4 (bits 0–13), "
            "word 1 = LBO >> 4 (bits 16–29), word 2 = SBO >> 4 (bits 32–45), word 3 = swizzle code << 14 "
            "(bits 62–63 of the descriptor are bits 14–15 of its last 16-bit word).",
        ),
    )
}


# ============================================================================ check
def _ranges(idx: Sequence[int], limit: int = 8) -> str:
    """`[0, 1, 2, 5, 7, 8]` -> `"0–2, 5, 7–8"` (at most `limit` runs, then "…")."""
    idx = sorted(set(int(i) for i in idx))
    runs: list[tuple[int, int]] = []
    for i in idx:
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    text = ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in runs[:limit])
    return text + (", …" if len(runs) > limit else "")


def _where(mask: np.ndarray, axes: tuple[str, str], total: tuple[int, ...]) -> str:
    """Which rows and columns hold the True entries of a 2-D mask, in words."""
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    row_text = f"all {axes[0]}" if len(rows) == total[0] else f"{axes[0]} {_ranges(rows)}"
    col_text = f"all {axes[1]}" if len(cols) == total[1] else f"{axes[1]} {_ranges(cols)}"
    return f"{row_text}; {col_text}"


def _launch(kernel: Any, case: Case) -> tuple[np.ndarray, np.ndarray]:
    """Run the kernel once on fresh device copies; returns (output, the guard rows after it)."""
    from moonvit_kernels.numba_backend._cuda import cuda

    fill = INT_SENTINEL if case.out_dtype == np.int32 else SENTINEL
    full = np.full((case.out_shape[0] + GUARD_ROWS, *case.out_shape[1:]), fill, dtype=case.out_dtype)
    full_d = cuda.to_device(full)
    out_d = full_d[: case.out_shape[0]]
    args = [out_d if a is OUT else (cuda.to_device(a) if isinstance(a, np.ndarray) else a) for a in case.args]
    kernel[case.grid, case.block](*args)
    cuda.synchronize()
    back = full_d.copy_to_host()
    return back[: case.out_shape[0]], back[case.out_shape[0] :]


def _diagnose(case: Case, got: np.ndarray, guard: np.ndarray) -> list[str]:
    """Plain-words problems of one run's output (empty when it matches the reference)."""
    fill = INT_SENTINEL if case.out_dtype == np.int32 else SENTINEL
    shape2 = got.reshape(got.shape[0], -1).shape
    problems = []
    if np.any(guard != fill):
        problems.append(
            f"the kernel wrote past the end of the output (into the {GUARD_ROWS} guard rows "
            "after it): an index runs out of bounds — is a bounds test missing?"
        )
    unwritten = (got == fill).reshape(shape2)
    if unwritten.all():
        shown = fill if case.out_dtype == np.int32 else format(fill, ".3g")
        problems.append(
            f"the kernel never wrote the output: every element still holds the fill value {shown}. "
            "Is the gap still empty, or does a bounds test skip every thread?"
        )
        return problems
    if unwritten.any():
        problems.append(
            f"{int(unwritten.sum())} of {unwritten.size} outputs were never written: "
            f"{_where(unwritten, case.axes, shape2)}"
        )
    written = ~unwritten
    got64 = got.astype(np.float64)
    if case.out_dtype != np.int32:
        bad_value = (~np.isfinite(got64)).reshape(shape2) & written
        if bad_value.any():
            kinds = "NaN" if np.isnan(got64).any() else "Inf"
            problems.append(
                f"{int(bad_value.sum())} outputs are {kinds} ({_where(bad_value, case.axes, shape2)}): "
                "an overflow (exp of a large number?), a 0/0, or a read of uninitialised memory"
            )
        written &= ~bad_value
    err = np.abs(got64 - case.expected)
    bound = np.broadcast_to(np.asarray(case.bound, dtype=np.float64), err.shape)
    wrong = ((err > bound).reshape(shape2)) & written
    if wrong.any():
        i = np.unravel_index(np.argmax(np.where(wrong.reshape(err.shape), err - bound, -np.inf)), err.shape)
        index = ", ".join(str(int(j)) for j in i)
        text = (
            f"{int(wrong.sum())} of {wrong.size} outputs are wrong: {_where(wrong, case.axes, shape2)}. "
            f"Worst at [{index}]: got {float(got[i]):.6g}, expected {float(case.expected[i]):.6g} "
            f"(allowed error {bound[i]:.2g})"
        )
        if np.all(got64.reshape(shape2)[wrong] == 0):
            text += ". Every wrong output is exactly 0: nothing was accumulated there"
        problems.append(text)
    return problems


def check(name: str, kernel: Any, strict: bool = False, seed: int = 0, verbose: bool = True) -> CheckResult:
    """Run the learner's `kernel` for exercise `name` against the NumPy reference; print the verdict.

    The kernel is launched twice on the same random inputs (a different result the second time
    means a race is likely). Returns a `CheckResult`; with `strict=True` a wrong kernel raises
    `ExerciseFailed` instead. A kernel that raises (for example an index out of bounds under the
    simulator) is reported, not propagated.
    """
    if name not in EXERCISES:
        raise ValueError(f"no exercise named {name!r}; known: {', '.join(EXERCISES)}")
    if not hasattr(kernel, "__getitem__"):
        raise TypeError(f"{name}: expected a @cuda.jit kernel, got {type(kernel).__name__}; decorate it with @cuda.jit")
    ex = EXERCISES[name]
    case = ex.make_case(np.random.default_rng(seed))
    launch = f"{name}[{case.grid}, {case.block}]({case.arg_names}), output {case.out_shape}"
    got, problems = None, []
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            got, guard = _launch(kernel, case)
            problems = _diagnose(case, got, guard)
            if not any("never wrote" in p for p in problems):
                again, _ = _launch(kernel, case)
                if not np.array_equal(got, again, equal_nan=True):
                    changed = ((got != again) & ~(np.isnan(got) & np.isnan(again))).reshape(got.shape[0], -1)
                    problems.append(
                        "two runs on the same input gave different results "
                        f"({_where(changed, case.axes, changed.shape)}): "
                        "a race is suspected — a missing cuda.syncthreads(), two threads writing one element, "
                        "or a read of memory nothing wrote (shared memory starts as garbage)"
                    )
    except IndexError as e:
        problems.append(f"an index is out of bounds ({e}). Check the bounds test and the index arithmetic.")
    except Exception as e:  # a compile or launch error: the learner's code, reported not raised
        problems.append(f"the kernel did not run: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    passed = not problems
    if passed:
        message = f"✓ {name}: correct — {launch}, every output within the error bound."
    else:
        message = "\n".join([f"✗ {name}: not yet — {launch}", *(f"  • {p}" for p in problems), f"  hint: {ex.hint}"])
    result = CheckResult(name, passed, message, got, case.expected, problems)
    if verbose:
        print(message)
    if strict and not passed:
        raise ExerciseFailed(message)
    return result


def catalogue() -> str:
    """A Markdown table of every exercise: notebook, name, what the learner writes."""
    rows = ["| notebook | exercise | you write |", "|---|---|---|"]
    rows += [f"| {e.notebook} | `{e.name}` | {e.task} |" for e in EXERCISES.values()]
    return "\n".join(rows)


# ============================================================================ solutions
def solution_path(name: str) -> Path:
    """Path of the solution file `notebooks/solutions/NN_<name>.py` of exercise `name`."""
    if name not in EXERCISES:
        raise ValueError(f"no exercise named {name!r}; known: {', '.join(EXERCISES)}")
    path = SOLUTIONS_DIR / f"{EXERCISES[name].notebook[:2]}_{name}.py"
    if not path.is_file():
        raise FileNotFoundError(
            f"solution {path.name} not found in {SOLUTIONS_DIR}: the solutions ship with the repository "
            "(notebooks/solutions/), not with an installed wheel — use a checkout (pip install -e .)"
        )
    return path


def solution(name: str, show: bool = True) -> str:
    """The source of exercise `name`'s solution; printed unless `show=False`."""
    text = solution_path(name).read_text()
    if show:
        print(text)
    return text


def load_solution(name: str) -> Any:
    """Compile the solution of exercise `name` and return its kernel (named like the exercise)."""
    namespace: dict[str, Any] = {"__name__": f"solution_{name}"}
    path = solution_path(name)
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace[name]
