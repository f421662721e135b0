"""Solution of warm-up "warm_map" (notebook 00a): one thread per element."""

from numba import cuda


@cuda.jit
def warm_map(a, out, n):
    i = cuda.threadIdx.x  # one block, exactly n threads
    out[i] = 2 * a[i] + 1
