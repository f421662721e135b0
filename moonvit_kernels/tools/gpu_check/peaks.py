"""Peaks: the GPUs' datasheet numbers, and the attainable peaks measured in the same run.

Datasheet numbers (dense, no sparsity) are labelled as such in every row that uses them; unknown
GPUs get none (the column stays empty). The measured peaks (`peak_items`: cuBLAS GEMMs at 8192³,
the fastest SDPA at the K3 shape, a 1 GiB device copy) are the ceilings that count: each kernel row
gives its rate as % of the measured peak of its kind (`peak_key`) beside % of the datasheet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# name substring -> (bf16 tensor TFLOP/s dense, fp32 SIMT TFLOP/s, memory GB/s), SXM parts
DATASHEET = {
    "H200": (989.0, 67.0, 4800.0),
    "H100": (989.0, 67.0, 3350.0),
    "A100": (312.0, 19.5, 2039.0),
}


def peak_for(gpu: str | None, unit: str, dtype: str) -> tuple[float, str] | None:
    """`(peak, label)` for a measurement in `unit` ("TFLOP/s" or "GB/s") whose operands are `dtype`."""
    if not gpu:
        return None
    key = next((k for k in DATASHEET if k in gpu), None)
    if key is None:
        return None
    bf16, fp32, bandwidth = DATASHEET[key]
    if unit == "GB/s":
        return bandwidth, f"{bandwidth:.0f} GB/s ({key} datasheet)"
    if dtype.startswith("bfloat16"):
        return bf16, f"{bf16:.0f} TFLOP/s bf16 dense ({key} datasheet)"
    return fp32, f"{fp32:.1f} TFLOP/s fp32 ({key} datasheet)"


# ============================================================================ measured in the same run
def peak_key(baseline_kind: str, dtype: str) -> str:
    """Which measured peak a kernel is compared with: its baseline kind and operand dtype."""
    if baseline_kind == "attention":
        return f"attention {dtype.split('->')[0]}"
    if baseline_kind in ("gemm_bf16", "gemm_fp32"):
        return baseline_kind.replace("_", " ")
    return "copy"


def peak_items(simulate: bool, baselines: Any, sink: Any, where: str) -> list[tuple[str, Callable[[], None]]]:
    """The attainable peaks, one item each, timed like the kernels (`baselines.Baselines`): on a GPU cuBLAS
    bf16 and fp32 GEMMs at 8192³, the fastest torch SDPA at the K3 shape (L = 4096, 12 heads of 128) in
    bf16 and fp32, and a 1 GiB device-to-device copy; under --simulate NumPy stand-ins on the CPU."""
    n = 256 if simulate else 8192
    L, H, hd = (64, 2, 24) if simulate else (4096, 12, 128)
    copy_bytes = 2 * (16 * 2**20 if simulate else 2**30)  # read + write of the copied bytes
    specs = [
        ("gemm bf16", f"{n}x{n}x{n}", ("gemm_bf16", n, n, n), 2.0 * n**3, "TFLOP/s", f"2·{n}³"),
        ("gemm fp32", f"{n}x{n}x{n}", ("gemm_fp32", n, n, n), 2.0 * n**3, "TFLOP/s", f"2·{n}³"),
        ("attention bfloat16", f"L={L} H={H} hd={hd}", ("attention", L, H, hd, "bfloat16"), 4.0 * L * L * H * hd,
         "TFLOP/s", f"4·{L}²·{H * hd}"),
        ("attention float32", f"L={L} H={H} hd={hd}", ("attention", L, H, hd, "float32"), 4.0 * L * L * H * hd,
         "TFLOP/s", f"4·{L}²·{H * hd}"),
        ("copy", f"{copy_bytes // 2 // 2**20} MiB", ("copy", copy_bytes), float(copy_bytes), "GB/s",
         f"2·{copy_bytes // 2} B (read + write)"),
    ]  # fmt: skip

    def item(key: str, shape: str, args: tuple, work: float, unit: str, formula: str) -> Callable[[], None]:
        def measure() -> None:
            label, timing = baselines.get(*args)
            if timing is None:
                sink.verdict("kernels", f"peak {key}", "skip", label)
                return
            t = timing.warm
            rate = work / t.median / (1e12 if unit == "TFLOP/s" else 1e9)
            sink.add_row(
                "peaks", item=f"{key}: {label}", where=where, shape=shape, median_ms=t.median_ms, p10_ms=t.p10 * 1e3,
                p90_ms=t.p90 * 1e3, runs=t.runs, clock=t.clock, work=work, unit=unit, rate=rate, formula=formula,
                peak_key=key, note="measured in this run: the ceiling each kernel is given as % of",
            )  # fmt: skip

        return measure

    return [(f"peak {spec[0]}", item(*spec)) for spec in specs]
