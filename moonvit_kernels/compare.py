"""Stage-by-stage comparison of two backends: where does a port first go wrong?

    report = compare_stages(candidate_stages, reference_stages)
    print(report.table())
    report.first_divergence        # e.g. "layer_3", or None

Stages are the dicts returned with `return_intermediates=True` (`patch_embed`, `pos_emb`,
`layer_{i}`, `final_norm`, `merged`, `projected`), compared in the reference's order. Per stage:
max abs error, relative error `max|a − b| / max|b|`, and whether it is within tolerance. The
tolerance grows with depth on purpose: each layer adds rounding, so a fixed bound would flag
late stages of a correct port; the default is for float32 backends, `tolerance_for("bfloat16")`
for bf16 ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

# Relative error (normwise, against max|ref|) allowed at the first stage, per compute dtype.
BASE_TOLERANCE = {"float64": 1e-10, "float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}


def tolerance_for(dtype: str, growth: float = 1.15) -> tuple[float, float]:
    """`(base, growth)`: stage k may have relative error `base · growth**k`."""
    if dtype not in BASE_TOLERANCE:
        raise ValueError(f"no tolerance for dtype {dtype!r}; known: {', '.join(BASE_TOLERANCE)}")
    return BASE_TOLERANCE[dtype], growth


@dataclass(frozen=True)
class StageDiff:
    """One stage's comparison."""

    stage: str
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return bool(np.isfinite(self.max_rel) and self.max_rel <= self.tolerance)


@dataclass(frozen=True)
class StageReport:
    """All stages in order, and the first one beyond tolerance."""

    rows: list[StageDiff]
    candidate: str = "candidate"
    reference: str = "reference"

    @property
    def first_divergence(self) -> str | None:
        return next((r.stage for r in self.rows if not r.ok), None)

    @property
    def ok(self) -> bool:
        return self.first_divergence is None

    def table(self) -> str:
        """A plain-text table, one line per stage."""
        lines = [
            f"{self.candidate} vs {self.reference}",
            f"{'stage':<12} {'shape':<16} {'max abs err':>12} {'rel err':>10} {'tolerance':>10}  ok",
        ]
        for r in self.rows:
            lines.append(
                f"{r.stage:<12} {str(r.shape):<16} {r.max_abs:12.3e} {r.max_rel:10.2e} {r.tolerance:10.1e}  "
                f"{'yes' if r.ok else 'NO'}"
            )
        first = self.first_divergence
        lines.append("all stages within tolerance" if first is None else f"first divergence: {first}")
        return "\n".join(lines)


def to_numpy(a: Any) -> np.ndarray:
    """A host float64 copy of a NumPy, numba-device, CuPy or torch array."""
    if hasattr(a, "copy_to_host"):
        a = a.copy_to_host()
    elif hasattr(a, "get") and not isinstance(a, np.ndarray):
        a = a.get()
    elif hasattr(a, "detach"):
        a = a.detach().float().cpu().numpy()
    return np.asarray(a, dtype=np.float64)


def compare_stages(
    candidate: Mapping[str, Any],
    reference: Mapping[str, Any],
    dtype: str = "float32",
    names: tuple[str, str] = ("candidate", "reference"),
) -> StageReport:
    """Compare two stage dicts in the reference's order; a stage missing from the candidate or
    of another shape is an error (ValueError), NaN/Inf counts as divergence."""
    base, growth = tolerance_for(dtype)
    rows = []
    for k, (stage, ref) in enumerate(reference.items()):
        if stage not in candidate:
            raise ValueError(f"candidate has no stage {stage!r} (it has {', '.join(candidate)})")
        a, b = to_numpy(candidate[stage]), to_numpy(ref)
        if a.shape != b.shape:
            raise ValueError(f"stage {stage!r}: candidate shape {a.shape} != reference shape {b.shape}")
        diff = np.abs(a - b)
        max_abs = float(diff.max()) if diff.size else 0.0
        if not np.all(np.isfinite(a)):
            max_abs = float("nan")
        scale = float(np.abs(b).max()) if b.size else 0.0
        rel = max_abs / scale if scale > 0 else max_abs
        rows.append(StageDiff(stage, b.shape, max_abs, rel, base * growth**k))
    return StageReport(rows, *names)


def compare_backends(
    candidate_model: Any, reference_model: Any, pixel_values: Any, grid_thws: Any, dtype: str = "float32"
) -> StageReport:
    """Run two `MoonViT` models (or anything with `forward(..., return_intermediates=True)`) on the
    same inputs and compare every stage."""
    _, cand = candidate_model.forward(pixel_values, grid_thws, return_intermediates=True)
    _, ref = reference_model.forward(pixel_values, grid_thws, return_intermediates=True)
    names = (
        getattr(candidate_model, "backend_name", "candidate"),
        getattr(reference_model, "backend_name", "reference"),
    )
    return compare_stages(cand, ref, dtype=dtype, names=names)
