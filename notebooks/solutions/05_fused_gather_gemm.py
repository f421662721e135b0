"""Solution of exercise "fused_gather_gemm" (notebook 05): the projector GEMM gathers its A operand."""

from moonvit_kernels.numba_backend._cuda import cuda, float32

KH, KW = 2, 2


@cuda.jit
def fused_gather_gemm(x, B, C, t, h, w, D, N):
    n = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    m = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    M = (h // KH) * (w // KW)
    if m < M and n < N:
        i = m // (w // KW)
        j = m % (w // KW)
        acc = float32(0.0)
        for k in range(KH * KW * D):
            slot = k // D
            d = k % D
            patch = (KH * i + slot // KW) * w + (KW * j + slot % KW)
            a = float32(0.0)
            for f in range(t):  # the merged A[m, k], never written to memory
                a += x[f * h * w + patch, d]
            acc += (a / float32(t)) * B[n, k]
        C[m, n] = acc
