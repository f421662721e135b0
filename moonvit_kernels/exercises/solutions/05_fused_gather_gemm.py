"""Solution of exercise "fused_gather_gemm" (notebook 05): the projector GEMM gathers its A operand."""

from moonvit_kernels.numba_backend._cuda import cuda, float32


@cuda.jit
def fused_gather_gemm(x, B, C, t, h, w, D, N, kh, kw):
    n = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    m = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    M = (h // kh) * (w // kw)
    if m < M and n < N:
        i = m // (w // kw)
        j = m % (w // kw)
        acc = float32(0.0)
        for k in range(kh * kw * D):
            slot = k // D
            d = k % D
            patch = (kh * i + slot // kw) * w + (kw * j + slot % kw)
            a = float32(0.0)
            for f in range(t):  # the merged A[m, k], never written to memory
                a += x[f * h * w + patch, d]
            acc += (a / float32(t)) * B[n, k]
        C[m, n] = acc
