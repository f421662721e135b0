"""The command line: parse options, decide GPU or --simulate, run the units in workers, write the report.

This process stays light (the standard library and the report until the options are known) and never
touches the GPU itself: every unit runs in a worker (`supervisor.py`), so a fault, a hang or a crash
costs one item. If even the start fails (an import, a bad install), report.md still says so, with the
traceback. SIGTERM (e.g. from `timeout`) or Ctrl-C stops the worker, and the report is written.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from moonvit_kernels.tools.gpu_check.events import RESULTS_FILE
from moonvit_kernels.tools.gpu_check.report import DIAGNOSTICS_FILE, ERRORS_FILE, TIMEOUT, Report

NO_GPU = (
    "gpu_check: no CUDA GPU found (the CUDA driver reports no device, or neither cuda-bindings, CuPy nor torch "
    "can ask it); nothing to check on hardware: run with --simulate to exercise the pipeline on the CPU"
)


class Stopped(Exception):
    """SIGTERM or SIGINT arrived: stop the worker, write the report, exit."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m moonvit_kernels.gpu_check",
        description="Prove every kernel on a CUDA GPU and write a report (report.md, results.csv, ... in --out).",
    )
    p.add_argument("--out", type=Path, required=True, help="folder for the report (created; at most 8 files)")
    p.add_argument("--quick", action="store_true", help="smaller run: under 6 minutes on one H100/H200")
    p.add_argument("--simulate", action="store_true", help="no GPU: numba simulator + CUDA C emulator, tiny sizes")
    p.add_argument("--sections", default="tests,kernels,tower", help="subset of a/tests, b/kernels, c/tower")
    p.add_argument("--budget-s", type=float, default=None, help="cap on the whole run in seconds (the watchdog)")
    p.add_argument("--backends", default="cuda,hopper,numba", help="kernel families: cuda, hopper, numba")
    p.add_argument("--tokens", type=int, nargs="+", help="kernel sizes for section b: square images of L patches")
    p.add_argument("--repeats", type=int, help="timed windows per kernel (default: the mode's)")
    p.add_argument("--only", help="comma-separated substrings of item names: run only those items (a targeted rerun)")
    p.add_argument("--item-timeout-s", type=float, help="limit of one item (default: the mode's)")
    p.add_argument(
        "--inject-fault", metavar="KIND:MATCH", help="make items named *MATCH* hang, crash, go wrong or error (tests)"
    )
    p.add_argument("--in-process", action="store_true", help="no workers (debugging): a hang or crash stops the run")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    words = sys.argv[1:] if argv is None else argv
    command = f"python -m moonvit_kernels.gpu_check {' '.join(shlex.quote(a) for a in words)}".strip()
    try:
        return _main(args, command)
    except Exception:  # an import or start-up failure: the report says so
        text = traceback.format_exc()
        print(text, file=sys.stderr)
        _emergency_report(args.out, command, text)
        return 1


def check_out(out: Path) -> None:
    """ValueError unless `out` is a folder or can become one (no file where a folder must be)."""
    for path in (out, *out.parents):
        if path.exists():
            if not path.is_dir():
                where = "is a file" if path == out else f"is inside {path}, a file"
                raise ValueError(f"--out {out} {where}: the report needs a folder")
            return


def _emergency_report(out: Path, command: str, text: str) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"gpu_check: no report written: {out}: {e}", file=sys.stderr)
        return
    (out / "report.md").write_text(
        "# moonvit_kernels gpu_check report\n\n"
        f"- command: `{command}`\n- FAILED TO START ({time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())})\n\n"
        "## Problems (read first)\n\n- **CRASH** [start-up] gpu_check could not start:\n\n```\n" + text + "```\n",
        encoding="utf-8",
    )
    with open(out / ERRORS_FILE, "a", encoding="utf-8") as f:
        f.write(f"\n=== start-up failure\n{text}")


def _main(args: argparse.Namespace, command: str) -> int:
    import os

    from moonvit_kernels.tools.gpu_check import faults
    from moonvit_kernels.tools.gpu_check.plan import parse_sections, plan_from_options, units_for

    options: dict[str, Any] = {
        "simulate": args.simulate, "quick": args.quick, "budget_s": args.budget_s, "backends": args.backends,
        "tokens": args.tokens, "repeats": args.repeats, "only": args.only, "item_timeout_s": args.item_timeout_s,
    }  # fmt: skip
    try:
        check_out(args.out)
        sections = parse_sections(args.sections)
        plan = plan_from_options(options)
        faults.parse_fault(args.inject_fault)
    except ValueError as e:
        print(f"gpu_check: {e}", file=sys.stderr)
        return 2

    gpu = None
    if args.simulate:
        if "numba" in sys.modules and os.environ.get("NUMBA_ENABLE_CUDASIM", "0") in ("", "0"):
            print("gpu_check: --simulate needs numba's simulator, but numba was imported without it", file=sys.stderr)
            return 2
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # before numba is first imported (here with --in-process)
    else:
        from moonvit_kernels.tools.gpu_check.machine import detect_gpu

        gpu, why = detect_gpu()
        if gpu is None:
            print(f"gpu_check: {why}" if why else NO_GPU, file=sys.stderr)
            return 2
        if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
            print(
                "gpu_check: NUMBA_ENABLE_CUDASIM is set; unset it to time the GPU (or pass --simulate)", file=sys.stderr
            )
            return 2

    mode = "SIMULATE (CPU only: numba CUDA simulator, CUDA C emulator; no number here is a GPU number)"
    if not args.simulate:
        mode = f"GPU ({gpu}){', quick' if plan.quick else ''}"
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    for stale in (RESULTS_FILE, ERRORS_FILE, DIAGNOSTICS_FILE):
        (out / stale).unlink(missing_ok=True)
    report = Report(out, mode, command, echo=args.in_process)
    if args.inject_fault:
        report.note(f"fault injected on purpose: --inject-fault {args.inject_fault}")
    report.write()
    units = units_for(plan, sections)
    print(
        f"gpu_check: {mode}; {len(units)} units ({', '.join(u.name for u in units)}); "
        f"watchdog {plan.total_budget:.0f} s; report in {out}",
        flush=True,
    )
    scratch = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    run_start = time.time()
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def stop(signum: int, frame: Any) -> None:
        raise Stopped(signum)

    for s in previous:
        signal.signal(s, stop)
    try:
        _run_units(plan, units, sections, report, options, scratch, gpu, args, run_start)
    except Stopped as e:
        report.verdict("run", report.running or "the run", TIMEOUT, f"stopped by {e} (the command's time limit?)")
        report.running = ""
        report.write()
        return 124 if e.signum == signal.SIGTERM else 130
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        shutil.rmtree(scratch, ignore_errors=True)
    report.finished = True
    report.write()
    status = report.exit_status()
    print(f"gpu_check: done in {time.time() - run_start:.0f} s; {len(report.failed)} failed; exit status {status}")
    print(f"gpu_check: wrote {', '.join(sorted(p.name for p in out.iterdir() if not p.name.startswith('.')))}")
    return status


def _run_units(
    plan: Any, units: list, sections: tuple[str, ...], report: Report, options: dict[str, Any], scratch: Path,
    gpu: str | None, args: argparse.Namespace, run_start: float,
) -> None:  # fmt: skip
    from moonvit_kernels.tools.gpu_check.machine import gpu_state
    from moonvit_kernels.tools.gpu_check.supervisor import Supervisor

    run_deadline = run_start + plan.total_budget
    supervisor = Supervisor(report, options, sections, plan, scratch, gpu, args.inject_fault, run_deadline)
    shared: dict[str, Any] = {}
    section, deadline = "", run_deadline
    for unit in units:
        if unit.section != section:
            if section in ("tests", "kernels", "tower"):
                report.machine.append((f"GPU state after {section}", gpu_state(plan.simulate)))
            section = unit.section
            budget = plan.budgets.get(section)
            deadline = run_deadline if budget is None else min(run_deadline, time.time() + budget)
        print(f"== {unit.name}", flush=True)
        if args.in_process:
            _in_process(unit, plan, options, sections, report, scratch, gpu, args.inject_fault, deadline, shared)
        else:
            supervisor.run(unit, deadline)
    if "tower" in sections:
        from moonvit_kernels.tools.gpu_check.tower import cross_checks

        try:
            cross_checks(report, plan, scratch)
        except Exception as e:
            report.note(f"tower cross-checks failed: {type(e).__name__}: {e}")
    report.machine.append(("GPU state at end", gpu_state(plan.simulate)))
    _figures(report, gpu)


def _in_process(
    unit: Any, plan: Any, options: dict[str, Any], sections: tuple[str, ...], report: Report, scratch: Path,
    gpu: str | None, fault: str | None, deadline: float, shared: dict[str, Any],
) -> None:  # fmt: skip
    from moonvit_kernels.tools.gpu_check.worker import InProcessSink, run_unit

    spec = {
        "unit": {"section": unit.section, "family": unit.family}, "options": options, "sections": list(sections),
        "first": 0, "deadline": deadline, "out": str(report.out_dir), "scratch": str(scratch), "gpu": gpu,
        "fault": fault, "shared": shared,
    }  # fmt: skip
    run_unit(spec, InProcessSink(report))


def _figures(report: Report, gpu: str | None) -> None:
    from moonvit_kernels.tools.gpu_check.figures import write_figures

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
