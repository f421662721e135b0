"""Bank conflicts and coalescing of the CUDA C kernels, from addresses recorded on the emulated device.

Each job calls the real launcher (`cuda_backend.launchers`) on the emulated device within
`device.tracing(recording)` (`tools.emulation.tracing`): the module is built with every memory access
reported, and the launch the launcher makes is recorded. Covered: the fp32 SIMT GEMM, the bf16
tensor-core GEMM (cp.async stores and ldmatrix rows, one 16-byte row per lane), both flash attentions
at hd 128, RMSNorm and the merge gather (fp32). Not traced: RoPE and the position embedding (CUDA C),
and the epilogue variants (they share the main loop of the traced `residual` / `none` instantiation).
Each launch is one block of full tiles (attention: the first block, one query tile over two key
tiles), with random data.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from moonvit_kernels.tools.xray import trace


@dataclass
class CudaTraceJob:
    name: str  # the registry's `trace_job` of the kernels it stands for
    setup: str
    run: Callable[[], list[tuple]]


@contextlib.contextmanager
def _recorded(arrays: Sequence[str], **what: Any) -> Iterator[Any]:
    """Within the block the launchers run on the emulated device and their launch is recorded: a
    `tracing.Recording` naming the launch's device arrays `arrays` (`what`: its other fields)."""
    from moonvit_kernels.tools.emulation import device, tracing

    recording = tracing.Recording(arrays, **what)
    with device.activated(), device.tracing(recording):
        yield recording


def _up(a: np.ndarray) -> Any:
    """`a` on the emulated device."""
    from moonvit_kernels.tools.emulation import device

    return device.asarray(np.ascontiguousarray(a))


def _bf16(x: np.ndarray) -> np.ndarray:
    from moonvit_kernels.weights import float32_to_bf16_bits

    return float32_to_bf16_bits(x.astype(np.float32))


def _gemm_fp32() -> list[tuple]:
    from moonvit_kernels.cuda_backend import launchers

    M = N = 64
    K = 32
    rng = np.random.default_rng(7)
    A, B, R = (rng.standard_normal(s).astype(np.float32) for s in ((M, K), (N, K), (M, N)))
    with _recorded(("A", "B", "C", "R"), shared=("gemm_fp32_simt<3>",)) as rec:
        C = launchers.gemm(_up(A), _up(B), epilogue="residual", residual=_up(R)).get()
    if not np.allclose(C, A.astype(np.float64) @ B.T + R, atol=1e-3):
        raise RuntimeError("the traced launch computed a wrong result")
    return rec.records


def _gemm_bf16() -> list[tuple]:
    from moonvit_kernels.cuda_backend import launchers

    M = N = 128
    K = 64
    rng = np.random.default_rng(8)
    A, B = _bf16(rng.standard_normal((M, K))), _bf16(rng.standard_normal((N, K)))
    with _recorded(("A", "B", "C", "R"), shared=("gemm_bf16_tc<float, 0>",)) as rec:
        launchers.gemm(_up(A), _up(B))
    return rec.records


def _attention(dtype: str) -> list[tuple]:
    from moonvit_kernels.cuda_backend import launchers

    hd, H = 128, 1
    bf16 = dtype == "bf16"
    if bf16:
        bq, bkv, lds, elem = 64, 64, hd + 8, 2
        slices = [("Qs", 0, bq * lds * elem), ("Ks", bq * lds * elem, 2 * bkv * lds * elem)]
        slices.append(("Vs", (bq + 2 * bkv) * lds * elem, 2 * bkv * lds * elem))
    else:
        bq, bkv = 16, 32
        slices = [("Qs", 0, bq * hd * 4), ("Ks", bq * hd * 4, bkv * (hd + 1) * 4)]
        slices.append(("Vs", (bq * hd + bkv * (hd + 1)) * 4, bkv * hd * 4))
    L = 2 * bkv
    rng = np.random.default_rng(9)
    qkv = rng.standard_normal((L, 3 * H * hd)).astype(np.float32)
    qkv = _bf16(qkv) if bf16 else qkv
    with _recorded(("qkv", "out", "lse", "cu_seqlens"), dynamic=slices, blocks=1) as rec:
        launchers.attention(_up(qkv), np.array([0, L]), H, hd)
    return rec.records


def _rmsnorm(dtype: str) -> list[tuple]:
    from moonvit_kernels.cuda_backend import launchers

    D = 1024
    rng = np.random.default_rng(10)
    x = rng.standard_normal((1, D)).astype(np.float32)
    x = _bf16(x) if dtype == "bf16" else x
    w = rng.standard_normal(D).astype(np.float32)
    out_dtype = "bfloat16" if dtype == "bf16" else "float32"
    with _recorded(("x", "weight", "out", "rstd"), shared=("block_sum",)) as rec:
        launchers.rmsnorm(_up(x), _up(w), 1e-6, out_dtype=out_dtype)
    return rec.records


def _merge() -> list[tuple]:
    from moonvit_kernels.cuda_backend import launchers

    D = 1024
    rng = np.random.default_rng(11)
    x = rng.standard_normal((4, D)).astype(np.float32)
    ms = np.asarray(launchers.merge_sources(np.array([[1, 2, 2]]), (2, 2)), dtype=np.int32)
    with _recorded(("x", "out", "merge_src")) as rec:
        launchers.tpool_merge(_up(x), _up(ms), (2, 2))
    return rec.records


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
