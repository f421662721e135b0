"""The NumPy oracle of the Kimi K3 vision tower (MoonViT-V2): every stage, readable as a spec.

Each function is one stage of docs/model.md, in the same order:

1. `patch_embed`            pixel patches [L, 3, p, p] -> tokens [L, D]          (one GEMM)
2. `add_position_embedding` + interpolated 2D grid (+ sin/cos time term for videos)
3. `encoder_layer` x N      rmsnorm -> qkv -> 2D RoPE -> packed attention -> wo -> MLP
4. `rmsnorm`                final_layernorm
5. `tpool_patch_merger`     mean over frames, kh x kw gather -> [M, kh*kw, D]
6. `projector`              Linear -> GELU(erf) -> Linear -> rmsnorm -> [M, T]

`vision_forward` chains them. Everything is computed in the requested dtype (float32 by
default, float64 on request); norms and softmax are never below float32. Weights are a dict
in the real checkpoint names (`moonvit_kernels.weights`).

Packed sequences: several media items (rows of `grid_thws`, each `(t, h, w)`) are concatenated
along the token axis; their boundaries are `cu_seqlens = [0, t0*h0*w0, ...]` and no item ever
attends to another.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from scipy.special import erf

from . import packing
from .config import ROPE_THETA, VisionConfig
from .packing import validate_grid_thws
from .weights import check_weights

# Budget for one block of attention scores (heads x query rows x keys), in elements.
# 16M float32 = 64 MiB: enough to keep matmuls large, small enough for 30k-token inputs.
ATTENTION_SCORE_BUDGET = 16 * 1024 * 1024


# ============================================================================ inputs
def validate_inputs(
    pixel_values: Any, grid_thws: Any, config: VisionConfig, dtype: Any = np.float32
) -> tuple[np.ndarray, np.ndarray]:
    """Check `pixel_values [L, 3, p, p]` and `grid_thws [N, 3]` against the config.

    Floating inputs (float16/32/64) are converted to `dtype`; integer or bool pixels are
    rejected (they are un-normalised images: use `moonvit_kernels.preprocess`). Returns
    `(pixel_values, grid_thws as int64)`. Raises ValueError naming the problem.
    """
    grid = validate_grid_thws(grid_thws, config)
    return check_pixels(as_array("pixel_values", pixel_values), grid, config, np, dtype), grid


def check_pixels(pv: Any, grid: np.ndarray, config: VisionConfig, xp: Any = np, dtype: Any = np.float32) -> Any:
    """`pixel_values [L, 3, p, p]` checked against a validated `grid` and converted to `dtype`, in the
    array module `xp` (NumPy, or CuPy for device arrays: the checks then run on the device and only
    one flag comes back to the host). ValueError naming the problem: dtype, shape, patch count,
    NaN/Inf (with the first bad patch), values that overflow `dtype`."""
    p = config.patch_size
    if not np.issubdtype(np.dtype(pv.dtype), np.floating):
        raise ValueError(
            f"pixel_values dtype {np.dtype(pv.dtype)} is not floating point; expected normalised float "
            "patches (float16/float32/float64). Integer images go through moonvit_kernels.preprocess."
        )
    shape = tuple(int(s) for s in pv.shape)
    if len(shape) != 4 or shape[1:] != (3, p, p):
        raise ValueError(f"pixel_values shape {shape} is not [L, 3, {p}, {p}] (patch_size={p})")
    expected = int(np.sum(np.prod(grid, axis=1)))
    if shape[0] != expected:
        raise ValueError(
            f"pixel_values holds {shape[0]} patches but grid_thws {grid.tolist()} needs sum(t*h*w) = {expected}"
        )
    with np.errstate(over="ignore"):
        converted = pv.astype(dtype, copy=False)
    bad = ~xp.isfinite(converted).reshape(shape[0], -1).all(axis=1)
    if bool(bad.any()):  # the one device-to-host transfer on the device path (NaN/Inf stay so when converted)
        src_bad = ~xp.isfinite(pv).reshape(shape[0], -1).all(axis=1)
        if bool(src_bad.any()):
            raise ValueError(
                f"pixel_values holds non-finite values (NaN/Inf; first in patch {int(xp.argmax(src_bad))})"
            )
        raise ValueError(
            f"pixel_values holds values too large for {np.dtype(dtype)} (first in patch {int(xp.argmax(bad))})"
        )
    return converted


def as_array(name: str, value: Any) -> np.ndarray:
    """`np.asarray(value)`, with numpy's complaint about ragged nesting turned into one naming `name`."""
    try:
        return np.asarray(value)
    except ValueError as e:
        raise ValueError(f"{name} is not a rectangular array ({e})") from None


def cu_seqlens(grid_thws: np.ndarray) -> np.ndarray:
    """Cumulative token offsets `[0, t0*h0*w0, ...]` (int64, length N + 1) of packed items (`packing.cu_seqlens`)."""
    return packing.cu_seqlens(grid_thws).astype(np.int64)


# ============================================================================ 1. patch embedding
def patch_embed(pixel_values: np.ndarray, proj_weight: np.ndarray) -> np.ndarray:
    """Conv2d(3, D, kernel=p, stride=p) on p x p patches == one GEMM.

    `pixel_values [L, 3, p, p]`, `proj_weight [D, 3, p, p]` -> `[L, D]`; the flattening order
    (c, ky, kx) is a plain reshape of both.
    """
    L = pixel_values.shape[0]
    D = proj_weight.shape[0]
    return pixel_values.reshape(L, -1) @ proj_weight.reshape(D, -1).astype(pixel_values.dtype, copy=False).T


# ============================================================================ 2. position embedding
def source_coordinate(d: np.ndarray, in_size: int, out_size: int) -> np.ndarray:
    """`F.interpolate(align_corners=False)` source coordinate: `s = (d + 0.5)·(in/out) − 0.5`."""
    return (d + 0.5) * (in_size / out_size) - 0.5


def cubic_weights(frac: np.ndarray, a: float = -0.75) -> np.ndarray:
    """Keys cubic convolution weights for taps at offsets -1, 0, 1, 2 (A = -0.75, as torch)."""

    def near(x: np.ndarray) -> np.ndarray:  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: np.ndarray) -> np.ndarray:  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return np.stack([far(frac + 1), near(frac), near(1 - frac), far(2 - frac)], axis=-1)


def interpolation_matrix(in_size: int, out_size: int, mode: str) -> np.ndarray:
    """The `[out, in]` float64 matrix of 1-D resampling along one axis.

    Bilinear clamps the source coordinate at 0 and the upper neighbour at `in − 1`; bicubic
    uses 4 clamped taps. Same size is exactly the identity (torch short-cuts it too).
    """
    if in_size == out_size:
        return np.eye(out_size)
    m = np.zeros((out_size, in_size))
    d = np.arange(out_size)
    s = source_coordinate(d, in_size, out_size)
    if mode == "bilinear":
        s = np.maximum(s, 0.0)
        i0 = np.minimum(np.floor(s).astype(np.int64), in_size - 1)
        i1 = np.minimum(i0 + 1, in_size - 1)
        lam = s - i0
        np.add.at(m, (d, i0), 1.0 - lam)
        np.add.at(m, (d, i1), lam)
    elif mode == "bicubic":
        i0 = np.floor(s).astype(np.int64)
        w = cubic_weights(s - i0)
        for tap in range(4):
            idx = np.clip(i0 - 1 + tap, 0, in_size - 1)
            np.add.at(m, (d, idx), w[:, tap])
    else:
        raise ValueError(f"unsupported interpolation mode {mode!r}")
    return m


def interpolate_pos_grid(grid: np.ndarray, out_h: int, out_w: int, mode: str = "bilinear") -> np.ndarray:
    """Resize the learned grid `[H0, W0, D]` to `[out_h, out_w, D]` (separable, align_corners=False)."""
    H0, W0, _ = grid.shape
    if (out_h, out_w) == (H0, W0):
        return grid
    mh = interpolation_matrix(H0, out_h, mode).astype(grid.dtype)
    mw = interpolation_matrix(W0, out_w, mode).astype(grid.dtype)
    rows = np.einsum("hi,iwd->hwd", mh, grid)
    return np.einsum("hwd,vw->hvd", rows, mw)


def time_sincos_table(dim: int, num_frames: int) -> np.ndarray:
    """`get_1d_sincos_pos_embed(dim, num_frames)` as float64 `[num_frames, dim]`:
    `ω_i = 10000^(−i/(dim/2))`, row f = `[sin(f·ω_i)] ++ [cos(f·ω_i)]`."""
    half = dim // 2
    omega = 1.0 / 10000.0 ** (np.arange(half, dtype=np.float64) / half)
    angles = np.arange(num_frames, dtype=np.float64)[:, None] * omega[None, :]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)


def position_embedding(grid_thws: np.ndarray, pos_weight: np.ndarray, config: VisionConfig) -> np.ndarray:
    """The `[L, D]` term added to the patch tokens of every packed item.

    Image (t = 1): the grid resized to (h, w). Video: frame f gets `grid + time[f]`.
    """
    parts = []
    time = time_sincos_table(config.vt_hidden_size, config.init_pos_emb_time).astype(pos_weight.dtype)
    for t, h, w in np.asarray(grid_thws).tolist():
        if t > config.init_pos_emb_time:
            raise ValueError(f"t={t} frames exceeds init_pos_emb_time={config.init_pos_emb_time}")
        grid = interpolate_pos_grid(pos_weight, h, w, config.pos_emb_interpolation_mode).reshape(h * w, -1)
        if t == 1:
            parts.append(grid)
        else:
            parts.append((grid[None, :, :] + time[:t, None, :]).reshape(t * h * w, -1))
    return np.concatenate(parts, axis=0)


def add_position_embedding(
    x: np.ndarray, grid_thws: np.ndarray, pos_weight: np.ndarray, config: VisionConfig
) -> np.ndarray:
    """`x [L, D]` plus `position_embedding` (a new array)."""
    return x + position_embedding(grid_thws, pos_weight.astype(x.dtype, copy=False), config)


# ============================================================================ 3a. 2D RoPE
def rope_frequencies(head_dim: int, theta: float = ROPE_THETA, dtype: Any = np.float32) -> np.ndarray:
    """`f_i = theta^(−4i/hd)` for `i < hd/4`, in `dtype` (the source computes them in fp32)."""
    i = np.arange(head_dim // 4, dtype=dtype)
    return (1.0 / np.asarray(theta, dtype=dtype) ** (4 * i / np.asarray(head_dim, dtype=dtype))).astype(dtype)


def rope_angles(h: int, w: int, head_dim: int, dtype: Any = np.float32) -> np.ndarray:
    """Angles `[h·w, hd/2]` of the h x w patch grid (row-major tokens).

    Complex slot `2i` turns by `column·f_i` (width), slot `2i+1` by `row·f_i` (height).
    """
    f = rope_frequencies(head_dim, dtype=dtype)
    rows, cols = np.divmod(np.arange(h * w), w)
    ang = np.empty((h * w, head_dim // 2), dtype=dtype)
    ang[:, 0::2] = cols.astype(dtype)[:, None] * f[None, :]
    ang[:, 1::2] = rows.astype(dtype)[:, None] * f[None, :]
    return ang


def rope_angles_packed(grid_thws: np.ndarray, head_dim: int, dtype: Any = np.float32) -> np.ndarray:
    """Angles `[L, hd/2]` for packed items; every frame of a video reuses its 2D table."""
    parts = [np.tile(rope_angles(h, w, head_dim, dtype), (t, 1)) for t, h, w in np.asarray(grid_thws).tolist()]
    return np.concatenate(parts, axis=0)


def apply_rope(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """Rotate consecutive pairs `(x[2j], x[2j+1])` of `x [L, heads, hd]` by `angles [L, hd/2]`.

    Interleaved pairs (NOT rotate-half): `(a, b) -> (a·cos − b·sin, a·sin + b·cos)`.
    """
    cos = np.cos(angles).astype(x.dtype)[:, None, :]
    sin = np.sin(angles).astype(x.dtype)[:, None, :]
    a = x[..., 0::2]
    b = x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


# ============================================================================ 3b. norms, activations
def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float, return_rstd: bool = False) -> Any:
    """`x · rsqrt(mean(x², axis=-1) + eps) · weight` over the last axis, in at least float32.

    With `return_rstd`, also the per-row `rsqrt(mean(x²) + eps)` (shape `x.shape[:-1]`).
    """
    dt = np.promote_types(x.dtype, np.float32)
    xf = x.astype(dt, copy=False)
    ms = np.einsum("...d,...d->...", xf, xf) / xf.shape[-1]
    rstd = (1.0 / np.sqrt(ms + dt.type(eps))).astype(dt)
    out = (xf * rstd[..., None]) * weight.astype(dt, copy=False)
    return (out, rstd) if return_rstd else out


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """`0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` — the encoder MLP's GELU."""
    c = x.dtype.type(math.sqrt(2.0 / math.pi))
    inner = x * x
    inner *= x.dtype.type(0.044715)
    inner += 1
    inner *= x
    inner *= c
    np.tanh(inner, out=inner)
    inner += 1
    inner *= x
    inner *= x.dtype.type(0.5)
    return inner


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """Exact GELU `0.5·x·(1 + erf(x/√2))` — the projector's GELU."""
    return (0.5 * x * (1.0 + erf(x / x.dtype.type(math.sqrt(2.0))))).astype(x.dtype, copy=False)


# ============================================================================ 3c. attention
WORKERS = os.cpu_count() or 1


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="moonvit-attention")


def _head_groups(heads: int) -> list[slice]:
    """Split the heads into one contiguous group per CPU core (at most one group per head)."""
    groups = min(heads, WORKERS)
    edges = np.linspace(0, heads, groups + 1).round().astype(int).tolist()
    return [slice(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    cu_seqlens: np.ndarray,
    return_lse: bool = False,
    score_budget: int = ATTENTION_SCORE_BUDGET,
) -> Any:
    """Packed block-diagonal, non-causal softmax attention.

    `q, k, v [L, heads, hd]`; item i covers tokens `cu_seqlens[i]:cu_seqlens[i+1]` and sees only
    itself. Scale `1/sqrt(hd)`, softmax in at least float32. Returns `o [L, heads, hd]` and,
    with `return_lse`, the natural-log log-sum-exp of the scaled scores `[L, heads]`.
    Query rows are processed in chunks so that at most `score_budget` scores exist at once
    (never an L x L x heads array).
    """
    L, H, hd = q.shape
    dt = np.promote_types(q.dtype, np.float32)
    out = np.empty((L, H, hd), dtype=dt)
    lse = np.empty((L, H), dtype=dt)
    bounds = np.asarray(cu_seqlens, dtype=np.int64)
    for s, e in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        if e > s:
            out[s:e], lse[s:e] = attention_rows(q[s:e], k[s:e], v[s:e], score_budget)
    return (out, lse) if return_lse else out


def attention_rows(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, score_budget: int = ATTENTION_SCORE_BUDGET
) -> tuple[np.ndarray, np.ndarray]:
    """One item's softmax attention: queries `q [r, heads, hd]` against the item's `k, v [n, heads, hd]`
    (r may differ from n: a checker samples query rows). Returns `(o [r, heads, hd], lse [r, heads])`
    in at least float32; at most `score_budget` scores exist at once."""
    r, H, hd = q.shape
    n = k.shape[0]
    dt = np.promote_types(q.dtype, np.float32)
    scale = dt.type(1.0 / math.sqrt(hd))
    out = np.empty((r, H, hd), dtype=dt)
    lse = np.empty((r, H), dtype=dt)
    groups = _head_groups(H)
    # At most WORKERS blocks of (widest group) x rows x n scores are alive at once.
    widest = max(g.stop - g.start for g in groups)
    rows = max(1, min(r, score_budget // (WORKERS * widest * n)))
    blocks = [(r0, min(r, r0 + rows), h) for r0 in range(0, r, rows) for h in groups]
    k_item = np.ascontiguousarray(k.transpose(1, 0, 2), dtype=dt)  # [H, n, hd]
    v_item = np.ascontiguousarray(v.transpose(1, 0, 2), dtype=dt)  # [H, n, hd]

    def attend(block: tuple[int, int, slice]) -> None:
        r0, r1, h = block
        qh = np.ascontiguousarray(q[r0:r1, h].transpose(1, 0, 2), dtype=dt) * scale  # [h, r, hd]
        scores = qh @ k_item[h].transpose(0, 2, 1)  # [h, r, n]
        m = scores.max(axis=-1, keepdims=True)
        scores -= m
        np.exp(scores, out=scores)
        denom = scores.sum(axis=-1, keepdims=True)
        o = scores @ v_item[h]  # [h, r, hd]
        o /= denom
        out[r0:r1, h] = o.transpose(1, 0, 2)
        lse[r0:r1, h] = (m + np.log(denom))[..., 0].T

    # Blocks write disjoint parts of out/lse; NumPy releases the GIL inside them, so the softmax work
    # (single-threaded in NumPy) spreads over the CPU cores. One BLAS thread per block: the blocks
    # already fill the cores, and nested BLAS threads would fight them.
    with _one_blas_thread():
        list(_pool().map(attend, blocks))
    return out, lse


def _one_blas_thread() -> Any:
    """BLAS limited to one thread (threadpoolctl) where threadpoolctl is installed; else a no-op (CUDA
    images ship without it: the reference must import there, only its CPU speed is at stake)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


# ============================================================================ 3d. encoder
def layer_weight_names(i: int) -> dict[str, str]:
    """Checkpoint names of encoder block `i`'s tensors, by role."""
    b = f"vision_tower.encoder.blocks.{i}."
    return {
        "norm0": b + "norm0.weight",
        "wqkv": b + "wqkv.weight",
        "wo": b + "wo.weight",
        "norm1": b + "norm1.weight",
        "fc0": b + "mlp.fc0.weight",
        "fc1": b + "mlp.fc1.weight",
    }


def encoder_layer(
    x: np.ndarray,
    layer: Mapping[str, np.ndarray],
    angles: np.ndarray,
    bounds: np.ndarray,
    config: VisionConfig,
) -> np.ndarray:
    """One pre-norm block on `x [L, D]`; `layer` maps roles (`layer_weight_names`) to weights.

    qkv's output index is `s·Q + head·hd + d` with s in (q, k, v).
    """
    dt = x.dtype
    L = x.shape[0]
    H, hd, Q = config.vt_num_attention_heads, config.head_dim, config.qkv_hidden_size
    eps = config.vit_norm_eps

    def w(role: str) -> np.ndarray:
        return layer[role].astype(dt, copy=False)

    a = rmsnorm(x, w("norm0"), eps).astype(dt, copy=False)
    qkv = a @ w("wqkv").T
    q = apply_rope(qkv[:, :Q].reshape(L, H, hd), angles)
    k = apply_rope(qkv[:, Q : 2 * Q].reshape(L, H, hd), angles)
    v = qkv[:, 2 * Q :].reshape(L, H, hd)
    o = attention(q, k, v, bounds).astype(dt, copy=False).reshape(L, Q)
    x = x + o @ w("wo").T
    hmid = rmsnorm(x, w("norm1"), eps).astype(dt, copy=False) @ w("fc0").T
    return x + gelu_tanh(hmid) @ w("fc1").T


# ============================================================================ 5. merge
def tpool_patch_merger(x: np.ndarray, grid_thws: np.ndarray, merge_kernel_size: tuple[int, int]) -> list[np.ndarray]:
    """Per item `(t, h, w)`: `[t·h·w, D] -> [(h/kh)·(w/kw), kh·kw, D]`, mean over frames.

    Merged token `m = i·(w/kw) + j` holds in slot `a·kw + b` the patch `(kh·i + a)·w + (kw·j + b)`.
    """
    kh, kw = merge_kernel_size
    D = x.shape[-1]
    out = []
    start = 0
    for t, h, w in np.asarray(grid_thws).tolist():
        item = x[start : start + t * h * w].reshape(t, h // kh, kh, w // kw, kw, D)
        item = item.transpose(0, 1, 3, 2, 4, 5).mean(axis=0)
        out.append(item.reshape((h // kh) * (w // kw), kh * kw, D))
        start += t * h * w
    return out


# ============================================================================ 6. projector
def projector(merged: np.ndarray, weights: Mapping[str, np.ndarray], config: VisionConfig) -> np.ndarray:
    """`PatchMergerMLPV2` on `merged [M, kh·kw·D]` (slot-major) -> `[M, T]`:
    Linear -> GELU(erf) -> Linear -> rmsnorm(eps = projector_ln_eps). No biases."""
    dt = merged.dtype
    h = merged @ weights["mm_projector.proj.0.weight"].astype(dt, copy=False).T
    h = gelu_erf(h) @ weights["mm_projector.proj.2.weight"].astype(dt, copy=False).T
    return rmsnorm(h, weights["mm_projector.post_norm.weight"], config.projector_ln_eps).astype(dt, copy=False)


# ============================================================================ the whole tower
def vision_forward(
    pixel_values: Any,
    grid_thws: Any,
    weights: Mapping[str, np.ndarray],
    config: VisionConfig,
    dtype: Any = np.float32,
    return_intermediates: bool = False,
    on_layer: Callable[[int], None] | None = None,
) -> Any:
    """Run the tower and projector; returns one `[n_merged_i, text_hidden]` array per item.

    `pixel_values [Σ t·h·w, 3, p, p]`, `grid_thws [N, 3]`. With `return_intermediates`, returns
    `(outputs, stages)` where `stages` is a dict of arrays, in order: `patch_embed [L, D]`,
    `pos_emb [L, D]`, `layer_{i} [L, D]` (output of block i), `final_norm [L, D]`,
    `merged [M_total, kh·kw·D]`, `projected [M_total, T]` — for stage-by-stage comparison.
    `on_layer(i)`, when given, is called after encoder block i (for progress bars).
    """
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    check_weights(weights, config)
    pv, grid = validate_inputs(pixel_values, grid_thws, config, dtype)
    stages: dict[str, np.ndarray] = {}

    def keep(name: str, value: np.ndarray) -> None:
        if return_intermediates:
            stages[name] = value

    x = patch_embed(pv, weights["vision_tower.patch_embed.proj.weight"])
    keep("patch_embed", x)
    x = add_position_embedding(x, grid, weights["vision_tower.patch_embed.pos_emb.weight"], config)
    keep("pos_emb", x)
    angles = rope_angles_packed(grid, config.head_dim, dtype)
    bounds = cu_seqlens(grid)
    for i in range(config.vt_num_hidden_layers):
        layer = {role: weights[name] for role, name in layer_weight_names(i).items()}
        x = encoder_layer(x, layer, angles, bounds, config)
        keep(f"layer_{i}", x)
        if on_layer is not None:
            on_layer(i)
    x = rmsnorm(x, weights["vision_tower.encoder.final_layernorm.weight"], config.vit_norm_eps).astype(dtype)
    keep("final_norm", x)
    merged_items = tpool_patch_merger(x, grid, config.merge_kernel_size)
    merged = np.concatenate([m.reshape(m.shape[0], -1) for m in merged_items], axis=0)
    keep("merged", merged)
    projected = projector(merged, weights, config)
    keep("projected", projected)
    sizes = [m.shape[0] for m in merged_items]
    outputs = np.split(projected, np.cumsum(sizes)[:-1], axis=0)
    return (outputs, stages) if return_intermediates else outputs
