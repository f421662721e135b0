"""Launch a learner's kernel on one case: numba.cuda (simulator or GPU), or CUDA C source on the CPU emulator.

Both return `(output, guard rows)`: the output is allocated with `GUARD_ROWS` extra rows, every element
set to the case's sentinel, so that elements never written and writes past the end both show. Both are
contained: the kernel runs in a forked child with a time limit (`TIME_LIMIT` seconds unless given), so an
endless loop or a crash is reported (`KernelStopped`) instead of hanging or ending the notebook's kernel.
A numba kernel on a real GPU runs in this process (CUDA does not survive a fork).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from moonvit_kernels import contained
from moonvit_kernels.exercises.core import GUARD_ROWS, OUT, TIME_LIMIT, Case, KernelStopped


def _filled(case: Case) -> np.ndarray:
    return np.full((case.out_shape[0] + GUARD_ROWS, *case.out_shape[1:]), case.fill, dtype=case.out_dtype)


def launch_numba(kernel: Any, case: Case, time_limit: float = TIME_LIMIT) -> tuple[np.ndarray, np.ndarray]:
    """Run a @cuda.jit kernel once on fresh device copies; returns (output, the guard rows after it). Under
    the simulator it runs in a forked child with `time_limit` seconds."""
    from moonvit_kernels.numba_backend.compilers import simulator_on

    if not (simulator_on() and contained.available()):
        return _launch_numba(kernel, case)
    name = getattr(kernel, "__name__", None) or getattr(getattr(kernel, "py_func", None), "__name__", "the kernel")
    try:
        return contained.run(lambda: _launch_numba(kernel, case), time_limit=time_limit, what=name)
    except contained.TimedOut:
        raise KernelStopped(_did_not_finish(name, time_limit)) from None
    except contained.Crashed as e:
        raise KernelStopped(f"{name}: the simulator's process died ({e.signal_name or 'exited'})\n{e.output}") from None


def _did_not_finish(name: str, seconds: float) -> str:
    return (
        f"{name}: your kernel did not finish in {seconds:g} s and was stopped: an endless loop (a loop whose "
        "condition never changes?) or threads waiting at a barrier others never reach?"
    )


def _launch_numba(kernel: Any, case: Case) -> tuple[np.ndarray, np.ndarray]:
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


def launch_cuda_c(function: Any, case: Case, time_limit: float = TIME_LIMIT) -> tuple[np.ndarray, np.ndarray]:
    """Run a compiled CUDA C kernel (a RawModule function of the emulated device) once on one case, contained,
    with `time_limit` seconds."""
    from moonvit_kernels.tools.emulation import device

    full = device.asarray(_filled(case))
    args = []
    for a in case.args:
        if a is OUT:
            args.append(full)  # the kernel sees the first out_shape[0] rows; the rest are the guard
        elif isinstance(a, np.ndarray):
            args.append(device.asarray(np.ascontiguousarray(a)))
        else:
            args.append(a)
    with device.contained_launches(time_limit):
        try:
            function(_dim3(case.grid), _dim3(case.block), tuple(args), shared_mem=case.shared_mem)
        except device.LaunchStopped as e:
            raise KernelStopped(_did_not_finish(function.name, time_limit) if e.timed_out else str(e)) from None
    back = full.get()
    return back[: case.out_shape[0]], back[case.out_shape[0] :]
