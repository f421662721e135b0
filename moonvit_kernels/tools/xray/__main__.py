"""Kernel X-ray without a GPU: resources, occupancy, SASS, bank conflicts, coalescing, roofline.

    python -m moonvit_kernels.tools.xray [KERNEL ...] [--arch sm_80,sm_89,sm_90] [--out DIR]

Writes DIR/xray.md (a table per kernel family), DIR/xray.csv (one row per kernel instantiation x
architecture) and PNGs (a roofline per GPU, hot-loop instructions per FMA), and prints a one-screen
summary. KERNEL filters by substring of the kernel label (gemm_v3, flash_attn, attention_v2_hd128...),
family name (gemm, attention, rmsnorm, rope, merge, pos_emb, input_check) or a regular expression.
Every number is a model without a GPU. Calibration: `--measured results.csv` (from gpu_check; by
default every benchmarks/results/*/results.csv of the source tree) puts the measured rates beside
the bounds in xray.md and as stars on the roofline; with no GPU run the report says so.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m moonvit_kernels.tools.xray", description=__doc__.splitlines()[0])
    p.add_argument("kernels", nargs="*", metavar="KERNEL", help="only kernels matching (substring, family, regex)")
    p.add_argument("--arch", default="sm_80,sm_89,sm_90", help="comma-separated architectures (default: all three)")
    p.add_argument("--out", default="xray_report", help="output directory (default: ./xray_report)")
    p.add_argument("--backend", choices=("numba", "cuda", "both"), default="both")
    p.add_argument("--no-trace", action="store_true", help="skip the bank-conflict / coalescing traces")
    p.add_argument(
        "--measured", help="a gpu_check results.csv to compare the bounds with (default: benchmarks/results)"
    )
    p.add_argument("--cache-dir", help="where cubins are cached (default: $MOONVIT_XRAY_CACHE or the temp dir)")
    args = p.parse_args(argv)

    from moonvit_kernels.tools.xray.arch import parse_archs

    try:
        archs = parse_archs(args.arch)
    except ValueError as e:
        p.error(str(e))
    if args.measured and not os.path.isfile(args.measured):
        p.error(f"--measured {args.measured}: no such file")
    backends = ("numba", "cuda") if args.backend == "both" else (args.backend,)
    trace_numba = "numba" in backends and not args.no_trace
    if trace_numba and "numba" not in sys.modules:
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")  # tracing runs kernels on numba's CPU simulator

    from moonvit_kernels.tools.xray import report as rep

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    traces = {}
    notes = []
    if trace_numba:
        traces, notes = run_numba_traces(args.kernels, args.cache_dir)
    if "cuda" in backends and not args.no_trace:
        from moonvit_kernels.tools.xray import emulator_trace

        cuda_traces, cuda_notes = emulator_trace.run_all(args.kernels)
        traces.update(cuda_traces)
        notes += cuda_notes
    report = rep.collect(args.kernels, archs, backends, traces, args.cache_dir, log=lambda m: print(m, flush=True))
    report.notes = notes + report.notes
    if not report.rows:
        print("no kernel matched " + " ".join(args.kernels), file=sys.stderr)
        return 1
    from moonvit_kernels.tools.xray.calibration import attach

    measured = attach(report, [args.measured] if args.measured else None)
    (out / "xray.md").write_text(rep.markdown(report, archs), encoding="utf-8")
    rep.write_csv(report.rows, out / "xray.csv")
    pngs = rep.plots(report, out, archs, measured)
    print(rep.summary(report, "sm_90" if "sm_90" in archs else archs[0]))
    print(f"wrote {out / 'xray.md'}, {out / 'xray.csv'}, {len(pngs)} PNGs in {time.perf_counter() - t0:.0f} s")
    return 0


def run_numba_traces(patterns: Sequence[str], cache_dir: str | None = None) -> tuple[dict, list[str]]:
    """Trace every numba job whose labels match `patterns`; ({("numba", cubin label): TraceResult}, notes)."""
    from numba import config

    if not config.ENABLE_CUDASIM:
        return {}, ["numba runs without its CUDA simulator in this process: numba traces skipped"]
    from moonvit_kernels import registry
    from moonvit_kernels.tools.xray import build, catalogue, jobs_numba
    from moonvit_kernels.tools.xray.report import wanted

    labels = [b.label for b in build.binaries("numba", "sm_90", cache_dir)]
    out = {}
    for job in jobs_numba.jobs():
        mine = registry.traced_by("numba", job.name, labels)
        mine = [lb for lb in mine if wanted(lb, catalogue.describe("numba", lb).family, patterns)]
        if not mine:
            continue
        print(f"[xray] tracing {job.name} under the numba simulator ({job.setup})", flush=True)
        result = jobs_numba.run(job)
        for lb in mine:
            out[("numba", lb)] = result
    return out, []


if __name__ == "__main__":
    sys.exit(main())
