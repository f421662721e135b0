"""Stand-ins for the Hopper launcher module that the pre-flight subprocess imports by name (`--hopper`).

    MOONVIT_STAND_IN=numpy     exact float64 NumPy versions of `gemm` and `attention` (bf16 bits in and out)
    MOONVIT_STAND_IN=planted   the Hopper emulator built from the kernel folder MOONVIT_PLANTED_KERNEL_DIR
                               (a copy of cuda_backend/ with a bug planted in it)

The tests of `cuda_backend.preflight` put this folder on PYTHONPATH and pass `--hopper hopper_stand_ins`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from moonvit_kernels.weights import bf16_bits_to_float32, float32_to_bf16_bits

if os.environ.get("MOONVIT_STAND_IN") == "planted":
    from moonvit_kernels.cuda_backend import sources

    sources.KERNEL_DIR = Path(os.environ["MOONVIT_PLANTED_KERNEL_DIR"])
    from moonvit_kernels.tools.emulation.hopper import array_module, attention, gemm  # noqa: F401
else:

    def array_module():
        return np

    def gemm(a, b, *, epilogue="none", residual=None, out=None, out_dtype="float32", block_n=128):
        x = bf16_bits_to_float32(a).astype(np.float64) @ bf16_bits_to_float32(b).astype(np.float64).T
        if epilogue == "gelu_tanh":
            x = 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
        dtype = out.dtype if out is not None else (np.float32 if out_dtype == "float32" else np.uint16)
        return x.astype(np.float32) if dtype == np.float32 else float32_to_bf16_bits(x.astype(np.float32))

    def attention(qkv, cu_seqlens, num_heads, head_dim, cu_seqlens_device=None):
        x = bf16_bits_to_float32(qkv).astype(np.float64)
        Q = num_heads * head_dim
        out, lse = np.zeros((x.shape[0], Q)), np.zeros((x.shape[0], num_heads), np.float32)
        cu = np.asarray(cu_seqlens)
        for s, e in zip(cu[:-1], cu[1:], strict=True):
            for h in range(num_heads):
                q, k, v = (x[s:e, j * Q + h * head_dim : j * Q + (h + 1) * head_dim] for j in range(3))
                z = q @ k.T / math.sqrt(head_dim)
                m = z.max(axis=1, keepdims=True)
                p = np.exp(z - m)
                out[s:e, h * head_dim : (h + 1) * head_dim] = (p @ v) / p.sum(axis=1, keepdims=True)
                lse[s:e, h] = (m + np.log(p.sum(axis=1, keepdims=True)))[:, 0]
        return float32_to_bf16_bits(out.astype(np.float32)), lse
