"""Bank conflicts and coalescing of the CUDA C kernels, from addresses recorded in the CPU emulator.

Uses `tools.emulation.tracing` (the emulator rebuilt with every memory access reported).
Covered: the fp32 SIMT GEMM, the bf16 tensor-core GEMM (cp.async stores and ldmatrix rows, one
16-byte row per lane), both flash attentions at hd 128, RMSNorm and the merge gather (fp32).
Not traced: RoPE and the position embedding (CUDA C), and the epilogue variants (they share the
main loop of the traced `residual` / `none` instantiation). Each launch is one block (two key
tiles for attention) of full tiles, with random data.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from moonvit_kernels.tools.xray import trace


@dataclass
class CudaTraceJob:
    name: str  # the registry's `trace_job` of the kernels it stands for
    setup: str
    run: Callable[[], list[tuple]]


def _p(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


def _bf16(x: np.ndarray) -> np.ndarray:
    from moonvit_kernels.weights import float32_to_bf16_bits

    return float32_to_bf16_bits(x.astype(np.float32))


def _gemm_fp32() -> list[tuple]:
    from moonvit_kernels.tools.emulation import tracing

    M = N = 64
    K = 32
    rng = np.random.default_rng(7)
    A, B, R = (rng.standard_normal(s).astype(np.float32) for s in ((M, K), (N, K), (M, N)))
    C = np.zeros((M, N), np.float32)
    regions = [("global", "A", A), ("global", "B", B), ("global", "R", R), ("global", "C", C)]
    regions += [("shared", n, (a, s)) for n, a, s in tracing.static_shared("gemm_fp32_simt<3>")]

    def launch(lib):
        lib.emu_gemm_fp32(3, _p(A), _p(B), _p(C), _p(R), M, N, K, 1)

    recs = tracing.run(launch, regions)
    if not np.allclose(C, A.astype(np.float64) @ B.T + R, atol=1e-3):
        raise RuntimeError("the traced launch computed a wrong result")
    return recs


def _gemm_bf16() -> list[tuple]:
    from moonvit_kernels.tools.emulation import tracing

    M = N = 128
    K = 64
    rng = np.random.default_rng(8)
    A, B = _bf16(rng.standard_normal((M, K))), _bf16(rng.standard_normal((N, K)))
    C = np.zeros((M, N), np.float32)
    regions = [("global", "A", A), ("global", "B", B), ("global", "C", C)]
    regions += [("shared", n, (a, s)) for n, a, s in tracing.static_shared("gemm_bf16_tc<float, 0>")]

    def launch(lib):
        lib.emu_gemm_bf16(0, 0, _p(A), _p(B), _p(C), _p(C), M, N, K, 1)

    return tracing.run(launch, regions)


def _attention(dtype: str) -> list[tuple]:
    from moonvit_kernels.tools.emulation import tracing

    hd, H = 128, 1
    bf16 = dtype == "bf16"
    if bf16:
        bq, bkv, lds, elem = 64, 64, hd + 8, 2
        slices = [("Qs", 0, bq * lds * elem), ("Ks", bq * lds * elem, 2 * bkv * lds * elem)]
        slices.append(("Vs", (bq + 2 * bkv) * lds * elem, 2 * bkv * lds * elem))
    else:
        bq, bkv, elem = 16, 32, 4
        slices = [("Qs", 0, bq * hd * 4), ("Ks", bq * hd * 4, bkv * (hd + 1) * 4)]
        slices.append(("Vs", (bq * hd + bkv * (hd + 1)) * 4, bkv * hd * 4))
    L = 2 * bkv
    rng = np.random.default_rng(9)
    qkv = rng.standard_normal((L, 3 * H * hd)).astype(np.float32)
    qkv = _bf16(qkv) if bf16 else qkv
    out = np.zeros((L, H * hd), qkv.dtype)
    lse = np.zeros((L, H), np.float32)
    cu = np.array([0, L], np.int32)
    regions = [("global", "qkv", qkv), ("global", "out", out), ("global", "lse", lse), ("global", "cu_seqlens", cu)]

    def launch(lib):
        rc = lib.emu_attention(hd, int(bf16), _p(qkv), _p(out), _p(lse), _p(cu), 1, bq, H)
        if rc:
            raise RuntimeError(f"emulator has no attention for hd {hd}")

    return tracing.run(launch, regions, slices)


def _rmsnorm(dtype: str) -> list[tuple]:
    from moonvit_kernels.tools.emulation import tracing

    D = 1024
    rng = np.random.default_rng(10)
    x = rng.standard_normal((1, D)).astype(np.float32)
    x = _bf16(x) if dtype == "bf16" else x
    w = rng.standard_normal(D).astype(np.float32)
    y = np.zeros_like(x)
    rstd = np.zeros(1, np.float32)
    regions = [("global", "x", x), ("global", "weight", w), ("global", "out", y), ("global", "rstd", rstd)]
    regions += [("shared", n, (a, s)) for n, a, s in tracing.static_shared("block_sum")]
    b = int(dtype == "bf16")

    def launch(lib):
        lib.emu_rmsnorm(b, b, _p(x), _p(w), _p(y), _p(rstd), 1, D, ctypes.c_float(1e-6))

    return tracing.run(launch, regions)


def _merge() -> list[tuple]:
    from moonvit_kernels.tools.emulation import merge_sources, tracing

    D = 1024
    rng = np.random.default_rng(11)
    x = rng.standard_normal((4, D)).astype(np.float32)
    ms = np.ascontiguousarray(merge_sources(np.array([[1, 2, 2]]), (2, 2)), dtype=np.int32)
    out = np.zeros((ms.shape[0], 4 * D), np.float32)
    regions = [("global", "x", x), ("global", "out", out), ("global", "merge_src", ms)]

    def launch(lib):
        lib.emu_merge(0, 0, _p(x), _p(out), _p(ms), ms.shape[0], D, 2, 2)

    return tracing.run(launch, regions)


def jobs() -> list[CudaTraceJob]:
    return [
        CudaTraceJob("gemm_fp32_simt", "M=N=64, K=32 (1 block), epilogue residual", _gemm_fp32),
        CudaTraceJob("gemm_bf16_tc", "M=N=128, K=64 (1 block), fp32 out, no epilogue", _gemm_bf16),
        CudaTraceJob("flash_attn_f32", "hd 128, 1 query tile, 2 key tiles", lambda: _attention("f32")),
        CudaTraceJob("flash_attn_bf16", "hd 128, 1 query tile, 2 key tiles", lambda: _attention("bf16")),
        CudaTraceJob("rmsnorm_rows_f32", "one row of D=1024, fp32", lambda: _rmsnorm("f32")),
        CudaTraceJob("rmsnorm_rows_bf16", "one row of D=1024, bf16", lambda: _rmsnorm("bf16")),
        CudaTraceJob("tpool_merge_f32", "one merged token, D=1024", _merge),
    ]


def run_all(patterns: Sequence[str] = (), log=print) -> tuple[dict, list[str]]:
    """({("cuda", cubin label): TraceResult}, notes) for the traced CUDA C kernels matching `patterns`."""
    from moonvit_kernels import registry
    from moonvit_kernels.tools.xray.catalogue import describe
    from moonvit_kernels.tools.xray.report import wanted

    try:
        from moonvit_kernels.tools.emulation import compiler

        if compiler() is None:
            return {}, ["CUDA C kernels: no C++ compiler, so no emulator traces"]
    except Exception as e:
        return {}, [f"CUDA C kernels: emulator unavailable ({e})"]
    out: dict = {}
    notes = ["CUDA C traces cover the GEMMs, flash attention (hd 128), RMSNorm and merge; RoPE and pos-emb untraced"]
    for job in jobs():
        mine = [lb for lb in registry.traced_by("cuda", job.name) if wanted(lb, describe("cuda", lb).family, patterns)]
        if not mine:
            continue
        log(f"[xray] tracing {job.name} on the CPU emulator ({job.setup})")
        result = trace.TraceResult(job.name, job.setup)
        try:
            result.sites = trace.merge_sites(trace.analyse(job.run()))
        except Exception as e:
            result.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
        for lb in mine:
            out[("cuda", lb)] = result
    return out, notes
