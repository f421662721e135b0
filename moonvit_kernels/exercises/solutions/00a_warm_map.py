"""Solution of warm-up "warm_map" (notebook 00a): one thread per element."""

from moonvit_kernels.numba_backend._cuda import cuda


@cuda.jit
def warm_map(a, out, n):
    i = cuda.threadIdx.x  # one block, exactly n threads
    out[i] = 2 * a[i] + 1
