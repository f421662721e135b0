"""Solution of exercise "rmsnorm_reduction" (notebook 02): the shared-memory tree reduction."""

import math

from moonvit_kernels.numba_backend._cuda import cuda, float32

THREADS = 32


@cuda.jit
def rmsnorm_reduction(x, weight, out, rows, cols, eps):
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    partial = cuda.shared.array(THREADS, float32)
    acc = float32(0.0)
    for j in range(tid, cols, THREADS):
        v = x[row, j]
        acc += v * v
    partial[tid] = acc
    cuda.syncthreads()
    stride = THREADS // 2
    while stride > 0:
        if tid < stride:
            partial[tid] += partial[tid + stride]
        cuda.syncthreads()  # outside the if: every thread of the block must reach it
        stride //= 2
    r = float32(1.0) / math.sqrt(partial[0] / float32(cols) + eps)
    for j in range(tid, cols, THREADS):
        out[row, j] = x[row, j] * r * weight[j]
