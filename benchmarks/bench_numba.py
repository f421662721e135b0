"""Benchmark the numba.cuda kernels, every version, and the whole `numba` forward.

    python benchmarks/bench_numba.py [--tokens 1024] [--repeats 10] [--csv FILE]

On a GPU: each kernel version at the encoder's real shapes, timed with CUDA events (median and
spread of `repeats` runs after a warm-up), with TFLOP/s (GEMM: 2·M·N·K; attention: 4·L²·Q)
or GB/s (memory-bound kernels: bytes read + written), the ratio to cuBLAS (`cupy.matmul`, when
CuPy is installed) for GEMMs, and the whole numba forward against the NumPy reference on the
CPU. Every timed output is re-checked against NumPy. Results are stamped with the GPU name and
package versions.

Without a GPU there is nothing to time: the script says so and prints what can be known here
(the compile tier's registers and shared memory, `python -m moonvit_kernels.numba_backend.compile_check`).
No GPU number exists until this runs on one.
"""

from __future__ import annotations

import argparse
import csv
import math
import platform
import statistics
import sys
from pathlib import Path

import numpy as np

from moonvit_kernels.device import gpu_name, simulator_enabled, where


def versions_stamp() -> str:
    import numba

    parts = [f"python {platform.python_version()}", f"numpy {np.__version__}", f"numba {numba.__version__}"]
    try:
        import cupy

        parts.append(f"cupy {cupy.__version__}")
    except ImportError:
        pass
    return ", ".join(parts)


def time_cuda(fn, repeats: int) -> tuple[float, float]:
    """Median and spread (max − min) in seconds of `fn()` timed with CUDA events."""
    from numba import cuda

    fn()
    cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = cuda.event(), cuda.event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return statistics.median(times), max(times) - min(times)


def check(got: np.ndarray, want: np.ndarray, tol: float, what: str) -> None:
    err = float(np.max(np.abs(got - want)) / max(1e-30, np.abs(want).max()))
    if not (math.isfinite(err) and err <= tol):
        raise SystemExit(f"{what}: timed output is wrong (relative error {err:.2e} > {tol:.0e})")


def run_gpu(tokens: int, repeats: int, out_csv: Path | None, config_name: str = "k3") -> None:
    from numba import cuda

    from moonvit_kernels import reference as ref
    from moonvit_kernels.config import VisionConfig
    from moonvit_kernels.model import MoonViT
    from moonvit_kernels.numba_backend import attention as attention_k
    from moonvit_kernels.numba_backend import gemm as gemm_k
    from moonvit_kernels.numba_backend import rmsnorm as rmsnorm_k
    from moonvit_kernels.plots import flop_table
    from moonvit_kernels.weights import random_weights

    cupy = None
    if not simulator_enabled():
        try:
            import cupy
        except ImportError:
            pass
    name = where()
    cfg = getattr(VisionConfig, config_name)()
    D, Q, I, H = cfg.vt_hidden_size, cfg.qkv_hidden_size, cfg.vt_intermediate_size, cfg.vt_num_attention_heads
    rng = np.random.default_rng(0)
    rows = []
    print(f"GPU: {name}; {versions_stamp()}; L = {tokens} tokens, float32")

    def record(
        kernel: str, seconds: float, spread: float, work: float, unit: str, formula: str, ratio: str = ""
    ) -> None:
        rate = work / seconds / (1e12 if unit == "TFLOP/s" else 1e9)
        print(
            f"{kernel:<28} {seconds * 1e3:9.3f} ms ±{spread * 1e3:7.3f}  {rate:8.2f} {unit:<8} {ratio:<22} [{formula}]"
        )
        rows.append([name, kernel, tokens, seconds, spread, rate, unit, formula, ratio])

    for M, N, K, what in [
        (tokens, 3 * Q, D, "wqkv"),
        (tokens, D, Q, "wo"),
        (tokens, I, D, "fc0"),
        (tokens, D, I, "fc1"),
    ]:
        a = rng.standard_normal((M, K)).astype(np.float32)
        b = (rng.standard_normal((N, K)) / math.sqrt(K)).astype(np.float32)
        a_d, b_d, c_d = cuda.to_device(a), cuda.to_device(b), cuda.device_array((M, N), np.float32)
        want = a.astype(np.float64) @ b.astype(np.float64).T
        base = None
        if cupy is not None:
            a_c, b_c = cupy.asarray(a), cupy.asarray(b)
            base, _ = time_cuda(lambda a_c=a_c, b_c=b_c: cupy.matmul(a_c, b_c.T), repeats)
            record(f"cuBLAS fp32 {what}", base, 0.0, 2 * M * N * K, "TFLOP/s", f"2·{M}·{N}·{K}")
        for v in gemm_k.VERSIONS:
            t, s = time_cuda(lambda v=v, a_d=a_d, b_d=b_d, c_d=c_d: gemm_k.gemm(a_d, b_d, out=c_d, version=v), repeats)
            check(c_d.copy_to_host(), want, 1e-4, f"gemm v{v} {what}")
            ratio = f"{100 * base / t:.1f}% of cuBLAS" if base else "no cuBLAS (install cupy)"
            record(f"gemm v{v} {what}", t, s, 2 * M * N * K, "TFLOP/s", f"2·{M}·{N}·{K}", ratio)

    x = rng.standard_normal((tokens, D)).astype(np.float32)
    g = (1 + 0.2 * rng.standard_normal(D)).astype(np.float32)
    x_d, g_d, o_d = cuda.to_device(x), cuda.to_device(g), cuda.device_array((tokens, D), np.float32)
    t, s = time_cuda(lambda: rmsnorm_k.rmsnorm(x_d, g_d, cfg.vit_norm_eps, out=o_d), repeats)
    check(o_d.copy_to_host(), ref.rmsnorm(x.astype(np.float64), g, cfg.vit_norm_eps), 1e-5, "rmsnorm")
    record("rmsnorm", t, s, 8 * tokens * D + 4 * D, "GB/s", f"4·(2·{tokens}·{D} + {D}) bytes")

    qkv = rng.standard_normal((tokens, 3 * Q)).astype(np.float32)
    qkv_d = cuda.to_device(qkv)
    cu = np.array([0, tokens], np.int32)
    q, k, v = (qkv[:, s * Q : (s + 1) * Q].reshape(tokens, H, -1).astype(np.float64) for s in range(3))
    want = ref.attention(q, k, v, cu).reshape(tokens, Q)
    for ver in attention_k.VERSIONS:
        result = {}

        def run(ver=ver, result=result):
            result["o"] = attention_k.attention(qkv_d, cu, H, version=ver)[0]

        t, s = time_cuda(run, repeats)
        check(result["o"].copy_to_host(), want, 1e-4, f"attention v{ver}")
        record(f"attention v{ver}", t, s, 4 * tokens * tokens * Q, "TFLOP/s", f"4·{tokens}²·{Q}")

    layers = 4
    cfg4 = cfg.replace(vt_num_hidden_layers=layers)
    w = random_weights(cfg4, 0)
    side = int(math.sqrt(tokens)) // 2 * 2
    grid = np.array([[1, side, side]])
    pv = rng.uniform(-1, 1, (side * side, 3, cfg.patch_size, cfg.patch_size)).astype(np.float32)
    model = MoonViT(cfg4, w, backend="numba")
    t, s = time_cuda(lambda: model.forward(pv, grid), max(3, repeats // 3))
    import time as _time

    t0 = _time.perf_counter()
    want = ref.vision_forward(pv, grid, w, cfg4)[0]
    t_np = _time.perf_counter() - t0
    check(model.forward(pv, grid, as_numpy=True)[0], want, 1e-3, "numba forward")
    flops = sum(row.count for row in flop_table(cfg4, grid))
    record(
        f"numba forward {layers} layers",
        t,
        s,
        flops,
        "TFLOP/s",
        f"flop_table: {side}x{side} patches",
        f"{t_np / t:.1f}x numpy CPU ({t_np:.2f} s)",
    )
    if out_csv:
        with open(out_csv, "w", newline="") as f:
            wr = csv.writer(f)
            wr.writerow(["gpu", "kernel", "tokens", "seconds", "spread", "rate", "unit", "formula", "ratio"])
            wr.writerows(rows)
        print(f"wrote {out_csv}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--csv", type=Path, default=None)
    ap.add_argument("--config", choices=["k3", "tiny"], default="k3", help="tiny: a smoke run of this script")
    args = ap.parse_args()
    if simulator_enabled():
        print("CUDA simulator: a smoke run of the benchmark code; its times say nothing about a GPU")
        run_gpu(args.tokens, args.repeats, args.csv, args.config)
        return
    if gpu_name() is None:
        print("No CUDA GPU here: no GPU number exists for the numba kernels yet.")
        print("What can be known without one is the compile tier (sm_90 registers, spills, shared memory):")
        print("    python -m moonvit_kernels.numba_backend.compile_check")
        print("and correctness under the CUDA simulator: python -m pytest tests/test_kernels_*.py")
        sys.exit(0)
    run_gpu(args.tokens, args.repeats, args.csv)


if __name__ == "__main__":
    main()
