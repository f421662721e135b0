"""Solution of warm-up "warm_broadcast_2d" (notebook 00a): an outer product over 2-D blocks."""

from moonvit_kernels.numba_backend._cuda import cuda


@cuda.jit
def warm_broadcast_2d(a, b, out, rows, cols):
    c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x  # x runs along the columns
    r = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    if r < rows and c < cols:
        out[r, c] = a[r] * b[c]
