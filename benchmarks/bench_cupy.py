"""Benchmark the CUDA C kernels (through CuPy) and the whole CupyBackend tower on a GPU.

    python benchmarks/bench_cupy.py [--tokens 1024 4096] [--repeats 20] [--out benchmarks/results]

For each kernel at the real K3 shapes, and for the whole tower (27 layers + projector) on one
image of L patches (L = 1024: a 448x448 image; 4096: 896x896):
  - time: median and spread (p10..p90) of `repeats` runs after warm-up, CUDA events;
  - rate: TFLOP/s (GEMM 2·M·N·K, attention 4·L²·Q, tower: SPEC.md's sum) or GB/s (memory-bound
    kernels: bytes read + written), the formula printed beside it, and % of the GPU's peak;
  - baseline measured in the same run: cuBLAS through cupy.matmul for GEMMs (float16 for the bf16
    kernel: CuPy has no bfloat16, and fp16 runs the same tensor-core rate; float32 for the SIMT
    kernel), torch SDPA for attention when torch is installed, a device-to-device copy of the
    same bytes for memory-bound kernels; the ratio is ours / baseline in throughput;
  - the timed output is re-checked (against an on-device fp32 computation, or the fp32 backend for
    the tower) and the run stops if it is wrong.
Writes a CSV and a PNG plot, both stamped with the GPU name and package versions.
Without a GPU it says so and exits with status 2: there is nothing to time.
"""

from __future__ import annotations

import argparse
import csv
import math
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from moonvit_kernels.device import gpu_name

# Dense peaks by GPU (bf16 tensor TFLOP/s, fp32 SIMT TFLOP/s, HBM GB/s). H200: SPEC.md's 790.
PEAKS = {"H200": (790.0, 67.0, 4800.0), "H100": (989.0, 67.0, 3350.0), "A100": (312.0, 19.5, 2039.0)}


def peaks_for(name: str) -> tuple[float, float, float] | None:
    return next((p for key, p in PEAKS.items() if key in name), None)


def versions_stamp() -> str:
    import cupy

    parts = [f"python {platform.python_version()}", f"numpy {np.__version__}", f"cupy {cupy.__version__}"]
    parts.append(f"CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}, driver {cupy.cuda.runtime.driverGetVersion()}")
    try:
        import torch

        parts.append(f"torch {torch.__version__}")
    except ImportError:
        pass
    return ", ".join(parts)


def time_ms(fn: Callable[[], object], repeats: int, warmup: int = 3) -> tuple[float, float, float]:
    """(median, p10, p90) milliseconds of `fn()` over `repeats` runs, each timed with CUDA events."""
    import cupy as cp

    for _ in range(warmup):
        fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(repeats):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return float(np.median(times)), float(np.percentile(times, 10)), float(np.percentile(times, 90))


def recheck(got, want, tol: float, what: str) -> float:
    """Relative max error of a timed output vs its check value; exits when it is too large or NaN."""
    import cupy as cp

    got = cp.asarray(got, dtype=cp.float32)
    want = cp.asarray(want, dtype=cp.float32)
    err = float(cp.max(cp.abs(got - want)) / max(1e-30, float(cp.max(cp.abs(want)))))
    if not (math.isfinite(err) and err <= tol):
        raise SystemExit(f"{what}: the timed output is wrong (relative max error {err:.2e} > {tol:.0e})")
    return err


class Results:
    """Rows of the CSV, printed as they come."""

    FIELDS = ("kernel", "tokens", "median_ms", "p10_ms", "p90_ms", "rate", "unit", "formula", "pct_peak",
              "baseline", "baseline_ms", "ratio_to_baseline", "check_rel_err")  # fmt: skip

    def __init__(self, peaks: tuple[float, float, float] | None):
        self.rows: list[dict] = []
        self.peaks = peaks

    def add(self, kernel, tokens, t, work, unit, formula, peak_index, baseline="", baseline_t=None, err=float("nan")):
        rate = work / (t[0] * 1e-3) / (1e12 if unit == "TFLOP/s" else 1e9)
        peak = self.peaks[peak_index] if self.peaks else None
        row = {
            "kernel": kernel,
            "tokens": tokens,
            "median_ms": round(t[0], 4),
            "p10_ms": round(t[1], 4),
            "p90_ms": round(t[2], 4),
            "rate": round(rate, 2),
            "unit": unit,
            "formula": formula,
            "pct_peak": round(100 * rate / peak, 1) if peak else "",
            "baseline": baseline,
            "baseline_ms": round(baseline_t[0], 4) if baseline_t else "",
            "ratio_to_baseline": round(baseline_t[0] / t[0], 3) if baseline_t else "",
            "check_rel_err": f"{err:.1e}",
        }
        self.rows.append(row)
        base = f"  vs {baseline} {row['ratio_to_baseline']}x" if baseline_t else ""
        pct = f" ({row['pct_peak']}% of peak)" if peak else ""
        print(
            f"{kernel:28s} L={tokens:5d} {t[0]:9.4f} ms [{t[1]:.4f}..{t[2]:.4f}] {rate:9.2f} {unit}{pct}  "
            f"{formula}{base}  check {err:.1e}",
            flush=True,
        )


# ============================================================================ the benchmarks
def bench_gemms(res: Results, L: int, repeats: int) -> None:
    import cupy as cp

    from moonvit_kernels.config import VisionConfig
    from moonvit_kernels.cuda_backend import launchers as k

    c = VisionConfig.k3()
    D, Q, I, T, P = c.vt_hidden_size, c.qkv_hidden_size, c.vt_intermediate_size, c.text_hidden_size, c.patch_dim
    M4 = L // 4  # merged tokens for the projector
    shapes = [  # name, M, N, K, output dtype, epilogue
        ("patch_embed", L, D, P, "float32", "none"),
        ("qkv", L, 3 * Q, D, "bfloat16", "none"),
        ("wo+residual", L, D, Q, "float32", "residual"),
        ("fc0+gelu_tanh", L, I, D, "bfloat16", "gelu_tanh"),
        ("fc1+residual", L, D, I, "float32", "residual"),
        ("proj0+gelu_erf", M4, 4 * D, 4 * D, "bfloat16", "gelu_erf"),
        ("proj2", M4, T, 4 * D, "float32", "none"),
    ]
    rng = cp.random.default_rng(0)
    for name, M, N, K, out_dtype, epi in shapes:
        a32 = rng.standard_normal((M, K), dtype=cp.float32)
        b32 = rng.standard_normal((N, K), dtype=cp.float32) / math.sqrt(K)
        a, b = k.to_bf16(a32), k.to_bf16(b32)
        r = rng.standard_normal((M, N), dtype=cp.float32) if epi == "residual" else None
        out = cp.empty((M, N), dtype=cp.float32 if out_dtype == "float32" else cp.uint16)
        resid = out if r is not None else None

        def ours(a=a, b=b, epi=epi, resid=resid, out=out, out_dtype=out_dtype):
            k.gemm(a, b, epilogue=epi, residual=resid, out=out, out_dtype=out_dtype)

        a16, b16 = k.from_bf16(a).astype(cp.float16), k.from_bf16(b).astype(cp.float16)
        t_base = time_ms(lambda a16=a16, b16=b16: cp.matmul(a16, b16.T), repeats)
        t = time_ms(ours, repeats)
        # check: one more run from a known residual, vs fp32 cupy on the same bf16 operands
        want = cp.matmul(k.from_bf16(a), k.from_bf16(b).T)
        if r is not None:
            out[...] = r
            want = want + r
        ours()
        got = k.from_bf16(out) if out_dtype == "bfloat16" else out
        if epi == "gelu_tanh":
            want = 0.5 * want * (1 + cp.tanh(math.sqrt(2 / math.pi) * (want + 0.044715 * want**3)))
        elif epi == "gelu_erf":
            import cupyx.scipy.special as sp

            want = 0.5 * want * (1 + sp.erf(want / math.sqrt(2)))
        err = recheck(got, want, 1e-2, f"gemm {name}")
        res.add(
            f"gemm_bf16 {name}", L, t, 2 * M * N * K, "TFLOP/s", f"2·{M}·{N}·{K}", 0, "cupy.matmul fp16", t_base, err
        )

    # the fp32 SIMT GEMM at the qkv shape, against cuBLAS SGEMM
    M, N, K = L, 3 * Q, D
    a = rng.standard_normal((M, K), dtype=cp.float32)
    b = rng.standard_normal((N, K), dtype=cp.float32) / math.sqrt(K)
    out = cp.empty((M, N), cp.float32)
    t = time_ms(lambda: k.gemm(a, b, out=out), repeats)
    t_base = time_ms(lambda: cp.matmul(a, b.T), repeats)
    err = recheck(out, cp.matmul(a, b.T), 1e-4, "gemm_fp32 qkv")
    res.add("gemm_fp32 qkv", L, t, 2 * M * N * K, "TFLOP/s", f"2·{M}·{N}·{K}", 1, "cupy.matmul fp32", t_base, err)


def attention_check(qkv32, out, lse, heads: int, hd: int, rows: int = 128) -> float:
    """Re-check the first `rows` queries of head 0 and head heads-1 with fp32 CuPy."""
    import cupy as cp

    from moonvit_kernels.cuda_backend import launchers as k

    Q = heads * hd
    got = k.from_bf16(out) if out.dtype == cp.uint16 else out
    worst = 0.0
    for h in (0, heads - 1):
        q = qkv32[:rows, h * hd : (h + 1) * hd]
        kk = qkv32[:, Q + h * hd : Q + (h + 1) * hd]
        v = qkv32[:, 2 * Q + h * hd : 2 * Q + (h + 1) * hd]
        s = (q @ kk.T) / math.sqrt(hd)
        m = s.max(axis=1, keepdims=True)
        p = cp.exp(s - m)
        want = (p @ v) / p.sum(axis=1, keepdims=True)
        worst = max(worst, recheck(got[:rows, h * hd : (h + 1) * hd], want, 2e-2, "attention output"))
        want_lse = (m + cp.log(p.sum(axis=1, keepdims=True)))[:, 0]
        worst = max(worst, recheck(lse[:rows, h], want_lse, 1e-4, "attention lse"))
    return worst


def bench_attention(res: Results, L: int, repeats: int) -> None:
    import cupy as cp

    from moonvit_kernels.cuda_backend import launchers as k

    heads, hd = 12, 128
    Q = heads * hd
    bounds = np.array([0, L], dtype=np.int32)
    flops = 4 * L * L * Q
    rng = cp.random.default_rng(1)
    qkv32 = rng.standard_normal((L, 3 * Q), dtype=cp.float32)
    torch_t = None
    try:
        import torch
        import torch.nn.functional as F

        q, kk, v = (torch.randn(1, heads, L, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        torch_t = time_ms(lambda: F.scaled_dot_product_attention(q, kk, v), repeats)
    except ImportError:
        pass
    for dtype in ("bfloat16", "float32"):
        qkv = k.to_bf16(qkv32) if dtype == "bfloat16" else qkv32
        checked32 = k.from_bf16(qkv) if dtype == "bfloat16" else qkv32
        t = time_ms(lambda qkv=qkv: k.attention(qkv, bounds, heads, hd), repeats)
        out, lse = k.attention(qkv, bounds, heads, hd)
        err = attention_check(checked32, out, lse, heads, hd)
        base = ("torch SDPA bf16", torch_t) if torch_t else ("", None)
        peak = 0 if dtype == "bfloat16" else 1
        res.add(f"attention_{dtype}", L, t, flops, "TFLOP/s", f"4·{L}²·{Q}", peak, base[0], base[1], err)


def bench_memory_bound(res: Results, L: int, repeats: int) -> None:
    import cupy as cp

    from moonvit_kernels import reference as ref
    from moonvit_kernels.config import VisionConfig
    from moonvit_kernels.cuda_backend import launchers as k

    c = VisionConfig.k3()
    D, H, hd, Q = c.vt_hidden_size, c.vt_num_attention_heads, c.head_dim, c.qkv_hidden_size
    side = int(round(math.sqrt(L)))
    grid = np.array([[1, side, L // side]])
    rng = cp.random.default_rng(2)

    def copy_baseline(nbytes: int) -> tuple[float, float, float]:
        src = cp.empty(nbytes // 2, dtype=cp.uint8)
        dst = cp.empty_like(src)  # read nbytes/2 + write nbytes/2 = nbytes moved
        return time_ms(lambda: cp.copyto(dst, src), repeats)

    # rmsnorm: fp32 [L, D] in, bf16 out (the layer's norm0/norm1)
    x = rng.standard_normal((L, D), dtype=cp.float32)
    w = 1 + 0.25 * rng.standard_normal(D, dtype=cp.float32)
    out = cp.empty((L, D), cp.uint16)
    t = time_ms(lambda: k.rmsnorm(x, w, c.vit_norm_eps, out=out, out_dtype="bfloat16"), repeats)
    want = x / cp.sqrt((x * x).mean(axis=1, keepdims=True) + c.vit_norm_eps) * w
    err = recheck(k.from_bf16(out), want, 1e-2, "rmsnorm")
    nbytes = L * D * (4 + 2) + D * 4
    res.add(
        "rmsnorm fp32->bf16", L, t, nbytes, "GB/s", f"{L}·{D}·(4+2)+{D}·4 B", 2, "D2D copy", copy_baseline(nbytes), err
    )

    # rope: in place on q and k of a bf16 qkv [L, 3Q]
    qkv0 = k.to_bf16(rng.standard_normal((L, 3 * Q), dtype=cp.float32))
    qkv = qkv0.copy()
    tp = cp.asarray(k.token_positions(grid))
    freqs = cp.asarray(ref.rope_frequencies(hd, dtype=np.float32))
    t = time_ms(lambda: k.rope_inplace(qkv, tp, freqs, H, hd), repeats)
    qkv[...] = qkv0
    k.rope_inplace(qkv, tp, freqs, H, hd)
    n = 64  # re-check the first 64 tokens on the host
    host = k.from_bf16(qkv0[:n]).get().astype(np.float64)
    ang = ref.rope_angles_packed(grid, hd, np.float32)[:n].astype(np.float64)
    for s in (0, 1):
        host[:, s * Q : (s + 1) * Q] = ref.apply_rope(host[:, s * Q : (s + 1) * Q].reshape(n, H, hd), ang).reshape(n, Q)
    err = recheck(k.from_bf16(qkv[:n]), host, 1e-2, "rope")
    nbytes = 2 * L * 2 * Q * 2 + L * 16
    res.add("rope bf16 (q,k in place)", L, t, nbytes, "GB/s", f"2·{L}·2·{Q}·2+{L}·16 B", 2, "D2D copy",
            copy_baseline(nbytes), err)  # fmt: skip

    # position embedding: x [L, D] fp32 += bilinear resize of the 64x64 grid
    pos_w = 0.5 * rng.standard_normal((c.init_pos_emb_height, c.init_pos_emb_width, D), dtype=cp.float32)
    time_tab = cp.asarray(ref.time_sincos_table(D, c.init_pos_emb_time).astype(np.float32))
    g = cp.asarray(grid.astype(np.int32))
    x0 = rng.standard_normal((L, D), dtype=cp.float32)
    xx = x0.copy()
    t = time_ms(lambda: k.add_position_embedding_inplace(xx, tp, g, pos_w, time_tab, "bilinear"), repeats)
    xx[...] = x0
    k.add_position_embedding_inplace(xx, tp, g, pos_w, time_tab, "bilinear")
    want = x0.get().astype(np.float64) + ref.position_embedding(grid, pos_w.get().astype(np.float64), c)
    err = recheck(xx, want, 1e-5, "pos_emb")
    nbytes = 2 * L * D * 4
    res.add("pos_emb (x in place)", L, t, nbytes, "GB/s", f"2·{L}·{D}·4 B", 2, "D2D copy", copy_baseline(nbytes), err)

    # merge: fp32 [L, D] -> bf16 [L/4, 4D]
    xf = rng.standard_normal((L, D), dtype=cp.float32)
    ms = cp.asarray(k.merge_sources(grid, c.merge_kernel_size))
    t = time_ms(lambda: k.tpool_merge(xf, ms, c.merge_kernel_size, "bfloat16"), repeats)
    got = k.from_bf16(k.tpool_merge(xf, ms, c.merge_kernel_size, "bfloat16"))
    items = ref.tpool_patch_merger(xf.get(), grid, c.merge_kernel_size)
    err = recheck(got, np.concatenate([m.reshape(m.shape[0], -1) for m in items]), 1e-2, "merge")
    nbytes = L * D * (4 + 2)
    res.add("merge fp32->bf16", L, t, nbytes, "GB/s", f"{L}·{D}·(4+2) B", 2, "D2D copy", copy_baseline(nbytes), err)


def tower_flops(L: int) -> int:
    """SPEC.md's cost of one image of L patches: patch GEMM + layers + projector."""
    from moonvit_kernels.config import VisionConfig

    c = VisionConfig.k3()
    D, Q, I, T = c.vt_hidden_size, c.qkv_hidden_size, c.vt_intermediate_size, c.text_hidden_size
    layer = 2 * L * D * (3 * Q + Q + 2 * I) + 4 * L * L * Q
    projector = 2 * (L // 4) * 4 * D * (4 * D + T)
    return 2 * L * c.patch_dim * D + c.vt_num_hidden_layers * layer + projector


def bench_tower(res: Results, L: int, repeats: int) -> None:
    from moonvit_kernels.config import VisionConfig
    from moonvit_kernels.cuda_backend.backend import CupyBackend
    from moonvit_kernels.weights import random_weights

    c = VisionConfig.k3()
    side = int(round(math.sqrt(L)))
    grid = np.array([[1, side, L // side]])
    weights = random_weights(c, 0)
    rng = np.random.default_rng(3)
    pixels = (rng.standard_normal((L, 3, c.patch_size, c.patch_size)) * 0.7).astype(np.float32)
    fp32 = CupyBackend(c, weights, dtype="float32")
    want = fp32.forward(pixels, grid)[0]
    del fp32
    bf16 = CupyBackend(c, weights, dtype="bfloat16")
    t = time_ms(lambda: bf16.forward(pixels, grid), max(3, repeats // 4), warmup=2)
    err = recheck(bf16.forward(pixels, grid)[0], want, 5e-2, "tower bf16 vs fp32 backend")
    res.add("tower+projector bf16 (27 layers)", L, t, tower_flops(L), "TFLOP/s", "SPEC.md costs", 0, "", None, err)


# ============================================================================ output
def plot(rows: list[dict], path: Path, stamp: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(15, 6))
    for ax, unit in zip(axes, ("TFLOP/s", "GB/s"), strict=True):
        sel = [r for r in rows if r["unit"] == unit]
        labels = [f"{r['kernel']}\nL={r['tokens']}" for r in sel]
        y = np.arange(len(sel))
        ax.barh(y - 0.2, [r["rate"] for r in sel], height=0.4, label="ours")
        base = [r["rate"] * r["ratio_to_baseline"] ** -1 if r["ratio_to_baseline"] else 0 for r in sel]
        ax.barh(y + 0.2, base, height=0.4, label="baseline (cuBLAS / SDPA / D2D copy)")
        ax.set_yticks(y, labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(unit)
        ax.legend(fontsize=8)
    fig.suptitle(f"moonvit_kernels CUDA C kernels on {stamp}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096], help="patches per image (square grid)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--skip-tower", action="store_true", help="kernels only")
    args = p.parse_args(argv)

    name = gpu_name()
    if name is None:
        print("bench_cupy: no CUDA GPU (cuInit failed or found no device): nothing to time.", file=sys.stderr)
        print(
            "  Without a GPU, run the compile tier: python -m moonvit_kernels.cuda_backend.nvrtc_check", file=sys.stderr
        )
        return 2
    try:
        import cupy  # noqa: F401
    except ImportError:
        print("bench_cupy: CuPy is not installed: pip install -e '.[cuda13]'", file=sys.stderr)
        return 2

    stamp = f"{name} | {versions_stamp()}"
    print(f"# {stamp}")
    res = Results(peaks_for(name))
    for L in args.tokens:
        bench_gemms(res, L, args.repeats)
        bench_attention(res, L, args.repeats)
        bench_memory_bound(res, L, args.repeats)
        if not args.skip_tower:
            bench_tower(res, L, args.repeats)

    args.out.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = args.out / "bench_cupy.csv", args.out / "bench_cupy.png"
    with open(csv_path, "w", newline="") as f:
        f.write(f"# {stamp}\n")
        w = csv.DictWriter(f, fieldnames=Results.FIELDS)
        w.writeheader()
        w.writerows(res.rows)
    plot(res.rows, png_path, stamp)
    print(f"wrote {csv_path} and {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
