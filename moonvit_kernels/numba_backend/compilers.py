"""Which compiler builds the numba kernels: the two names, the environment variable, and the choice.

Nothing here imports a compiler (`_cuda` does, once the choice is made), so a launcher such as
`compile_check` can pick a compiler before any kernel module is imported.

  numba-cuda        `numba.cuda` (package numba-cuda). Its CUDA simulator (`NUMBA_ENABLE_CUDASIM=1`) runs the
                    kernels on the CPU: what every GPU-less learner uses. In maintenance since 2026 (security
                    and critical fixes only, through CUDA 13).
  numba-cuda-mlir   `numba_cuda_mlir.cuda` (package numba-cuda-mlir, Python 3.11+): NVIDIA's forward CUDA
                    compiler for Python kernels. No simulator.

The choice (`select_compiler`):
  - the simulator is on                                    -> numba-cuda
  - `MOONVIT_NUMBA_COMPILER` = `numba-cuda-mlir` or `mlir` -> numba-cuda-mlir (an error if it is not installed,
                                                              or if the simulator is on)
  - `numba-cuda`, `auto` or unset                          -> numba-cuda: numba-cuda-mlir stays opt-in until a
                                                              GPU run passes the gpu tier with it
"""

from __future__ import annotations

import importlib.metadata
import os

NUMBA_CUDA = "numba-cuda"
NUMBA_CUDA_MLIR = "numba-cuda-mlir"
COMPILERS = (NUMBA_CUDA, NUMBA_CUDA_MLIR)
ENV_VAR = "MOONVIT_NUMBA_COMPILER"
_NAMES = {"": None, "auto": None, NUMBA_CUDA: NUMBA_CUDA, NUMBA_CUDA_MLIR: NUMBA_CUDA_MLIR, "mlir": NUMBA_CUDA_MLIR}


def simulator_on() -> bool:
    """True when `NUMBA_ENABLE_CUDASIM` asks numba-cuda for its CPU simulator."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def compiler_name(value: str | None) -> str | None:
    """The compiler `value` names (`numba-cuda`, `numba-cuda-mlir` or `mlir`), None for `auto`, empty or None.

    Raises ValueError for anything else."""
    key = (value or "").strip().lower()
    if key not in _NAMES:
        raise ValueError(f"unknown numba compiler {value!r}: expected numba-cuda, numba-cuda-mlir (or mlir), auto")
    return _NAMES[key]


def installed(compiler: str) -> bool:
    """True when `compiler`'s package is installed (read from its metadata: nothing is imported)."""
    try:
        importlib.metadata.version(compiler)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def installed_compilers() -> list[str]:
    """The compilers that can be imported here, numba-cuda first."""
    return [c for c in COMPILERS if installed(c)]


def version(compiler: str) -> str:
    """The installed version of `compiler`'s package, e.g. `0.30.4`."""
    return importlib.metadata.version(compiler)


def select_compiler() -> str:
    """The compiler for this process, from the simulator switch and `$MOONVIT_NUMBA_COMPILER` (see module doc)."""
    try:
        asked = compiler_name(os.environ.get(ENV_VAR))
    except ValueError as e:
        raise ValueError(f"{ENV_VAR}: {e}") from None
    if asked != NUMBA_CUDA_MLIR:
        return NUMBA_CUDA
    if simulator_on():
        raise ValueError(
            f"{ENV_VAR} asks for numba-cuda-mlir but the CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1): "
            "numba-cuda-mlir has no simulator; unset one of the two"
        )
    if not installed(NUMBA_CUDA_MLIR):
        raise ValueError(
            f"{ENV_VAR} asks for numba-cuda-mlir, which is not installed: "
            "pip install 'numba-cuda-mlir[cu13]>=0.6' (or [cu12] for a CUDA 12 driver)"
        )
    return NUMBA_CUDA_MLIR
