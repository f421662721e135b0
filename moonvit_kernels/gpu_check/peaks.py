"""Datasheet peaks of the GPUs this project expects, for the "% of peak" column.

These are vendor datasheet numbers (dense, no sparsity), labelled as such in every row that uses
them; the baselines measured in the same run (cuBLAS, SDPA, a device copy) are the ceilings that
count. Unknown GPUs get no peak (the column stays empty).
"""

from __future__ import annotations

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
