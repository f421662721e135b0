"""Checks of the CUDA C kernels against the NumPy reference, shared by two test tiers.

Each check takes `k`, a launcher module with the API of `moonvit_kernels.cuda_backend.launchers`: that module on a
GPU, or the same launchers on the CPU emulator from NumPy, `emulation.OnEmulator(launchers)` (classes TestGpu and
TestCudaEmulator of tests/stages/test_<stage>.py). Inputs
are random and non-uniform; bf16 kernels are compared with a float64 reference computed on the
same bf16-rounded inputs, so the tolerance only has to cover fp32 accumulation and the rounding of
the outputs (2^-8 relative), never the input rounding. Output buffers the kernels allocate start
as NaN in the emulation, so an element a kernel forgets to write fails `assert_close`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from helpers import random_pixels

from moonvit_kernels import reference as ref
from moonvit_kernels.checks import (
    BF16_ULP,
    FP32_EPS,
    assert_close,
    bf16_round,
    fp32_rtol,
    gemm_want,
    merge_want,
    pos_emb_tolerance,
    pos_emb_want,
    random,
    rmsnorm_want,
    rope_want,
    to_host,
)
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.weights import float32_to_bf16_bits, random_weights


def upload(k: Any, a: np.ndarray, dtype: str) -> tuple[Any, np.ndarray]:
    """`a` on the device in `dtype` (bf16 as uint16 bits) and the float64 values it holds."""
    xp = k.array_module()
    if dtype == "bfloat16":
        return xp.asarray(float32_to_bf16_bits(a)), bf16_round(a).astype(np.float64)
    return xp.asarray(np.ascontiguousarray(a, dtype=np.float32)), a.astype(np.float64)


# ============================================================================ GEMM
def check_gemm(k: Any, M: int, N: int, K: int, operands: str, out_dtype: str, epilogue: str, seed: int = 0) -> None:
    """k.gemm(a [M, K], b [N, K]) with one epilogue vs float64 `a·bᵀ` (residual updated in place)."""
    rng = np.random.default_rng(seed)
    a, a_ref = upload(k, random(rng, (M, K)), operands)
    b, b_ref = upload(k, random(rng, (N, K), 1 / math.sqrt(K)), operands)
    # fp32 accumulation error, scaled by the size of the products summed
    acc_tol = fp32_rtol(K) * float(np.max(np.abs(a_ref)) * np.max(np.abs(b_ref)) * math.sqrt(K))
    residual = r_ref = None
    if epilogue == "residual":
        residual, r_ref = upload(k, random(rng, (M, N), 2.0), out_dtype)
    want = gemm_want(a_ref, b_ref, epilogue, r_ref)
    got = k.gemm(a, b, epilogue=epilogue, residual=residual, out=residual, out_dtype=out_dtype)
    if residual is not None:
        assert got is residual, "gemm: out= must be returned"
    rtol = BF16_ULP if out_dtype == "bfloat16" else 16 * FP32_EPS
    name = f"gemm {operands}->{out_dtype} {epilogue} M={M} N={N} K={K}"
    assert_close(to_host(got), want, rtol=rtol, atol=2 * acc_tol, name=name)


# ============================================================================ attention
def check_attention(k: Any, dtype: str, head_dim: int, heads: int, lens: list[int], seed: int = 0) -> None:
    """k.attention on a packed qkv vs reference.attention (output and log-sum-exp), items isolated."""
    rng = np.random.default_rng(seed)
    L, Q = sum(lens), heads * head_dim
    qkv, qkv_ref = upload(k, random(rng, (L, 3 * Q), 1.5), dtype)  # scale 1.5: peaked softmax rows
    bounds = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    q, kk, v = (qkv_ref[:, s * Q : (s + 1) * Q].reshape(L, heads, head_dim) for s in range(3))
    want, want_lse = ref.attention(q, kk, v, bounds, return_lse=True)
    out, lse = k.attention(qkv, bounds, heads, head_dim)
    vmax = float(np.max(np.abs(v)))
    if dtype == "bfloat16":  # P is rounded to bf16 before P·V, and so is the output
        rtol, atol = BF16_ULP, 2 * BF16_ULP * vmax
    else:
        rtol, atol = 1e-5, 1e-5 * vmax
    name = f"attention {dtype} hd={head_dim} heads={heads} lens={lens}"
    assert_close(to_host(out).reshape(L, heads, head_dim), want, rtol=rtol, atol=atol, name=name)
    score_tol = 64 * FP32_EPS * head_dim * float(np.max(np.abs(q)) * np.max(np.abs(kk))) / math.sqrt(head_dim)
    assert_close(to_host(lse), want_lse, rtol=1e-6, atol=score_tol, name=name + " lse")


# ============================================================================ rmsnorm
def check_rmsnorm(k: Any, rows: int, D: int, in_dtype: str, out_dtype: str, eps: float = 1e-6, seed: int = 0) -> None:
    """k.rmsnorm vs reference.rmsnorm, output and rstd."""
    rng = np.random.default_rng(seed)
    x, x_ref = upload(k, random(rng, (rows, D), 2.0), in_dtype)
    w_host = (1.0 + 0.25 * rng.standard_normal(D)).astype(np.float32)
    w = k.array_module().asarray(w_host)
    want, want_rstd = rmsnorm_want(x_ref, w_host, eps)
    got, rstd = k.rmsnorm(x, w, eps, out_dtype=out_dtype, return_rstd=True)
    rtol = BF16_ULP if out_dtype == "bfloat16" else fp32_rtol(D)
    name = f"rmsnorm {in_dtype}->{out_dtype} {rows}x{D}"
    assert_close(to_host(got), want, rtol=rtol, atol=1e-6, name=name)
    assert_close(to_host(rstd), want_rstd, rtol=fp32_rtol(D), atol=0.0, name=name + " rstd")


def flush_denormals(x: np.ndarray) -> np.ndarray:
    """float32 `x` with subnormals replaced by signed zero (what -ftz=true does to fp32 operands)."""
    x = np.asarray(x, dtype=np.float32)
    return np.where(np.abs(x) < np.finfo(np.float32).tiny, np.copysign(np.float32(0.0), x), x)


def check_rmsnorm_flushes_denormals(k: Any, in_dtype: str, D: int = 36, eps: float = 1e-6, seed: int = 0) -> None:
    """-ftz=true on the GPU, FTZ|DAZ in the emulator: subnormal inputs count as signed zero.

    Row 0 holds only subnormals (mean square 0, so rstd = 1/sqrt(eps) = 1000 and y = x·1000·w would be
    a normal number, ~1e-35, if x were not flushed); row 1 is ordinary data with a few subnormals,
    which must come out as signed zeros, the rest as the reference."""
    rng = np.random.default_rng(seed)
    tiny = np.finfo(np.float32).tiny
    sub = (rng.uniform(0.05, 0.95, D) * tiny * rng.choice([-1.0, 1.0], D)).astype(np.float32)
    if in_dtype == "bfloat16":  # values bf16 holds exactly (subnormal bf16: exponent bits zero)
        sub = bf16_round(sub)
    row1 = random(rng, (D,), 2.0)
    holes = rng.choice(D, 5, replace=False)
    row1[holes] = sub[holes]
    x_host = np.stack([sub, row1])
    assert np.all(np.abs(x_host[0]) < tiny) and np.all(x_host[0] != 0)
    x, x_ref = upload(k, x_host, in_dtype)
    w_host = (1.0 + 0.25 * rng.standard_normal(D)).astype(np.float32)
    got, rstd = k.rmsnorm(x, k.array_module().asarray(w_host), eps, return_rstd=True)
    got, rstd = to_host(got), to_host(rstd)
    flushed = flush_denormals(x_ref.astype(np.float32)).astype(np.float64)
    want, want_rstd = ref.rmsnorm(flushed, w_host.astype(np.float64), eps, return_rstd=True)
    unflushed = ref.rmsnorm(x_ref, w_host.astype(np.float64), eps)
    assert np.all(np.abs(unflushed[0]) > 1e-37), "the test needs row 0 to be visible without flushing"
    assert np.all(got[0] == 0.0) and np.array_equal(np.signbit(got[0]), np.signbit(x_host[0] * w_host)), got[0]
    assert np.all(got[1, holes] == 0.0), got[1, holes]
    assert_close(got, want, rtol=fp32_rtol(D), atol=0.0, name=f"rmsnorm ftz {in_dtype}")
    assert_close(rstd, want_rstd, rtol=fp32_rtol(D), atol=0.0, name=f"rmsnorm ftz {in_dtype} rstd")


# ============================================================================ RoPE
def check_rope(k: Any, dtype: str, grid: np.ndarray, heads: int, head_dim: int, seed: int = 0) -> None:
    """k.rope_inplace on q and k of a packed qkv vs reference.apply_rope; v must be untouched."""
    rng = np.random.default_rng(seed)
    L, Q = int(np.sum(np.prod(grid, axis=1))), heads * head_dim
    qkv, qkv_ref = upload(k, random(rng, (L, 3 * Q)), dtype)
    xp = k.array_module()
    want = rope_want(qkv_ref, grid, heads, head_dim)
    freqs = xp.asarray(ref.rope_frequencies(head_dim, dtype=np.float32))
    token_pos = xp.asarray(k.token_positions(grid))
    got = k.rope_inplace(qkv, token_pos, freqs, heads, head_dim)
    assert got is qkv
    rtol = BF16_ULP if dtype == "bfloat16" else 8 * FP32_EPS
    name = f"rope {dtype} grid={grid.tolist()} hd={head_dim}"
    assert_close(to_host(qkv), want, rtol=rtol, atol=1e-6, name=name)


# ============================================================================ position embedding
def check_pos_emb(k: Any, config: VisionConfig, grid: np.ndarray, seed: int = 0) -> None:
    """k.add_position_embedding_inplace vs reference.position_embedding (interpolation, time term)."""
    rng = np.random.default_rng(seed)
    L, D = int(np.sum(np.prod(grid, axis=1))), config.vt_hidden_size
    H0, W0 = config.init_pos_emb_height, config.init_pos_emb_width
    xp = k.array_module()
    x_host = random(rng, (L, D))
    pos_w = random(rng, (H0, W0, D), 0.5)
    time = ref.time_sincos_table(D, config.init_pos_emb_time).astype(np.float32)
    want = pos_emb_want(x_host, grid, pos_w, config)
    x = xp.asarray(x_host)
    got = k.add_position_embedding_inplace(
        x,
        xp.asarray(k.token_positions(grid)),
        xp.asarray(grid.astype(np.int32)),
        xp.asarray(pos_w),
        xp.asarray(time),
        config.pos_emb_interpolation_mode,
    )
    assert got is x
    name = f"pos_emb {config.pos_emb_interpolation_mode} grid={grid.tolist()}"
    rtol, atol = pos_emb_tolerance(pos_w, config.pos_emb_interpolation_mode)
    assert_close(to_host(x), want, rtol=rtol, atol=atol, name=name)


# ============================================================================ merge
def check_merge(
    k: Any, grid: np.ndarray, merge_kernel_size: tuple[int, int], D: int, in_dtype: str, out_dtype: str, seed: int = 0
) -> None:
    """k.tpool_merge vs reference.tpool_patch_merger, flattened slot-major."""
    rng = np.random.default_rng(seed)
    L = int(np.sum(np.prod(grid, axis=1)))
    x, x_ref = upload(k, random(rng, (L, D)), in_dtype)
    want = merge_want(x_ref, grid, merge_kernel_size)
    ms = k.array_module().asarray(k.merge_sources(grid, merge_kernel_size))
    got = k.tpool_merge(x, ms, merge_kernel_size, out_dtype=out_dtype)
    rtol = BF16_ULP if out_dtype == "bfloat16" else 4 * FP32_EPS
    name = f"merge {in_dtype}->{out_dtype} {merge_kernel_size} grid={grid.tolist()}"
    assert_close(to_host(got), want, rtol=rtol, atol=1e-7, name=name)


# ============================================================================ the whole backend
def check_backend_forward(
    kernels: Any, config: VisionConfig, grid: np.ndarray, dtype: str, tol: float, seed: int = 0
) -> None:
    """CupyBackend(kernels=...) vs reference.vision_forward in float64, every stage and every item.

    The reference gets the weights the backend holds (bf16-rounded for dtype "bfloat16"); each
    stage must satisfy |got − ref| <= tol·(|ref| + max|ref|)."""
    from moonvit_kernels.cuda_backend.backend import CupyBackend

    weights = random_weights(config, seed)
    pixels = random_pixels(grid, config.patch_size, seed=seed + 1)
    backend = CupyBackend(config, weights, dtype=dtype, kernels=kernels)
    outputs, stages = backend.forward(pixels, grid, return_intermediates=True, as_numpy=True)
    if dtype == "bfloat16":
        weights = {name: bf16_round(w) for name, w in weights.items()}
    want_outputs, want_stages = ref.vision_forward(pixels, grid, weights, config, np.float64, return_intermediates=True)
    assert list(stages) == list(want_stages), f"stage names {list(stages)} != {list(want_stages)}"
    for name, want in want_stages.items():
        scale = float(np.max(np.abs(want)))
        assert_close(stages[name], want, rtol=tol, atol=tol * scale, name=f"{dtype} forward stage {name}")
    assert len(outputs) == len(want_outputs)
    for i, (got, want) in enumerate(zip(outputs, want_outputs, strict=True)):
        assert isinstance(got, np.ndarray) and got.dtype == np.float32
        scale = float(np.max(np.abs(want)))
        assert_close(got, want, rtol=tol, atol=tol * scale, name=f"{dtype} forward output {i}")
