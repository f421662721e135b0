"""Solution of exercise "gelu_tanh_epilogue" (notebook 06): GELU (tanh form) fused into the GEMM store."""

import math

from moonvit_kernels.numba_backend._cuda import cuda, float32

GELU_C = float32(math.sqrt(2.0 / math.pi))


@cuda.jit
def gelu_tanh_epilogue(A, B, C, M, N, K):
    n = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    m = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    if m < M and n < N:
        v = float32(0.0)
        for k in range(K):
            v += A[m, k] * B[n, k]
        C[m, n] = float32(0.5) * v * (float32(1.0) + math.tanh(GELU_C * (v + float32(0.044715) * v * v * v)))
