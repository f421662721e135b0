"""Section (c): the whole tower + projector per backend, timed per stage and checked against NumPy.

Backends: the NumPy reference (CPU, float64), numba (fp32), the CUDA C kernels in fp32 and bf16
(CuPy on a GPU; the emulator under --simulate), all with the same random weights at the real
config. Per case:

1. the reference runs the first `check_layers` layers + projector (a full 27-layer reference at
   896² costs minutes of CPU); every backend runs the same truncated model and is compared stage
   by stage (`compare.compare_stages`, tolerance growing with depth, bf16 with its own);
2. every backend is timed on the full model: events at the start, after each layer (the
   backends' `on_layer` hook) and at the end give the time per stage;
3. the full-depth outputs are cross-checked: numba fp32 vs CUDA C fp32, CUDA C bf16 vs fp32.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..compare import compare_stages, to_numpy, tolerance_for
from ..config import VisionConfig
from .plan import Plan
from .report import ERROR, FAIL, PASS, SKIP, Report
from .sections import Budget, _NotAsked, _short, cuda_kernels_module

BF16_FULL_DEPTH_TOL = 0.1  # bf16 vs fp32 after every layer: a loose bound for a gross error, not a precision claim


def tower_flops(c: VisionConfig, grid: np.ndarray) -> float:
    """Multiply-add FLOPs of one forward (the formula of `plots.flop_table`, which needs matplotlib):
    `2·L·3p²·D + N·2·L·D·(3Q + Q + 2I) + N·4·Σ nᵢ²·Q + 2·M·K² + 2·M·K·T` (K = kh·kw·D)."""
    g = np.asarray(grid, dtype=np.int64)
    sizes = np.prod(g, axis=1)
    L = int(sizes.sum())
    kh, kw = c.merge_kernel_size
    M = int(np.sum((g[:, 1] // kh) * (g[:, 2] // kw)))
    D, Q, I, N = c.vt_hidden_size, c.qkv_hidden_size, c.vt_intermediate_size, c.vt_num_hidden_layers
    K, T = c.merged_hidden_size, c.text_hidden_size
    return float(
        2 * L * c.patch_dim * D
        + N * 2 * L * D * (4 * Q + 2 * I)
        + N * 4 * int(np.sum(sizes**2)) * Q
        + 2 * M * K * K
        + 2 * M * K * T
    )


FLOP_FORMULA = "2·L·3p²·D + N·2·L·D·(3Q+Q+2I) + N·4·Σnᵢ²·Q + 2·M·K² + 2·M·K·T"


def truncated_weights(weights: Mapping[str, np.ndarray], layers: int) -> dict[str, np.ndarray]:
    """The weights of the first `layers` encoder blocks (and everything outside the blocks)."""
    out = {}
    for name, w in weights.items():
        if name.startswith("vision_tower.encoder.blocks."):
            if int(name.split(".")[3]) >= layers:
                continue
        out[name] = w
    return out


# ============================================================================ clocks with layer marks
class Marks:
    """Timestamps at the start, after each layer and at the end of one forward."""

    def __init__(self, kind: str):
        self.kind = kind
        self.events: list[Any] = []

    def mark(self, *_: Any) -> None:
        if self.kind == "cupy":
            import cupy as cp

            e = cp.cuda.Event()
            e.record()
        elif self.kind == "numba":
            from numba import cuda

            e = cuda.event()
            e.record()
        elif self.kind == "torch":
            import torch

            e = torch.cuda.Event(enable_timing=True)
            e.record()
        else:
            e = time.perf_counter()
        self.events.append(e)

    def intervals(self) -> list[float]:
        """Seconds between consecutive marks (waits for the last event)."""
        ev = self.events
        if self.kind == "cupy":
            import cupy as cp

            ev[-1].synchronize()
            return [cp.cuda.get_elapsed_time(a, b) / 1e3 for a, b in zip(ev[:-1], ev[1:], strict=True)]
        if self.kind in ("numba", "torch"):
            ev[-1].synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in zip(ev[:-1], ev[1:], strict=True)]
        return [b - a for a, b in zip(ev[:-1], ev[1:], strict=True)]


def timed_forward(model: Any, pixels: np.ndarray, grid: np.ndarray, kind: str) -> tuple[list[float], Any]:
    """One forward with marks at every layer boundary: `(intervals, outputs)`."""
    marks = Marks(kind)
    marks.mark()
    out = model.forward(pixels, grid, on_layer=marks.mark)
    marks.mark()
    return marks.intervals(), out


def stage_times(intervals: list[float]) -> list[tuple[str, float]]:
    """Named stages from the intervals between marks (start, after each layer, end)."""
    if len(intervals) < 2:
        return [("whole forward (no layers)", sum(intervals))]
    layers = intervals[1:-1]
    stages = [("patch embed + pos emb + layer 0", intervals[0])]
    if layers:
        stages.append((f"layer, median of layers 1..{len(layers)}", statistics.median(layers)))
        stages.append((f"layers 1..{len(layers)}, sum", sum(layers)))
    stages.append(("final norm + merge + projector", intervals[-1]))
    return stages


# ============================================================================ the section
def run_tower(plan: Plan, report: Report, budget: Budget, gpu: str | None) -> None:
    from ..model import MoonViT
    from ..weights import random_weights

    c = plan.tower_config
    layers = c.vt_num_hidden_layers
    check_layers = min(plan.tower_check_layers, layers)
    c_check = c.replace(vt_num_hidden_layers=check_layers)
    print(f"[tower] random weights for {layers} layers ...", flush=True)
    t0 = time.perf_counter()
    weights = random_weights(c, 0)
    w_check = truncated_weights(weights, check_layers)
    report.note(f"tower: random weights (seed 0) for {layers} layers made in {time.perf_counter() - t0:.1f} s (CPU)")
    if check_layers < layers:
        report.note(
            f"tower: the NumPy reference check runs the first {check_layers} of {layers} layers + projector "
            "(its CPU cost grows with L²); timings use all layers"
        )

    backends = _backends(plan, gpu, report)
    torch_ctx: dict[str, Any] = {"gpu": gpu}
    models: dict[tuple[str, int], Any] = {}

    def model(name: str, full: bool) -> Any:
        key = (name, layers if full else check_layers)
        if key not in models:
            make = backends[name][0]
            models[key] = make(c, weights) if full else make(c_check, w_check)
        return models[key]

    for index, (case, grid_tuple) in enumerate(plan.tower_cases):
        grid = np.array(grid_tuple, dtype=np.int64)
        L = plan.tokens(grid_tuple)
        pixels = (np.random.default_rng(7 + index).standard_normal((L, 3, c.patch_size, c.patch_size)) * 0.7).astype(
            np.float32
        )
        if budget.spent():
            report.verdict("tower", case, SKIP, f"section budget ({budget.seconds:.0f} s) spent")
            continue
        print(f"[tower] {case}: NumPy reference, {check_layers} layers (CPU) ...", flush=True)
        ref_model = MoonViT(c_check, w_check, backend="numpy", dtype="float64")
        marks = Marks("host")
        marks.mark()
        _, ref_stages = ref_model.forward(pixels, grid, return_intermediates=True, on_layer=marks.mark)
        marks.mark()
        ref_iv = marks.intervals()
        _time_rows(
            report,
            case,
            "numpy float64 (reference)",
            "CPU",
            L,
            check_layers,
            [ref_iv],
            c_check,
            grid,
            note="1 run; the check reference",
        )

        base = _torch_baseline(plan, report, torch_ctx, case, L, c, weights, pixels, grid, budget)
        full_out: dict[str, np.ndarray] = {}
        for name, (_, kind, where, dtype) in backends.items():
            if name.startswith("numba") and index >= plan.numba_tower_cases:
                report.verdict("tower", f"{case} {name}", SKIP, "not run on this case under --simulate (slow)")
                continue
            if budget.spent():
                report.verdict("tower", f"{case} {name}", SKIP, f"section budget ({budget.seconds:.0f} s) spent")
                continue
            print(f"[tower] {case}: {name} check ({check_layers} layers) and timing ({layers} layers) ...", flush=True)
            reuse = check_layers == layers and plan.tower_repeats == 1 and plan.tower_warmup == 0
            try:
                marks = Marks(kind)
                marks.mark()
                out, stages = model(name, full=False).forward(
                    pixels, grid, return_intermediates=True, as_numpy=True, on_layer=marks.mark
                )
                marks.mark()
                check_run = marks.intervals()
                rep = compare_stages(stages, ref_stages, dtype=dtype, names=(name, "numpy float64"))
            except Exception as e:
                report.add_row("tower_check", item=case, backend=name, verdict=ERROR, note=_short(e))
                report.verdict("tower", f"{case} {name} vs reference", ERROR, _short(e))
                continue
            worst = max(rep.rows, key=lambda r: (not math.isfinite(r.max_rel), r.max_rel / r.tolerance))
            last = rep.rows[-1]
            status = PASS if rep.ok else FAIL
            first = rep.first_divergence or "none"
            report.add_row(
                "tower_check",
                item=case,
                backend=name,
                where=where,
                dtype=dtype,
                tokens=L,
                shape=f"{len(rep.rows)} stages, {check_layers} layers",
                check=f"first divergence: {first}",
                check_err=last.max_rel,
                check_tol=last.tolerance,
                verdict=status,
                note=f"worst stage {worst.stage}: {worst.max_rel:.2e} (tol {worst.tolerance:.1e})",
            )
            report.verdict(
                "tower",
                f"{case} {name} vs NumPy ({check_layers} layers)",
                status,
                f"output rel err {last.max_rel:.2e} (tol {last.tolerance:.1e}); first divergence {first}",
            )
            if reuse:  # the checked model is the full model: its run is the timed run
                full_out[name] = np.concatenate([to_numpy(o) for o in out])
                _time_rows(
                    report,
                    case,
                    name,
                    where,
                    L,
                    layers,
                    [check_run],
                    c,
                    grid,
                    note="1 run, the checked one (stage copies included)",
                    baseline=base,
                )
                continue
            if budget.spent():
                continue
            try:
                full = model(name, full=True)
                for _ in range(plan.tower_warmup):
                    full.forward(pixels, grid)
                runs = []
                for _ in range(max(1, plan.tower_repeats)):
                    iv, out = timed_forward(full, pixels, grid, kind)
                    runs.append(iv)
                full_out[name] = np.concatenate([to_numpy(o) for o in out])
                _time_rows(report, case, name, where, L, layers, runs, c, grid, baseline=base)
            except Exception as e:
                report.add_row("tower", item=case, backend=name, where=where, verdict=ERROR, note=_short(e))
                report.verdict("tower", f"{case} {name} timing run", ERROR, _short(e))
        _cross_checks(report, case, full_out, layers)


def _time_rows(
    report: Report,
    case: str,
    backend: str,
    where: str,
    L: int,
    layers: int,
    runs: list[list[float]],
    c: VisionConfig,
    grid: np.ndarray,
    note: str = "",
    baseline: tuple[str, float] | None = None,
) -> float:
    """Rows for one backend on one case (`runs`: intervals between marks per run); returns the median total."""
    totals = [sum(iv) for iv in runs]
    med = statistics.median(totals)
    extra = {}
    if baseline is not None:
        extra = {"baseline": baseline[0], "baseline_ms": baseline[1] * 1e3, "pct_of_baseline": 100 * baseline[1] / med}
    median_run = runs[min(range(len(runs)), key=lambda i: abs(totals[i] - med))]
    flops = tower_flops(c, grid)
    report.add_row(
        "tower",
        item=case,
        backend=backend,
        where=where,
        tokens=L,
        shape=f"{layers} layers",
        median_ms=med * 1e3,
        p10_ms=min(totals) * 1e3 if len(totals) < 3 else _pct(totals, 10) * 1e3,
        p90_ms=max(totals) * 1e3 if len(totals) < 3 else _pct(totals, 90) * 1e3,
        runs=len(runs),
        clock="host clock" if where in ("CPU",) or "CPU" in where else "CUDA events",
        work=flops,
        unit="TFLOP/s",
        rate=flops / med / 1e12,
        formula=FLOP_FORMULA,
        note=note,
        **extra,
    )
    if len(median_run) == 1:  # a single interval: no layer marks (the torch baseline)
        return med
    for stage, seconds in stage_times(median_run):
        report.add_row(
            "stages",
            item=case,
            backend=backend,
            where=where,
            tokens=L,
            stage=stage,
            median_ms=seconds * 1e3,
            shape=f"{layers} layers",
            note="run with the median total",
        )
    return med


def _pct(values: list[float], q: float) -> float:
    from .timing import percentile

    return percentile(values, q)


def _cross_checks(report: Report, case: str, out: dict[str, np.ndarray], layers: int) -> None:
    base, growth = tolerance_for("float32")
    pairs = [
        ("numba fp32", "CUDA C fp32", base * growth ** (layers + 4)),
        ("CUDA C bf16", "CUDA C fp32", BF16_FULL_DEPTH_TOL),
    ]
    for a, b, tol in pairs:
        if a not in out or b not in out:
            continue
        got, want = out[a], out[b]
        err = float(np.max(np.abs(got - want)) / max(1e-30, float(np.max(np.abs(want)))))
        if not np.all(np.isfinite(got)):
            err = float("nan")
        status = PASS if (math.isfinite(err) and err <= tol) else FAIL
        report.add_row(
            "tower_check",
            item=case,
            backend=f"{a} vs {b}",
            shape=f"output, {layers} layers",
            check="full depth, backend vs backend",
            check_err=err,
            check_tol=tol,
            verdict=status,
        )
        report.verdict("tower", f"{case} {a} vs {b} ({layers} layers)", status, f"rel err {err:.2e} (tol {tol:.1e})")


def _backends(plan: Plan, gpu: str | None, report: Report) -> dict[str, tuple[Callable, str, str, str]]:
    """name -> (make(config, weights), clock kind, where, compare dtype) for the backends that can run here."""
    from ..model import MoonViT

    out: dict[str, tuple[Callable, str, str, str]] = {}
    try:
        if "numba" not in plan.backends:
            raise _NotAsked
        import numba  # noqa: F401

        where = "CUDA simulator (CPU)" if plan.simulate else (gpu or "GPU")
        out["numba fp32"] = (
            lambda c, w: MoonViT(c, w, backend="numba"),
            "host" if plan.simulate else "numba",
            where,
            "float32",
        )
    except _NotAsked:
        pass
    except ImportError as e:
        report.verdict("tower", "numba backend", SKIP, f"numba does not import ({_short(e)})")
    if "cuda" not in plan.backends:
        return out
    try:
        k = cuda_kernels_module(plan)
    except ImportError as e:
        report.verdict("tower", "CUDA C backend", SKIP, _short(e))
        return out
    except Exception as e:
        report.verdict("tower", "CUDA C backend", ERROR, _short(e))
        return out
    if plan.simulate:
        from ..cuda_backend.backend import CupyBackend

        for dtype, short in (("float32", "fp32"), ("bfloat16", "bf16")):
            out[f"CUDA C {short}"] = (
                lambda c, w, dtype=dtype: CupyBackend(c, w, dtype=dtype, kernels=k),
                "host",
                "CUDA C emulator (CPU)",
                dtype,
            )
    else:
        for dtype, short in (("float32", "fp32"), ("bfloat16", "bf16")):
            out[f"CUDA C {short}"] = (
                lambda c, w, dtype=dtype: MoonViT(c, w, backend="cupy", dtype=dtype),
                "cupy",
                gpu or "GPU",
                dtype,
            )
    return out


def _torch_baseline(
    plan: Plan,
    report: Report,
    ctx: dict[str, Any],
    case: str,
    L: int,
    c: VisionConfig,
    weights: Mapping[str, np.ndarray],
    pixels: np.ndarray,
    grid: np.ndarray,
    budget: Budget,
) -> tuple[str, float] | None:
    """Time the tower in PyTorch eager (`torch_tower.torch_forward`: cuBLAS GEMMs + SDPA) as the
    tower's baseline: bf16 on the GPU, fp32 on the CPU under --simulate. A missing torch, or a
    failure of the baseline itself, is a note, never a verdict: it says nothing about our kernels."""
    if ctx.get("unavailable") or budget.spent():
        return None
    try:
        if "torch" not in ctx:
            import torch

            if plan.simulate:
                device, dtype, label, kind = "cpu", torch.float32, "torch eager fp32 (CPU)", "host"
            elif torch.cuda.is_available():
                device, dtype, label, kind = "cuda", torch.bfloat16, "torch eager bf16 (cuBLAS + SDPA)", "torch"
            else:
                raise ImportError(f"torch {torch.__version__} sees no CUDA device")
            from .torch_tower import torch_weights

            ctx.update(
                torch=torch,
                device=device,
                dtype=dtype,
                label=label,
                kind=kind,
                w=torch_weights(torch, weights, device, dtype),
            )
    except Exception as e:
        ctx["unavailable"] = True
        report.note(f"tower: no torch baseline ({_short(e)})")
        return None
    from .torch_tower import torch_forward

    torch = ctx["torch"]

    class Eager:
        def forward(self, pv: np.ndarray, g: np.ndarray, on_layer: Any = None) -> Any:
            return torch_forward(torch, pv, g, weights, c, ctx["device"], ctx["dtype"], ctx["w"])

    print(f"[tower] {case}: {ctx['label']} baseline ...", flush=True)
    try:
        with torch.inference_mode():
            for _ in range(plan.tower_warmup):
                Eager().forward(pixels, grid)
            runs = [timed_forward(Eager(), pixels, grid, ctx["kind"])[0] for _ in range(max(1, plan.tower_repeats))]
    except Exception as e:
        report.note(f"tower: torch baseline failed on {case} ({_short(e)}); no % of baseline for it")
        return None
    where = "CPU" if ctx["device"] == "cpu" else (ctx["gpu"] or "GPU")
    med = _time_rows(
        report,
        case,
        ctx["label"],
        where,
        L,
        c.vt_num_hidden_layers,
        runs,
        c,
        grid,
        note="baseline: whole forward, no per-stage marks; not checked",
    )
    return ctx["label"], med
