"""Solution of exercise "gemm_naive" (notebook 01): one thread per output, C = A·Bᵀ."""

from moonvit_kernels.numba_backend._cuda import cuda, float32


@cuda.jit
def gemm_naive(A, B, C, M, N, K):
    n = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x  # threadIdx.x runs along the columns of C
    m = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    if m < M and n < N:  # the grid overshoots M and N: those threads do nothing
        acc = float32(0.0)
        for k in range(K):
            acc += A[m, k] * B[n, k]
        C[m, n] = acc
