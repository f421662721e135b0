"""Small but representative launches of every numba kernel under the simulator, for `trace`.

Each job launches the kernel exactly as its launcher does (block shape, K3 head_dim 128, the K3
block size of the memory-bound kernels) on the fewest blocks that show a full warp pattern: full
tiles (so no lane is masked by an edge), one or two blocks, random data. A job stands for the
kernels whose registry entry names it as `trace_job` (`moonvit_kernels.registry`: every epilogue of
one GEMM version shares its loads; the epilogue traced is `residual`, which also reads R).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from moonvit_kernels.tools.xray import trace


@dataclass
class TraceJob:
    name: str  # the registry's `trace_job` of the kernels it stands for
    setup: str  # what was launched, for the report
    launch: Callable[[], tuple[Any, Any, Any, list, list[str], Callable[[], bool] | None]]


def _rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def _dispatcher(label: str) -> Any:
    """The kernel of numba registry entry `label`, reached the one way every tool reaches a kernel
    (`KernelEntry.dispatcher`)."""
    from moonvit_kernels import registry

    entry = registry.find("numba", label)
    if entry is None:
        raise ValueError(f"no numba registry entry is called {label!r}")
    return entry.dispatcher()


def _f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def _gemm_job(version: int, M: int, N: int, K: int) -> TraceJob:
    def launch():
        from moonvit_kernels.numba_backend import gemm

        rng = _rng()
        A, B, R = _f32(rng, M, K), _f32(rng, N, K), _f32(rng, M, N)
        C = np.zeros((M, N), np.float32)
        blocks, threads = gemm.launch_config(version, M, N)
        args = [A, B, R, C, np.int32(M), np.int32(N), np.int32(K)]

        def ok() -> bool:
            return bool(np.allclose(C, A.astype(np.float64) @ B.T + R, atol=1e-3, rtol=1e-3))

        return _dispatcher(f"gemm_v{version}_residual"), blocks, threads, args, ["A", "B", "R", "C", "M", "N", "K"], ok

    return TraceJob(f"gemm_v{version}", f"M={M}, N={N}, K={K}, epilogue residual", launch)


def _qkv(rng: np.random.Generator, L: int, H: int, hd: int) -> np.ndarray:
    return _f32(rng, L, 3 * H * hd)


def _attention_v1_job(hd: int, L: int) -> TraceJob:
    def launch():
        from moonvit_kernels.numba_backend import attention

        rng = _rng()
        qkv = _qkv(rng, L, 1, hd)
        cu = np.array([0, L], np.int32)
        o = np.zeros((L, hd), np.float32)
        lse = np.zeros((L, 1), np.float32)
        kernel = _dispatcher(f"attention_v1_hd{hd}_t{attention.V1_THREADS}")
        scale = np.float32(1 / np.sqrt(hd))
        return (
            kernel,
            (1, 1),
            attention.V1_THREADS,
            [qkv, cu, o, lse, scale],
            ["qkv", "cu_seqlens", "o", "lse", ""],
            None,
        )

    return TraceJob("attention_v1", f"hd={hd}, one item of L={L} keys, query row 0 (1 block)", launch)


def _attention_v2_job(hd: int, L: int) -> TraceJob:
    def launch():
        from moonvit_kernels.numba_backend import attention

        rng = _rng()
        qkv = _qkv(rng, L, 1, hd)
        cu = np.array([0, L], np.int32)
        bq, bk = attention.V2_BLOCK_Q, attention.V2_BLOCK_K
        tiles = attention.query_tiles(cu, bq)[:1]
        o = np.zeros((L, hd), np.float32)
        lse = np.zeros((L, 1), np.float32)
        kernel = _dispatcher(f"attention_v2_hd{hd}_q{bq}_k{bk}")
        scale = np.float32(1 / np.sqrt(hd))
        args = [qkv, cu, tiles, o, lse, scale]
        return kernel, (1, 1), (bk, bq), args, ["qkv", "cu_seqlens", "tiles", "o", "lse", ""], None

    return TraceJob("attention_v2", f"hd={hd}, one item of L={L}, first query tile", launch)


def _rmsnorm_job(cols: int) -> TraceJob:
    def launch():

        rng = _rng()
        x, w = _f32(rng, 1, cols), _f32(rng, cols)
        out, rstd = np.zeros_like(x), np.zeros(1, np.float32)
        t = 256
        args = [x, w, out, rstd, np.int32(1), np.int32(cols), np.float32(1e-6)]
        return _dispatcher(f"rmsnorm_kernel_t{t}"), 1, t, args, ["x", "weight", "out", "rstd", "", "", ""], None

    return TraceJob("rmsnorm", f"one row of D={cols}, 256 threads", launch)


def _rope_job(heads: int, hd: int) -> TraceJob:
    def launch():

        rng = _rng()
        qkv = _qkv(rng, 2, heads, hd)
        g = np.array([[1, 1, 2]], np.int32)
        cu = np.array([0, 2], np.int32)
        args = [qkv, g, cu, np.int32(1), np.int32(2), np.int32(heads), np.int32(hd)]
        return _dispatcher("rope2d_kernel"), 1, 128, args, ["qkv", "grid_thws", "cu_seqlens", "", "", "", ""], None

    return TraceJob("rope", f"token 0 of 2, H={heads}, hd={hd}, 128 threads", launch)


def _merge_job(D: int) -> TraceJob:
    def launch():
        from moonvit_kernels.numba_backend import launch as nl

        rng = _rng()
        x = _f32(rng, 4, D)
        items = nl.item_table([[1, 2, 2]], (2, 2))
        out = np.zeros((1, 4 * D), np.float32)
        args = [x, items, out, np.int32(1), np.int32(1), np.int32(D), np.int32(2), np.int32(2)]
        return _dispatcher("merge_gather_kernel"), 1, 128, args, ["x", "items", "out", "", "", "", "", ""], None

    return TraceJob("merge", f"one merged token, D={D}, 128 threads", launch)


def _pos_emb_job(mode: str, D: int) -> TraceJob:
    def launch():
        from moonvit_kernels.numba_backend import launch as nl
        from moonvit_kernels.numba_backend import pos_emb

        rng = _rng()
        x = _f32(rng, 4, D)
        pos = _f32(rng, 8, 8, D)
        time = pos_emb.time_table(D, 4)
        items = nl.item_table([[1, 2, 2]])
        args = [x, pos, time, items, np.int32(1), np.int32(4), np.int32(D), np.int32(8), np.int32(8)]
        names = ["x", "pos_weight", "time", "items", "", "", "", "", ""]
        return _dispatcher(f"add_pos_emb_{mode}"), 1, 128, args, names, None

    return TraceJob(f"pos_emb_{mode}", f"token 0 of a 2x2 item, 8x8 grid, D={D}", launch)


# (stage, version) -> the job of a registry entry (its version's number, `args`, `trace_size`); version None: any
_MAKERS: dict[tuple[str, str | None], Callable[[Any], TraceJob]] = {
    ("gemm", None): lambda e: _gemm_job(int(e.version[1:]), *e.trace_size),
    ("attention", "v1"): lambda e: _attention_v1_job(e.args[0], *e.trace_size),
    ("attention", "v2"): lambda e: _attention_v2_job(e.args[0], *e.trace_size),
    ("rmsnorm", None): lambda e: _rmsnorm_job(*e.trace_size),
    ("rope", None): lambda e: _rope_job(*e.trace_size),
    ("merge", None): lambda e: _merge_job(*e.trace_size),
    ("pos_emb", None): lambda e: _pos_emb_job(e.args[0], *e.trace_size),
}


def jobs() -> list[TraceJob]:
    """Every numba trace job the registry names (`registry.trace_jobs`: sizes from each job's first entry, chosen
    to run in seconds under the simulator), in registry order."""
    from moonvit_kernels import registry

    out = []
    for name, entry in registry.trace_jobs("numba").items():
        make = _MAKERS.get((entry.stage, entry.version)) or _MAKERS.get((entry.stage, None))
        if make is None:
            raise ValueError(f"registry trace job {name!r}: no trace for stage {entry.stage} {entry.version}")
        job = make(entry)
        if job.name != name:
            raise ValueError(f"registry trace job {name!r} launches {job.name!r}: name them alike")
        out.append(job)
    return out


def run(job: TraceJob) -> trace.TraceResult:
    """Run one job traced; errors become the result's `error` (the report carries on)."""
    result = trace.TraceResult(job.name, job.setup)
    try:
        kernel, grid, block, args, names, ok = job.launch()
        names = [n or f"arg{i}" for i, n in enumerate(names)]
        records = trace.run_traced(kernel, grid, block, args, names)
        result.sites = trace.merge_sites(trace.analyse(records))
        if ok is not None and not ok():
            result.error = "the traced launch computed a wrong result"
    except Exception as e:  # a kernel the tracer cannot run is reported, not fatal
        result.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
    return result
