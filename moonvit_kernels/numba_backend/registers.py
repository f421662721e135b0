"""Registers per thread of every kernel the compile tier builds, per compiler, for `launch.check_launch`.

A block launches only if its warps' registers fit the SM's register file (65,536 32-bit registers on
sm_80, sm_89 and sm_90); the CUDA simulator cannot see this, so launchers check it on the host, with
the table of the compiler that built the kernels (`_cuda.COMPILER`).
The numbers live beside each numba kernel's entry in `moonvit_kernels.registry` (`KernelEntry.registers`,
with the reason for every raised number and how to regenerate them); this module reads them from there.
A compile-tier test (tests/test_compile_numba.py; tests/target/ for numba-cuda-mlir) fails when a compiler
now reports more than its table for any kernel, or when a compiled kernel is missing from it.
Specialisations not in the table (e.g. attention at another head_dim) are assumed to use ASSUMED_REGISTERS,
the most a thread can have.
"""

from __future__ import annotations

from typing import Any

ASSUMED_REGISTERS = 255


def registers_for(compiler: str) -> dict[str, int]:
    """The register table of `compiler` (`numba-cuda` or `numba-cuda-mlir`): {kernel label: registers}."""
    from .. import registry

    return registry.register_table(compiler)


def __getattr__(name: str) -> Any:
    """`KERNEL_REGISTERS`: {compiler: registers_for(compiler)}, read from the registry when asked."""
    if name == "KERNEL_REGISTERS":
        from .. import registry

        return {c: registers_for(c) for c in registry.COMPILERS}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
