"""The one import point of `cuda` and numba's scalar types for every numba kernel, and which compiler builds them.

Two compilers read the same kernel source:
  numba-cuda        `numba.cuda` (package numba-cuda). Its CUDA simulator (`NUMBA_ENABLE_CUDASIM=1`) runs the
                    kernels on the CPU: what every GPU-less learner uses. In maintenance since 2026 (security
                    and critical fixes only, through CUDA 13).
  numba-cuda-mlir   `numba_cuda_mlir.cuda` (package numba-cuda-mlir): NVIDIA's forward CUDA compiler for Python
                    kernels. It has no simulator.
Objects of the two do not mix (a kernel typed with numba's `float32` does not compile under numba-cuda-mlir), so
kernels, device functions, exercises and tests take `cuda`, `float32`, `int32`, `uint32` from here:

    from moonvit_kernels.numba_backend._cuda import cuda, float32

Which compiler, decided once, when this module is first imported (`COMPILER`):
  - the simulator is on                                   -> numba-cuda
  - `MOONVIT_NUMBA_COMPILER` = `numba-cuda-mlir` or `mlir` -> numba-cuda-mlir (an error if it is not installed,
                                                             or if the simulator is on)
  - `numba-cuda`, `auto` or unset                          -> numba-cuda: numba-cuda-mlir stays opt-in until a
                                                             GPU run passes the gpu tier with it
A process holds one compiler's kernels; `NumbaBackend(compiler=...)` checks that it is the one asked for.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
from typing import Any

NUMBA_CUDA = "numba-cuda"
NUMBA_CUDA_MLIR = "numba-cuda-mlir"
COMPILERS = (NUMBA_CUDA, NUMBA_CUDA_MLIR)
ENV_VAR = "MOONVIT_NUMBA_COMPILER"
_ALIASES = {"": None, "auto": None, NUMBA_CUDA: NUMBA_CUDA, NUMBA_CUDA_MLIR: NUMBA_CUDA_MLIR, "mlir": NUMBA_CUDA_MLIR}


def _simulator_on() -> bool:
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def requested_compiler(value: str | None = None) -> str | None:
    """The compiler `value` (default: `$MOONVIT_NUMBA_COMPILER`) names, or None for automatic.

    Accepts `numba-cuda`, `numba-cuda-mlir`, `mlir`, `auto` or empty; raises ValueError otherwise."""
    raw = os.environ.get(ENV_VAR, "") if value is None else value
    key = raw.strip().lower()
    if key not in _ALIASES:
        raise ValueError(f"{ENV_VAR}={raw!r}: expected one of numba-cuda, numba-cuda-mlir (or mlir), auto")
    return _ALIASES[key]


def mlir_installed() -> bool:
    """True when the numba-cuda-mlir package can be imported (nothing is imported here)."""
    return importlib.util.find_spec("numba_cuda_mlir") is not None


def select_compiler() -> str:
    """The compiler this process uses, from the simulator switch and `$MOONVIT_NUMBA_COMPILER` (see module doc)."""
    asked = requested_compiler()
    if asked == NUMBA_CUDA_MLIR:
        if _simulator_on():
            raise ValueError(
                f"{ENV_VAR} asks for numba-cuda-mlir but the CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1): "
                "numba-cuda-mlir has no simulator; unset one of the two"
            )
        if not mlir_installed():
            raise ValueError(
                f"{ENV_VAR} asks for numba-cuda-mlir, which is not installed: "
                "pip install 'numba-cuda-mlir[cu13]>=0.6' (or [cu12] for a CUDA 12 driver)"
            )
        return NUMBA_CUDA_MLIR
    return NUMBA_CUDA


# ============================================================================ numba-cuda on numpy 2.5
def import_numba_cuda_arrayobj() -> None:
    """Import numba-cuda's `numba.cuda.np.arrayobj` under numpy 2.5, which no longer has `np.row_stack`.

    numba-cuda 0.30's arrayobj registers an overload for `np.row_stack` at import (the first kernel compile
    imports it), so on numpy >= 2.5 every compile fails with AttributeError (NVIDIA/numba-cuda issue 907, which
    will not be fixed: numba-cuda is in maintenance). A placeholder `np.row_stack` exists only while that one
    module is imported, then is removed: the overload lands on a function nobody can reach. Remove this shim
    when the numba-cuda the project accepts no longer references `np.row_stack`, or when numba-cuda is dropped.
    Does nothing under the simulator (it never imports arrayobj) or when numpy still has `row_stack`.
    """
    import numpy as np

    if _simulator_on() or hasattr(np, "row_stack"):
        return

    def row_stack(tup: Any) -> Any:  # pragma: no cover - registered, never called
        raise AttributeError("numpy has no row_stack (removed in numpy 2.5)")

    setattr(np, "row_stack", row_stack)  # noqa: B010 (np.row_stack by name: ruff's NPY201 flags the attribute)
    try:
        importlib.import_module("numba.cuda.np.arrayobj")
    finally:
        delattr(np, "row_stack")


# ============================================================================ the import point
COMPILER = select_compiler()

if COMPILER == NUMBA_CUDA_MLIR:
    from numba_cuda_mlir import cuda
    from numba_cuda_mlir.cuda import float32, int32, uint32
    from numba_cuda_mlir.numba_cuda.cudadrv.devicearray import is_cuda_ndarray
else:
    from numba import cuda, float32, int32, uint32
    from numba.cuda.cudadrv.devicearray import is_cuda_ndarray

    import_numba_cuda_arrayobj()


def compiler_version() -> str:
    """The installed version of `COMPILER`, e.g. `0.30.4`."""
    return importlib.metadata.version(COMPILER)


def compiler_label() -> str:
    """`COMPILER` and its version, plus ` (CUDA simulator)` when kernels run on the CPU: for reports and results."""
    return f"{COMPILER} {compiler_version()}" + (" (CUDA simulator)" if _simulator_on() else "")


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
    "COMPILERS",
    "ENV_VAR",
    "NUMBA_CUDA",
    "NUMBA_CUDA_MLIR",
    "compiler_label",
    "compiler_version",
    "cuda",
    "current_device_id",
    "device_label",
    "float32",
    "int32",
    "is_cuda_ndarray",
    "uint32",
]
