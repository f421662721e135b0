"""What the machine has: the GPU, its clocks and power, package versions, and the CUDA toolchain in use.

Packages are told apart three ways: "not installed" (no such module), a version (it imports), and
"installed but incompatible" (it is there, its import fails: a wrong CUDA, a missing library); the
error is kept. The toolchain rows give the version and the loaded library's path of each compiler the
kernels go through: NVRTC as CuPy loads it and as cuda-bindings loads it, NVVM (numba), nvJitLink.
`gpu_state()` reads SM and memory clocks, power and temperature (nvidia-smi, else NVML through ctypes,
else it says absent). Nothing here installs anything.
"""

from __future__ import annotations

import glob
import importlib
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
from typing import Any

from moonvit_kernels.tools import SOURCE_ROOT

OPTIONAL = (  # (module, distribution)
    ("numba", "numba"),
    ("numba.cuda", "numba-cuda"),
    ("cupy", "cupy-cuda13x"),
    ("torch", "torch"),
    ("cuda.bindings", "cuda-bindings"),
    ("matplotlib", "matplotlib"),
    ("pytest", "pytest"),
)
MIN_VERSIONS = {"numba": (0, 60), "numba.cuda": (0, 20), "cupy": (13, 0), "numpy": (1, 24)}
NOT_INSTALLED = "not installed"
INCOMPATIBLE = "installed but incompatible"


def _distribution_version(module: str, dist: str) -> str | None:
    for name in (dist, module.split(".")[0], "cupy-cuda12x"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def version_of(module: str, dist: str | None = None, try_import: bool = True) -> str:
    """`module`'s version; 'not installed'; or 'installed but incompatible: <error>' when it is there but its
    import fails. `try_import=False` reads the installed version without importing (fast, proves less)."""
    installed = _distribution_version(module, dist or module)
    if not _found(module) and installed is None:
        return NOT_INSTALLED
    if not try_import:
        return installed or "installed"
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # there, but it does not import here (wrong CUDA, missing libraries)
        return f"{installed or ''} {INCOMPATIBLE}: {type(e).__name__}: {e}".strip()[:300]
    return str(getattr(mod, "__version__", None) or installed or "installed")


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


def detect_gpu(timeout_s: float = 90.0) -> tuple[str | None, str]:
    """`gpu_present()` asked in a subprocess, so that a driver that hangs costs `timeout_s`, not the run:
    (the GPU's name, "") or (None, why: "" when there is simply no GPU)."""
    import sys

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SOURCE_ROOT), env.get("PYTHONPATH", "")]))
    code = "from moonvit_kernels.tools.gpu_check.machine import gpu_present; print(repr(gpu_present()))"
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return None, f"asking the CUDA driver for a GPU did not finish in {timeout_s:.0f} s (a hung driver?)"
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines:
        tail = " | ".join(r.stderr.strip().splitlines()[-2:])
        return None, f"asking the CUDA driver for a GPU failed (exit status {r.returncode}): {tail}"[:300]
    import ast

    name = ast.literal_eval(lines[-1])
    return (str(name), "") if name else (None, "")


def gpu_properties() -> dict[str, Any]:
    """SM count, memory, L2, compute capability, driver and runtime versions of device 0 (what can be read)."""
    info: dict[str, Any] = {}
    try:
        import cupy

        rt = cupy.cuda.runtime
        props = rt.getDeviceProperties(0)
        info["SMs"] = props["multiProcessorCount"]
        info["memory"] = f"{props['totalGlobalMem'] / 2**30:.1f} GiB"
        info["L2 cache"] = f"{props.get('l2CacheSize', 0) / 2**20:.0f} MiB"
        info["compute capability"] = f"{props['major']}.{props['minor']}"
        info["shared memory per block (opt-in)"] = f"{props.get('sharedMemPerBlockOptin', 0)} B"
        info["CUDA driver API"] = _cuda_version(rt.driverGetVersion())
        info["CUDA runtime (CuPy)"] = _cuda_version(rt.runtimeGetVersion())
    except Exception as e:
        info["CuPy device query"] = f"unavailable ({type(e).__name__}: {e})"[:200]
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
    driver = _nvidia_smi(["driver_version"])
    if driver:
        info["driver"] = driver[0]
    return info


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def _nvidia_smi(fields: list[str]) -> list[str] | None:
    """Values of `nvidia-smi --query-gpu=FIELDS` for GPU 0, or None (no nvidia-smi, or it failed)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        r = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0 or not r.stdout.strip():
        return None
    return [v.strip() for v in r.stdout.strip().splitlines()[0].split(",")]


STATE_FIELDS = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "clocks_event_reasons.active")


def format_state(values: list[str]) -> str:
    """One line from nvidia-smi's values for STATE_FIELDS."""
    sm, mem, power, temp, reasons = (values + [""] * 5)[:5]
    text = f"SM {sm} MHz, memory {mem} MHz, power {power} W, {temp} °C"
    return text + (f", clock event reasons {reasons}" if reasons and reasons not in ("0x0000000000000000",) else "")


def gpu_state(simulate: bool = False) -> str:
    """SM and memory clocks, power, temperature and throttle reasons of GPU 0 now, in one line."""
    if simulate:
        return "absent (--simulate: no GPU)"
    values = _nvidia_smi(list(STATE_FIELDS))
    if values is not None:
        return format_state(values) + " (nvidia-smi)"
    try:
        return _nvml_state() + " (NVML)"
    except Exception as e:
        return f"absent (no nvidia-smi; NVML: {type(e).__name__}: {e})"[:200]


def _nvml_state() -> str:
    """The state line read from NVML itself (libnvidia-ml, through ctypes: no Python package needed)."""
    import ctypes

    nvml = ctypes.CDLL("libnvidia-ml.so.1")

    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} returned {rc}")

    check(nvml.nvmlInit_v2(), "nvmlInit_v2")
    handle = ctypes.c_void_p()
    check(nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)), "nvmlDeviceGetHandleByIndex_v2")
    sm, mem, power, temp = (ctypes.c_uint() for _ in range(4))
    check(nvml.nvmlDeviceGetClockInfo(handle, 1, ctypes.byref(sm)), "nvmlDeviceGetClockInfo(SM)")
    check(nvml.nvmlDeviceGetClockInfo(handle, 2, ctypes.byref(mem)), "nvmlDeviceGetClockInfo(MEM)")
    check(nvml.nvmlDeviceGetPowerUsage(handle, ctypes.byref(power)), "nvmlDeviceGetPowerUsage")
    check(nvml.nvmlDeviceGetTemperature(handle, 0, ctypes.byref(temp)), "nvmlDeviceGetTemperature")
    nvml.nvmlShutdown()
    return format_state([str(sm.value), str(mem.value), f"{power.value / 1000:.1f}", str(temp.value), ""])


# ============================================================================ the CUDA toolchain
_LIBRARY = re.compile(r"/lib(nvrtc|nvJitLink|nvvm)[^/]*\.so[.\d]*$")


def loaded_libraries() -> dict[str, list[str]]:
    """Paths of the NVRTC, nvJitLink and NVVM shared libraries loaded in this process, by name."""
    found: dict[str, list[str]] = {}
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            for line in f:
                path = line.split()[-1] if line.split() else ""
                m = _LIBRARY.search(path)
                if m and path not in found.setdefault(m.group(1), []):
                    found[m.group(1)].append(path)
    except OSError:
        pass
    return found


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        return False


def _probe(module: str, ask: Any) -> str:
    """`ask()` as text; 'not installed' when `module` is not there; 'installed but incompatible: <error>'."""
    if not _found(module):
        return NOT_INSTALLED
    try:
        return str(ask())
    except Exception as e:
        return f"{INCOMPATIBLE}: {type(e).__name__}: {e}"[:300]


def toolchain(simulate: bool) -> list[tuple[str, str]]:
    """(component, version and path) of NVRTC (CuPy's, cuda-bindings'), NVVM (numba), nvJitLink, the driver."""

    def cupy_nvrtc() -> str:
        import cupy

        return ".".join(map(str, cupy.cuda.nvrtc.getVersion()))

    def bindings_nvrtc() -> str:
        from cuda.bindings import nvrtc

        v = nvrtc.nvrtcVersion()
        return ".".join(str(x) for x in v[-2:])

    def nvvm() -> str:
        if simulate:
            return "not asked here (numba runs its simulator); the item 'numba GPU build' checks it"
        from moonvit_kernels.numba_backend.nvvm import NvvmUnavailable, require_nvvm

        try:
            return require_nvvm()  # the numba launchers' own check, the prepared gpu_toolchain/ included
        except NvvmUnavailable as e:
            return f"unusable: {e}"

    def nvjitlink() -> str:
        from cuda.bindings import nvjitlink as nvj

        v = nvj.version()
        return ".".join(str(x) for x in (v[-2:] if isinstance(v, tuple) else (v,)))

    def driver() -> str:
        from cuda.bindings import driver as drv

        try:
            err, v = drv.cuDriverGetVersion()
        except Exception as e:
            if "NotFound" in type(e).__name__:  # libcuda is not on this machine: nothing incompatible about it
                return f"{NOT_INSTALLED} (no NVIDIA driver library on this machine)"
            raise
        if err != drv.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuDriverGetVersion: {err.name} (no CUDA driver)")
        return _cuda_version(v)

    rows = [
        ("NVRTC (CuPy)", _probe("cupy", cupy_nvrtc)),
        ("NVRTC (cuda-bindings)", _probe("cuda.bindings", bindings_nvrtc)),
        ("NVVM (numba-cuda)", _probe("numba", nvvm)),
        ("nvJitLink (cuda-bindings)", _probe("cuda.bindings", nvjitlink)),
        ("CUDA driver (cuda-bindings)", _probe("cuda.bindings", driver)),
    ]
    libs = loaded_libraries()
    rows += [(f"loaded lib{name}", ", ".join(paths)) for name, paths in sorted(libs.items())]
    return rows


def describe(simulate: bool, gpu: str | None) -> tuple[list[tuple[str, str]], list[str]]:
    """Machine table rows and notes (missing, incompatible or too-old packages)."""
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
    for module, dist in OPTIONAL:
        # under --simulate torch and CuPy are not needed: their installed version is read, not imported
        v = version_of(module, dist, try_import=not (simulate and module in ("torch", "cupy")))
        rows.append((module, v))
        if v == NOT_INSTALLED and module == "cupy" and simulate:
            continue  # --simulate runs the CUDA C kernels on the emulator, not through CuPy
        if v == NOT_INSTALLED and module in ("numba", "numba.cuda", "cupy"):
            notes.append(f"{module} is not installed: its checks are skipped")
        elif INCOMPATIBLE in v:
            notes.append(f"{module}: {v}; its checks are skipped")
        elif too_old(module, v):
            need = ".".join(map(str, MIN_VERSIONS[module]))
            notes.append(f"{module} {v} is older than {need}: its checks may fail or be skipped")
    if too_old("numpy", np.__version__):
        notes.append(f"numpy {np.__version__} is older than the project expects")
    rows.append(("NUMBA_ENABLE_CUDASIM", os.environ.get("NUMBA_ENABLE_CUDASIM", "unset")))
    from moonvit_kernels.cuda_backend.toolchain import compatibility_problems, toolchain_versions

    notes += [f"toolchain: {p}" for p in compatibility_problems(toolchain_versions())]
    return rows, notes
