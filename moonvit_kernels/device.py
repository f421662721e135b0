"""Where kernels can run: a real CUDA GPU, or numba's CUDA simulator on the CPU.

A GPU is detected by the CUDA driver itself (`cuInit` succeeding and at least one device),
never by `numba.cuda.is_available()`, which is also True under the simulator.
"""

from __future__ import annotations

import functools
import os


@functools.cache
def gpu_name() -> str | None:
    """Name of CUDA device 0, or None when there is no usable GPU (no driver, no device)."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return None
        err, count = driver.cuDeviceGetCount()
        if err != driver.CUresult.CUDA_SUCCESS or count < 1:
            return None
        err, dev = driver.cuDeviceGet(0)
        err, name = driver.cuDeviceGetName(64, dev)
        if err != driver.CUresult.CUDA_SUCCESS:
            return "CUDA GPU"
        return name.split(b"\0", 1)[0].decode(errors="replace")
    except Exception:  # a broken driver install is "no GPU", not a crash at import
        return None


def gpu_available() -> bool:
    """True when a real CUDA GPU can be used."""
    return gpu_name() is not None


def simulator_enabled() -> bool:
    """True when numba.cuda runs under the CPU simulator (NUMBA_ENABLE_CUDASIM=1)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def use_simulator_without_gpu() -> bool:
    """Turn on numba's CUDA simulator when there is no GPU; call before numba is imported.

    Returns True when the simulator is (now) on."""
    if "NUMBA_ENABLE_CUDASIM" not in os.environ and not gpu_available():
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    return simulator_enabled()


def where() -> str:
    """A label for results: the GPU's name, or 'CUDA simulator (CPU)'."""
    if simulator_enabled():
        return "CUDA simulator (CPU)"
    return gpu_name() or "no GPU"
