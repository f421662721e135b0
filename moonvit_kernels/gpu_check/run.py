"""The command line: parse options, decide GPU or --simulate, run the sections, write the report."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import time
import traceback
from pathlib import Path

from .plan import SECTION_NAMES, grids_for_tokens, make_plan, parse_backends, parse_sections
from .report import ERROR, Report

NO_GPU = (
    "gpu_check: no CUDA GPU found (the CUDA driver reports no device, or neither cuda-bindings, CuPy nor torch "
    "can ask it); nothing to check on hardware: run with --simulate to exercise the pipeline on the CPU"
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m moonvit_kernels.gpu_check",
        description="Prove every kernel on a CUDA GPU and write a report (report.md, results.csv, pytest.log, PNGs).",
    )
    p.add_argument("--out", type=Path, required=True, help="folder for the report (created; at most 8 files)")
    p.add_argument("--quick", action="store_true", help="smaller run: under 3 minutes on one H100/H200")
    p.add_argument("--simulate", action="store_true", help="no GPU: numba simulator + CUDA C emulator, tiny sizes")
    p.add_argument(
        "--sections",
        default=",".join(SECTION_NAMES),
        help="comma-separated subset of a/tests, b/kernels, c/tower (default: all)",
    )
    p.add_argument("--budget-s", type=float, default=None, help="cap on the whole run in seconds (sections share it)")
    p.add_argument("--backends", default="numba,cuda", help="kernel families for sections b and c: numba, cuda")
    p.add_argument("--tokens", type=int, nargs="+", help="kernel sizes for section b: square images of L patches")
    p.add_argument("--repeats", type=int, help="timed calls per kernel (default: the mode's)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        sections = parse_sections(args.sections)
        plan = make_plan(args.simulate, args.quick, args.budget_s)
        changes: dict = {"backends": parse_backends(args.backends)}
        if args.tokens:
            changes["kernel_grids"] = grids_for_tokens(args.tokens)
        if args.repeats is not None:
            if args.repeats < 1:
                raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
            changes["repeats"] = args.repeats
        plan = dataclasses.replace(plan, **changes)
    except ValueError as e:
        print(f"gpu_check: {e}", file=sys.stderr)
        return 2

    gpu = None
    if args.simulate:
        if "numba" in sys.modules and os.environ.get("NUMBA_ENABLE_CUDASIM", "0") in ("", "0"):
            print("gpu_check: --simulate needs numba's simulator, but numba was imported without it", file=sys.stderr)
            return 2
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # before numba is first imported
    else:
        from .machine import gpu_present

        gpu = gpu_present()
        if gpu is None:
            print(NO_GPU, file=sys.stderr)
            return 2
        if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
            print(
                "gpu_check: NUMBA_ENABLE_CUDASIM is set; unset it to time the GPU (or pass --simulate)", file=sys.stderr
            )
            return 2

    from .machine import describe

    mode = "SIMULATE (CPU only: numba CUDA simulator, CUDA C emulator; no number here is a GPU number)"
    if not args.simulate:
        mode = f"GPU ({gpu}){', quick' if plan.quick else ''}"
    argv_text = " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    report = Report(args.out, mode, f"python -m moonvit_kernels.gpu_check {argv_text}".strip())
    report.write()
    print(f"gpu_check: {mode}; sections {', '.join(sections)}; budget {plan.total_budget:.0f} s; report in {args.out}")
    report.machine, notes = describe(args.simulate, gpu)
    for n in notes:
        report.note(n)
    report.write()

    run_start = time.monotonic()
    try:
        for name in sections:
            _run_section(name, plan, report, gpu, run_start)
            _figures(report, gpu)
    except KeyboardInterrupt:
        report.note("interrupted (Ctrl-C): the report holds what finished")
        report.write()
        return 130
    report.finished = True
    report.write()
    status = report.exit_status()
    print(f"gpu_check: done in {time.monotonic() - run_start:.0f} s; {len(report.failed)} failed; exit status {status}")
    print(f"gpu_check: wrote {', '.join(sorted(p.name for p in args.out.iterdir() if not p.name.startswith('.')))}")
    return status


def _run_section(name: str, plan, report: Report, gpu: str | None, run_start: float) -> None:
    from .sections import Budget

    left = plan.total_budget - (time.monotonic() - run_start)
    budget = Budget(max(1.0, min(plan.budgets[name], left)))
    print(f"== section {name} (budget {budget.seconds:.0f} s)", flush=True)
    t0 = time.monotonic()
    try:
        if name == "tests":
            from .suite import run_suite

            run_suite(report, plan.test_files, budget.seconds, plan.simulate)
        elif name == "kernels":
            from .sections import run_kernels

            run_kernels(plan, report, budget, gpu)
        else:
            from .tower import run_tower

            run_tower(plan, report, budget, gpu)
    except Exception as e:
        traceback.print_exc()
        report.verdict(name, f"section {name}", ERROR, f"{type(e).__name__}: {e}"[:300])
    report.note(f"section {name}: {time.monotonic() - t0:.0f} s of a {budget.seconds:.0f} s budget")


def _figures(report: Report, gpu: str | None) -> None:
    from .figures import write_figures

    title = (
        f"moonvit_kernels gpu_check on {gpu}" if gpu else "moonvit_kernels gpu_check --simulate (CPU: not GPU times)"
    )
    try:
        write_figures(report.rows, report.out_dir, title)
    except ImportError:
        if not any("matplotlib" in n for n in report.notes):
            report.note("matplotlib is not installed: no PNG written")
    except Exception as e:
        report.note(f"plotting failed ({type(e).__name__}: {e}); the tables hold every number")
