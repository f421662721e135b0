"""Solution of exercise "rope_qkv_epilogue" (notebook 03): RoPE fused into the wqkv GEMM's epilogue."""

import math

from moonvit_kernels.numba_backend._cuda import cuda, float32

THETA = float32(10000.0)


@cuda.jit
def rope_qkv_epilogue(x, W, rows, cols, qkv, L, Din, heads, head_dim):
    p = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x  # output columns 2p and 2p + 1
    m = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y  # token
    Q = heads * head_dim
    if m < L and 2 * p < 3 * Q:
        c = 2 * p
        c0 = float32(0.0)
        c1 = float32(0.0)
        for k in range(Din):
            c0 += x[m, k] * W[c, k]
            c1 += x[m, k] * W[c + 1, k]
        if c < 2 * Q:  # q or k: rotate the pair before it is stored
            d = c % head_dim
            i = d // 4
            freq = float32(1.0) / THETA ** (float32(4 * i) / float32(head_dim))
            pos = cols[m] if d % 4 < 2 else rows[m]
            angle = float32(pos) * freq
            cs = math.cos(angle)
            sn = math.sin(angle)
            c0, c1 = c0 * cs - c1 * sn, c0 * sn + c1 * cs
        qkv[m, c] = c0
        qkv[m, c + 1] = c1
