"""Section (c): the whole tower + projector, one backend per worker, timed per stage and checked against NumPy.

Units (`plan.units_for`), each in a process of its own, sharing files in the run's scratch folder:
  reference   random weights (seed 0) made once and saved (`weights`: .npy files, memory-mapped by the
              others), and per case the NumPy float64 reference of the first `check_layers` layers +
              projector, saved (`reference_stages`) and timed;
  torch       PyTorch eager (cuBLAS + SDPA, bf16 on a GPU; fp32 on the CPU) timed per case: the baseline
              the report gives the backends' % of;
  backends    "CUDA C fp32", "CUDA C bf16" (the backend's own kernel choice: on sm_90 the Hopper kernels,
              after their pre-flight), "CUDA C bf16 hopper=False", "numba fp32". Per case: the truncated
              model compared stage by stage with the reference (`compare.compare_stages`, tolerance growing
              with depth, bf16 with its own), the full model timed with events at the start, after each layer
              and at the end (time per stage), its full-depth output saved, its `describe()` recorded;
  cross-checks (in the parent, `cross_checks`): full-depth outputs backend vs backend (numba fp32 vs
              CUDA C fp32; CUDA C bf16, with and without Hopper, vs CUDA C fp32 and vs each other).
"""

from __future__ import annotations

import json
import math
import re
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from moonvit_kernels.config import VisionConfig
from moonvit_kernels.tools.gpu_check import faults
from moonvit_kernels.tools.gpu_check.plan import Plan
from moonvit_kernels.tools.gpu_check.report import ERROR, FAIL, PASS, SKIP
from moonvit_kernels.tools.gpu_check.sections import (
    Context,
    Item,
    ItemFailed,
    _short,
    cuda_kernels_module,
    tower_cuda_backend,
)

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


# ============================================================================ files shared between the units
def case_inputs(plan: Plan, index: int) -> tuple[str, np.ndarray, int, np.ndarray]:
    """(name, grid_thws, tokens, pixel_values) of tower case `index` (pixels from a fixed seed)."""
    name, grid_tuple = plan.tower_cases[index]
    grid = np.array(grid_tuple, dtype=np.int64)
    L = plan.tokens(grid_tuple)
    c = plan.tower_config
    rng = np.random.default_rng(7 + index)
    pixels = (rng.standard_normal((L, 3, c.patch_size, c.patch_size)) * 0.7).astype(np.float32)
    return name, grid, L, pixels


def weights(plan: Plan, scratch: Path, sink: Any = None) -> dict[str, np.ndarray]:
    """The run's random weights (seed 0) for the tower config: made and saved to `scratch` by the first unit
    that asks, memory-mapped from there by the others."""
    folder = scratch / "weights"
    index = folder / "names.json"
    if index.exists():
        names = json.loads(index.read_text())
        return {n: np.load(folder / f"{i}.npy", mmap_mode="r") for i, n in enumerate(names)}
    from moonvit_kernels.weights import random_weights

    t0 = time.perf_counter()
    w = random_weights(plan.tower_config, 0)
    folder.mkdir(parents=True, exist_ok=True)
    for i, array in enumerate(w.values()):
        np.save(folder / f"{i}.npy", np.ascontiguousarray(array))
    (folder / ".names.tmp").write_text(json.dumps(list(w)))
    (folder / ".names.tmp").replace(index)
    if sink is not None:
        sink.note(
            f"tower: random weights (seed 0) for {plan.tower_config.vt_num_hidden_layers} layers made and saved in "
            f"{time.perf_counter() - t0:.1f} s (CPU)"
        )
    return w


def reference_stages(plan: Plan, scratch: Path, index: int, sink: Any = None) -> dict[str, np.ndarray]:
    """The NumPy float64 reference's stages of case `index` at the check depth: loaded from `scratch`, else
    computed (timed, when `sink` is given) and saved."""
    path = scratch / f"reference_{index}.npz"
    if path.exists():
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    from moonvit_kernels.model import MoonViT

    c = plan.tower_config
    check_layers = min(plan.tower_check_layers, c.vt_num_hidden_layers)
    c_check = c.replace(vt_num_hidden_layers=check_layers)
    case, grid, L, pixels = case_inputs(plan, index)
    model = MoonViT(c_check, truncated_weights(weights(plan, scratch, sink), check_layers), backend="numpy",
                    dtype="float64")  # fmt: skip
    marks = Marks("host")
    marks.mark()
    _, stages = model.forward(pixels, grid, return_intermediates=True, on_layer=marks.mark)
    marks.mark()
    stages = {k: np.asarray(v) for k, v in stages.items()}
    tmp = scratch / f".reference_{index}.tmp.npz"
    np.savez(tmp, **stages)
    tmp.replace(path)
    if sink is not None:
        _time_rows(sink, case, "numpy float64 (reference)", "CPU", L, check_layers, [marks.intervals()], c_check, grid,
                   note="1 run; the check reference")  # fmt: skip
    return stages


def output_path(scratch: Path, backend: str, index: int) -> Path:
    return scratch / f"out_{re.sub(r'[^A-Za-z0-9]+', '_', backend)}_{index}.npy"


# ============================================================================ the units
def tower_items(plan: Plan, family: str, sink: Any, ctx: Context) -> list[Item]:
    """The items of tower unit `family` ("reference", "torch", or a backend of `plan.TOWER_BACKENDS`), one per case."""
    cases = range(len(plan.tower_cases))
    names = [plan.tower_cases[i][0] for i in cases]
    if family == "reference":
        items = [("tower weights", lambda: weights(plan, ctx.scratch, sink) and None)]
        items += [(f"reference {names[i]}", _reference_item(plan, ctx, sink, i)) for i in cases]
        return [it for it in items if plan.wanted(it[0]) or it[0] == "tower weights"]
    if family == "torch":
        torch_ctx: dict[str, Any] = {"gpu": ctx.gpu}
        items = [(f"torch baseline {names[i]}", _torch_item(plan, ctx, sink, torch_ctx, i)) for i in cases]
        return [it for it in items if plan.wanted(it[0])]
    verdict = ctx.shared.get("hopper") or {}
    if family.endswith("hopper=False") and verdict.get("skip"):
        sink.verdict("tower", family, SKIP, f"the Hopper kernels do not apply here ({verdict['why']})")
        return []
    try:
        make, kind, where, dtype = _backend(plan, family, ctx)
    except ImportError as e:
        sink.verdict("tower", f"{family} backend", SKIP, _short(e))
        return []
    except Exception as e:
        sink.verdict("tower", f"{family} backend", ERROR, _short(e))
        raise ItemFailed(family) from e
    models: dict[bool, Any] = {}
    items = []
    for i in cases:
        item = f"{family} {names[i]}"
        if not plan.wanted(item):
            continue
        if family.startswith("numba") and i >= plan.numba_tower_cases:
            sink.verdict("tower", item, SKIP, f"numba runs the first {plan.numba_tower_cases} case(s) in this mode")
            continue
        items.append((item, _backend_item(plan, ctx, sink, family, make, kind, where, dtype, models, i)))
    return items


def _reference_item(plan: Plan, ctx: Context, sink: Any, index: int) -> Callable[[], None]:
    return lambda: reference_stages(plan, ctx.scratch, index, sink) and None


def _torch_item(plan: Plan, ctx: Context, sink: Any, torch_ctx: dict, index: int) -> Callable[[], None]:
    def run() -> None:
        case, grid, L, pixels = case_inputs(plan, index)
        _torch_baseline(plan, sink, torch_ctx, case, L, plan.tower_config, weights(plan, ctx.scratch), pixels, grid)

    return run


def _backend(plan: Plan, family: str, ctx: Context) -> tuple[Callable, str, str, str]:
    """(make(config, weights), clock kind, where, compare dtype) of tower backend `family`."""
    if family == "numba fp32":
        import numba  # noqa: F401

        from moonvit_kernels.model import MoonViT

        where = "CUDA simulator (CPU)" if plan.simulate else (ctx.gpu or "GPU")
        return (lambda c, w: MoonViT(c, w, backend="numba")), ("host" if plan.simulate else "numba"), where, "float32"
    cuda_kernels_module(plan)  # ImportError: a skip, like the kernels section
    dtype = "float32" if family == "CUDA C fp32" else "bfloat16"
    hopper = family == "CUDA C bf16" and "hopper" in plan.backends
    make = tower_cuda_backend(plan, dtype, hopper, ctx.shared.get("hopper"))
    where = "CUDA C emulator (CPU)" if plan.simulate else (ctx.gpu or "GPU")
    return make, ("host" if plan.simulate else "cupy"), where, dtype


def _backend_item(
    plan: Plan, ctx: Context, sink: Any, name: str, make: Callable, kind: str, where: str, dtype: str,
    models: dict[bool, Any], index: int,
) -> Callable[[], None]:  # fmt: skip
    def run() -> None:
        from moonvit_kernels.compare import compare_stages, to_numpy

        c = plan.tower_config
        layers = c.vt_num_hidden_layers
        check_layers = min(plan.tower_check_layers, layers)
        case, grid, L, pixels = case_inputs(plan, index)
        ref_stages = reference_stages(plan, ctx.scratch, index)
        w = weights(plan, ctx.scratch)

        def model(full: bool) -> Any:
            if full not in models:
                models[full] = make(c, w) if full else make(c.replace(vt_num_hidden_layers=check_layers),
                                                            truncated_weights(w, check_layers))  # fmt: skip
            return models[full]

        reuse = check_layers == layers and plan.tower_repeats == 1 and plan.tower_warmup == 0
        try:
            marks = Marks(kind)
            marks.mark()
            out, stages = model(False).forward(pixels, grid, return_intermediates=True, as_numpy=True,
                                               on_layer=marks.mark)  # fmt: skip
            marks.mark()
            check_run = marks.intervals()
            if faults.wrong(ctx.fault, f"{name} {case}"):
                for a in (out[0], stages["projected"]):
                    faults.perturb(a)
            rep = compare_stages(stages, ref_stages, dtype=dtype, names=(name, "numpy float64"))
        except Exception as e:
            sink.add_row("tower_check", item=case, backend=name, verdict=ERROR, note=_short(e))
            sink.verdict("tower", f"{case} {name} vs reference", ERROR, _short(e))
            raise ItemFailed(name) from e
        worst = max(rep.rows, key=lambda r: (not math.isfinite(r.max_rel), r.max_rel / r.tolerance))
        last = rep.rows[-1]
        status = PASS if rep.ok else FAIL
        first = rep.first_divergence or "none"
        described = _describe(model(False))
        sink.add_row(
            "tower_check", item=case, backend=name, where=where, dtype=dtype, tokens=L,
            shape=f"{len(rep.rows)} stages, {check_layers} layers", check=f"first divergence: {first}",
            check_err=last.max_rel, check_tol=last.tolerance, verdict=status,
            note=f"worst stage {worst.stage}: {worst.max_rel:.2e} (tol {worst.tolerance:.1e})",
        )  # fmt: skip
        text = f"output rel err {last.max_rel:.2e} (tol {last.tolerance:.1e}); first divergence {first}"
        sink.verdict("tower", f"{case} {name} vs NumPy ({check_layers} layers)", status, text)
        if status != PASS:
            return  # a wrong tower is not timed
        # the backend's own summary: the CUDA C backend says which Hopper kernels ran, numba which compiler
        summary = described and (described.get("hopper") or described.get("compiler"))
        kernels = f"; {summary}" if summary else ""
        if reuse:  # the checked model is the full model: its run is the timed run
            np.save(output_path(ctx.scratch, name, index), np.concatenate([to_numpy(o) for o in out]))
            _time_rows(sink, case, name, where, L, layers, [check_run], c, grid,
                       note=f"1 run, the checked one (stage copies included){kernels}")  # fmt: skip
        else:
            full = model(True)
            for _ in range(plan.tower_warmup):
                full.forward(pixels, grid)
            runs = []
            for _ in range(max(1, plan.tower_repeats)):
                iv, out = timed_forward(full, pixels, grid, kind)
                runs.append(iv)
            np.save(output_path(ctx.scratch, name, index), np.concatenate([to_numpy(o) for o in out]))
            _time_rows(sink, case, name, where, L, layers, runs, c, grid, note=kernels.lstrip("; "))
            described = _describe(full) or described
        if described:
            sink.diagnostic(f"describe() of tower backend {name} after {case}", json.dumps(described, indent=1))

    return run


def _describe(model: Any) -> dict[str, str] | None:
    """The backend's `describe()` (which kernels it uses), when it has one."""
    backend = getattr(model, "backend", model)
    describe = getattr(backend, "describe", None)
    try:
        return describe() if callable(describe) else None
    except Exception as e:
        return {"hopper": f"describe() failed: {_short(e)}"}


def _time_rows(
    report: Any,
    case: str,
    backend: str,
    where: str,
    L: int,
    layers: int,
    runs: list[list[float]],
    c: VisionConfig,
    grid: np.ndarray,
    note: str = "",
) -> float:
    """Rows for one backend on one case (`runs`: intervals between marks per run); returns the median total.
    The report fills in % of the torch baseline of the same case."""
    totals = [sum(iv) for iv in runs]
    med = statistics.median(totals)
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
    from moonvit_kernels.tools.gpu_check.timing import percentile

    return percentile(values, q)


def cross_checks(report: Any, plan: Plan, scratch: Path) -> None:
    """Full-depth outputs backend vs backend, from the files the tower units saved (runs in the parent)."""
    from moonvit_kernels.compare import tolerance_for

    layers = plan.tower_config.vt_num_hidden_layers
    base, growth = tolerance_for("float32")
    pairs = [
        ("numba fp32", "CUDA C fp32", base * growth ** (layers + 4)),
        ("CUDA C bf16", "CUDA C fp32", BF16_FULL_DEPTH_TOL),
        ("CUDA C bf16 hopper=False", "CUDA C fp32", BF16_FULL_DEPTH_TOL),
        ("CUDA C bf16", "CUDA C bf16 hopper=False", BF16_FULL_DEPTH_TOL),
    ]
    for index, (case, _) in enumerate(plan.tower_cases):
        for a, b, tol in pairs:
            pa, pb = output_path(scratch, a, index), output_path(scratch, b, index)
            if not (pa.exists() and pb.exists()):
                continue
            got, want = np.load(pa), np.load(pb)
            err = float(np.max(np.abs(got - want)) / max(1e-30, float(np.max(np.abs(want)))))
            if not np.all(np.isfinite(got)):
                err = float("nan")
            status = PASS if (math.isfinite(err) and err <= tol) else FAIL
            report.add_row(
                "tower_check", item=case, backend=f"{a} vs {b}", shape=f"output, {layers} layers",
                check="full depth, backend vs backend", check_err=err, check_tol=tol, verdict=status,
            )  # fmt: skip
            report.verdict(
                "tower", f"{case} {a} vs {b} ({layers} layers)", status, f"rel err {err:.2e} (tol {tol:.1e})"
            )


def _torch_baseline(
    plan: Plan,
    report: Any,
    ctx: dict[str, Any],
    case: str,
    L: int,
    c: VisionConfig,
    weights: Mapping[str, np.ndarray],
    pixels: np.ndarray,
    grid: np.ndarray,
) -> tuple[str, float] | None:
    """Time the tower in PyTorch eager (`torch_tower.torch_forward`: cuBLAS GEMMs + SDPA) as the
    tower's baseline: bf16 on the GPU, fp32 on the CPU under --simulate. A missing torch, or a
    failure of the baseline itself, is a note, never a verdict: it says nothing about our kernels."""
    if ctx.get("unavailable"):
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
            from moonvit_kernels.tools.gpu_check.torch_tower import torch_weights

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
    from moonvit_kernels.tools.gpu_check.torch_tower import torch_forward

    torch = ctx["torch"]

    class Eager:
        def forward(self, pv: np.ndarray, g: np.ndarray, on_layer: Any = None) -> Any:
            return torch_forward(torch, pv, g, weights, c, ctx["device"], ctx["dtype"], ctx["w"])

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
