"""Run the CUDA C kernels on the CPU: a test tier for machines without a GPU.

The `.cu` files are compiled unchanged by the host C++ compiler (g++ >= 11, C++20) against
stand-ins for the CUDA pieces they use: `prelude.h` (threads, blocks, barriers, warp shuffles),
`ptx.cuh` (cp.async, ldmatrix, mma.sync, written from the PTX ISA's fragment tables),
`ptx_sm90.cuh` + `hopper.cuh` (wgmma, tensor copies, mbarrier, setmaxnreg) and `cuda_bf16.h`. Each
CUDA thread becomes a fiber, so only small sizes are practical (a few blocks), but every index,
bound, fragment layout, pipeline wait and softmax step of the real kernels runs and is compared with
the NumPy reference. What it cannot show: speed, registers, races the barriers do not order, and the
device's exact transcendental functions.
The stand-ins never read the real headers' inline PTX: `ptx_models.py` names the exact PTX each one
models, and tests/test_ptx_conformance.py holds the real asm statements to it (`ptx_conformance`).

The emulator is a *device* (`emulation.device`): an object with CuPy's interface that the real
launchers (`cuda_backend.launchers`, `hopper_launchers`) run on, argument marshalling, checks and
launch geometry included. `build.py` is its one build recipe. `run(launcher, ...)` runs any launcher
on it from NumPy (bf16 as uint16 bits), and `OnEmulator(module)` is a launcher module whose
functions all run that way (the checks of tests/cuda_kernel_checks.py take it for the GPU's).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from moonvit_kernels import registry
from moonvit_kernels.cuda_backend import sources as kcuda
from moonvit_kernels.tools.emulation import build, device
from moonvit_kernels.tools.emulation.build import compiler

HERE = Path(__file__).resolve().parent
HEAD_DIMS = tuple(range(8, kcuda.MAX_HEAD_DIM + 1, 8))  # attention head dims the kernels (and so the emulator) take


@functools.cache
def library() -> None:
    """Build (cached by source digest; `build.build_library`) and load every portable kernel module of the
    catalogue for the emulated device, as a GPU would compile them on first use."""
    if compiler() is None:
        raise RuntimeError("the CUDA C emulation needs a C++20 compiler (g++ >= 11); set CXX")
    for source, specs in kcuda.specs_by_source(registry.kernel_specs()).items():
        if source in kcuda.PORTABLE_SOURCES:
            build.build_module(kcuda.load_source(source), tuple(s.name for s in specs), False)


# ============================================================================ launchers from NumPy
def run(launcher: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`launcher(*args, **kwargs)` on the emulated device, from NumPy: each NumPy array argument is uploaded
    (once, however often it is passed), the launcher runs within `device.activated()`, array results come
    back as NumPy arrays (in tuples and lists too), and an argument the launcher changed in place is written
    back (a result that is an argument's device copy comes back as that argument)."""
    copies: dict[int, tuple[np.ndarray, device.ndarray]] = {}

    def up(a: Any) -> Any:
        if not isinstance(a, np.ndarray) or isinstance(a, device.ndarray):
            return a
        if id(a) not in copies:
            copies[id(a)] = (a, device.asarray(a))
        return copies[id(a)][1]

    with device.activated():
        got = launcher(*[up(a) for a in args], **{k: up(v) for k, v in kwargs.items()})
    for host, copy in copies.values():
        if host.tobytes() != copy.tobytes():
            host[...] = copy.view(np.ndarray)
    return _download(got, {id(copy): host for host, copy in copies.values()})


def _download(got: Any, hosts: dict[int, np.ndarray]) -> Any:
    """`got` with device arrays as NumPy: an argument's device copy as that argument (`hosts`, by the copy's id)."""
    if isinstance(got, (tuple, list)):
        return type(got)(_download(g, hosts) for g in got)
    if id(got) in hosts:
        return hosts[id(got)]
    return got.get() if isinstance(got, device.ndarray) else got


class OnEmulator:
    """Launcher module `module` (`launchers`, `hopper_launchers`) with every function run on the emulated device
    from NumPy (`run`): `OnEmulator(launchers).gemm(a, b)`. Its `array_module()` is NumPy."""

    def __init__(self, module: Any):
        self.module = module

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.module, name)
        return functools.partial(run, attr) if callable(attr) else attr

    def __dir__(self) -> list[str]:
        return sorted({*dir(self.module), "array_module", "module"})

    @staticmethod
    def array_module() -> Any:
        return np
