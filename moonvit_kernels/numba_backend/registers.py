"""Registers per thread of every kernel the compile tier builds, for the launch checks (`launch.check_launch`).

A block launches only if its warps' registers fit the SM's register file (65,536 32-bit registers on
sm_80, sm_89 and sm_90); the CUDA simulator cannot see this, so launchers check it on the host.
The numbers are the largest ptxas reports over sm_80, sm_89 and sm_90 (numba-cuda 0.30, nvJitLink 13)
for the kernel named by its specialised name. Regenerate with

    python -m moonvit_kernels.numba_backend.compile_check --json --arch sm_80   (and sm_89, sm_90)

A compile-tier test (tests/test_compile_numba.py) fails when the compiler now reports more than this
table for any kernel, or when a compiled kernel is missing from it. Specialisations not in the table
(e.g. attention at another head_dim) are assumed to use ASSUMED_REGISTERS, the most a thread can have.
"""

from __future__ import annotations

ASSUMED_REGISTERS = 255

KERNEL_REGISTERS = {
    "attention_v1_hd128_t128": 48,
    "attention_v1_hd24_t128": 129,
    "attention_v2_hd128_q32_k16": 72,
    "attention_v2_hd24_q32_k16": 56,
    **{f"gemm_v1_{ep}": 30 for ep in ("none", "gelu_tanh", "gelu_erf", "residual")},
    **{f"gemm_v2_{ep}": 40 for ep in ("none", "gelu_tanh", "gelu_erf", "residual")},
    **{f"gemm_v3_{ep}": 96 for ep in ("none", "gelu_tanh", "gelu_erf", "residual")},
    "merge_gather_kernel": 60,
    "first_nonfinite_row_kernel": 30,
    "add_pos_emb_bilinear": 48,
    "add_pos_emb_bicubic": 80,
    **{f"rmsnorm_kernel_t{t}": 40 for t in (32, 64, 128, 256)},
    "rope2d_kernel": 36,
}
