"""Time the NumPy reference `vision_forward` at the real K3 dimensions against the same
computation written in PyTorch on the CPU (when torch is installed), and report peak memory.

    python -m moonvit_kernels.gpu_check.cpu_reference [--layers 4] [--side 448] [--repeats 3] [--csv FILE]

Real dimensions: D = 1024, Q = 1536 (12 heads of 128), I = 4096, p = 14, text 7168; a side×side
image gives (side/14)² patches (448 → 1024 tokens). Both sides run in float32 with all CPU
threads; runs of the two alternate (so drifting machine speed hits both alike), and the
medians and the median per-round ratio are reported after one warm-up each. The torch version is
written independently from docs/model.md (SDPA per item, complex-free RoPE) and its output is compared
with the reference's, so the two really compute the same thing.
Peak memory: tracemalloc's peak of NumPy allocations during one reference forward.
"""

from __future__ import annotations

import argparse
import csv
import math
import platform
import statistics
import time
import tracemalloc
from pathlib import Path

import numpy as np

from moonvit_kernels import reference as ref
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.tools.gpu_check.torch_tower import torch_forward
from moonvit_kernels.tools.gpu_check.tower import tower_flops
from moonvit_kernels.weights import random_weights


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--side", type=int, default=448, help="image side in pixels (multiple of 28)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--csv", type=Path, default=None)
    args = ap.parse_args(argv)

    config = VisionConfig.k3().replace(vt_num_hidden_layers=args.layers)
    weights = random_weights(config, seed=0)
    n = args.side // config.patch_size
    grid = np.array([[1, n, n]])
    L = n * n
    rng = np.random.default_rng(0)
    pixels = rng.uniform(-1, 1, (L, 3, config.patch_size, config.patch_size)).astype(np.float32)
    flops = tower_flops(config, grid)
    print(
        f"K3 tower, {args.layers} layers, {args.side}x{args.side} image = {L} patches, float32, CPU "
        f"({platform.processor() or platform.machine()}); work = {flops / 1e9:.1f} GFLOP "
        "(GEMMs 2·L·D·(3Q+Q+2I)/layer + attention 4·L²·Q/layer + patch embed + projector)"
    )

    # numpy and torch runs alternate, so that a machine whose speed drifts (shared or
    # throttled CPUs) affects both sides alike; each side is warmed up first.
    def run_numpy():
        return ref.vision_forward(pixels, grid, weights, config)

    try:
        import torch
    except ImportError:
        torch = None
        print("torch not installed: no PyTorch baseline (pip install torch to compare)")
    sides = {"numpy": run_numpy}
    if torch is not None:
        torch.set_grad_enabled(False)
        sides[f"pytorch {torch.__version__}"] = lambda: torch_forward(torch, pixels, grid, weights, config)
    times: dict[str, list[float]] = {name: [] for name in sides}
    for fn in sides.values():
        fn()
    for _ in range(args.repeats):
        for name, fn in sides.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    tracemalloc.start()
    out_ref = run_numpy()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    weight_bytes = sum(v.nbytes for v in weights.values())
    rows = []
    for name, ts in times.items():
        t = statistics.median(ts)
        print(
            f"{name:<20}: median {t * 1e3:8.1f} ms (min {min(ts) * 1e3:.1f}, max {max(ts) * 1e3:.1f}, "
            f"{len(ts)} runs) {flops / t / 1e9:6.1f} GFLOP/s"
        )
        rows.append((name, t, peak if name == "numpy" else float("nan")))
    print(f"numpy peak extra memory {peak / 2**20:.0f} MiB (weights {weight_bytes / 2**20:.0f} MiB, not counted)")
    if torch is not None:
        out_pt = sides[f"pytorch {torch.__version__}"]().numpy()
        err = float(np.abs(out_pt - out_ref[0]).max())
        ratios = [a / b for a, b in zip(*times.values(), strict=True)]
        print(f"torch threads {torch.get_num_threads()}; max |numpy - torch| = {err:.2e}")
        print(
            f"ratio numpy / pytorch: median of per-round ratios {statistics.median(ratios):.3f} "
            f"(range {min(ratios):.3f}..{max(ratios):.3f}; target <= 1.25)"
        )
        assert math.isfinite(err) and err < 1e-2, f"torch and numpy disagree: {err}"
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            wr = csv.writer(f)
            wr.writerow(["impl", "layers", "tokens", "seconds", "gflops", "peak_bytes"])
            for name, t, pk in rows:
                wr.writerow([name, args.layers, L, f"{t:.4f}", f"{flops / t / 1e9:.2f}", pk])


if __name__ == "__main__":
    main()
