"""Solution of warm-up "warm_guard" (notebook 00a): a global index and a bounds test."""

from moonvit_kernels.numba_backend._cuda import cuda


@cuda.jit
def warm_guard(a, b, out, n):
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x  # the thread's place in the whole grid
    if i < n:  # the grid overshoots n: the extra threads do nothing
        out[i] = a[i] + b[i]
