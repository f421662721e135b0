"""Section (b): every kernel version timed against its baseline, and its timed output re-checked.

A `KernelCase` holds one kernel at one shape: `run()` (what is timed), `check(go)` (resets the
inputs and poisons the outputs, calls `go()` to run the kernel once — `run` itself, or `run`
under a timer when that single run is also the timed one — and compares the result with a
float64 NumPy computation on a sample of rows: GEMM rows and attention query rows are
independent, so a row sample checks them exactly), the work (FLOPs or bytes moved, with the
formula), the baseline it is compared with (`baselines.Baselines`), the arrays it writes, and what
the X-ray needs for its bound (`model.xray_bound`: catalogue label, FLOPs, compulsory DRAM bytes).

`numba_cases` builds them for the numba.cuda kernels (device arrays; a GPU or the simulator),
`cuda_cases` for the CUDA C kernels through a launcher module with the API of
`cuda_backend.launchers` (CuPy on a GPU, `tools.emulation` on the CPU), `hopper_cases` for
the Hopper kernels (gemm_bf16_sm90 at both tile widths, flash_attn_sm90) through `hopper_launchers`
(sm_90 GPUs) or `emulation.hopper`, with the same checks and baselines. All yield
`(name, build)` pairs so that nothing is allocated before the section's budget allows it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from moonvit_kernels import reference as ref
from moonvit_kernels.checks import (
    attention_want,
    bf16_round,
    gemm_want,
    merge_want,
    random,
    rel_err,
    rope_want,
    sample_rows,
    to_host,
)
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.weights import float32_to_bf16_bits

TOL_FP32 = 1e-4  # max|got − want| / max|want| for fp32 outputs (fp32 accumulation over K <= 4096)
TOL_BF16_ACC = 1e-3  # bf16 operands (rounded values used by the reference too), fp32 output
TOL_BF16_OUT = 1e-2  # bf16 outputs: rounding of the output, 2^-9 relative, plus accumulation


@dataclass
class KernelCase:
    item: str
    backend: str
    dtype: str
    shape: str
    tokens: int
    work: float
    unit: str  # "TFLOP/s" or "GB/s"
    formula: str
    run: Callable[[], Any]
    check: Callable[[Callable[[], Any]], tuple[float, float]]  # check(go): reset, go() runs the kernel, compare
    baseline: tuple[Any, ...]  # arguments of Baselines.get
    outputs: Callable[[], list[Any]]  # the arrays the last run wrote (for --inject-fault wrong)
    model: tuple[str, float, float]  # (X-ray catalogue label, FLOPs, compulsory DRAM bytes) of one call


def gemm_shapes(c: VisionConfig, L: int) -> dict[str, tuple[int, int, int, str]]:
    """name -> (M, N, K, epilogue) of the model's GEMMs for L tokens (projector on L/4 merged tokens)."""
    D, Q, I, T, P = c.vt_hidden_size, c.qkv_hidden_size, c.vt_intermediate_size, c.text_hidden_size, c.patch_dim
    Km = c.merged_hidden_size
    M4 = max(1, L // (c.merge_kernel_size[0] * c.merge_kernel_size[1]))
    return {
        "patch_embed": (L, D, P, "none"),
        "qkv": (L, 3 * Q, D, "none"),
        "wo+residual": (L, D, Q, "residual"),
        "fc0+gelu_tanh": (L, I, D, "gelu_tanh"),
        "fc1+residual": (L, D, I, "residual"),
        "proj0+gelu_erf": (M4, Km, Km, "gelu_erf"),
        "proj2": (M4, T, Km, "none"),
    }


Builder = Callable[[], KernelCase]


def gemm_bytes(M: int, N: int, K: int, in_bytes: int, out_bytes: int, epilogue: str) -> float:
    """Compulsory DRAM bytes of one GEMM: A and B read once, C written once (and read too with a residual)."""
    return float(in_bytes * (M * K + N * K) + out_bytes * M * N * (2 if epilogue == "residual" else 1))


def attention_bytes(L: int, Q: int, H: int, elem: int) -> float:
    """Compulsory DRAM bytes of one attention call: qkv [L, 3Q] read, out [L, Q] written, lse [L, H] fp32 written."""
    return float(elem * 4 * L * Q + 4 * L * H)


# ============================================================================ numba.cuda kernels
def numba_cases(
    c: VisionConfig,
    grid: np.ndarray,
    gemm_names: tuple[str, ...],
    v1_threads: int | None,
    versions: tuple[int, ...],
    attention_versions: tuple[int, ...],
) -> Iterator[tuple[str, Builder]]:
    """The numba kernels (fp32): GEMM `versions` per shape, attention `attention_versions`, rmsnorm, rope,
    pos_emb, merge."""
    from numba import cuda

    from moonvit_kernels.numba_backend import attention as attention_k
    from moonvit_kernels.numba_backend import gemm as gemm_k
    from moonvit_kernels.numba_backend import merge as merge_k
    from moonvit_kernels.numba_backend import pos_emb as pos_emb_k
    from moonvit_kernels.numba_backend import rmsnorm as rmsnorm_k
    from moonvit_kernels.numba_backend import rope as rope_k
    from moonvit_kernels.numba_backend.launch import cu_seqlens_table, grid_table, item_table

    L = int(np.sum(np.prod(grid, axis=1)))
    D, H, hd, Q = c.vt_hidden_size, c.vt_num_attention_heads, c.head_dim, c.qkv_hidden_size
    shapes = gemm_shapes(c, L)

    for name in gemm_names:
        M, N, K, epi = shapes[name]
        for v in versions:

            def build(M=M, N=N, K=K, epi=epi, v=v, name=name) -> KernelCase:
                rng = np.random.default_rng(100 + v)
                a, b = random(rng, (M, K)), random(rng, (N, K), 1 / math.sqrt(K))
                r = random(rng, (M, N), 2.0) if epi == "residual" else None
                a_d, b_d = cuda.to_device(a), cuda.to_device(b)
                out_d = cuda.to_device(r) if r is not None else cuda.device_array((M, N), np.float32)
                res_d = out_d if r is not None else None

                def run() -> Any:
                    return gemm_k.gemm(a_d, b_d, epilogue=epi, residual=res_d, out=out_d, version=v)

                def check(go: Callable[[], Any]) -> tuple[float, float]:
                    if r is not None:
                        out_d.copy_to_device(r)
                    else:
                        out_d.copy_to_device(np.full((M, N), np.nan, np.float32))
                    go()
                    rows = sample_rows(M)
                    got = out_d.copy_to_host()[rows]
                    return rel_err(got, gemm_want(a[rows], b, epi, None if r is None else r[rows])), TOL_FP32

                return KernelCase(
                    f"gemm v{v} {name}",
                    "numba",
                    "float32",
                    f"{M}x{N}x{K}",
                    L,
                    2.0 * M * N * K,
                    "TFLOP/s",
                    f"2·{M}·{N}·{K}",
                    run,
                    check,
                    ("gemm_fp32", M, N, K),
                    lambda: [out_d],
                    (f"gemm_v{v}_{epi}", 2.0 * M * N * K, gemm_bytes(M, N, K, 4, 4, epi)),
                )

            yield f"numba gemm v{v} {name}", build

    for v in attention_versions:

        def build_attn(v=v) -> KernelCase:
            rng = np.random.default_rng(200 + v)
            qkv = random(rng, (L, 3 * Q))
            qkv_d = cuda.to_device(qkv)
            cu = np.array([0, L], dtype=np.int32)
            kw = {"threads": v1_threads} if (v == 1 and v1_threads) else {}
            result: dict[str, Any] = {}

            def run() -> Any:
                result["o"], result["lse"] = attention_k.attention(qkv_d, cu, H, version=v, **kw)

            def check(go: Callable[[], Any]) -> tuple[float, float]:
                go()
                rows = sample_rows(L, 32)
                want_o, want_lse = attention_want(qkv, [0, L], H, hd, rows)
                err_o = rel_err(result["o"].copy_to_host()[rows], want_o)
                err_l = rel_err(result["lse"].copy_to_host()[rows], want_lse)
                return max(err_o, err_l) if math.isfinite(err_o + err_l) else float("nan"), TOL_FP32

            return KernelCase(
                f"attention v{v}",
                "numba",
                "float32",
                f"L={L} H={H} hd={hd}",
                L,
                4.0 * L * L * Q,
                "TFLOP/s",
                f"4·{L}²·{Q}",
                run,
                check,
                ("attention", L, H, hd, "float32"),
                lambda: [result["o"]],
                (f"attention_v{v}", 4.0 * L * L * Q, attention_bytes(L, Q, H, 4)),
            )

        yield f"numba attention v{v}", build_attn

    def build_rmsnorm() -> KernelCase:
        rng = np.random.default_rng(300)
        x = random(rng, (L, D), 1.5)
        w = (1 + 0.25 * rng.standard_normal(D)).astype(np.float32)
        x_d, w_d = cuda.to_device(x), cuda.to_device(w)
        out_d = cuda.device_array((L, D), np.float32)

        def run() -> Any:
            return rmsnorm_k.rmsnorm(x_d, w_d, c.vit_norm_eps, out=out_d)

        def check(go: Callable[[], Any]) -> tuple[float, float]:
            out_d.copy_to_device(np.full((L, D), np.nan, np.float32))
            go()
            return rel_err(out_d.copy_to_host(), ref.rmsnorm(x.astype(np.float64), w, c.vit_norm_eps)), TOL_FP32

        nbytes = 4 * (2 * L * D + D)
        return KernelCase(
            "rmsnorm",
            "numba",
            "float32",
            f"{L}x{D}",
            L,
            nbytes,
            "GB/s",
            f"4·(2·{L}·{D}+{D}) B",
            run,
            check,
            ("copy", nbytes),
            lambda: [out_d],
            ("rmsnorm_kernel_t256", 4.0 * L * D, float(nbytes)),
        )

    yield "numba rmsnorm", build_rmsnorm

    g32 = grid_table(grid)
    cu_host = cu_seqlens_table(g32)

    def build_rope() -> KernelCase:
        rng = np.random.default_rng(301)
        qkv = random(rng, (L, 3 * Q))
        qkv_d, g_d, cu_d = cuda.to_device(qkv), cuda.to_device(g32), cuda.to_device(cu_host)

        def run() -> Any:
            return rope_k.rope2d(qkv_d, g_d, cu_d, H, hd)

        def check(go: Callable[[], Any]) -> tuple[float, float]:
            qkv_d.copy_to_device(qkv)
            go()
            return rel_err(qkv_d.copy_to_host(), rope_want(qkv, grid, H, hd)), TOL_FP32

        nbytes = 2 * L * 2 * Q * 4
        return KernelCase(
            "rope (q, k in place)",
            "numba",
            "float32",
            f"{L}x{3 * Q}",
            L,
            nbytes,
            "GB/s",
            f"2·{L}·2·{Q}·4 B",
            run,
            check,
            ("copy", nbytes),
            lambda: [qkv_d],
            ("rope2d_kernel", 6.0 * L * Q, float(nbytes)),
        )

    yield "numba rope", build_rope

    def build_pos_emb() -> KernelCase:
        rng = np.random.default_rng(302)
        x = random(rng, (L, D))
        pos_w = (0.5 * rng.standard_normal((c.init_pos_emb_height, c.init_pos_emb_width, D))).astype(np.float32)
        x_d, pw_d = cuda.to_device(x), cuda.to_device(pos_w)
        t_d = cuda.to_device(pos_emb_k.time_table(D, c.init_pos_emb_time))
        items_d = cuda.to_device(item_table(g32))

        def run() -> Any:
            return pos_emb_k.add_position_embedding(x_d, pw_d, t_d, items_d, mode=c.pos_emb_interpolation_mode)

        def check(go: Callable[[], Any]) -> tuple[float, float]:
            x_d.copy_to_device(x)
            go()
            want = x.astype(np.float64) + ref.position_embedding(grid, pos_w.astype(np.float64), c)
            return rel_err(x_d.copy_to_host(), want), TOL_FP32

        nbytes = 2 * L * D * 4
        return KernelCase(
            "pos_emb (x in place)",
            "numba",
            "float32",
            f"{L}x{D}",
            L,
            nbytes,
            "GB/s",
            f"2·{L}·{D}·4 B",
            run,
            check,
            ("copy", nbytes),
            lambda: [x_d],
            (f"add_pos_emb_{c.pos_emb_interpolation_mode}", 36.0 * L * D, float(nbytes)),
        )

    yield "numba pos_emb", build_pos_emb

    def build_merge() -> KernelCase:
        rng = np.random.default_rng(303)
        x = random(rng, (L, D))
        mks = c.merge_kernel_size
        items = item_table(g32, mks)
        kh, kw = mks
        M = int(sum((h // kh) * (w // kw) for _, h, w in grid.tolist()))
        x_d, items_d = cuda.to_device(x), cuda.to_device(items)
        out_d = cuda.device_array((M, kh * kw * D), np.float32)

        def run() -> Any:
            return merge_k.merge_gather(x_d, items_d, mks, M, out=out_d)

        def check(go: Callable[[], Any]) -> tuple[float, float]:
            out_d.copy_to_device(np.full((M, kh * kw * D), np.nan, np.float32))
            go()
            return rel_err(out_d.copy_to_host(), merge_want(x, grid, mks)), TOL_FP32

        nbytes = 2 * L * D * 4
        return KernelCase(
            "merge",
            "numba",
            "float32",
            f"{L}x{D} -> {M}x{kh * kw * D}",
            L,
            nbytes,
            "GB/s",
            f"2·{L}·{D}·4 B",
            run,
            check,
            ("copy", nbytes),
            lambda: [out_d],
            ("merge_gather_kernel", 2.0 * L * D, float(nbytes)),
        )

    yield "numba merge", build_merge


# ============================================================================ CUDA C kernels
def _up(xp: Any, a: np.ndarray, dtype: str) -> tuple[Any, np.ndarray]:
    """`a` on the device in `dtype` (bf16 = uint16 bits) and the values it holds (float32 host)."""
    if dtype == "bfloat16":
        return xp.asarray(float32_to_bf16_bits(a)), bf16_round(a)
    return xp.array(a, dtype=np.float32, copy=True), a  # a copy: NumPy (the emulator) would alias


def _poison(xp: Any, shape: tuple[int, ...], dtype: str) -> Any:
    if dtype == "bfloat16":
        return xp.asarray(np.full(shape, 0x7FC0, np.uint16))
    return xp.asarray(np.full(shape, np.nan, np.float32))


def _gemm_out_dtype(name: str, operands: str, epi: str) -> str:
    """The output dtype the backend gives GEMM `name` (fp32 for the residual stream, patch and proj2)."""
    if operands == "float32" or epi == "residual" or name in ("patch_embed", "proj2"):
        return "float32"
    return "bfloat16"


def _gemm_builder(
    gemm: Callable[..., Any],
    xp: Any,
    shape: tuple[int, int, int, str],
    L: int,
    name: str,
    operands: str,
    label: str,
    xray_label: str = "",
) -> Builder:
    """A GEMM case through `gemm` (the launchers' signature) at `shape` = (M, N, K, epilogue); `xray_label`
    names the kernel in the X-ray's catalogue (default: the mma.sync or SIMT kernel)."""
    M, N, K, epi = shape
    out_dtype = _gemm_out_dtype(name, operands, epi)

    def build() -> KernelCase:
        rng = np.random.default_rng(400)
        a_d, a = _up(xp, random(rng, (M, K)), operands)
        b_d, b = _up(xp, random(rng, (N, K), 1 / math.sqrt(K)), operands)
        r = random(rng, (M, N), 2.0) if epi == "residual" else None
        out = _poison(xp, (M, N), out_dtype) if r is None else xp.array(r, copy=True)
        res = out if r is not None else None

        def run() -> Any:
            return gemm(a_d, b_d, epilogue=epi, residual=res, out=out, out_dtype=out_dtype)

        def check(go: Callable[[], Any]) -> tuple[float, float]:
            out[...] = xp.asarray(r) if r is not None else _poison(xp, (M, N), out_dtype)
            go()
            rows = sample_rows(M)
            got = to_host(out)[rows]
            want = gemm_want(a[rows], b, epi, None if r is None else r[rows])
            tol = TOL_FP32 if operands == "float32" else (TOL_BF16_OUT if out_dtype == "bfloat16" else TOL_BF16_ACC)
            return rel_err(got, want), tol

        kind = "gemm_bf16" if operands == "bfloat16" else "gemm_fp32"
        short = "bf16" if out_dtype == "bfloat16" else "f32"
        default = f"gemm_bf16_tc_{short}_{epi}" if operands == "bfloat16" else f"gemm_fp32_simt_{epi}"
        in_b, out_b = (2 if operands == "bfloat16" else 4), (2 if out_dtype == "bfloat16" else 4)
        return KernelCase(
            label,
            "CUDA C",
            f"{operands}->{out_dtype}",
            f"{M}x{N}x{K}",
            L,
            2.0 * M * N * K,
            "TFLOP/s",
            f"2·{M}·{N}·{K}",
            run,
            check,
            (kind, M, N, K),
            lambda: [out],
            (
                (xray_label or default).format(out=short, epi=epi),
                2.0 * M * N * K,
                gemm_bytes(M, N, K, in_b, out_b, epi),
            ),
        )

    return build


def _attention_builder(
    attention: Callable[..., Any], xp: Any, L: int, H: int, hd: int, dtype: str, label: str, xray_label: str = ""
) -> Builder:
    """An attention case through `attention` (the launchers' signature): one item of L tokens; `xray_label`
    names the kernel in the X-ray's catalogue (default: the mma.sync or fp32 flash kernel)."""
    Q = H * hd
    bounds = np.array([0, L], dtype=np.int64)

    def build() -> KernelCase:
        bounds_dev = xp.asarray(bounds.astype(np.int32))  # uploaded once, as the backend does per forward
        rng = np.random.default_rng(500)
        qkv_d, qkv = _up(xp, random(rng, (L, 3 * Q)), dtype)
        result: dict[str, Any] = {}

        def run() -> Any:
            result["o"], result["lse"] = attention(qkv_d, bounds, H, hd, cu_seqlens_device=bounds_dev)

        def check(go: Callable[[], Any]) -> tuple[float, float]:
            go()
            rows = sample_rows(L, 32)
            want_o, want_lse = attention_want(qkv, [0, L], H, hd, rows)
            err_o = rel_err(to_host(result["o"])[rows], want_o)
            err_l = rel_err(to_host(result["lse"])[rows], want_lse)
            err = max(err_o, err_l) if math.isfinite(err_o + err_l) else float("nan")
            return err, (TOL_BF16_OUT if dtype == "bfloat16" else TOL_FP32)

        return KernelCase(
            label,
            "CUDA C",
            dtype,
            f"L={L} H={H} hd={hd}",
            L,
            4.0 * L * L * Q,
            "TFLOP/s",
            f"4·{L}²·{Q}",
            run,
            check,
            ("attention", L, H, hd, dtype),
            lambda: [result["o"]],
            (
                xray_label or f"flash_attn_{'bf16' if dtype == 'bfloat16' else 'f32'}_hd{hd}",
                4.0 * L * L * Q,
                attention_bytes(L, Q, H, 2 if dtype == "bfloat16" else 4),
            ),
        )

    return build


def cuda_cases(k: Any, c: VisionConfig, grid: np.ndarray, gemm_names: tuple[str, ...]) -> Iterator[tuple[str, Builder]]:
    """The CUDA C kernels through launcher module `k`: bf16 GEMM per shape, fp32 GEMM, attention
    bf16/fp32, rmsnorm fp32->bf16, rope bf16, pos_emb, merge fp32->bf16."""
    xp = k.array_module()
    L = int(np.sum(np.prod(grid, axis=1)))
    D, H, hd, Q = c.vt_hidden_size, c.vt_num_attention_heads, c.head_dim, c.qkv_hidden_size
    shapes = gemm_shapes(c, L)

    def up(a: np.ndarray, dtype: str) -> tuple[Any, np.ndarray]:
        return _up(xp, a, dtype)

    def poison(shape: tuple[int, ...], dtype: str) -> Any:
        return _poison(xp, shape, dtype)

    gemm_list = [(name, "bfloat16") for name in gemm_names] + [("qkv", "float32")]
    for name, operands in gemm_list:
        label = f"gemm_{'bf16' if operands == 'bfloat16' else 'fp32'} {name}"
        yield f"cuda gemm {operands} {name}", _gemm_builder(k.gemm, xp, shapes[name], L, name, operands, label)

    for dtype in ("bfloat16", "float32"):
        yield f"cuda attention {dtype}", _attention_builder(k.attention, xp, L, H, hd, dtype, f"attention_{dtype}")

    def build_rmsnorm() -> KernelCase:
        rng = np.random.default_rng(600)
        x_d, x = up(random(rng, (L, D), 1.5), "float32")
        w = (1 + 0.25 * rng.standard_normal(D)).astype(np.float32)
        w_d = xp.asarray(w)
        out = poison((L, D), "bfloat16")

        def run() -> Any:
            return k.rmsnorm(x_d, w_d, c.vit_norm_eps, out=out, out_dtype="bfloat16")

        def check(go: Callable[[], Any]) -> tuple[float, float]:
            out[...] = poison((L, D), "bfloat16")
            go()
            return rel_err(to_host(out), ref.rmsnorm(x.astype(np.float64), w, c.vit_norm_eps)), TOL_BF16_OUT

        nbytes = L * D * (4 + 2) + D * 4
        return KernelCase(
            "rmsnorm fp32->bf16",
            "CUDA C",
            "float32->bfloat16",
            f"{L}x{D}",
            L,
            nbytes,
            "GB/s",
            f"{L}·{D}·(4+2)+{D}·4 B",
            run,
            check,
            ("copy", nbytes),
            lambda: [out],
            ("rmsnorm_rows_f32_bf16", 4.0 * L * D, float(nbytes)),
        )

    yield "cuda rmsnorm", build_rmsnorm

    tp = xp.asarray(k.token_positions(grid))

    def build_rope() -> KernelCase:
        rng = np.random.default_rng(601)
        qkv0, qkv = up(random(rng, (L, 3 * Q)), "bfloat16")
        work = qkv0.copy()
        freqs = xp.asarray(ref.rope_frequencies(hd, dtype=np.float32))

        def run() -> Any:
            return k.rope_inplace(work, tp, freqs, H, hd)

        def check(go: Callable[[], Any]) -> tuple[float, float]:
            work[...] = qkv0
            go()
            return rel_err(to_host(work), rope_want(qkv, grid, H, hd)), TOL_BF16_OUT

        nbytes = 2 * L * 2 * Q * 2 + L * 16
        return KernelCase(
            "rope bf16 (q, k in place)",
            "CUDA C",
            "bfloat16",
            f"{L}x{3 * Q}",
            L,
            nbytes,
            "GB/s",
            f"2·{L}·2·{Q}·2+{L}·16 B",
            run,
            check,
            ("copy", nbytes),
            lambda: [work],
            ("rope_2d_inplace_bf16", 6.0 * L * Q, float(nbytes)),
        )

    yield "cuda rope", build_rope

    def build_pos_emb() -> KernelCase:
        rng = np.random.default_rng(602)
        x0, x = up(random(rng, (L, D)), "float32")
        work = x0.copy()
        pos_w = (0.5 * rng.standard_normal((c.init_pos_emb_height, c.init_pos_emb_width, D))).astype(np.float32)
        pw_d = xp.asarray(pos_w)
        time_tab = xp.asarray(ref.time_sincos_table(D, c.init_pos_emb_time).astype(np.float32))
        g_d = xp.asarray(grid.astype(np.int32))

        def run() -> Any:
            return k.add_position_embedding_inplace(work, tp, g_d, pw_d, time_tab, c.pos_emb_interpolation_mode)

        def check(go: Callable[[], Any]) -> tuple[float, float]:
            work[...] = x0
            go()
            want = x.astype(np.float64) + ref.position_embedding(grid, pos_w.astype(np.float64), c)
            return rel_err(to_host(work), want), TOL_FP32

        nbytes = 2 * L * D * 4
        return KernelCase(
            "pos_emb (x in place)",
            "CUDA C",
            "float32",
            f"{L}x{D}",
            L,
            nbytes,
            "GB/s",
            f"2·{L}·{D}·4 B",
            run,
            check,
            ("copy", nbytes),
            lambda: [work],
            (f"add_pos_emb_{c.pos_emb_interpolation_mode}", 36.0 * L * D, float(nbytes)),
        )

    yield "cuda pos_emb", build_pos_emb

    def build_merge() -> KernelCase:
        rng = np.random.default_rng(603)
        x_d, x = up(random(rng, (L, D)), "float32")
        mks = c.merge_kernel_size
        ms = xp.asarray(k.merge_sources(grid, mks))
        result: dict[str, Any] = {}

        def run() -> Any:
            result["out"] = k.tpool_merge(x_d, ms, mks, "bfloat16")

        def check(go: Callable[[], Any]) -> tuple[float, float]:
            go()
            return rel_err(to_host(result["out"]), merge_want(x, grid, mks)), TOL_BF16_OUT

        nbytes = L * D * (4 + 2)
        return KernelCase(
            "merge fp32->bf16",
            "CUDA C",
            "float32->bfloat16",
            f"{L}x{D}",
            L,
            nbytes,
            "GB/s",
            f"{L}·{D}·(4+2) B",
            run,
            check,
            ("copy", nbytes),
            lambda: [result["out"]],
            ("tpool_merge_f32_bf16", 2.0 * L * D, float(nbytes)),
        )

    yield "cuda merge", build_merge


# ============================================================================ Hopper (sm_90a) kernels
def hopper_cases(
    hk: Any, c: VisionConfig, grid: np.ndarray, gemm_names: tuple[str, ...], block_ns: tuple[int, ...] = (128, 256)
) -> Iterator[tuple[str, Builder]]:
    """The Hopper kernels through `hk` (hopper_launchers on a GPU, emulation.hopper on the CPU): bf16
    gemm_bf16_sm90 per shape (K % 8 == 0 only) and tile width, then flash_attn_sm90 (head_dim <= 128),
    checked like the mma.sync kernels and against the same baselines (cuBLAS, SDPA)."""
    xp = hk.array_module()
    L = int(np.sum(np.prod(grid, axis=1)))
    H, hd = c.vt_num_attention_heads, c.head_dim
    shapes = gemm_shapes(c, L)
    for name in gemm_names:
        if shapes[name][2] % 8:  # the tensor maps need 16-byte rows; the backend takes gemm_bf16_tc there
            continue
        for bn in block_ns:

            def gemm(*args: Any, bn: int = bn, **kwargs: Any) -> Any:
                return hk.gemm(*args, block_n=bn, **kwargs)

            label = f"gemm_bf16_sm90 bn{bn} {name}"
            xray = f"gemm_bf16_sm90_bn{bn}_{{out}}_{{epi}}"
            yield f"hopper gemm bn{bn} {name}", _gemm_builder(gemm, xp, shapes[name], L, name, "bfloat16", label, xray)
    if hd % 8 == 0 and hd <= 128:
        build = _attention_builder(hk.attention, xp, L, H, hd, "bfloat16", "flash_attn_sm90", f"flash_attn_sm90_hd{hd}")
        yield "hopper attention", build
