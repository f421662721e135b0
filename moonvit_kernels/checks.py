"""What a kernel's output should be, and how close to it is close enough: the one set of checks that the
test suite, `gpu_check` and the Hopper preflight share.

- **Error measures.** `assert_close`: elementwise `|got − want| ≤ atol + rtol·|want|`, equal shapes, and
  any NaN/Inf on either side fails (the tests' measure). `rel_err`: `max|got − want| / max|want|`, NaN
  when `got` is not finite or has another shape (gpu_check's one number per kernel: a NaN is never "ok").
  `fp32_rtol(K)`: `factor · eps(fp32) · √K` for a float32 reduction of length K; `BF16_ULP`: the spacing
  of bf16 numbers in [1, 2); `pos_emb_tolerance`: the interpolation's, whose rounded source coordinate grows
  with the learned grid.
- **Data.** `random`: normal noise with a random offset (never uniform, never exactly centred);
  `bf16_round`: the float32 value a bf16 kernel sees; `sample_rows`: rows spread over a matrix, first and
  last included (GEMM rows and attention query rows are independent, so a sample checks them exactly).
- **Wants.** float64 results of one stage on exactly the inputs a kernel saw (bf16-rounded where it read
  bf16), from `moonvit_kernels.reference`: `gemm_want`, `attention_want`, `rmsnorm_want`, `rope_want`,
  `pos_emb_want`, `merge_want`, `input_check_want`. Each registry entry names its check case
  (`registry.KernelEntry.check`, `.want()`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import reference as ref
from .config import FP32_EPS, VisionConfig
from .weights import bf16_bits_to_float32, float32_to_bf16_bits

BF16_ULP = 2.0**-8  # round-to-nearest bf16 is within half of this, relative


# ============================================================================ error measures
def fp32_rtol(k: int, factor: float = 8.0) -> float:
    """A relative tolerance for a float32 reduction of length `k`: factor · eps · sqrt(k)."""
    return factor * FP32_EPS * max(1.0, math.sqrt(k))


# Interpolation weights as functions of the source coordinate s, maximised over the fraction of s (Keys cubic with
# A = -0.75 computed on a 2·10⁵-point grid of the fraction: Σ|w| = 1.375, Σ|dw/ds| = 3.0; bilinear: 1 and 2).
_INTERP_SUM_ABS = {"bilinear": 1.0, "bicubic": 1.375}
_INTERP_SLOPE = {"bilinear": 2.0, "bicubic": 3.0}


def pos_emb_tolerance(pos_weight: Any, mode: str) -> tuple[float, float]:
    """`(rtol, atol)` of a float32 position-embedding kernel against `pos_emb_want`.

    Two error sources. The arithmetic: a few float32 roundings of terms at most `Σ|w|²·max|pos|` (16 eps). The
    source coordinate `s = (o + 0.5)·(in/out) − 0.5`, which float32 rounds by up to `2·eps·in` (the quotient, the
    product and the difference; a GPU fuses the last two into one FMA, a CPU does not, so the two differ in the
    last bits): each axis's weights move by `slope·|Δs|`, so the output by `slope·|Δs|·Σ|w|·max|pos|`. This term
    grows with the learned grid (K3: 64 x 64), which is why a test on a small grid alone cannot show it.
    """
    pos = np.asarray(pos_weight, np.float64)
    H0, W0 = pos.shape[:2]
    peak, sum_abs, slope = float(np.max(np.abs(pos))), _INTERP_SUM_ABS[mode], _INTERP_SLOPE[mode]
    coordinate = sum(2 * FP32_EPS * n_in * slope * sum_abs * peak for n_in in (H0, W0))
    arithmetic = 16 * FP32_EPS * (1.0 + sum_abs**2 * peak)
    return 16 * FP32_EPS, arithmetic + coordinate


def assert_close(got: Any, want: Any, rtol: float, atol: float, name: str = "array") -> None:
    """AssertionError unless `|got − want| ≤ atol + rtol·|want|` elementwise with equal shapes and no NaN/Inf
    on either side; the message names the worst element, its values and its bound."""
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != reference {want.shape}"
    assert np.all(np.isfinite(want)), f"{name}: reference holds NaN/Inf"
    assert np.all(np.isfinite(got)), f"{name}: result holds NaN/Inf at {np.argwhere(~np.isfinite(got))[:3].tolist()}"
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    bound = atol + rtol * np.abs(want.astype(np.float64))
    if not np.all(err <= bound):
        i = np.unravel_index(np.argmax(err - bound), err.shape)
        raise AssertionError(
            f"{name}: max abs err {err.max():.3e}; worst at {tuple(int(j) for j in i)}: "
            f"got {got[i]!r}, ref {want[i]!r}, bound {bound[i]:.3e} (rtol={rtol:.1e}, atol={atol:.1e})"
        )


def rel_err(got: Any, want: Any) -> float:
    """max|got − want| / max|want|; NaN when `got` holds NaN/Inf or the shapes differ."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape or not np.all(np.isfinite(got)):
        return float("nan")
    return float(np.max(np.abs(got - want)) / max(1e-30, float(np.max(np.abs(want)))))


# ============================================================================ data
def to_host(a: Any) -> np.ndarray:
    """A device (CuPy, emulator) or host array as NumPy; bf16 bits (uint16) become the float32 values they hold."""
    a = a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)
    return bf16_bits_to_float32(a) if a.dtype == np.uint16 else a


def random(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
    """float32 normal noise times `scale` plus one random offset in [-0.3, 0.3)."""
    return (rng.standard_normal(shape) * scale + rng.uniform(-0.3, 0.3)).astype(np.float32)


def bf16_round(x: Any) -> np.ndarray:
    """float32 values rounded to the nearest bf16, as float32."""
    return bf16_bits_to_float32(float32_to_bf16_bits(np.asarray(x, dtype=np.float32)))


def sample_rows(n: int, count: int = 64) -> np.ndarray:
    """Up to `count` row indices spread over 0..n-1, the first and the last included."""
    return np.unique(np.linspace(0, n - 1, min(n, count)).round().astype(np.int64))


# ============================================================================ wants (float64)
def gemm_want(a: np.ndarray, b: np.ndarray, epilogue: str, residual: np.ndarray | None = None) -> np.ndarray:
    """`epilogue(a · bᵀ)` for a [M, K], b [N, K] (+ residual [M, N] for "residual"), float64."""
    lin = np.asarray(a, dtype=np.float64) @ np.asarray(b, dtype=np.float64).T
    if epilogue == "gelu_tanh":
        return ref.gelu_tanh(lin)
    if epilogue == "gelu_erf":
        return ref.gelu_erf(lin)
    if epilogue == "residual":
        if residual is None:
            raise ValueError("gemm_want: the residual epilogue needs residual [M, N]")
        return lin + np.asarray(residual, dtype=np.float64)
    if epilogue != "none":
        raise ValueError(f"gemm_want: unknown epilogue {epilogue!r}")
    return lin


def attention_want(
    qkv: np.ndarray, cu_seqlens: Any, heads: int, head_dim: int, rows: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Packed attention of `qkv [L, 3·heads·head_dim]` (q | k | v, head-major inside each) over the items
    `cu_seqlens`, float64: `(o [r, heads·head_dim], lse [r, heads])` for the query `rows` (all when None).
    Each sampled row attends to its own item only, through `reference.attention` on that row's item."""
    qkv = np.asarray(qkv, dtype=np.float64)
    L, Q = qkv.shape[0], heads * head_dim
    bounds = np.asarray(cu_seqlens, dtype=np.int64)
    rows = np.arange(L) if rows is None else np.asarray(rows, dtype=np.int64)
    o = np.empty((rows.size, Q))
    lse = np.empty((rows.size, heads))
    item_of = np.searchsorted(bounds, rows, side="right") - 1
    for item in np.unique(item_of):
        s, e = int(bounds[item]), int(bounds[item + 1])
        mine = np.flatnonzero(item_of == item)
        q = qkv[rows[mine], :Q].reshape(-1, heads, head_dim)
        k, v = (qkv[s:e, j * Q : (j + 1) * Q].reshape(e - s, heads, head_dim) for j in (1, 2))
        # the sampled rows as a query set of their own against the item's keys (reference.attention with
        # one item whose query count differs from its key count)
        o_i, lse_i = ref.attention_rows(q, k, v)
        o[mine] = o_i.reshape(-1, Q)
        lse[mine] = lse_i
    return o, lse


def rmsnorm_want(x: np.ndarray, weight: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """`(y [rows, D], rstd [rows])` of RMSNorm over the last axis, float64."""
    return ref.rmsnorm(np.asarray(x, np.float64), np.asarray(weight, np.float64), eps, return_rstd=True)


def rope_want(qkv: np.ndarray, grid_thws: np.ndarray, heads: int, head_dim: int) -> np.ndarray:
    """float64 `qkv [L, 3Q]` with the 2D RoPE applied to q and k (v untouched); angles in float32, as the
    source model and the kernels compute them."""
    L, Q = qkv.shape[0], heads * head_dim
    out = np.asarray(qkv, dtype=np.float64).copy()
    angles = ref.rope_angles_packed(grid_thws, head_dim, np.float32).astype(np.float64)
    for s in (0, 1):
        block = out[:, s * Q : (s + 1) * Q].reshape(L, heads, head_dim)
        out[:, s * Q : (s + 1) * Q] = ref.apply_rope(block, angles).reshape(L, Q)
    return out


def pos_emb_want(x: np.ndarray, grid_thws: np.ndarray, pos_weight: np.ndarray, config: VisionConfig) -> np.ndarray:
    """float64 `x [L, D]` plus the interpolated position embedding and time term of every item."""
    return np.asarray(x, np.float64) + ref.position_embedding(grid_thws, np.asarray(pos_weight, np.float64), config)


def merge_want(x: np.ndarray, grid_thws: np.ndarray, merge_kernel_size: tuple[int, int]) -> np.ndarray:
    """float64 `[Σ merged tokens, kh·kw·D]`: every item's temporal-pool patch merge, flattened slot-major."""
    items = ref.tpool_patch_merger(np.asarray(x, np.float64), grid_thws, merge_kernel_size)
    return np.concatenate([m.reshape(m.shape[0], -1) for m in items], axis=0)


def input_check_want(x: np.ndarray) -> int:
    """The first row of `x [rows, cols]` holding NaN or Inf, -1 when every value is finite (what the
    device input check reports)."""
    bad = np.flatnonzero(~np.isfinite(np.asarray(x)).all(axis=1))
    return int(bad[0]) if bad.size else -1
