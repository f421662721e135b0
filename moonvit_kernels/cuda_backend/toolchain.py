"""Which CUDA compilers this process would use, and whether the driver can load what they make.

The kernels reach the GPU through compilers that come as pip wheels (NVRTC for CuPy and the Hopper
cubins, NVVM + nvJitLink for numba-cuda), while the driver comes with the machine. A compiler newer
than the driver emits PTX of an ISA the driver does not know (CUDA_ERROR_UNSUPPORTED_PTX_VERSION at
the first launch, far from its cause). `toolchain_versions()` reads every version once;
`compatibility_problems(...)` says in one message per component what cannot work together and
which wheel to pin; `check_toolchain()` raises with those messages before the first compile.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

# component -> the wheel that provides it (what to pin)
WHEELS = {"nvrtc": "nvidia-cuda-nvrtc", "nvvm": "nvidia-nvvm", "nvjitlink": "nvidia-nvjitlink"}
Version = tuple[int, int]


def _nvrtc() -> Version | None:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    return (int(major), int(minor)) if int(err) == 0 else None


def _nvjitlink() -> Version | None:
    from cuda.bindings import nvjitlink

    v = nvjitlink.version()
    return (int(v[0]), int(v[1]))


def _nvvm() -> Version | None:
    """The CUDA release of the NVVM wheel (libNVVM's own version() is its IR version, 2.0 for years)."""
    from importlib import metadata

    try:
        parts = metadata.version("nvidia-nvvm").split(".")
    except metadata.PackageNotFoundError:
        return None
    return (int(parts[0]), int(parts[1]))


def _driver() -> Version | None:
    from cuda.bindings import driver

    err, v = driver.cuDriverGetVersion()
    return (int(v) // 1000, int(v) % 1000 // 10) if int(err) == 0 and int(v) > 0 else None


@functools.cache
def toolchain_versions() -> dict[str, Version | str | None]:
    """{"driver", "nvrtc", "nvvm", "nvjitlink"} -> (major, minor); None when absent, a string saying why
    when it is installed but cannot be read (an incompatible build, a missing library)."""
    out: dict[str, Version | str | None] = {}
    for name, read in (("driver", _driver), ("nvrtc", _nvrtc), ("nvvm", _nvvm), ("nvjitlink", _nvjitlink)):
        try:
            out[name] = read()
        except ImportError:
            out[name] = None
        except Exception as e:
            if "NotFound" in type(e).__name__:  # its library is not on this machine (no driver)
                out[name] = None
                continue  # installed, but its library did not load or answer
            out[name] = f"unreadable: {type(e).__name__}: {str(e)[:160]}"
    return out


def compatibility_problems(versions: Mapping[str, Version | str | None]) -> list[str]:
    """One message per compiler the driver cannot follow: a compiler of a newer CUDA major than the
    driver's always fails; a newer minor of the PTX emitters (NVRTC, NVVM) may fail to load its PTX."""
    driver = versions.get("driver")
    if not isinstance(driver, tuple):
        return []
    problems = []
    for name in ("nvrtc", "nvvm", "nvjitlink"):
        v = versions.get(name)
        if not isinstance(v, tuple):
            continue
        pin = f"pip install '{WHEELS[name]}=={driver[0]}.{driver[1]}.*'"
        if v[0] > driver[0]:
            problems.append(
                f"{name} {v[0]}.{v[1]} is newer than the driver (CUDA {driver[0]}.{driver[1]}): its output needs a "
                f"newer driver; {pin} (or upgrade the driver)"
            )
        elif v[0] == driver[0] and v[1] > driver[1] and name != "nvjitlink":
            problems.append(
                f"{name} {v[0]}.{v[1]} emits PTX of a newer ISA than the driver (CUDA {driver[0]}.{driver[1]}) may "
                f"load; if kernels fail with CUDA_ERROR_UNSUPPORTED_PTX_VERSION, {pin}"
            )
    return problems


def check_toolchain() -> None:
    """RuntimeError naming every compiler that cannot work with this driver (majors ahead of it)."""
    versions = toolchain_versions()
    hard = [p for p in compatibility_problems(versions) if "always" in p or "needs a newer driver" in p]
    if hard:
        raise RuntimeError("the CUDA toolchain cannot work with this driver:\n  " + "\n  ".join(hard))
