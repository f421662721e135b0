"""What the machine has: the GPU (name, SMs, memory, driver, CUDA runtime) and package versions.

Every optional package is imported inside a try block: a missing or broken one is reported
("not installed", or the error), never raised. Nothing here installs anything.
"""

from __future__ import annotations

import glob
import importlib
import os
import platform
import re
import shutil
import subprocess
from typing import Any

OPTIONAL = ("numba", "numba_cuda", "cupy", "torch", "cuda.bindings", "matplotlib", "pytest")
MIN_VERSIONS = {"numba": (0, 60), "numba_cuda": (0, 20), "cupy": (13, 0), "numpy": (1, 24)}


def version_of(module: str) -> str:
    """`module.__version__`, or 'not installed' / 'broken: <error>'."""
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return "not installed"
    except Exception as e:  # a package that fails at import (wrong CUDA, missing libraries)
        return f"broken: {type(e).__name__}: {e}"[:200]
    return str(getattr(mod, "__version__", getattr(mod, "VERSION", "installed")))


def version_tuple(text: str) -> tuple[int, ...]:
    """Leading numeric parts of a version: '2.11.0+cu130' -> (2, 11, 0), '0.30.4' -> (0, 30, 4)."""
    parts = []
    for piece in text.split("."):
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
        if m.end() < len(piece):  # '0+cu130', '1rc1': the rest is a local or pre-release tag
            break
    return tuple(parts)


def too_old(module: str, version: str) -> bool:
    need = MIN_VERSIONS.get(module)
    v = version_tuple(version)
    return bool(need and v and v < need)


def gpu_present() -> str | None:
    """The name of CUDA device 0, asked of the driver (cuda.bindings), else CuPy, else torch; None if none."""
    from moonvit_kernels.device import gpu_name

    name = gpu_name()
    if name:
        return name
    if not (glob.glob("/dev/nvidia*") or shutil.which("nvidia-smi")):
        return None  # no NVIDIA driver here: skip importing CuPy/torch just to hear it
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            props = cupy.cuda.runtime.getDeviceProperties(0)
            return props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    except Exception:
        pass
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:
        pass
    return None


def gpu_properties() -> dict[str, Any]:
    """SM count, memory, compute capability, driver and runtime versions of device 0 (what can be read)."""
    info: dict[str, Any] = {}
    try:
        import cupy

        rt = cupy.cuda.runtime
        props = rt.getDeviceProperties(0)
        info["SMs"] = props["multiProcessorCount"]
        info["memory"] = f"{props['totalGlobalMem'] / 2**30:.1f} GiB"
        info["compute capability"] = f"{props['major']}.{props['minor']}"
        info["shared memory per block (opt-in)"] = f"{props.get('sharedMemPerBlockOptin', 0)} B"
        info["CUDA driver API"] = _cuda_version(rt.driverGetVersion())
        info["CUDA runtime (CuPy)"] = _cuda_version(rt.runtimeGetVersion())
    except Exception as e:
        info["CuPy device query"] = f"unavailable ({type(e).__name__})"
    if "SMs" not in info:
        try:
            from numba import cuda

            dev = cuda.get_current_device()
            info["SMs"] = dev.MULTIPROCESSOR_COUNT
            info["compute capability"] = ".".join(map(str, dev.compute_capability))
        except Exception:
            pass
    try:
        import torch

        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            info.setdefault("SMs", p.multi_processor_count)
            info.setdefault("memory", f"{p.total_memory / 2**30:.1f} GiB")
            info["CUDA runtime (torch)"] = str(torch.version.cuda)
            info["cuDNN (torch)"] = str(torch.backends.cudnn.version())
    except Exception:
        pass
    driver = _nvidia_smi("driver_version")
    if driver:
        info["driver"] = driver
    return info


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def _nvidia_smi(field: str) -> str | None:
    try:
        r = subprocess.run(
            ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None


def describe(simulate: bool, gpu: str | None) -> tuple[list[tuple[str, str]], list[str]]:
    """Machine table rows and notes (missing or too-old packages)."""
    import numpy as np

    rows: list[tuple[str, str]] = []
    notes: list[str] = []
    if simulate:
        rows.append(("GPU", "none used: --simulate (numba CUDA simulator and the CUDA C emulator on the CPU)"))
    else:
        rows.append(("GPU", gpu or "none"))
        rows += [(k, str(v)) for k, v in gpu_properties().items()]
    rows.append(("host", f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}"))
    rows.append(("python", platform.python_version()))
    rows.append(("numpy", np.__version__))
    for module in OPTIONAL:
        v = version_of(module)
        rows.append((module, v))
        if v == "not installed" and module == "cupy" and simulate:
            continue  # --simulate runs the CUDA C kernels on the emulator, not through CuPy
        if v == "not installed" and module in ("numba", "numba_cuda", "cupy"):
            notes.append(f"{module} is not installed: its checks are skipped")
        elif v.startswith("broken"):
            notes.append(f"{module} does not import ({v}): its checks are skipped")
        elif too_old(module, v):
            need = ".".join(map(str, MIN_VERSIONS[module]))
            notes.append(f"{module} {v} is older than {need}: its checks may fail or be skipped")
    if too_old("numpy", np.__version__):
        notes.append(f"numpy {np.__version__} is older than the project expects")
    rows.append(("NUMBA_ENABLE_CUDASIM", os.environ.get("NUMBA_ENABLE_CUDASIM", "unset")))
    return rows, notes
