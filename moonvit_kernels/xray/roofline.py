"""Roofline: lower-bound time of one launch from datasheet peaks, and the roofline picture.

time >= max(FLOPs / peak FLOP/s, DRAM bytes / peak bandwidth), with the fp32 SIMT peak for fp32
kernels and the dense bf16 tensor-core peak for tensor-core kernels. Every number here is a model
from datasheet peaks ("model, no GPU"), never a measurement; measured points (a `gpu_check`
results.csv) are drawn separately when given.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .arch import GpuPeaks
from .catalogue import KernelInfo


@dataclass
class Bound:
    """The roofline bound of one kernel launch on one GPU."""

    gpu: str
    seconds: float
    limit: str  # "compute" or "memory"
    intensity: float  # FLOPs per DRAM byte


def peak_flops(gpu: GpuPeaks, peak: str) -> float:
    """The datasheet FLOP/s of `gpu` for `peak` ("fp32" SIMT or "bf16" tensor cores)."""
    if peak not in ("fp32", "bf16"):
        raise ValueError(f"peak {peak!r} is not 'fp32' or 'bf16'")
    return gpu.fp32_flops if peak == "fp32" else gpu.bf16_tensor_flops


def bound(info: KernelInfo, gpu: GpuPeaks) -> Bound | None:
    """Lower-bound time of `info`'s launch at K3 shape on `gpu`; None without a FLOP/byte model."""
    if info.flops is None or not info.dram_bytes:
        return None
    t_compute = info.flops / peak_flops(gpu, info.peak)
    t_memory = info.dram_bytes / gpu.dram_bytes_per_s
    limit = "compute" if t_compute >= t_memory else "memory"
    return Bound(gpu.name, max(t_compute, t_memory), limit, info.flops / info.dram_bytes)


def read_measured(path: str | Path) -> list[dict[str, str]]:
    """Rows of a gpu_check `results.csv` that carry a measured rate in TFLOP/s or GB/s
    (columns used: item, backend, unit, rate)."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    out = []
    for r in rows:
        unit = (r.get("unit") or "").strip()
        try:
            ok = unit in ("TFLOP/s", "GB/s") and float(r.get("rate") or "nan") > 0
        except ValueError:
            ok = False
        if ok:
            out.append(r)
    return out


def match_measured(row: dict[str, str], infos: Sequence[KernelInfo]) -> KernelInfo | None:
    """The catalogue entry a measured row stands for: same backend (numba, else CUDA C), family named in
    the row's item, preferring entries whose version tag (v1, v2, v3, bf16, fp32, f32) the item names."""
    item = (row.get("item") or "").lower()
    backend = "numba" if "numba" in (row.get("backend") or "").lower() else "cuda"
    family_hits = [i for i in infos if i.backend == backend and i.family.replace("_", "") in item.replace("_", "")]
    if not family_hits:
        return None

    def score(info: KernelInfo) -> int:
        tags = re.findall(r"v\d|bf16|fp32|f32", info.version.lower() + " " + info.label.lower())
        return sum(t in item for t in tags)

    return max(family_hits, key=score)


def plot(infos: Sequence[KernelInfo], gpu: GpuPeaks, path: str | Path, measured: Sequence[dict] = ()) -> Path:
    """Draw the roofline of `gpu` with each kernel version as a point; write a PNG to `path`.

    Filled markers: the kernel as written (x = FLOPs / bytes its global loads request, y = the rate
    the roof allows at that intensity). Hollow markers: the same kernel at its compulsory intensity
    (FLOPs / DRAM bytes). Measured points from `measured` (gpu_check rows, `match_measured`) are stars
    at the compulsory intensity of the kernel they measure."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 6))  # no pyplot: works under any backend, inline or headless
    ax = fig.subplots()
    xs = [10 ** (k / 20) for k in range(-60, 101)]
    bw = gpu.dram_bytes_per_s
    for peak, style in (("fp32", "-"), ("bf16", "--")):
        p = peak_flops(gpu, peak)
        ax.plot(xs, [min(p, x * bw) / 1e12 for x in xs], style, color="k", lw=1.2, label=f"roof, {peak} (datasheet)")
    families = sorted({i.family for i in infos})
    colours = dict(zip(families, colormaps["tab10"].colors, strict=False))
    for info in infos:
        if info.flops is None or not info.request_bytes:
            continue
        p = peak_flops(gpu, info.peak)
        x_req = info.flops / info.request_bytes
        x_dram = info.flops / info.dram_bytes
        c = colours[info.family]
        marker = "o" if info.backend == "numba" else "s"
        ax.scatter([x_req], [min(p, x_req * bw) / 1e12], color=c, marker=marker, zorder=3)
        ax.scatter([x_dram], [min(p, x_dram * bw) / 1e12], facecolors="none", edgecolors=c, marker=marker, zorder=3)
        ax.annotate(f"{info.family} {info.version}", (x_req, min(p, x_req * bw) / 1e12), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")  # fmt: skip
    for r in measured:
        info = match_measured(r, infos)
        if info is None or not info.dram_bytes:
            continue
        x = info.flops / info.dram_bytes
        rate = float(r["rate"])
        y = rate if r["unit"] == "TFLOP/s" else rate * 1e9 * x / 1e12
        ax.scatter([x], [y], marker="*", s=120, color="crimson", zorder=4)
    for fam, c in colours.items():
        ax.scatter([], [], color=c, label=fam)
    ax.scatter([], [], color="grey", marker="o", label="numba (filled: as written)")
    ax.scatter([], [], color="grey", marker="s", label="CUDA C")
    ax.scatter([], [], facecolors="none", edgecolors="grey", label="compulsory DRAM intensity")
    if measured:
        ax.scatter([], [], marker="*", s=120, color="crimson", label="measured (gpu_check)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("attainable TFLOP/s")
    tag = "" if measured else " — model, no GPU"
    ax.set_title(f"Roofline {gpu.name} ({gpu.arch}), datasheet peaks, K3 shapes{tag}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path
