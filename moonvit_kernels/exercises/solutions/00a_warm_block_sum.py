"""Solution of warm-up "warm_block_sum" (notebook 00a): a tree reduction in shared memory."""

from moonvit_kernels.numba_backend._cuda import cuda, float32

THREADS = 32


@cuda.jit
def warm_block_sum(a, out, n):
    partial = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    base = cuda.blockIdx.x * 2 * THREADS
    x0 = a[base + t] if base + t < n else float32(0.0)
    x1 = a[base + THREADS + t] if base + THREADS + t < n else float32(0.0)
    partial[t] = x0 + x1
    stride = THREADS // 2
    while stride > 0:
        cuda.syncthreads()  # outside the if: every thread of the block reaches it
        if t < stride:
            partial[t] += partial[t + stride]
        stride //= 2
    if t == 0:
        out[cuda.blockIdx.x] = partial[0]
