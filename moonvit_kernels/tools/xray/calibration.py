"""Calibration: the rates a GPU measured (a gpu_check results.csv) beside the X-ray's bounds.

`calibrate(report, results_csv)` pairs each measured kernel row of a `gpu_check` results.csv (section
"kernels", a rate in TFLOP/s or GB/s) with the X-ray row of the kernel it timed, on the GPU the run
names (its folder `<gpu>-<date>`, or the datasheet peak its rows quote), and puts them side by side:

    bound rate  the rate the X-ray's bound allows at K3 shape: FLOPs / bound time (TFLOP/s rows) or
                compulsory DRAM bytes / bound time (GB/s rows), model, no GPU;
    ratio       measured rate / bound rate: at most 1 when the bound holds; how far below 1 says how
                far the kernel runs from the roof the X-ray says binds.

Rates, not times, are compared because gpu_check may time other shapes than K3's (its `shape`
column is kept beside). `results_files()` lists the runs under benchmarks/results/; while there is
none, `NO_GPU_RUN` says so, and nothing is compared: no number here is ever invented.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from moonvit_kernels.tools import SOURCE_ROOT
from moonvit_kernels.tools.xray import arch as arch_table
from moonvit_kernels.tools.xray import roofline
from moonvit_kernels.tools.xray.catalogue import describe

RESULTS_ROOT = SOURCE_ROOT / "benchmarks" / "results"
NO_GPU_RUN = (
    "No GPU run yet: no gpu_check results.csv (benchmarks/results/<gpu>-<date>/results.csv) exists, so no bound "
    "has been compared with a measurement. Every time in this report is a model, no GPU."
)
_FAMILIES = (("attention", "attention"), ("flash", "attention"), ("gemm", "gemm"), ("rmsnorm", "rmsnorm"),
             ("rope", "rope"), ("pos_emb", "pos_emb"), ("merge", "merge"))  # fmt: skip
_EPILOGUES = ("gelu_tanh", "gelu_erf", "residual")


@dataclass
class Calibration:
    """One measured row beside the bound of the kernel it timed."""

    item: str
    backend: str
    shape: str
    unit: str  # "TFLOP/s" or "GB/s"
    measured: float
    kernel: str = ""  # the X-ray row's kernel label; "" when none matches
    xray_backend: str = ""  # its backend ("numba" or "cuda")
    bound_rate: float | None = None  # in `unit`
    binds: str = ""

    @property
    def ratio(self) -> float | None:
        return self.measured / self.bound_rate if self.bound_rate else None


def results_files(root: str | Path = RESULTS_ROOT) -> list[Path]:
    """Every `<run>/results.csv` under `root` (benchmarks/results/ of the source tree), oldest name first."""
    root = Path(root)
    return sorted(root.glob("*/results.csv")) if root.is_dir() else []


def gpu_of_run(results_csv: str | Path, rows: Sequence[dict[str, str]] = ()) -> str:
    """The `arch.GPUS` key of the GPU a results.csv was measured on: from its folder name, else from the
    datasheet peak its rows quote; ValueError naming the file when neither says."""
    path = Path(results_csv)
    texts = [path.parent.name, *(r.get("peak") or "" for r in rows)]
    for text in texts:
        for key in arch_table.GPUS:
            if re.search(rf"\b{key}\b", text):
                return key
    raise ValueError(
        f"{path}: cannot tell which GPU measured it (folder name or 'peak' column naming one of "
        f"{', '.join(arch_table.GPUS)})"
    )


def read_kernel_rows(results_csv: str | Path) -> list[dict[str, str]]:
    """Rows of section "kernels" with a positive rate in TFLOP/s or GB/s."""
    with open(results_csv, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    out = []
    for r in rows:
        try:
            ok = r.get("unit") in ("TFLOP/s", "GB/s") and float(r.get("rate") or "nan") > 0
        except ValueError:
            ok = False
        if ok and (r.get("section") or "kernels") == "kernels":
            out.append(r)
    return out


def _score(item: str, row) -> int:
    """How many of the item's words pick out this X-ray row among those `match_row` left (version, dtype, tile
    width, epilogue; Hopper or not is already equal)."""
    label = row.kernel.lower()
    version = row.version.lower()
    score = 0
    if m := re.search(r"\bv(\d)\b", item):
        score += 3 * (version == f"v{m[1]}")
    if "bf16" in item or "bfloat16" in item:
        score += 2 * ("bf16" in version or "bf16" in label)
    if "fp32" in item or "float32" in item:
        score += 2 * ("fp32" in version or "f32" in label)
    for bn in re.findall(r"bn(\d+)", item):
        score += 2 * (f"bn{bn}" in label)
    epilogue = next((e for e in _EPILOGUES if e in item), "none")
    score += 1 * label.endswith(epilogue) + 1 * (epilogue in label)
    return score


def _dtype_word(text: str) -> str | None:
    """ "bfloat16" or "float32" from the first dtype word of `text` (bf16, bfloat16, f32, fp32, float32), or None."""
    m = re.search(r"(bfloat16|bf16|float32|fp32|f32)", text)
    return None if m is None else ("bfloat16" if m[1].startswith("b") else "float32")


def _input_dtype(row) -> str:
    """The dtype an X-ray row's kernel reads: numba's are float32; a CUDA C kernel's from its version or label
    (the Hopper kernels read bf16)."""
    if row.backend == "numba":
        return "float32"
    version = row.version.lower()
    found = _dtype_word(version) or _dtype_word(row.kernel.lower())
    return found or ("bfloat16" if "sm90" in version else "float32")


def _output_dtype(row) -> str:
    """The dtype a CUDA C GEMM row's kernel writes: the second dtype word of its label (gemm_bf16_tc_f32_none
    writes float32), else the one it reads."""
    words = re.findall(r"(?<![a-z])(bf16|f32|fp32)(?![a-z0-9])", row.kernel.lower())
    return "bfloat16" if words[1:2] == ["bf16"] else ("float32" if words[1:2] else _input_dtype(row))


def match_row(measured: dict[str, str], rows: Sequence) -> object | None:
    """The X-ray K3 row (of one architecture) that a measured row timed, or None when none of `rows` is that
    kernel: the family, the backend, Hopper or not, the numba version and the input dtype must agree (the
    dtype from the row's `dtype` column, else from its item's words); the epilogue and tile width then pick
    the closest one; a GEMM's epilogue and tile width must match too (another instantiation is another kernel)."""
    item = (measured.get("item") or "").lower()
    backend = "numba" if "numba" in (measured.get("backend") or "").lower() else "cuda"
    family = next((fam for word, fam in _FAMILIES if word in item), None)
    candidates = [r for r in rows if r.backend == backend and r.family == family and r.k3 and r.flops is not None]
    hopper = "sm90" in item or "hopper" in item or "hopper" in (measured.get("backend") or "").lower()
    candidates = [r for r in candidates if ("sm90" in r.version.lower()) == hopper]
    if backend == "numba" and (m := re.search(r"\bv(\d)\b", item)):
        candidates = [r for r in candidates if r.version.lower() == f"v{m[1]}"]
    dtype = _dtype_word((measured.get("dtype") or "").split("->")[0]) or _dtype_word(item)
    if dtype is not None:
        candidates = [r for r in candidates if _input_dtype(r) == dtype]
    if family == "gemm":  # an epilogue, an output dtype or a tile width is another instantiation
        epilogue = next((e for e in _EPILOGUES if e in item), "none")
        candidates = [r for r in candidates if r.kernel.lower().endswith(epilogue)]
        out = _dtype_word((measured.get("dtype") or "").partition("->")[2])
        if out is not None and backend == "cuda":
            candidates = [r for r in candidates if _output_dtype(r) == out]
        for bn in re.findall(r"bn(\d+)", item):
            candidates = [r for r in candidates if f"bn{bn}" in r.kernel.lower()]
    if not candidates:
        return None
    return max(candidates, key=lambda r: _score(item, r))


def calibrate(report, results_csv: str | Path, gpu: str | None = None) -> list[Calibration]:
    """Each measured kernel row of `results_csv` beside the bound of the X-ray row it timed, on `gpu`
    (an `arch.GPUS` key; default: the GPU the run names)."""
    measured = read_kernel_rows(results_csv)
    key = gpu or gpu_of_run(results_csv, measured)
    peaks = arch_table.GPUS[key]
    rows = [r for r in report.rows if r.arch == peaks.arch]
    out = []
    for m in measured:
        cal = Calibration(m.get("item", ""), m.get("backend", ""), m.get("shape", ""), m["unit"], float(m["rate"]))
        row = match_row(m, rows)
        if row is not None:
            info = describe(row.backend, row.kernel, row.threads, row.dynamic_shared)
            bd = roofline.bound(info, peaks, report.counts.get((row.backend, row.kernel, row.arch)))
            if bd is not None:
                work = info.flops / 1e12 if m["unit"] == "TFLOP/s" else info.dram_bytes / 1e9
                cal.kernel, cal.xray_backend, cal.bound_rate, cal.binds = (
                    row.kernel,
                    row.backend,
                    work / bd.seconds,
                    bd.limit,
                )
        out.append(cal)
    return out


def markdown(calibrations: Sequence[Calibration], results_csv: str | Path, gpu: str) -> list[str]:
    """The calibration table (Markdown lines): measured on `gpu` beside the X-ray's bound rate."""
    lines = [
        f"Measured: {results_csv} on {gpu} (gpu_check). Bound: the X-ray's rate at K3 shape (model, no GPU). "
        "Ratio = measured / bound: at most 1 where the bound holds.",
        "",
        "| measured item | backend | shape | measured | X-ray kernel | bound rate | binds | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in calibrations:
        bound = f"{c.bound_rate:.1f} {c.unit}" if c.bound_rate else "-"
        ratio = f"{c.ratio:.2f}" if c.ratio is not None else "-"
        lines.append(
            f"| {c.item} | {c.backend} | {c.shape} | {c.measured:.1f} {c.unit} | {c.kernel or 'no X-ray row'} | "
            f"{bound} | {c.binds or '-'} | {ratio} |"
        )
    return lines


def attach(report, files: Sequence[str | Path] | None = None) -> dict[str, list[Calibration]]:
    """Calibrate `report` against `files` (default: `results_files()`): the Markdown goes into
    `report.calibration` (`NO_GPU_RUN` when there is no file); returns {GPU key: calibrations} for the
    roofline's measured stars."""
    paths = list(files) if files is not None else results_files()
    if not paths:
        report.calibration = [NO_GPU_RUN]
        return {}
    by_gpu: dict[str, list[Calibration]] = {}
    lines: list[str] = []
    for path in paths:
        try:
            gpu = gpu_of_run(path, read_kernel_rows(path))
            cals = calibrate(report, path, gpu)
        except ValueError as e:
            lines += [f"{path}: {e}", ""]
            continue
        by_gpu.setdefault(gpu, []).extend(cals)
        lines += [*markdown(cals, path, gpu), ""]
    report.calibration = lines
    return by_gpu
