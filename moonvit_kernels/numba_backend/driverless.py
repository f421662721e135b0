"""Building numba kernels for a GPU that is not here: the compile tier's, the toolchain check's and gpu_check's
numba build rehearsal's common steps.

`driverless_target(cc)` lets the compiler in use build for `sm_{cc}` with no driver; `link(ptx, arch)` assembles
PTX to a cubin with nvJitLink and returns its verbose (ptxas -v) log; `ptx_isa(ptx)` reads the PTX ISA a text
declares.
"""

from __future__ import annotations

import contextlib
import re
import types
from collections.abc import Iterator


@contextlib.contextmanager
def driverless_target(cc: tuple[int, int]) -> Iterator[None]:
    """Let the compiler in use (`_cuda.COMPILER`) build for `sm_{cc}` with no CUDA driver present.

    numba-cuda 0.30 compiles a `@cuda.jit(device=True)` callee for "the current device"
    (`dispatcher.get_current_device().compute_capability`) even inside `compile_ptx(..., cc=...)`.
    numba-cuda-mlir 0.6 asks the driver for the current device's compute capability in every compile
    (`tools.resolve_gpu_target`, to pick the linker's architecture), even with `cc=` given; it caches
    the answer in `tools._cached_cc`, which is set to `cc` here. Both lookups need a driver and have no
    public switch (worth an upstream issue); here they answer the target architecture instead.
    """
    from ._cuda import COMPILER
    from .compilers import NUMBA_CUDA_MLIR

    if COMPILER == NUMBA_CUDA_MLIR:
        from numba_cuda_mlir import tools

        original = tools._cached_cc
        tools._cached_cc = cc
        try:
            yield
        finally:
            tools._cached_cc = original
        return

    from numba.cuda import dispatcher

    original = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=cc)
    try:
        yield
    finally:
        dispatcher.get_current_device = original


def link(ptx: str, arch: str = "sm_90") -> tuple[bytes, str]:
    """Assemble PTX to SASS for `arch` with nvJitLink: `(cubin bytes, verbose info log)`."""
    from cuda.bindings import nvjitlink

    handle = nvjitlink.create(2, [f"-arch={arch}".encode(), b"-verbose"])
    try:
        data = ptx.encode()
        try:
            nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "kernel.ptx")
            nvjitlink.complete(handle)
        except nvjitlink.nvJitLinkError as e:
            size = nvjitlink.get_error_log_size(handle)
            log = bytearray(size)
            nvjitlink.get_error_log(handle, log)
            raise RuntimeError(f"nvJitLink: {e}: {log.decode(errors='replace').strip(chr(0)).strip()}") from None
        size = nvjitlink.get_info_log_size(handle)
        log = bytearray(size)
        nvjitlink.get_info_log(handle, log)
        cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, cubin)
        return bytes(cubin), log.decode(errors="replace").rstrip("\0")
    finally:
        nvjitlink.destroy(handle)


def ptx_isa(ptx: str) -> str | None:
    """The PTX ISA version a PTX text declares (`.version 9.0` -> `"9.0"`), None without one."""
    found = re.search(r"^\s*\.version\s+(\d+\.\d+)", ptx, re.MULTILINE)
    return found.group(1) if found else None
