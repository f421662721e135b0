"""Model vs measured: the X-ray's lower-bound time of a kernel call on a GPU, beside the measured time.

The X-ray (`moonvit_kernels.tools.xray`) is called through its public functions only: `catalogue.describe`
gives the kernel's catalogue entry (which peak applies: fp32 SIMT or bf16 tensor cores, and whatever
else the X-ray models), its FLOPs and compulsory DRAM bytes are replaced by this call's (the catalogue
models K3 at 4096 tokens; gpu_check also times 1024), and `roofline.bound` gives the bound on the GPU
of the X-ray's table (`arch.GPUS`) whose name the GPU's name contains. Any failure (an unknown GPU, a
label the catalogue lacks, an X-ray API that changed) is reported as "no model (why)", never raised.
Under --simulate there is no GPU: the bound is given for an H200 (datasheet), and no ratio.
"""

from __future__ import annotations

import dataclasses
from typing import Any

SIMULATE_GPU = "H200"


def xray_bound(model: tuple[str, float, float], backend: str, gpu: str | None) -> dict[str, Any]:
    """`{"model": text, "model_ms": bound}` for a call described by `model` = (catalogue label, FLOPs, DRAM
    bytes) of `backend` ("numba" or "CUDA C") on GPU `gpu` (None: --simulate, bound for an H200);
    `{"model": "no model (why)"}` when the X-ray cannot say."""
    label, flops, dram_bytes = model
    try:
        from moonvit_kernels.tools.xray import arch, catalogue, roofline

        name = gpu or SIMULATE_GPU
        peaks = next((g for key, g in arch.GPUS.items() if key in name), None)
        if peaks is None:
            return {"model": f"no model ({name} is not in the X-ray's GPU table)"}
        info = catalogue.describe("numba" if backend == "numba" else "cuda", label)
        info = dataclasses.replace(info, flops=float(flops), dram_bytes=float(dram_bytes))
        bound = roofline.bound(info, peaks)
        if bound is None:
            return {"model": f"no model (no bound for {label})"}
        where = f"{peaks.name} datasheet" + (", no GPU" if gpu is None else "")
        return {"model": f"{bound.limit}-bound, {info.peak} peak, {where}", "model_ms": bound.seconds * 1e3}
    except Exception as e:  # the X-ray is a model: its failure never stops a measurement
        return {"model": f"no model ({type(e).__name__}: {e})"[:200]}
