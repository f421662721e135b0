"""Launch a learner's kernel on one case: numba.cuda (simulator or GPU), or CUDA C source on the CPU emulator.

Both return `(output, guard rows)`: the output is allocated with `GUARD_ROWS` extra rows, every element
set to the case's sentinel, so that elements never written and writes past the end both show.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .core import GUARD_ROWS, OUT, Case


def _filled(case: Case) -> np.ndarray:
    return np.full((case.out_shape[0] + GUARD_ROWS, *case.out_shape[1:]), case.fill, dtype=case.out_dtype)


def launch_numba(kernel: Any, case: Case) -> tuple[np.ndarray, np.ndarray]:
    """Run a @cuda.jit kernel once on fresh device copies; returns (output, the guard rows after it)."""
    from moonvit_kernels.numba_backend._cuda import cuda

    full_d = cuda.to_device(_filled(case))
    out_d = full_d[: case.out_shape[0]]
    args = [out_d if a is OUT else (cuda.to_device(a) if isinstance(a, np.ndarray) else a) for a in case.args]
    kernel[case.grid, case.block](*args)
    cuda.synchronize()
    back = full_d.copy_to_host()
    return back[: case.out_shape[0]], back[case.out_shape[0] :]


def _dim3(v: tuple[int, ...] | int) -> tuple[int, int, int]:
    t = (v,) if isinstance(v, int) else tuple(v)
    return tuple(int(x) for x in (*t, 1, 1, 1)[:3])  # type: ignore[return-value]


def launch_cuda_c(function: Any, case: Case) -> tuple[np.ndarray, np.ndarray]:
    """Run a compiled CUDA C kernel (a RawModule function of the emulated device) once on one case."""
    from moonvit_kernels.cuda_backend.emulation import device

    full = device.asarray(_filled(case))
    args = []
    for a in case.args:
        if a is OUT:
            args.append(full)  # the kernel sees the first out_shape[0] rows; the rest are the guard
        elif isinstance(a, np.ndarray):
            args.append(device.asarray(np.ascontiguousarray(a)))
        else:
            args.append(a)
    function(_dim3(case.grid), _dim3(case.block), tuple(args), shared_mem=case.shared_mem)
    back = full.get()
    return back[: case.out_shape[0]], back[case.out_shape[0] :]
