"""Section (b), one kernel family per worker: the items of units kernels:CUDA C, Hopper pre-flight, Hopper, numba.

Where the kernel modules come from is decided here and nowhere else: `cuda_kernels_module` (CuPy
launchers on a GPU, the CUDA C emulator under --simulate), `hopper_kernels_module` and
`hopper_module_name` (hopper_launchers on an sm_90 GPU, the Hopper emulator under --simulate), and
`tower_cuda_backend` for the tower.

Each kernel item is checked before it is timed (poisoned outputs, a float64 NumPy computation): a
failed check is a FAIL row with no timing. A checked kernel is timed by `timing.measure_kernel` (warm
back-to-back calls between one pair of events, L2-flushed single calls, host overhead per call), and
its row carries the baseline measured in the same run, % of the measured peak (filled in by the
report), % of the datasheet peak, and the X-ray's bound (`model.xray_bound`).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moonvit_kernels.tools import SOURCE_ROOT
from moonvit_kernels.tools.gpu_check import faults
from moonvit_kernels.tools.gpu_check.baselines import Baselines
from moonvit_kernels.tools.gpu_check.kernels import Builder, KernelCase, cuda_cases, hopper_cases, numba_cases
from moonvit_kernels.tools.gpu_check.model import xray_bound
from moonvit_kernels.tools.gpu_check.peaks import peak_for, peak_key
from moonvit_kernels.tools.gpu_check.plan import Plan
from moonvit_kernels.tools.gpu_check.report import ERROR, FAIL, PASS, SKIP
from moonvit_kernels.tools.gpu_check.timing import CupyClock, HostClock, NumbaClock, measure_kernel

Item = tuple[str, Callable[[], None]]
HOPPER_EMULATION = "moonvit_kernels.tools.emulation.hopper"
HOPPER_ITEM = "Hopper kernels (gemm_bf16_sm90, flash_attn_sm90)"
PREFLIGHT_ITEM = "hopper pre-flight"


class Budget:
    """A deadline: `seconds` from now, or at wall-clock time `at` (shared between processes)."""

    def __init__(self, seconds: float | None = None, at: float | None = None):
        self.deadline = at if at is not None else time.time() + float(seconds or 0.0)
        self.seconds = self.deadline - time.time() if seconds is None else seconds

    def left(self) -> float:
        return self.deadline - time.time()

    def spent(self) -> bool:
        return self.left() <= 0


class ItemFailed(Exception):
    """An item failed and has recorded its ERROR row and verdict; the cause is `__cause__`."""


@dataclass
class Context:
    """What a worker's items share: the GPU's name (None under --simulate), the injected fault, the section's
    budget, a scratch folder for files between workers, and values later workers need (`share`)."""

    gpu: str | None
    fault: faults.Fault | None
    budget: Budget
    scratch: Path
    shared: dict[str, Any] = field(default_factory=dict)
    sink: Any = None

    def share(self, key: str, value: Any) -> None:
        """Keep `value` for later units of this run (the parent passes it on to the next workers)."""
        self.shared[key] = value
        if hasattr(self.sink, "emit"):
            self.sink.emit("share", key=key, value=value)


@dataclass
class Where:
    """Where one backend runs: a label for the report and the clock that times it."""

    label: str
    clock: Any


def numba_where(plan: Plan, gpu: str | None) -> Where:
    if plan.simulate:
        return Where("CUDA simulator (CPU)", HostClock("host clock (simulator)"))
    return Where(gpu or "GPU", NumbaClock())


def cuda_where(plan: Plan, gpu: str | None) -> Where:
    if plan.simulate:
        return Where("CUDA C emulator (CPU)", HostClock("host clock (emulator)"))
    return Where(gpu or "GPU", CupyClock())


# ============================================================================ where the kernel modules come from
def cuda_kernels_module(plan: Plan) -> Any:
    """The launcher module for the CUDA C kernels: CuPy launchers on a GPU; under --simulate the same launchers
    on the emulated device, from NumPy (`emulation.OnEmulator`)."""
    if plan.simulate:
        from moonvit_kernels.cuda_backend import launchers
        from moonvit_kernels.tools import emulation

        if emulation.compiler() is None:
            raise ImportError("the CUDA C emulator needs a C++20 compiler (g++ >= 11): none found")
        emulation.library()
        return emulation.OnEmulator(launchers)
    import cupy  # noqa: F401  (ImportError: reported as a skip)

    from moonvit_kernels.cuda_backend import launchers

    launchers.require_sm80()
    return launchers


class HopperUnavailable(Exception):
    """The Hopper kernels cannot be timed here (the message says why); a skip, not a failure."""


def hopper_skip_reason(capability: str | None) -> str | None:
    """Why a device of compute capability `capability` ("90" for sm_90) cannot run the Hopper kernels, or None."""
    if capability == "90":
        return None
    return f"the Hopper kernels need compute capability 9.0 (sm_90a code); this GPU is sm_{capability}"


def hopper_module_name(plan: Plan) -> str:
    """The dotted name of the Hopper kernels' launcher module (the pre-flight subprocess imports it)."""
    if plan.simulate:
        return HOPPER_EMULATION
    from moonvit_kernels.cuda_backend import preflight

    return preflight.HOPPER_MODULE


def hopper_kernels_module(plan: Plan) -> Any:
    """The Hopper kernels' launchers: the emulator under --simulate; on an sm_90 GPU `hopper_launchers`
    (HopperUnavailable on other GPUs). Whether they may run is the pre-flight's verdict, not checked here."""
    import importlib

    if not plan.simulate:
        import cupy

        reason = hopper_skip_reason(str(cupy.cuda.Device().compute_capability))
        if reason:
            raise HopperUnavailable(reason)
    module = importlib.import_module(hopper_module_name(plan))
    if plan.simulate:
        module.library()
    return module


class _Sm90Emulation:
    """The CUDA C emulator presenting itself as a compute capability 9.0 device, so that the backend's own
    routing picks the Hopper kernels as it would on an H100/H200."""

    def __init__(self, module: Any):
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    @staticmethod
    def compute_capability() -> str:
        return "90"


def tower_cuda_backend(plan: Plan, dtype: str, hopper: bool, hopper_verdict: dict | None) -> Callable[..., Any]:
    """`make(config, weights)` of the CUDA C tower in `dtype`; `hopper` False forces the Hopper kernels off.
    On a GPU the backend's own routing and pre-flight decide (on sm_90: on, after its cached pre-flight);
    under --simulate the emulator plays an sm_90 device and the pre-flight verdict of this run is used."""
    from moonvit_kernels.cuda_backend.backend import CupyBackend

    if not plan.simulate:  # a failed pre-flight of this run: off, without the backend paying for it again
        hopper = hopper and (hopper_verdict is None or bool(hopper_verdict["ok"]))
        return lambda c, w: CupyBackend(c, w, dtype=dtype, hopper=None if hopper else False)
    k = cuda_kernels_module(plan)
    if not hopper or dtype != "bfloat16":
        return lambda c, w: CupyBackend(c, w, dtype=dtype, kernels=k)
    hk = hopper_kernels_module(plan)
    verdict = hopper_verdict or {"ok": False, "why": "the Hopper pre-flight did not run"}

    def gate(head_dim: int) -> tuple[bool, str]:
        return bool(verdict["ok"]), str(verdict["why"])

    return lambda c, w: CupyBackend(c, w, dtype=dtype, kernels=_Sm90Emulation(k), hopper_kernels=hk, preflight=gate)


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".replace("\n", " ")[:300]


# ============================================================================ the pre-flight
def preflight_items(plan: Plan, sink: Any, ctx: Context) -> list[Item]:
    """The Hopper pre-flight as one item (never filtered by --only: the Hopper items depend on it)."""

    def run() -> None:
        from moonvit_kernels.cuda_backend import preflight

        dims = preflight.probe_head_dims(plan.tower_config.head_dim)
        key = None
        if not plan.simulate:
            import cupy

            reason = hopper_skip_reason(str(cupy.cuda.Device().compute_capability))
            if reason:
                ctx.share("hopper", {"ok": False, "why": reason, "skip": True})
                sink.verdict("kernels", HOPPER_ITEM, SKIP, reason)
                return
            key = preflight.current_device_key(dims)
        if faults.wrong(ctx.fault, PREFLIGHT_ITEM):
            os.environ[preflight.FAULT_ENV] = "wrong"
        verdict = preflight.preflight(hopper_module_name(plan), dims, plan.preflight_timeout_s, key)
        ctx.share("hopper", {"ok": verdict.ok, "why": verdict.why})
        where = "the Hopper emulator (CPU)" if plan.simulate else ctx.gpu
        sink.diagnostic(
            "Hopper pre-flight",
            f"module {hopper_module_name(plan)} on {where}; {verdict.seconds:.1f} s"
            f"{' (cached verdict)' if verdict.cached else ''}; ok={verdict.ok} {verdict.why}\n"
            + json.dumps(verdict.probes, indent=1),
        )
        n = len(verdict.probes)
        if verdict.ok:
            cached = " (cached verdict of this device)" if verdict.cached else ""
            sink.verdict("kernels", "Hopper pre-flight", PASS, f"{n} probes passed in {verdict.seconds:.1f} s{cached}")
        else:
            sink.verdict("kernels", "Hopper pre-flight", FAIL, f"{verdict.why}; the Hopper kernels are not timed")

    return [(PREFLIGHT_ITEM, run)]


# ============================================================================ the numba build, rehearsed
NUMBA_BUILD_ITEM = "numba GPU build (NVVM, numba-cuda's linker, sm_90)"


def numba_build_item(sink: Any) -> None:
    """Under --simulate: the numba kernels built as a GPU builds them (`numba_build`, in a process with the
    simulator off): a PASS with the kernels' registers in diagnostics.md, or an ERROR whose reason is the one line
    naming what is missing (NVVM, a matching NVVM) and what fixes it."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SOURCE_ROOT), env.get("PYTHONPATH", "")]))
    r = subprocess.run(
        [sys.executable, "-m", "moonvit_kernels.tools.gpu_check.numba_build"], env=env, capture_output=True, text=True
    )
    try:
        result = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        why = f"the numba build rehearsal printed no result (exit {r.returncode}): {r.stderr[-500:]}"
        raise RuntimeError(why) from None
    if result["table"]:
        sink.diagnostic(f"numba kernels built by {NUMBA_BUILD_ITEM}", f"{result['toolchain']}\n{result['table']}")
    if result["error"]:
        sink.verdict("kernels", NUMBA_BUILD_ITEM, ERROR, result["error"])
        raise ItemFailed(NUMBA_BUILD_ITEM)
    sink.verdict("kernels", NUMBA_BUILD_ITEM, PASS, f"{result['built']} kernels built; {result['toolchain']}")


# ============================================================================ the kernel families
def kernel_items(plan: Plan, family: str, sink: Any, ctx: Context) -> list[Item]:
    """The items of kernel family `family` ("CUDA C", "Hopper", "numba") over the plan's kernel sizes;
    a family that cannot run here is one verdict (skip or error) and no item."""
    c = plan.kernel_config
    baselines = Baselines(plan.simulate, plan)
    cases: Callable[[np.ndarray], Iterator[tuple[str, Builder]]]
    try:
        if family == "numba":
            import numba  # noqa: F401

            if not plan.simulate:  # what the launchers check before their first compile, as one verdict
                from moonvit_kernels.numba_backend.nvvm import require_nvvm

                require_nvvm()
            where = numba_where(plan, ctx.gpu)
            versions, attention_versions = plan.numba_gemm_versions, plan.numba_attention_versions

            def cases(g: np.ndarray) -> Iterator[tuple[str, Builder]]:
                return numba_cases(c, g, plan.numba_gemm_shapes, plan.v1_threads, versions, attention_versions)

        elif family == "CUDA C":
            k = cuda_kernels_module(plan)
            where = cuda_where(plan, ctx.gpu)

            def cases(g: np.ndarray) -> Iterator[tuple[str, Builder]]:
                return cuda_cases(k, c, g, plan.cuda_gemm_shapes)

        else:
            verdict = ctx.shared.get("hopper")
            if verdict is None:
                raise HopperUnavailable("the Hopper pre-flight did not run")
            if not verdict["ok"]:
                raise HopperUnavailable(verdict["why"] if verdict.get("skip") else f"pre-flight: {verdict['why']}")
            hk = hopper_kernels_module(plan)
            where = cuda_where(plan, ctx.gpu)

            def cases(g: np.ndarray) -> Iterator[tuple[str, Builder]]:
                return hopper_cases(hk, c, g, plan.hopper_gemm_shapes, plan.hopper_block_ns)

    except HopperUnavailable as e:
        sink.verdict("kernels", HOPPER_ITEM, SKIP, str(e))
        return []
    except ImportError as e:
        sink.verdict("kernels", f"{family} kernels", SKIP, _short(e))
        return []
    except Exception as e:  # no sm_80, broken CuPy: the kernels cannot run, which is a failure on a GPU
        sink.verdict("kernels", f"{family} kernels", ERROR, _short(e))
        raise ItemFailed(f"{family} kernels") from e

    items: list[Item] = []
    if family == "numba" and plan.simulate:
        items.append((NUMBA_BUILD_ITEM, lambda: numba_build_item(sink)))
    for grid_tuple in plan.kernel_grids:
        grid = np.array([grid_tuple], dtype=np.int64)
        suffix = f" L={plan.tokens((grid_tuple,))}" if len(plan.kernel_grids) > 1 else ""
        for name, build in cases(grid):
            if plan.wanted(name + suffix):
                items.append((name + suffix, _kernel_item(plan, sink, ctx, baselines, where, name + suffix, build)))
    return items


def _kernel_item(
    plan: Plan, sink: Any, ctx: Context, baselines: Baselines, where: Where, name: str, build: Builder
) -> Callable[[], None]:
    return lambda: _one_kernel(plan, sink, ctx, baselines, where, name, build)


def _one_kernel(
    plan: Plan, sink: Any, ctx: Context, baselines: Baselines, where: Where, name: str, build: Builder
) -> None:
    case: KernelCase | None = None

    def error(e: Exception) -> None:
        backend = getattr(case, "backend", "")
        sink.add_row("kernels", item=name, backend=backend, where=where.label, verdict=ERROR, note=_short(e))
        sink.verdict("kernels", name, ERROR, _short(e))
        raise ItemFailed(name) from e

    try:
        case = build()
        go = case.run
        if faults.wrong(ctx.fault, name):

            def go() -> None:
                case.run()
                for array in case.outputs():
                    faults.perturb(array)

        err, tol = case.check(go)
    except Exception as e:
        error(e)
    ok = math.isfinite(err) and err <= tol
    values: dict[str, Any] = dict(
        item=case.item, backend=case.backend, where=where.label, dtype=case.dtype, shape=case.shape,
        tokens=case.tokens, work=case.work, unit=case.unit, formula=case.formula, check="max rel err vs NumPy",
        check_err=err, check_tol=tol,
    )  # fmt: skip
    label = f"{case.backend} {case.item} {case.shape}"
    if not ok:
        sink.add_row("kernels", verdict=FAIL, note="not timed: the check failed", **values)
        sink.verdict("kernels", label, FAIL, f"rel err {err:.2e} (tol {tol:.0e}); not timed")
        return
    try:
        t = measure_kernel(
            case.run, where.clock, plan.repeats, plan.warmup, plan.inner, plan.cold_repeats, plan.seconds_per_item
        )
    except Exception as e:
        error(e)
    scale = 1e12 if case.unit == "TFLOP/s" else 1e9
    rate = case.work / t.warm.median / scale
    values.update(
        median_ms=t.warm.median_ms, p10_ms=t.warm.p10 * 1e3, p90_ms=t.warm.p90 * 1e3, runs=t.warm.runs,
        clock=f"{t.warm.clock}, {t.inner} calls per window", host_us=t.host * 1e6, gap_free=t.gap_free, rate=rate,
        peak_key=peak_key(case.baseline[0], case.dtype),
    )  # fmt: skip
    if t.cold is not None:
        values.update(cold_ms=t.cold.median_ms, cold_rate=case.work / t.cold.median / scale)
    try:
        blabel, base = baselines.get(*case.baseline)
        values["baseline"] = blabel
        if base is not None:
            values.update(
                baseline_ms=base.warm.median_ms,
                baseline_rate=case.work / base.warm.median / scale,
                pct_of_baseline=100.0 * base.warm.median / t.warm.median,
            )
    except Exception as e:
        values["baseline"] = f"baseline failed: {_short(e)}"
    peak = peak_for(ctx.gpu, case.unit, case.dtype)
    if peak is not None:
        values.update(peak=peak[1], pct_of_peak=100.0 * rate / peak[0])
    bound = xray_bound(case.model, case.backend, ctx.gpu)
    values.update(bound)
    if "model_ms" in bound and ctx.gpu is not None:
        values["model_ratio"] = t.warm.median_ms / bound["model_ms"]
    sink.add_row("kernels", verdict=PASS, **values)
    pct = f", {values['pct_of_baseline']:.1f}% of {values['baseline']}" if "pct_of_baseline" in values else ""
    sink.verdict(
        "kernels", label, PASS, f"rel err {err:.2e} (tol {tol:.0e}); {rate:.4g} {case.unit} ({where.label}){pct}"
    )
