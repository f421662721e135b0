"""One unit of a gpu_check run, in a process of its own: `python -m moonvit_kernels.gpu_check.worker SPEC.json`.

The parent (`supervisor.py`) writes SPEC: the unit (section, family), the run's command-line options
(`plan.plan_from_options` builds the same plan here), the selected sections, `first` (the index of the
first item to run: earlier ones were done, or killed, in an earlier worker), the section's deadline
(wall-clock time), the output folder, the results file, the scratch folder, the GPU's name, the
injected fault, and what earlier units shared (the Hopper pre-flight's verdict).

The worker lists its items (`items` event), then runs them in order: before each it appends a `start`
line to the results file, after each an `end` line; every row, verdict and note goes there too
(`events.EventWriter`), and full tracebacks go to stderr, which the parent points at errors.log.
An item that raises is an ERROR verdict; if its error is one that leaves the CUDA context unusable
(`is_sticky`), the worker records it and exits with STICKY_EXIT, and the parent starts a fresh worker
at the next item. Hangs and crashes are the parent's to see: it kills or outlives the worker.

`run_unit(spec, sink)` is the same loop for a caller's own process (`--in-process`: no containment).
"""

from __future__ import annotations

import faulthandler
import json
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

STICKY_EXIT = 3
STICKY_MARKERS = (
    "illegal memory access", "illegal address", "misaligned address", "unspecified launch failure",
    "launch failed", "launch timed out", "hardware stack error", "illegal instruction", "uncorrectable ecc",
    "cudaerrorillegaladdress", "cuda_error_illegal_address", "cudaerrorlaunchfailure", "cuda_error_launch_failed",
    "cudaerrormisalignedaddress", "cuda_error_misaligned_address", "context is destroyed",
)  # fmt: skip


def is_sticky(error: BaseException) -> bool:
    """True for errors after which the process's CUDA context cannot be used again (a fault in a kernel)."""
    text = f"{type(error).__name__}: {error}".lower()
    return any(marker in text for marker in STICKY_MARKERS)


class InProcessSink:
    """The worker's event methods for a run without workers: rows, verdicts and notes go to the report."""

    def __init__(self, report: Any):
        self.report = report
        self.out_dir = report.out_dir

    def __getattr__(self, name: str) -> Any:
        return getattr(self.report, name)

    def machine(self, rows: list[tuple[str, str]]) -> None:
        self.report.apply({"ev": "machine", "rows": rows})

    def items(self, names: list[str]) -> None:
        pass

    def start(self, index: int, item: str) -> None:
        self.report.running = item
        print(f"[{item}] ...", flush=True)
        self.report.write()

    def end(self, index: int, item: str) -> None:
        self.report.running = ""

    def sticky(self, index: int, item: str, error: str) -> None:
        self.report.note(f"{item}: {error} (the CUDA context is lost; with workers, a fresh one would continue)")

    def done(self) -> None:
        pass


def unit_items(spec: dict[str, Any], plan: Any, sink: Any, ctx: Any) -> list[tuple[str, Any]]:
    """The items of the unit `spec` names."""
    section, family = spec["unit"]["section"], spec["unit"]["family"]
    if section == "machine":
        return machine_items(plan, spec, sink, ctx)
    if section == "tests":
        from moonvit_kernels.tools.gpu_check.suite import run_suite

        return [("pytest -m gpu", lambda: run_suite(sink, plan.test_files, max(1.0, ctx.budget.left()), plan.simulate))]
    if section == "kernels":
        from moonvit_kernels.tools.gpu_check.sections import kernel_items, preflight_items

        if family == "Hopper pre-flight":
            return preflight_items(plan, sink, ctx)
        return kernel_items(plan, family, sink, ctx)
    from moonvit_kernels.tools.gpu_check.tower import tower_items

    return tower_items(plan, family, sink, ctx)


def machine_items(plan: Any, spec: dict[str, Any], sink: Any, ctx: Any) -> list[tuple[str, Any]]:
    """The machine's description and toolchain, then (with the kernels section) the measured peaks."""

    def describe() -> None:
        from moonvit_kernels.tools.gpu_check.machine import describe as machine_rows
        from moonvit_kernels.tools.gpu_check.machine import gpu_state, toolchain

        rows, notes = machine_rows(plan.simulate, ctx.gpu)
        sink.machine(rows + [("GPU state at start", gpu_state(plan.simulate))])
        for n in notes:
            sink.note(n)
        tools = toolchain(plan.simulate)
        sink.machine(tools[:5])
        sink.diagnostic("CUDA toolchain (versions and loaded libraries)", "\n".join(f"{k}: {v}" for k, v in tools))
        if plan.simulate:
            why = (
                "the simulator and the emulators load no GPU binary: each family's section below gives the emulated "
                "kernels and the GPU builds rehearsed on the CPU (the X-ray reads the real cubins: "
                "python -m moonvit_kernels.tools.xray)"
            )
            sink.diagnostic("kernel binaries", why)

    items = [("machine", describe)]
    if "kernels" in spec["sections"]:
        from moonvit_kernels.tools.gpu_check.baselines import Baselines
        from moonvit_kernels.tools.gpu_check.peaks import peak_items

        where = "CPU (NumPy stand-in)" if plan.simulate else (ctx.gpu or "GPU")
        items += [it for it in peak_items(plan.simulate, Baselines(plan.simulate, plan), sink, where)]
    return items


def run_unit(spec: dict[str, Any], sink: Any) -> int:
    """Run the unit `spec` names, from item `spec["first"]` on, writing to `sink`; 0, or STICKY_EXIT."""
    from moonvit_kernels.tools.gpu_check import faults
    from moonvit_kernels.tools.gpu_check.plan import plan_from_options
    from moonvit_kernels.tools.gpu_check.sections import Budget, Context

    plan = plan_from_options(spec["options"])
    fault = faults.parse_fault(spec.get("fault"))
    family = spec["unit"]["family"]
    shared = spec.setdefault("shared", {})  # the same dict: an in-process caller sees what this unit shares
    ctx = Context(spec.get("gpu"), fault, Budget(at=spec["deadline"]), Path(spec["scratch"]), shared, sink)
    recorder = None
    if family in ("CUDA C", "Hopper") or family.startswith("CUDA C "):  # on the emulator too (--simulate)
        from moonvit_kernels.tools.gpu_check.binaries import BinaryRecorder

        recorder = BinaryRecorder()
        recorder.install()
    try:
        return _run_items(spec, plan, sink, ctx, recorder)
    finally:
        if recorder is not None:
            recorder.uninstall()  # an in-process run (--in-process, the tests) leaves the launchers as it found them


def _run_items(spec: dict[str, Any], plan: Any, sink: Any, ctx: Any, recorder: Any) -> int:
    """`run_unit`'s loop over its unit's items, from `spec["first"]` on; 0, or STICKY_EXIT."""
    from moonvit_kernels.tools.gpu_check import faults
    from moonvit_kernels.tools.gpu_check.report import ERROR, SKIP
    from moonvit_kernels.tools.gpu_check.sections import ItemFailed

    section, family = spec["unit"]["section"], spec["unit"]["family"]
    fault = ctx.fault
    try:
        items = unit_items(spec, plan, sink, ctx)
    except ItemFailed:
        items = []  # recorded by the unit
    except Exception as e:
        _traceback(f"{section}:{family} set-up")
        sink.verdict(section, f"{family} (set-up)", ERROR, f"{type(e).__name__}: {e}"[:300])
        items = []
    sink.items([name for name, _ in items])
    for index, (name, run) in enumerate(items):
        if index < spec.get("first", 0):
            continue
        if ctx.budget.spent() and section != "machine":
            sink.verdict(section, name, SKIP, "section budget spent")
            continue
        sink.start(index, name)
        error: BaseException | None = None
        try:
            faults.before_item(fault, name)
            run()
        except ItemFailed as e:
            error = e.__cause__ or e
            _traceback(name, error)
        except Exception as e:
            error = e
            _traceback(name, e)
            sink.verdict(section, name, ERROR, f"{type(e).__name__}: {e}"[:300])
        sink.end(index, name)
        if error is not None and is_sticky(error):
            sink.sticky(index, name, f"{type(error).__name__}: {error}"[:300])
            _diagnose(sink, recorder, plan, section, family)
            return STICKY_EXIT
    _diagnose(sink, recorder, plan, section, family)
    sink.done()
    return 0


def _traceback(what: str, error: BaseException | None = None) -> None:
    """The full traceback of `error` (or of the exception being handled) on stderr (errors.log), with a header."""
    print(f"\n=== {what}: traceback", file=sys.stderr)
    if error is None:
        traceback.print_exc(file=sys.stderr)
    else:
        traceback.print_exception(error, file=sys.stderr)
    sys.stderr.flush()


def _diagnose(sink: Any, recorder: Any, plan: Any, section: str, family: str) -> None:
    """The registers and spills of the binaries this worker loaded; under --simulate, the emulated kernels' (the
    catalogue's register bounds) and the GPU builds the launchers rehearsed (the numba kernels' binaries come
    from the numba build rehearsal, `numba_build`, as the simulator builds none)."""
    try:
        if family.startswith("numba"):
            if not plan.simulate:
                from moonvit_kernels.tools.gpu_check.binaries import numba_table

                sink.diagnostic(f"numba kernels compiled by {section}:{family}", numba_table())
        elif recorder is not None:
            text = recorder.text()
            if plan.simulate:
                from moonvit_kernels.cuda_backend import rehearsal

                text = (
                    "CPU emulator: registers are the catalogue's bounds, -1 = known only from a GPU binary\n"
                    f"{text}\n\nGPU builds rehearsed (MOONVIT_REHEARSE_GPU_BUILDS=1):\n{rehearsal.text()}"
                )
            sink.diagnostic(f"kernel binaries loaded by {section}:{family}", text)
    except Exception as e:
        sink.diagnostic(f"kernel binaries of {section}:{family}", f"not recorded: {type(e).__name__}: {e}")


def main(argv: Sequence[str] | None = None) -> int:
    faulthandler.enable()  # a segfault or abort prints the Python stack to stderr (errors.log)
    args = list(sys.argv[1:] if argv is None else argv)
    spec = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    from moonvit_kernels.tools.gpu_check.events import EventWriter

    sink = EventWriter(Path(spec["events"]), Path(spec["out"]))
    try:
        return run_unit(spec, sink)
    finally:
        sink.close()


if __name__ == "__main__":
    sys.exit(main())
