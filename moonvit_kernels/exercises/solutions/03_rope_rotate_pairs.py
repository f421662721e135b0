"""Solution of exercise "rope_rotate_pairs" (notebook 03): the 2D RoPE rotation of one head."""

import math

from moonvit_kernels.numba_backend._cuda import cuda, float32

THETA = float32(10000.0)


@cuda.jit
def rope_rotate_pairs(x, rows, cols, out, head_dim):
    l = cuda.blockIdx.x  # one block per token
    i = cuda.threadIdx.x  # one thread per quad (4i, 4i+1, 4i+2, 4i+3)
    freq = float32(1.0) / THETA ** (float32(4 * i) / float32(head_dim))
    for pair in range(2):
        angle = float32(cols[l] if pair == 0 else rows[l]) * freq  # width pair first, then height
        c = math.cos(angle)
        s = math.sin(angle)
        j = 4 * i + 2 * pair
        a = x[l, j]
        b = x[l, j + 1]
        out[l, j] = a * c - b * s
        out[l, j + 1] = a * s + b * c
