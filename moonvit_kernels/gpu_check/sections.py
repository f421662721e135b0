"""Running sections (b) and (c) item by item inside a time budget, recording rows and verdicts."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .baselines import Baselines
from .kernels import Builder, KernelCase, cuda_cases, hopper_cases, numba_cases
from .peaks import peak_for
from .plan import Plan
from .report import ERROR, FAIL, PASS, SKIP, Report
from .timing import Timer, cupy_timer, host_timer, measure, numba_timer, summarize


class Budget:
    """A deadline in seconds from now."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def spent(self) -> bool:
        return self.left() <= 0


@dataclass
class Where:
    """Where one backend runs: a label for the report and how to time it."""

    label: str
    timer: Timer
    clock: str


def numba_where(plan: Plan, gpu: str | None) -> Where:
    if plan.simulate:
        return Where("CUDA simulator (CPU)", host_timer, "host clock (simulator)")
    return Where(gpu or "GPU", numba_timer, "CUDA events")


def cuda_where(plan: Plan, gpu: str | None) -> Where:
    if plan.simulate:
        return Where("CUDA C emulator (CPU)", host_timer, "host clock (emulator)")
    return Where(gpu or "GPU", cupy_timer, "CUDA events")


def cuda_kernels_module(plan: Plan) -> Any:
    """The launcher module for the CUDA C kernels: CuPy launchers on a GPU, the emulator under --simulate."""
    if plan.simulate:
        from ..cuda_backend import emulation

        if emulation.compiler() is None:
            raise ImportError("the CUDA C emulator needs a C++20 compiler (g++ >= 11): none found")
        emulation.library()
        return emulation
    import cupy  # noqa: F401  (ImportError: reported as a skip)

    from ..cuda_backend import launchers

    launchers.require_sm80()
    return launchers


class _NotAsked(Exception):
    """A backend left out with --backends."""


class HopperUnavailable(Exception):
    """The Hopper kernels cannot be timed here (the message says why); a skip, not a failure."""


HOPPER_ITEM = "Hopper kernels (gemm_bf16_sm90, flash_attn_sm90)"


def hopper_skip_reason(capability: str | None) -> str | None:
    """Why a device of compute capability `capability` ("90" for sm_90) cannot run the Hopper kernels, or None."""
    if capability == "90":
        return None
    return f"the Hopper kernels need compute capability 9.0 (sm_90a code); this GPU is sm_{capability}"


def hopper_preflight(head_dim: int, timeout_s: float = 90.0) -> dict:
    """Run the Hopper kernels' first-use self-checks in a subprocess (`python -m
    moonvit_kernels.cuda_backend.selfcheck`), so that a faulting kernel cannot spoil this process's CUDA
    context, and a kernel that hangs (a barrier never completing) costs at most `timeout_s`; returns its JSON
    result. RuntimeError when the checks fail, the subprocess dies or runs out of time."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "moonvit_kernels.cuda_backend.selfcheck", "--head-dim", str(head_dim)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"self-check subprocess still running after {timeout_s:.0f} s (a kernel hangs?)") from None
    lines = r.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"self-check subprocess exited {r.returncode}: {' | '.join(tail)[:400]}") from None
    if r.returncode != 0:
        bad = {k: v.get("why") or f"rel err {v.get('error')}" for k, v in result.items() if not v.get("ok")}
        raise RuntimeError(f"first-use self-check failed: {bad}")
    return result


def hopper_kernels_module(plan: Plan, timeout_s: float = 90.0) -> Any:
    """The Hopper kernels' launchers: the emulator (`emulation.hopper`) under --simulate; on a GPU,
    `hopper_launchers` once their self-checks passed in a subprocess (HopperUnavailable on other GPUs)."""
    if plan.simulate:
        from ..cuda_backend.emulation import hopper

        hopper.library()
        return hopper
    import cupy

    reason = hopper_skip_reason(str(cupy.cuda.Device().compute_capability))
    if reason:
        raise HopperUnavailable(reason)
    hopper_preflight(plan.kernel_config.head_dim, timeout_s)
    from ..cuda_backend import hopper_launchers

    return hopper_launchers


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".replace("\n", " ")[:300]


# ============================================================================ (b) kernels
def run_kernels(plan: Plan, report: Report, budget: Budget, gpu: str | None) -> None:
    baselines = Baselines(plan.simulate, plan.repeats, plan.warmup, plan.seconds_per_item)
    c = plan.kernel_config
    sources: list[tuple[str, Where, Callable[[np.ndarray], Iterator[tuple[str, Builder]]]]] = []
    try:
        if "numba" not in plan.backends:
            raise _NotAsked
        import numba  # noqa: F401

        sources.append(
            ("numba", numba_where(plan, gpu), lambda g: numba_cases(c, g, plan.numba_gemm_shapes, plan.v1_threads))
        )
    except _NotAsked:
        pass
    except ImportError as e:
        report.verdict("kernels", "numba kernels", SKIP, f"numba does not import ({_short(e)})")
    try:
        if "cuda" not in plan.backends:
            raise _NotAsked
        k = cuda_kernels_module(plan)
        sources.append(("CUDA C", cuda_where(plan, gpu), lambda g: cuda_cases(k, c, g, plan.cuda_gemm_shapes)))
    except _NotAsked:
        pass
    except ImportError as e:
        report.verdict("kernels", "CUDA C kernels", SKIP, _short(e))
    except Exception as e:  # no sm_80, broken CuPy: the kernels cannot run, which is a failure on a GPU
        report.verdict("kernels", "CUDA C kernels", ERROR, _short(e))
    if sources and sources[-1][0] == "CUDA C" and plan.hopper_gemm_shapes:
        try:
            hk = hopper_kernels_module(plan, max(10.0, min(90.0, budget.left() / 2)))
            sources.append(
                (
                    "Hopper",
                    cuda_where(plan, gpu),
                    lambda g: hopper_cases(hk, c, g, plan.hopper_gemm_shapes, plan.hopper_block_ns),
                )
            )
        except (HopperUnavailable, ImportError) as e:
            report.verdict("kernels", HOPPER_ITEM, SKIP, str(e) if isinstance(e, HopperUnavailable) else _short(e))
        except Exception as e:  # a failed self-check on an sm_90 GPU is a finding
            report.verdict("kernels", HOPPER_ITEM, FAIL, _short(e))

    for grid_tuple in plan.kernel_grids:
        grid = np.array([grid_tuple], dtype=np.int64)
        for backend, where, cases in sources:
            try:
                items = list(cases(grid))
            except Exception as e:
                report.verdict("kernels", f"{backend} kernels (setup)", ERROR, _short(e))
                continue
            for name, build in items:
                if budget.spent():
                    report.verdict("kernels", name, SKIP, f"section budget ({budget.seconds:.0f} s) spent")
                    continue
                print(f"[kernels] {name} ({where.label}) ...", flush=True)
                _one_kernel(report, baselines, where, name, build)


def _one_kernel(report: Report, baselines: Baselines, where: Where, name: str, build: Builder) -> None:
    case: KernelCase | None = None
    try:
        case = build()
        if baselines.repeats == 1 and baselines.warmup == 0:  # one run: the checked run is the timed one
            times: list[float] = []
            err, tol = case.check(lambda: times.append(where.timer(case.run)))
            t = summarize(times, where.clock)
        else:
            t = measure(case.run, where.timer, where.clock, baselines.repeats, baselines.warmup, baselines.seconds)
            err, tol = case.check(case.run)
    except Exception as e:
        report.add_row(
            "kernels", item=name, backend=getattr(case, "backend", ""), where=where.label, verdict=ERROR, note=_short(e)
        )
        report.verdict("kernels", name, ERROR, _short(e))
        traceback.print_exc()
        return
    scale = 1e12 if case.unit == "TFLOP/s" else 1e9
    rate = case.work / t.median / scale
    values: dict[str, Any] = {}
    try:
        label, base = baselines.get(*case.baseline)
        values["baseline"] = label
        if base is not None:
            values.update(
                baseline_ms=base.median_ms,
                baseline_rate=case.work / base.median / scale,
                pct_of_baseline=100.0 * base.median / t.median,
            )
    except Exception as e:
        values["baseline"] = f"baseline failed: {_short(e)}"
    peak = peak_for(None if where.label.endswith("(CPU)") else where.label, case.unit, case.dtype)
    if peak is not None:
        values.update(peak=peak[1], pct_of_peak=100.0 * rate / peak[0])
    ok = math.isfinite(err) and err <= tol
    status = PASS if ok else FAIL
    report.add_row(
        "kernels",
        item=case.item,
        backend=case.backend,
        where=where.label,
        dtype=case.dtype,
        shape=case.shape,
        tokens=case.tokens,
        median_ms=t.median_ms,
        p10_ms=t.p10 * 1e3,
        p90_ms=t.p90 * 1e3,
        runs=t.runs,
        clock=t.clock,
        work=case.work,
        unit=case.unit,
        rate=rate,
        formula=case.formula,
        check="max rel err vs NumPy",
        check_err=err,
        check_tol=tol,
        verdict=status,
        **values,
    )
    pct = f", {values['pct_of_baseline']:.1f}% of {values['baseline']}" if "pct_of_baseline" in values else ""
    report.verdict(
        "kernels",
        f"{case.backend} {case.item} {case.shape}",
        status,
        f"rel err {err:.2e} (tol {tol:.0e}); {rate:.4g} {case.unit} ({where.label}){pct}",
    )
