"""Input checks that run on the device: the first row of a float32 matrix holding NaN or Inf.

Device `pixel_values [L, 3·p·p]` are checked where they are, so that a bad image gives a clear
error instead of NaN embeddings, without copying the pixels back to the host: one thread per
element, and a thread that sees a non-finite value lowers `first[0]` to its row with an atomic
minimum. Only that one int32 comes back.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._cuda import cuda
from .launch import ceil_div, check_array, check_launch

SIGNATURE = "void(float32[:, ::1], int32[::1])"
THREADS = 256


@cuda.jit
def first_nonfinite_row_kernel(x, first):
    i = cuda.grid(1)
    cols = x.shape[1]
    if i < x.shape[0] * cols:
        row = i // cols
        if not math.isfinite(x[row, i - row * cols]):
            cuda.atomic.min(first, 0, row)


def first_nonfinite_row(x: Any) -> int:
    """Index of the first row of the device matrix `x [rows, cols]` (float32) holding NaN or Inf; -1 if none."""
    rows, cols = check_array("x", x, ndim=2)
    blocks = ceil_div(rows * cols, THREADS)
    check_launch(first_nonfinite_row_kernel, blocks, THREADS)
    first = cuda.to_device(np.array([rows], np.int32))
    first_nonfinite_row_kernel[blocks, THREADS](x, first)
    found = int(first.copy_to_host()[0])
    return -1 if found == rows else found
