"""The numba kernels' GPU build, rehearsed without a GPU: `python -m moonvit_kernels.gpu_check.numba_build`.

On a GPU the numba kernels compile at their first launch: the launcher's `check_launch` first checks the
toolchain (`nvvm.require_nvvm`), then numba-cuda's dispatcher types the kernel, NVVM writes PTX, numba-cuda's
run-time linker (nvJitLink through cuda.core, `CUDACodeLibrary.get_cubin`) assembles it for the device and the
driver loads it; gpu_check's diagnostics then read each kernel's registers, local and shared memory through
the dispatchers (`binaries.numba_table`). Under `--simulate` the kernels run on numba's simulator, which does
none of that, so this module does it, with the simulator off (hence a process of its own):
`require_nvvm()`, then every numba entry of the registry compiled by its real dispatcher
(`Dispatcher.compile(signature)`) for sm_90, then `binaries.numba_table()` unchanged. Only what needs a device
is stood in for: the current device is an sm_90 (`driverless.driverless_target`), and loading the cubin
into a context (`CUDACodeLibrary.get_cufunc`) returns a function whose `attrs` (numba's FuncAttr: regs,
shared, local, const, maxthreads) are read from the cubin numba's own linker made (`xray.cubin`).

Prints one JSON line: {"toolchain": str | None, "error": str | None, "built": int, "table": str | None}.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

CC = (9, 0)


@contextlib.contextmanager
def cubin_functions(cc: tuple[int, int] = CC) -> Iterator[None]:
    """While active, numba-cuda's code libraries see a device of compute capability `cc` (its `_ensure_cc` then
    picks the target a GPU gets: sm_90a on an H200) and `CUDACodeLibrary.get_cufunc` links the kernel with
    numba-cuda's own linker, returning a stand-in function whose `attrs` come from that cubin, not a driver."""
    from numba.cuda import codegen
    from numba.cuda.cudadrv.driver import FuncAttr

    from moonvit_kernels.tools.xray.cubin import kernel_resources

    device = types.SimpleNamespace(compute_capability=cc, id=0)

    def get_cufunc(self: Any) -> Any:
        if self._entry_name is None:
            raise RuntimeError("Missing entry_name - are you trying to get the cufunc for a device function?")
        target = self._ensure_cc(None)
        cubin = self.get_cubin()
        arch = "sm_" + "".join(str(p) for p in target)
        found = kernel_resources(bytes(getattr(cubin, "code", cubin)), arch).get(self._entry_name)
        if found is None:
            raise RuntimeError(f"the cubin numba-cuda linked for {arch} has no kernel {self._entry_name}")
        attrs = FuncAttr(
            regs=found["registers"], shared=found["static_shared"], local=found["stack_bytes"], const=0,
            maxthreads=1024,
        )  # fmt: skip
        module = types.SimpleNamespace(initialized=True, setup=lambda: None)
        return types.SimpleNamespace(attrs=attrs, module=module, name=self._entry_name, arch=arch)

    saved = (codegen.devices.get_context, codegen.CUDACodeLibrary.get_cufunc)
    codegen.devices.get_context = lambda *a, **k: types.SimpleNamespace(device=device)
    codegen.CUDACodeLibrary.get_cufunc = get_cufunc
    try:
        yield
    finally:
        codegen.devices.get_context, codegen.CUDACodeLibrary.get_cufunc = saved


def build_all() -> dict[str, Any]:
    """The rehearsal (see the module docstring); never raises for a build problem: it is in `error`."""
    from moonvit_kernels.numba_backend import nvvm

    result: dict[str, Any] = {"toolchain": None, "error": None, "built": 0, "table": None}
    try:
        result["toolchain"] = nvvm.require_nvvm()
    except nvvm.NvvmUnavailable as e:
        result["error"] = str(e)
        return result
    from moonvit_kernels import registry
    from moonvit_kernels.numba_backend.driverless import driverless_target
    from moonvit_kernels.tools.gpu_check.binaries import numba_table

    failed = []
    with driverless_target(CC), cubin_functions(CC):
        for entry in registry.numba_entries():
            try:
                entry.dispatcher().compile(entry.numba_signature())
                result["built"] += 1
            except Exception as e:
                failed.append(f"{entry.label}: {type(e).__name__}: {str(e).strip().splitlines()[0][:200]}")
        result["table"] = numba_table()
    if failed:
        result["error"] = f"{len(failed)} numba kernels did not build: " + "; ".join(failed[:5])
    return result


def main() -> int:
    os.environ.pop("NUMBA_ENABLE_CUDASIM", None)  # numba is not imported yet in this process
    print(json.dumps(build_all()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
