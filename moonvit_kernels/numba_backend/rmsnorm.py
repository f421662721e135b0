"""RMSNorm `out = x · rsqrt(mean(x², row) + eps) · weight`, in float32 (docs/model.md §3 and §7).

Layout: `x [rows, cols]` row-major (one token per row), `weight [cols]`, `out [rows, cols]`,
`rstd [rows]` = `rsqrt(mean(x²) + eps)` per row (kept for tests and a backward pass).

One kernel, `rmsnorm_kernel`: one block per row. Each thread sums the squares of a strided
subset of the row's columns, then the block adds its partial sums with a shared-memory tree
reduction (halving the number of active threads each step; no warp shuffles, so it also runs
in the simulator), and finally every thread scales its columns. The block size is a power of
two baked into each specialisation (`kernel_for(threads)`), as is the shared buffer's size.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from ._cuda import cuda, float32
from .device_functions import REDUCE_SUM, block_reduce
from .launch import check_array, check_launch, copy_back, device_array, jit_named, threads_for, to_device

BLOCK_SIZES = (32, 64, 128, 256)
SIGNATURE = "void(float32[:, ::1], float32[::1], float32[:, ::1], float32[::1], int32, int32, float32)"


@functools.cache
def kernel_for(threads: int) -> Any:
    """The RMSNorm kernel specialised for `threads` threads per block (a power of two)."""
    if threads not in BLOCK_SIZES:
        raise ValueError(f"threads={threads} is not one of {BLOCK_SIZES}")
    THREADS = threads

    def rmsnorm_kernel(x, weight, out, rstd, rows, cols, eps):
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        if row >= rows:  # uniform over the block, so no thread misses a syncthreads below
            return
        partial = cuda.shared.array(THREADS, float32)
        acc = float32(0.0)
        # `while`, not `range` (CONTRIBUTING.md, "Hot loops: `while`, not `range`"): j starts at tid >= 0
        j = tid
        while j < cols:
            v = x[row, j]
            acc += v * v
            j += THREADS
        total = block_reduce(partial, acc, REDUCE_SUM)
        r = float32(1.0) / math.sqrt(total / float32(cols) + eps)
        if tid == 0:
            rstd[row] = r
        # Each thread reads x[row, j] before writing out[row, j], and all reads of pass 1
        # finished at the syncthreads above: out may alias x.
        j = tid
        while j < cols:
            out[row, j] = x[row, j] * r * weight[j]
            j += THREADS

    return jit_named(rmsnorm_kernel, f"rmsnorm_kernel_t{threads}")


def rmsnorm(
    x: Any,
    weight: Any,
    eps: float,
    out: Any = None,
    return_rstd: bool = False,
    threads: int | None = None,
    rstd: Any = None,
) -> Any:
    """`out [rows, cols] = x · rsqrt(mean(x², axis=1) + eps) · weight [cols]`, float32.

    Returns the device array `out` (a new one unless given), or `(out, rstd [rows])` with
    `return_rstd`. `out` may be `x` itself (in place). Arguments may be numba device arrays or
    NumPy arrays (copied to the device; a NumPy `out` also receives the result). `threads` is
    the block size (default: the smallest power of two >= cols, within 32..256). `rstd [rows]`
    float32, when given, receives rstd (a workspace to reuse; otherwise a new device array).
    """
    rows, cols = check_array("x", x, ndim=2)
    check_array("weight", weight, shape=(cols,))
    if out is not None:
        check_array("out", out, shape=(rows, cols))
    if rstd is not None:
        check_array("rstd", rstd, shape=(rows,))
    if not (isinstance(eps, (int, float, np.floating)) and math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a positive finite number, got {eps!r}")
    threads = threads_for(cols, max_threads=BLOCK_SIZES[-1]) if threads is None else threads
    kernel = kernel_for(threads)
    check_launch(kernel, rows, threads)

    x_d = to_device(x)
    if out is None:
        out_d = device_array((rows, cols))
    elif out is x:
        out_d = x_d
    else:
        out_d = to_device(out)
    rstd_d = device_array(rows) if rstd is None else to_device(rstd)
    kernel[rows, threads](x_d, to_device(weight), out_d, rstd_d, np.int32(rows), np.int32(cols), np.float32(eps))
    if out is not None:
        copy_back(out, out_d)
    if rstd is not None:
        copy_back(rstd, rstd_d)
    return (out_d, rstd_d) if return_rstd else out_d
