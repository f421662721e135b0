"""Put the five views together: one row per kernel instantiation x architecture, Markdown, CSV, PNGs.

Every number is "model, no GPU": resources and SASS from the compiled binary, occupancy from the
architecture table, conflicts and coalescing from addresses recorded on the CPU, roofline times
from the roofs of `arch` (compute per instruction class, DRAM, shared memory, issue) with the
launch's instruction counts modelled from its SASS (`launch_counts`). `calibration` puts measured
rates beside the bounds once a GPU run exists.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from moonvit_kernels.tools.xray import arch as arch_table
from moonvit_kernels.tools.xray import build, calibration, catalogue, launch_counts, roofline, sass
from moonvit_kernels.tools.xray.occupancy import occupancy
from moonvit_kernels.tools.xray.trace import TraceResult

DEFAULT_ARCHS = ("sm_80", "sm_89", "sm_90")
ROOFS_NOTE = (
    "Bounds (model, no GPU): each launch at K3 shape takes at least as long as each roof allows: compute (FFMA, "
    "mma.sync or wgmma peak), DRAM (compulsory bytes), shared memory (wavefronts at 1 per clock per SM) and issue "
    "(warp-instructions at 4 per clock per SM); the last two count only the loops doing the FMAs, from the SASS "
    "(`launch_counts`). The longest binds."
)
FIRST_GPU = {"sm_80": "A100", "sm_89": "L40S", "sm_90": "H200"}


@dataclass
class Row:
    """One kernel instantiation on one architecture (the xray.csv columns)."""

    backend: str
    kernel: str
    family: str
    version: str
    specialisation: str
    arch: str
    k3: bool
    threads: int
    registers: int
    static_shared: int
    dynamic_shared: int
    stack_bytes: int
    spill_bytes: int
    blocks_per_sm: int
    warps_per_sm: int
    occupancy: float
    limiter: str
    sass_instructions: int | None = None
    innermost_loops: int | None = None
    hot_loop_instructions: int | None = None
    hot_loop_fmas: int | None = None
    hot_loop_per_fma: float | None = None
    hot_loop_mix: str = ""
    generation_ops: str = ""  # whole kernel: "HGMMA=.. UTMALDG=.. HMMA=.. LDGSTS=.." (Hopper vs Ampere instructions)
    worst_bank_conflict: float | None = None
    worst_coalescing: float | None = None
    traced: str = ""
    flops: float | None = None
    dram_bytes: float | None = None
    request_bytes: float | None = None
    intensity: float | None = None
    shared_wavefronts: float | None = None  # per launch, modelled (launch_counts)
    issued_instructions: float | None = None  # warp-instructions per launch, modelled
    conflicts: str = ""  # where the conflict factors of the shared roof come from
    roofline_gpu: str = ""
    roofline_us: float | None = None
    roofline_limit: str = ""  # the binding roof: FFMA, mma.sync, wgmma, DRAM, shared or issue
    roof_compute_us: float | None = None
    roof_dram_us: float | None = None
    roof_shared_us: float | None = None
    roof_issue_us: float | None = None
    roofline_all: str = ""
    formula: str = ""
    problems: str = ""


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    traces: dict[tuple[str, str], TraceResult] = field(default_factory=dict)  # by (backend, kernel label)
    notes: list[str] = field(default_factory=list)
    hot_loops: dict[tuple[str, str, str], sass.Loop] = field(default_factory=dict)  # (backend, label, arch)
    counts: dict[tuple[str, str, str], launch_counts.LaunchCounts] = field(
        default_factory=dict
    )  # (backend, label, arch)
    calibration: list[str] = field(default_factory=lambda: [calibration.NO_GPU_RUN])  # Markdown lines


def wanted(label: str, family: str, patterns: Sequence[str]) -> bool:
    """True when no pattern is given, or one is a substring of the label or family, or a regex matching it."""
    if not patterns:
        return True
    for p in patterns:
        if p in label or p == family:
            return True
        try:
            if re.fullmatch(p, label):
                return True
        except re.error:
            pass
    return False


def _mix_text(loop: sass.Loop) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(loop.mix.items(), key=lambda kv: -kv[1]))


def collect(
    patterns: Sequence[str] = (),
    archs: Sequence[str] = DEFAULT_ARCHS,
    backends: Sequence[str] = build.BACKENDS,
    traces: dict[str, TraceResult] | None = None,
    cache_dir: str | None = None,
    log=print,
) -> Report:
    """Build (or load from cache), disassemble and model every wanted kernel on every arch.

    `traces` maps (backend, cubin label) to trace results (see `trace_numba`); kernels without one get no
    conflict/coalescing figures."""
    report = Report()
    traces = traces or {}
    report.traces = traces
    have_nvdisasm = sass.nvdisasm_path() is not None
    if not have_nvdisasm:
        report.notes.append("nvdisasm not found (pip install nvidia-cuda-nvdisasm): SASS view skipped")
    jobs = [(backend, arch) for backend in backends for arch in archs]
    log(f"[xray] building / loading cubins: {', '.join(f'{b} {a}' for b, a in jobs)}")
    # numba builds run in subprocesses and NVRTC in worker processes: overlap them
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {job: pool.submit(build.binaries, job[0], job[1], cache_dir) for job in jobs}
        built = {}
        for job, fut in futures.items():
            try:
                built[job] = fut.result()
            except Exception as e:  # one tier failing leaves the others' rows
                report.notes.append(f"{job[0]} {job[1]}: build failed: {str(e).strip()[:300]}")
    selected = []
    for (backend, arch), bins in built.items():
        for b in bins:
            info = catalogue.describe(backend, b.label, b.threads, b.dynamic_shared)
            if wanted(b.label, info.family, patterns):
                selected.append((b, info, arch))
    if have_nvdisasm:  # disassemble in parallel once; listings are cached beside the cubins
        with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
            list(pool.map(_try_disassemble, [b.cubin_path for b, _, _ in selected]))
    for b, info, arch in selected:
        report.rows.append(_row(report, b, info, arch, traces.get((b.backend, b.label)), have_nvdisasm))
    return report


def _try_disassemble(path: str) -> None:
    try:
        sass.disassemble_file(path)
    except Exception:  # reported per row when the row asks for it again
        pass


def _row(
    report: Report, b: build.Binary, info: catalogue.KernelInfo, arch: str, tr: TraceResult | None, nvdisasm: bool
) -> Row:
    occ = occupancy(arch, info.threads, max(b.registers, 0), b.static_shared, info.dynamic_shared)
    row = Row(
        backend=b.backend,
        kernel=b.label,
        family=info.family,
        version=info.version,
        specialisation=info.specialisation,
        arch=arch,
        k3=info.k3,
        threads=info.threads,
        registers=b.registers,
        static_shared=b.static_shared,
        dynamic_shared=info.dynamic_shared,
        stack_bytes=b.stack_bytes,
        spill_bytes=b.spill_stores + b.spill_loads,
        blocks_per_sm=occ.blocks_per_sm,
        warps_per_sm=occ.warps_per_sm,
        occupancy=round(occ.occupancy, 4),
        limiter=occ.limiter,
        flops=info.flops,
        dram_bytes=info.dram_bytes,
        request_bytes=info.request_bytes,
        formula=info.formula,
        problems="; ".join([*b.problems, *occ.problems, *(["no register count in cubin"] if b.registers < 0 else [])]),
    )
    fn = None
    if nvdisasm:
        try:
            fns = sass.disassemble_file(b.cubin_path)
            fn = max(fns, key=lambda f: len(f.instructions))
            row.sass_instructions = sum(1 for i in fn.instructions if i.opcode != "NOP")
            row.innermost_loops = len(fn.innermost)
            row.generation_ops = sass.generation_text(sass.generation_counts(fn))
            hot = fn.hot_loop
            if hot is not None:
                row.hot_loop_instructions = hot.size
                row.hot_loop_fmas = hot.fmas
                row.hot_loop_per_fma = round(hot.per_fma, 3) if hot.per_fma else None
                row.hot_loop_mix = _mix_text(hot)
                report.hot_loops[(b.backend, b.label, arch)] = hot
        except Exception as e:
            row.problems = "; ".join(filter(None, [row.problems, f"SASS: {e}"[:200]]))
    if tr is not None and tr.error is None:
        row.worst_bank_conflict = tr.worst("shared")
        row.worst_coalescing = tr.worst("global")
        row.traced = tr.setup
    elif tr is not None:
        row.traced = f"trace failed: {tr.error}"
    if info.flops is not None and info.dram_bytes:
        row.intensity = round(info.flops / info.dram_bytes, 3)
        counts = None
        if fn is not None and info.fma_exact:
            try:
                counts = launch_counts.count(fn, info.flops, info.fma_shares, tr)
            except ValueError as e:
                row.problems = "; ".join(filter(None, [row.problems, f"counts: {e}"[:200]]))
        if counts is not None:
            report.counts[(b.backend, b.label, arch)] = counts
            row.shared_wavefronts, row.issued_instructions = counts.shared_wavefronts, counts.issued
            row.conflicts = "; ".join([counts.conflicts, *counts.notes])
        bounds = []
        for key, gpu in arch_table.GPUS.items():
            if gpu.arch != arch:
                continue
            bd = roofline.bound(info, gpu, counts)
            if bd is None:
                continue
            bounds.append(f"{gpu.name}: {bd.seconds * 1e6:.1f} us ({bd.limit})")
            if key == FIRST_GPU.get(arch) or not row.roofline_gpu:
                _set_bound(row, gpu, bd)
        row.roofline_all = "; ".join(bounds)
    return row


def _set_bound(row: Row, gpu: arch_table.GpuPeaks, bd: roofline.Bound) -> None:
    def us(roof: str) -> float | None:
        return round(bd.roofs[roof] * 1e6, 3) if roof in bd.roofs else None

    row.roofline_gpu, row.roofline_us, row.roofline_limit = gpu.name, round(bd.seconds * 1e6, 3), bd.limit
    row.roof_compute_us = next(us(r) for r in roofline.COMPUTE_ROOFS.values() if r in bd.roofs)
    row.roof_dram_us, row.roof_shared_us, row.roof_issue_us = us("DRAM"), us("shared"), us("issue")


# ============================================================================ outputs
def write_csv(rows: Sequence[Row], path: Path) -> Path:
    """xray.csv: one row per kernel instantiation x architecture."""
    names = list(Row.__dataclass_fields__)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=names)
        w.writeheader()
        for r in rows:
            w.writerow(asdict(r))
    return path


def _fmt(v, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _table(header: Sequence[str], rows: Sequence[Sequence]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(_fmt(c) for c in r) + " |" for r in rows]
    return out


def markdown(report: Report, archs: Sequence[str]) -> str:
    """The report: one section per kernel family (resources + occupancy, SASS, traces, roofline)."""
    lines = [
        "# Kernel X-ray (model, no GPU)",
        "",
        "Resources and SASS: the compiled cubins (compile tiers). Occupancy: "
        f"{arch_table.SOURCE_LIMITS}. Bank conflicts / coalescing: addresses recorded by running the kernel "
        "on the CPU (numba simulator), costed per warp request (wavefronts: 32 banks x 4 B, broadcast of one "
        "word, 8/16-byte accesses in half/quarter-warp phases; sectors: 32 B). Roofline: "
        f"{arch_table.SOURCE_PEAKS}. Nothing here was measured on a GPU.",
        "",
    ]
    lines += [f"> {n}" for n in report.notes]
    lines += ["", ROOFS_NOTE, f"Sources: {arch_table.SOURCE_ROOFS}."]
    families = sorted({(r.backend, r.family) for r in report.rows})
    for backend, family in families:
        rows = [r for r in report.rows if r.backend == backend and r.family == family]
        lines += ["", f"## {backend} — {family}", ""]
        lines += ["### Resources and occupancy", ""]
        lines += _table(
            ("kernel", "arch", "threads", "regs", "static smem B", "dyn smem B", "stack B", "spill B",
             "blocks/SM", "warps/SM", "occupancy", "limited by"),
            [
                (r.kernel, r.arch, r.threads, r.registers, r.static_shared, r.dynamic_shared, r.stack_bytes,
                 r.spill_bytes, r.blocks_per_sm, r.warps_per_sm, f"{r.occupancy:.0%}", r.limiter)
                for r in rows
            ],
        )  # fmt: skip
        lines += ["", "### SASS: whole kernel and hot loop (the loop with the most FMAs outside its nested loops)", ""]
        lines += _table(
            ("kernel", "arch", "instructions", "innermost loops", "hot loop instr", "FMA|MMA", "instr per FMA", "mix",
             "Hopper vs Ampere ops"),
            [
                (r.kernel, r.arch, r.sass_instructions, r.innermost_loops, r.hot_loop_instructions, r.hot_loop_fmas,
                 r.hot_loop_per_fma, r.hot_loop_mix, r.generation_ops)
                for r in rows
            ],
        )  # fmt: skip
        traced = {r.kernel: report.traces[(backend, r.kernel)] for r in rows if (backend, r.kernel) in report.traces}
        seen = set()
        for tr in traced.values():
            if id(tr) in seen:
                continue
            seen.add(id(tr))
            lines += ["", f"### Access sites of {tr.kernel} ({tr.setup})", ""]
            if tr.error:
                lines += [f"trace failed: {tr.error}"]
                continue
            lines += _table(
                ("where", "op", "array", "requests", "per request", "ideal", "factor", "worst", "code"),
                [
                    (s.where, s.kind, s.array, s.requests,
                     f"{s.per_request:.2f} {'wavefronts' if s.space == 'shared' else 'sectors'}",
                     f"{s.ideal / s.requests:.2f}" if s.requests else "-", s.factor, s.worst, f"`{s.code[:70]}`")
                    for s in tr.sites
                ],
            )  # fmt: skip
        k3 = [r for r in rows if r.flops is not None]
        if k3:
            lines += ["", "### Roofs at K3 shapes (model, no GPU)", ""]
            lines += _table(
                ("kernel", "arch", "GFLOP", "DRAM MB", "FLOP/B", "shared wavefronts", "warp-instructions", "GPU",
                 "compute us", "DRAM us", "shared us", "issue us", "bound us", "binds", "all GPUs"),
                [
                    (r.kernel, r.arch, r.flops / 1e9, r.dram_bytes / 1e6, r.intensity, _count(r.shared_wavefronts),
                     _count(r.issued_instructions), r.roofline_gpu, r.roof_compute_us, r.roof_dram_us,
                     r.roof_shared_us, r.roof_issue_us, r.roofline_us, r.roofline_limit, r.roofline_all)
                    for r in k3
                ],
            )  # fmt: skip
            formulas = sorted({r.formula for r in k3})
            lines += ["", *[f"- {f}" for f in formulas]]
            conflicts = sorted({f"{r.kernel}: {r.conflicts}" for r in k3 if r.conflicts})
            if conflicts:
                lines += ["", "Shared-memory conflict factors of the shared roof:", *[f"- {c}" for c in conflicts]]
    lines += ["", "## Calibration against a GPU run", "", *report.calibration]
    return "\n".join(lines) + "\n"


def _count(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def summary(report: Report, arch: str = "sm_90") -> str:
    """One screen: the K3 instantiations on `arch`, one line each."""
    rows = [r for r in report.rows if r.arch == arch and r.k3]
    if not rows:
        rows = [r for r in report.rows if r.k3]
    cols = ("regs", "blk/SM", "occ", "limit", "i/FMA", "bank", "coal", "bound us", "binds")
    widths = (4, 6, 5, 16, 6, 5, 5, 9, 8)
    head = f"{'kernel':34s} " + " ".join(f"{c:>{w}s}" for c, w in zip(cols, widths, strict=True))
    lines = [f"Kernel X-ray, {arch} (model, no GPU; roofs: {FIRST_GPU.get(arch, '')})", head]
    groups: dict[tuple, list[Row]] = {}
    for r in rows:  # specialisations with identical figures (e.g. epilogues) share one line
        key = (r.backend, r.family, r.version, r.registers, r.blocks_per_sm, r.limiter, r.hot_loop_per_fma,
               r.worst_bank_conflict, r.worst_coalescing, r.roofline_limit)  # fmt: skip
        groups.setdefault(key, []).append(r)
    for members in groups.values():
        r = members[0]
        name = r.backend[0] + ":" + r.kernel + (f" +{len(members) - 1}" if len(members) > 1 else "")
        lines.append(
            f"{name[:34]:34s} {r.registers:4d} {r.blocks_per_sm:6d} {r.occupancy:5.0%} "
            f"{r.limiter[:16]:>16s} {_fmt(r.hot_loop_per_fma, 1):>6s} {_fmt(r.worst_bank_conflict, 0):>5s} "
            f"{_fmt(r.worst_coalescing, 0):>5s} {_fmt(r.roofline_us, 1):>9s} {r.roofline_limit:>8s}"
        )
    lines.append("i/FMA: hot-loop SASS instructions per FFMA (per HMMA on tensor cores); bank, coal: worst access")
    lines.append("site's wavefronts and sectors over ideal (traced on the CPU); bound: roofline lower bound at K3 size")
    lines.append("(first kernel of a group), binds: the roof that sets it (FFMA, mma.sync, wgmma, DRAM, shared, issue)")
    lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines)


def plots(report: Report, out: Path, archs: Sequence[str], measured: dict | None = None) -> list[Path]:
    """roofline_<gpu>.png for each GPU of the archs, and hot_loop_instr_per_fma.png."""
    from matplotlib.figure import Figure

    paths = []
    for key, gpu in arch_table.GPUS.items():
        if gpu.arch not in archs:
            continue
        points, seen = [], set()
        for r in report.rows:  # one point per (backend, family, version): epilogues and dtypes share it
            if r.arch != gpu.arch or not r.k3 or r.flops is None or (r.backend, r.family, r.version) in seen:
                continue
            seen.add((r.backend, r.family, r.version))
            info = catalogue.describe(r.backend, r.kernel, r.threads, r.dynamic_shared)
            counts = report.counts.get((r.backend, r.kernel, r.arch))
            bd = roofline.bound(info, gpu, counts)
            if bd is not None:
                points.append((info, bd))
        paths.append(roofline.plot(points, gpu, out / f"roofline_{key}.png", (measured or {}).get(key, ())))
    arch = "sm_90" if "sm_90" in archs else archs[0]
    rows, seen = [], set()
    for r in report.rows:  # the compute kernels; specialisations with the same hot loop drawn once
        key = (r.backend, r.family, r.version, r.hot_loop_per_fma)
        if r.arch == arch and r.k3 and r.hot_loop_per_fma is not None and r.family in ("gemm", "attention"):
            if key not in seen:
                seen.add(key)
                rows.append(r)
    if rows:
        fig = Figure(figsize=(9, max(3, 0.28 * len(rows))))
        ax = fig.subplots()
        labels = [f"{r.backend}:{r.kernel}" for r in rows]
        ax.barh(
            labels, [r.hot_loop_per_fma for r in rows], color=["C0" if r.backend == "numba" else "C1" for r in rows]
        )
        ax.axvline(4, color="k", ls="--", lw=1, label="target <= 4 per FFMA (numba GEMM v3, attention v2)")
        ax.set_xlabel("SASS instructions per FMA (per HMMA for tensor-core kernels) in the hot loop")
        ax.set_title(f"Hot-loop cost of the GEMM and attention kernels, {arch} SASS (model, no GPU)")
        ax.invert_yaxis()
        ax.legend(fontsize=7)
        fig.tight_layout()
        p = out / "hot_loop_instr_per_fma.png"
        fig.savefig(p, dpi=110)
        paths.append(p)
    return paths
