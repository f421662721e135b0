"""Prediction beside measurement: the X-ray's roofline for a stage's kernels, and gpu_check's numbers when they exist.

The prediction (model, no GPU) is `xray.roofline` at K3 shapes on one GPU's datasheet peaks: the time floor
from compulsory DRAM traffic, and the bound of the kernel as written (its global loads as requested).
The measurement is read from gpu_check reports of real GPUs committed under `benchmarks/results/<gpu>-<date>/
results.csv`, matched to the kernels by `roofline.match_measured`; with none there, the table says so.
"""

from __future__ import annotations

from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def measured_reports(results_dir: Path | None = None) -> list[Path]:
    """The `results.csv` of every gpu_check report under `results_dir` (default: the checkout's
    benchmarks/results/), newest folder name last; empty when there is none (or no checkout)."""
    root = RESULTS_DIR if results_dir is None else Path(results_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("*/results.csv") if p.is_file())


def _rate_text(row: dict[str, str]) -> str:
    what = " ".join(x for x in (row.get("item"), row.get("shape")) if x)
    ms = f"{float(row['median_ms']):.3g} ms, " if row.get("median_ms") else ""
    rate = f"{ms}{float(row['rate']):.3g} {row['unit']}"
    return f"{what}: {rate}" if what else rate


def prediction_rows(
    stage: str, gpu: str = "H200", results_dir: Path | None = None
) -> tuple[list[str], list[list[str]], str]:
    """(header, rows, note) of the stage's prediction-and-measurement table, for `markdown_table`.

    Rows: kernel, family and version, FLOPs and compulsory DRAM bytes at K3 shape, the limit, the time
    floor (compulsory traffic), the bound as written (requested traffic), then what gpu_check measured
    for it on a real GPU (or "—"). `note` says where the measured column comes from, or that nothing
    was measured yet."""
    from types import SimpleNamespace

    from moonvit_kernels import registry
    from moonvit_kernels.tools.xray import calibration, catalogue, roofline
    from moonvit_kernels.tools.xray.arch import GPUS

    listed = registry.notebook_kernels(stage)  # the registry entries whose `notebook` is this one
    if not listed:
        known = sorted({e.notebook for e in registry.entries() if e.notebook})
        raise ValueError(f"no kernels listed for stage {stage!r}; known: {', '.join(known)}")
    if gpu not in GPUS:
        raise ValueError(f"unknown GPU {gpu!r}; known: {', '.join(GPUS)}")
    peaks = GPUS[gpu]
    infos = [catalogue.describe(backend, label) for backend, label in listed]
    reports = measured_reports(results_dir)
    measured: dict[str, list[str]] = {}
    candidates = [  # the rows calibration.match_row reads, one per catalogue kernel of the stage
        SimpleNamespace(
            backend=i.backend, family=i.family, k3=True, flops=i.flops, kernel=i.label, version=i.version, info=i
        )
        for i in infos
    ]
    # one entry per (kernel, measured item and shape): from the report that timed the most kernels (a full run
    # over a --quick one of the same machine)
    best: dict[tuple[str, str, str], tuple[int, str]] = {}
    for path in reports:
        kernel_rows = calibration.read_kernel_rows(path)
        for row in kernel_rows:
            match = calibration.match_row(row, candidates)
            if match is None:
                continue
            key = (match.info.label, row.get("item", ""), row.get("shape", ""))
            if key not in best or len(kernel_rows) > best[key][0]:
                best[key] = (len(kernel_rows), f"{_rate_text(row)} ({path.parent.name})")
    for (label, _, _), (_, text) in best.items():
        measured.setdefault(label, []).append(text)
    rows = []
    for info in infos:
        bound = roofline.bound(info, peaks)
        if bound is None or info.flops is None:
            continue
        peak = roofline.peak_flops(peaks, info.peak)
        as_written = max(info.flops / peak, (info.request_bytes or info.dram_bytes) / peaks.dram_bytes_per_s)
        rows.append(
            [
                f"`{info.label}` ({'numba' if info.backend == 'numba' else 'CUDA C'})",
                f"{info.family} {info.version}",
                f"{info.flops / 1e9:,.2f} G",
                f"{info.dram_bytes / 2**20:,.1f} MiB",
                bound.limit,
                f"{bound.seconds * 1e6:,.1f}",
                f"{as_written * 1e6:,.1f}",
                "; ".join(measured.get(info.label, [])) or "—",
            ]
        )
    header = [
        "kernel",
        "version",
        "FLOPs (K3 shape)",
        "DRAM bytes (compulsory)",
        "limit",
        f"floor µs on {peaks.name} (model, no GPU)",
        "bound as written µs (model, no GPU)",
        "measured (gpu_check, real GPU)",
    ]
    if not reports:
        note = (
            "Measured: nothing yet — no gpu_check report from a real GPU is committed under benchmarks/results/, so "
            "the last column is empty. Run `python -m moonvit_kernels.gpu_check --out benchmarks/results/<gpu>-<date>` "
            "on a GPU and re-execute this notebook to see measured beside predicted."
        )
    else:
        note = (
            f"Measured: gpu_check reports {', '.join(p.parent.name for p in reports)} (their own shapes, in the cell)."
        )
    return header, rows, note
