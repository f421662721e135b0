"""Time the NumPy reference `vision_forward` at the real K3 dimensions against the same
computation written in PyTorch on the CPU (when torch is installed), and report peak memory.

    python benchmarks/bench_reference.py [--layers 4] [--side 448] [--repeats 3] [--csv FILE]

Real dimensions: D = 1024, Q = 1536 (12 heads of 128), I = 4096, p = 14, text 7168; a side×side
image gives (side/14)² patches (448 → 1024 tokens). Both sides run in float32 with all CPU
threads; runs of the two alternate (so drifting machine speed hits both alike), and the
medians and the median per-round ratio are reported after one warm-up each. The torch version is
written independently from SPEC.md (SDPA per item, complex-free RoPE) and its output is compared
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
from moonvit_kernels.plots import flop_table
from moonvit_kernels.weights import random_weights


def torch_forward(torch, pixel_values, grid_thws, weights, config):
    """The same tower in PyTorch (float32, CPU), written from SPEC.md for timing comparison."""
    F = torch.nn.functional
    w = {k: torch.from_numpy(v) for k, v in weights.items()}
    D, Q, H = config.vt_hidden_size, config.qkv_hidden_size, config.vt_num_attention_heads
    hd = Q // H
    eps = config.vit_norm_eps

    def rms(x, g, e):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + e) * g

    x = (
        torch.from_numpy(pixel_values).reshape(pixel_values.shape[0], -1)
        @ w["vision_tower.patch_embed.proj.weight"].reshape(D, -1).T
    )
    pos = w["vision_tower.patch_embed.pos_emb.weight"]
    parts, cos_l, sin_l = [], [], []
    freqs = 1.0 / (10000.0 ** (torch.arange(0, hd, 4)[: hd // 4].float() / hd))
    for t, h, wd in grid_thws.tolist():
        grid = (
            pos
            if (h, wd) == tuple(pos.shape[:2])
            else F.interpolate(
                pos.permute(2, 0, 1)[None], size=(h, wd), mode=config.pos_emb_interpolation_mode, align_corners=False
            )[0].permute(1, 2, 0)
        )
        assert t == 1, "benchmark uses images"
        parts.append(grid.reshape(h * wd, D))
        rows = torch.arange(h).repeat_interleave(wd).float()
        cols = torch.arange(wd).repeat(h).float()
        ang = torch.stack([cols[:, None] * freqs, rows[:, None] * freqs], dim=-1).reshape(h * wd, hd // 2)
        cos_l.append(ang.cos())
        sin_l.append(ang.sin())
    x = x + torch.cat(parts)
    cos, sin = torch.cat(cos_l)[:, None, :], torch.cat(sin_l)[:, None, :]
    L = x.shape[0]
    sizes = (grid_thws[:, 0] * grid_thws[:, 1] * grid_thws[:, 2]).tolist()

    def rope(z):
        a, b = z[..., 0::2], z[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)

    for i in range(config.vt_num_hidden_layers):
        b = f"vision_tower.encoder.blocks.{i}."
        qkv = rms(x, w[b + "norm0.weight"], eps) @ w[b + "wqkv.weight"].T
        q, k, v = qkv.view(L, 3, H, hd).unbind(1)
        q, k = rope(q), rope(k)
        outs = [
            F.scaled_dot_product_attention(qi.transpose(0, 1), ki.transpose(0, 1), vi.transpose(0, 1)).transpose(0, 1)
            for qi, ki, vi in zip(q.split(sizes), k.split(sizes), v.split(sizes), strict=True)
        ]
        x = x + torch.cat(outs).reshape(L, Q) @ w[b + "wo.weight"].T
        hmid = rms(x, w[b + "norm1.weight"], eps) @ w[b + "mlp.fc0.weight"].T
        x = x + F.gelu(hmid, approximate="tanh") @ w[b + "mlp.fc1.weight"].T
    x = rms(x, w["vision_tower.encoder.final_layernorm.weight"], eps)
    kh, kw = config.merge_kernel_size
    merged = []
    start = 0
    for t, h, wd in grid_thws.tolist():
        item = x[start : start + t * h * wd].view(t, h // kh, kh, wd // kw, kw, D).permute(0, 1, 3, 2, 4, 5).mean(0)
        merged.append(item.reshape(-1, kh * kw * D))
        start += t * h * wd
    m = torch.cat(merged)
    y = F.gelu(m @ w["mm_projector.proj.0.weight"].T) @ w["mm_projector.proj.2.weight"].T
    return rms(y, w["mm_projector.post_norm.weight"], config.projector_ln_eps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--side", type=int, default=448, help="image side in pixels (multiple of 28)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--csv", type=Path, default=None)
    args = ap.parse_args()

    config = VisionConfig.k3().replace(vt_num_hidden_layers=args.layers)
    weights = random_weights(config, seed=0)
    n = args.side // config.patch_size
    grid = np.array([[1, n, n]])
    L = n * n
    rng = np.random.default_rng(0)
    pixels = rng.uniform(-1, 1, (L, 3, config.patch_size, config.patch_size)).astype(np.float32)
    flops = sum(row.count for row in flop_table(config, grid))
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
