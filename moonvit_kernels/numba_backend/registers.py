"""Registers per thread of every kernel the compile tier builds, per compiler, for `launch.check_launch`.

A block launches only if its warps' registers fit the SM's register file (65,536 32-bit registers on
sm_80, sm_89 and sm_90); the CUDA simulator cannot see this, so launchers check it on the host, with
the table of the compiler that built the kernels (`_cuda.COMPILER`).
The numbers are the largest ptxas reports over sm_80, sm_89 and sm_90 and over nvJitLink 13.0 (the target
tier: what a driver-580 machine has) and 13.5 (the main venv), for the kernel named by its specialised name.
Regenerate with

    MOONVIT_NUMBA_COMPILER=numba-cuda-mlir python -m moonvit_kernels.numba_backend.compile_check --json --arch sm_80
    (and sm_89, sm_90; `--compiler each` builds with every installed compiler)

A compile-tier test (tests/test_compile_numba.py; tests/target/ for numba-cuda-mlir) fails when a compiler
now reports more than its table for any kernel, or when a compiled kernel is missing from it. A number
is raised only with the reason written beside it. Specialisations not in the table (e.g. attention at
another head_dim) are assumed to use ASSUMED_REGISTERS, the most a thread can have.
"""

from __future__ import annotations

ASSUMED_REGISTERS = 255

_GEMM_EPILOGUES = ("none", "gelu_tanh", "gelu_erf", "residual")
_RMSNORM_THREADS = (32, 64, 128, 256)

KERNEL_REGISTERS: dict[str, dict[str, int]] = {
    # numba-cuda 0.30
    "numba-cuda": {
        # 48 -> 53 (sm_90): find_item's two-select update (which keeps numba-cuda-mlir out of local
        # memory) changes numba-cuda's allocation here; no spills, and 128 threads still fit 9 blocks per SM
        "attention_v1_hd128_t128": 53,
        "attention_v1_hd24_t128": 130,  # 129 -> 130: nvJitLink 13.0 on sm_89/sm_90 (13.5: 129)
        "attention_v2_hd128_q32_k16": 80,  # 72 -> 80: nvJitLink 13.0 on sm_80 (13.5: 72); no spills
        "attention_v2_hd24_q32_k16": 56,
        **{f"gemm_v1_{ep}": 30 for ep in _GEMM_EPILOGUES},
        **{f"gemm_v2_{ep}": 40 for ep in _GEMM_EPILOGUES},
        **{f"gemm_v3_{ep}": 96 for ep in _GEMM_EPILOGUES},
        "merge_gather_kernel": 60,
        "first_nonfinite_row_kernel": 30,
        "add_pos_emb_bilinear": 48,
        "add_pos_emb_bicubic": 80,
        **{f"rmsnorm_kernel_t{t}": 40 for t in _RMSNORM_THREADS},
        "rope2d_kernel": 36,
    },
    # numba-cuda-mlir 0.6 (first table). Above numba-cuda: gemm v1 (40 on sm_89: every index is multiplied
    # by the array's run-time stride, even on a `::1` axis, so the unrolled k-loop keeps a pointer per load),
    # merge, bilinear pos_emb (its own schedule; no spills). Below it: bicubic pos_emb, attention v2.
    "numba-cuda-mlir": {
        "attention_v1_hd128_t128": 49,
        "attention_v1_hd24_t128": 128,
        "attention_v2_hd128_q32_k16": 71,  # nvJitLink 13.0 on sm_80 (13.5: 64)
        "attention_v2_hd24_q32_k16": 56,
        **{f"gemm_v1_{ep}": 40 for ep in _GEMM_EPILOGUES},
        **{f"gemm_v2_{ep}": 40 for ep in _GEMM_EPILOGUES},
        **{f"gemm_v3_{ep}": 96 for ep in _GEMM_EPILOGUES},
        "merge_gather_kernel": 64,  # nvJitLink 13.0 on sm_80 (13.5: 63)
        "first_nonfinite_row_kernel": 30,
        "add_pos_emb_bilinear": 54,
        "add_pos_emb_bicubic": 62,
        **{f"rmsnorm_kernel_t{t}": 40 for t in _RMSNORM_THREADS},
        "rope2d_kernel": 34,
    },
}


def registers_for(compiler: str) -> dict[str, int]:
    """The register table of `compiler` (`numba-cuda` or `numba-cuda-mlir`)."""
    if compiler not in KERNEL_REGISTERS:
        raise ValueError(f"no register table for compiler {compiler!r}: expected one of {sorted(KERNEL_REGISTERS)}")
    return KERNEL_REGISTERS[compiler]
