"""Roofline: lower-bound time of one launch from every roof, and the roofline picture.

time >= max over the roofs of the time each allows:
  compute  FLOPs / the peak of the kernel's instruction class: FFMA (fp32), mma.sync (bf16 HMMA) or
           wgmma (bf16 HGMMA) (`arch.GpuPeaks`; mma.sync on sm_90 is a labelled model, not a datasheet)
  DRAM     compulsory bytes / datasheet bandwidth
  shared   shared-memory wavefronts of the launch / (1 wavefront per clock per SM x SMs x clock)
  issue    warp-instructions of the launch / (4 per clock per SM x SMs x clock)
The shared and issue roofs need the launch's modelled instruction counts (`launch_counts`, from the
SASS of its FMA loops and the traced conflicts); without them a bound has the compute and DRAM roofs
only. The roof that gives the longest time binds: the bound's `limit` names it. Every number here is
a model ("model, no GPU"), never a measurement; measured points (a `gpu_check` results.csv) are drawn
separately when given, and `calibration` puts them beside the bounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from moonvit_kernels.tools.xray.arch import GpuPeaks
from moonvit_kernels.tools.xray.catalogue import KernelInfo, describe
from moonvit_kernels.tools.xray.launch_counts import LaunchCounts

if TYPE_CHECKING:
    from moonvit_kernels.tools.xray.calibration import Calibration

# roof names of the compute peaks, by the catalogue's `peak`
COMPUTE_ROOFS = {"fp32": "FFMA", "mma_sync": "mma.sync", "wgmma": "wgmma"}
ROOFS = (*COMPUTE_ROOFS.values(), "DRAM", "shared", "issue")


@dataclass
class Bound:
    """The roofline bound of one kernel launch on one GPU: the time each roof allows, the longest binds."""

    gpu: str
    seconds: float
    limit: str  # the binding roof: "FFMA", "mma.sync", "wgmma", "DRAM", "shared" or "issue"
    intensity: float  # FLOPs per DRAM byte
    roofs: dict[str, float] = field(default_factory=dict)  # roof -> seconds


def peak_flops(gpu: GpuPeaks, peak: str) -> float:
    """The FLOP/s of `gpu` for the instruction class `peak` ("fp32", "mma_sync" or "wgmma")."""
    if peak not in COMPUTE_ROOFS:
        raise ValueError(f"peak {peak!r} is not one of {', '.join(COMPUTE_ROOFS)}")
    value = {"fp32": gpu.fp32_flops, "mma_sync": gpu.mma_sync_flops, "wgmma": gpu.wgmma_flops}[peak]
    if value is None:
        raise ValueError(f"{gpu.name} ({gpu.arch}) has no {COMPUTE_ROOFS[peak]} instruction")
    return value


def bound(info: KernelInfo, gpu: GpuPeaks, counts: LaunchCounts | None = None) -> Bound | None:
    """Lower-bound time of `info`'s launch at K3 shape on `gpu`, from the compute and DRAM roofs and,
    given the launch's modelled `counts`, the shared-memory and issue roofs; None without a FLOP/byte model."""
    if info.flops is None or not info.dram_bytes:
        return None
    roofs = {
        COMPUTE_ROOFS[info.peak]: info.flops / peak_flops(gpu, info.peak),
        "DRAM": info.dram_bytes / gpu.dram_bytes_per_s,
    }
    if counts is not None:
        roofs["shared"] = counts.shared_wavefronts / gpu.shared_wavefronts_per_s
        roofs["issue"] = counts.issued / gpu.issue_per_s
    limit = max(roofs, key=roofs.__getitem__)
    return Bound(gpu.name, roofs[limit], limit, info.flops / info.dram_bytes, roofs)


def plot(
    points: Sequence[tuple[KernelInfo, Bound]], gpu: GpuPeaks, path: str | Path, measured: Sequence[Calibration] = ()
) -> Path:
    """Draw `gpu`'s roofline with every roof and each kernel at its bound; write a PNG to `path`.

    Lines: the DRAM slope and the compute roofs of the GPU (FFMA, mma.sync, wgmma where it exists).
    Per kernel, at its compulsory intensity (FLOPs / DRAM bytes): a filled marker at the rate its
    bound allows (FLOPs / bound time), and where the kernel has them, its own shared-memory (▽) and
    issue (×) roofs as the rates they alone would allow (kernels sharing an intensity are spread
    along x by factors of 1.3, so that they stay apart). Measured rates (`calibration.calibrate` rows
    on this GPU) are stars at the intensity of the kernel they timed."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 6))  # no pyplot: works under any backend, inline or headless
    ax = fig.subplots()
    xs = [10 ** (k / 20) for k in range(-30, 81)]
    bw = gpu.dram_bytes_per_s
    ax.plot(xs, [x * bw / 1e12 for x in xs], ":", color="grey", lw=1)
    for peak, style in (("fp32", "-"), ("mma_sync", "--"), ("wgmma", "-.")):
        try:
            p = peak_flops(gpu, peak)
        except ValueError:
            continue
        ax.plot(xs, [min(p, x * bw) / 1e12 for x in xs], style, color="k", lw=1.2,
                label=f"{COMPUTE_ROOFS[peak]} roof, {p / 1e12:.0f} TFLOP/s / DRAM")  # fmt: skip
    families = sorted({info.family for info, _ in points})
    colours = dict(zip(families, colormaps["tab10"].colors, strict=False))
    shared_x: dict[float, int] = {}  # kernels at one intensity (the GEMM versions) are spread apart
    for info, bd in points:
        if not info.flops or not info.dram_bytes:
            continue
        x0 = round(info.flops / info.dram_bytes, 6)
        x = x0 * 1.3 ** shared_x.get(x0, 0)
        shared_x[x0] = shared_x.get(x0, 0) + 1
        c = colours[info.family]
        marker = "o" if info.backend == "numba" else "s"
        ax.scatter([x], [info.flops / bd.seconds / 1e12], color=c, marker=marker, zorder=3)
        for roof, m in (("shared", "v"), ("issue", "x")):
            if bd.roofs.get(roof):
                ax.scatter([x], [info.flops / bd.roofs[roof] / 1e12], color=c, marker=m, s=30, zorder=3,
                           facecolors="none" if m == "v" else None)  # fmt: skip
        ax.annotate(f"{info.version} ({bd.limit})", (x, info.flops / bd.seconds / 1e12), fontsize=6, rotation=30,
                    xytext=(3, 2), textcoords="offset points")  # fmt: skip
    for cal in measured:
        if not cal.kernel:
            continue
        info = describe(cal.xray_backend, cal.kernel)
        x = info.flops / info.dram_bytes
        y = cal.measured if cal.unit == "TFLOP/s" else cal.measured * 1e9 * x / 1e12
        ax.scatter([x], [y], marker="*", s=120, color="crimson", zorder=4)
    for fam, c in colours.items():
        ax.scatter([], [], color=c, label=fam)
    ax.scatter([], [], color="grey", marker="o", label="numba kernel at its bound")
    ax.scatter([], [], color="grey", marker="s", label="CUDA C kernel at its bound")
    ax.scatter([], [], facecolors="none", edgecolors="grey", marker="v", label="its shared-memory roof")
    ax.scatter([], [], color="grey", marker="x", label="its issue roof")
    if measured:
        ax.scatter([], [], marker="*", s=120, color="crimson", label="measured (gpu_check)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / compulsory DRAM byte)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_title(f"Roofline {gpu.name} ({gpu.arch}), K3 shapes — model, no GPU" + (" + measured" if measured else ""))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path
