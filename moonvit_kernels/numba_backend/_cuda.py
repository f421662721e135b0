"""The one import point of `cuda` and numba's scalar types for every numba kernel, exercise and test.

The same kernel source builds with numba-cuda (and runs on its CPU simulator) or with numba-cuda-mlir
(`compilers` says which, and why). Objects of the two do not mix: a kernel typed with numba's `float32` does
not compile under numba-cuda-mlir. So kernels take `cuda`, `float32`, `int32`, `uint32` from here:

    from moonvit_kernels.numba_backend._cuda import cuda, float32

The compiler is chosen once, when this module is first imported (`COMPILER`); a process holds one compiler's
kernels, and `NumbaBackend(compiler=...)` checks that it is the one asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

from moonvit_kernels.numba_backend.compilers import NUMBA_CUDA_MLIR, select_compiler, simulator_on, version


# ============================================================================ numba-cuda on numpy 2.5
def import_numba_cuda_arrayobj() -> None:
    """Import numba-cuda's `numba.cuda.np.arrayobj` under numpy 2.5, which no longer has `np.row_stack`.

    numba-cuda 0.30's arrayobj registers an overload for `np.row_stack` when it is imported (by the first
    kernel compile), so on numpy >= 2.5 every compile fails with AttributeError: NVIDIA/numba-cuda issue 907,
    which will not be fixed (numba-cuda is in maintenance). A placeholder `np.row_stack` exists only while
    that one module is imported, then is removed: the overload lands on a function nobody can reach.
    Remove this shim when the project drops numba-cuda, or when its numba-cuda floor no longer references
    `np.row_stack`. Does nothing under the simulator (which never imports arrayobj) or when numpy still
    has `row_stack`.
    """
    import numpy as np

    if simulator_on() or hasattr(np, "row_stack"):
        return

    def row_stack(tup: Any) -> Any:  # registered by arrayobj, never called
        raise AttributeError("numpy has no row_stack (removed in numpy 2.5)")

    setattr(np, "row_stack", row_stack)  # noqa: B010 (by name: ruff's NPY201 flags the attribute)
    try:
        importlib.import_module("numba.cuda.np.arrayobj")
    finally:
        delattr(np, "row_stack")


# ============================================================================ the import point
# region: import_point
COMPILER = select_compiler()

if COMPILER == NUMBA_CUDA_MLIR:
    from numba_cuda_mlir import cuda
    from numba_cuda_mlir.cuda import float32, int32, uint32
    from numba_cuda_mlir.numba_cuda.cudadrv.devicearray import is_cuda_ndarray
else:
    from numba import cuda, float32, int32, uint32
    from numba.cuda.cudadrv.devicearray import is_cuda_ndarray

    import_numba_cuda_arrayobj()
# endregion

if COMPILER != NUMBA_CUDA_MLIR and simulator_on():
    from moonvit_kernels.tools import simulator

    simulator.install()  # the same results, about 4x sooner (simulator.py says how)


def compiler_label() -> str:
    """`COMPILER` and its version, plus ` (CUDA simulator)` when kernels run on the CPU: for reports and results."""
    return f"{COMPILER} {version(COMPILER)}" + (" (CUDA simulator)" if simulator_on() else "")


def current_device_id() -> int:
    """The id of the CUDA device current in this thread (0 under the simulator, which has one device)."""
    return int(getattr(cuda.get_current_device(), "id", 0))


def device_label(device_id: int) -> str:
    """`device 1 (NVIDIA H200)`: the id, and the device's name where the driver gives it."""
    try:
        name = cuda.gpus[device_id].name
    except Exception:  # the simulator and a missing device have no name: the id alone still says which
        return f"device {device_id}"
    name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
    return f"device {device_id} ({name})"


__all__ = [
    "COMPILER",
    "compiler_label",
    "cuda",
    "current_device_id",
    "device_label",
    "float32",
    "int32",
    "is_cuda_ndarray",
    "uint32",
]
