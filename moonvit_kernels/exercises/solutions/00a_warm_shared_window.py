"""Solution of warm-up "warm_shared_window" (notebook 00a): a 3-point window through shared memory."""

from moonvit_kernels.numba_backend._cuda import cuda, float32

THREADS = 16


@cuda.jit
def warm_shared_window(a, out, n):
    tile = cuda.shared.array(THREADS + 2, float32)  # tile[t + 1] = a[i]; tile[0], tile[THREADS + 1]: the halo
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * THREADS + t
    tile[t + 1] = a[i] if i < n else float32(0.0)
    if t == 0:
        tile[0] = a[i - 1] if i > 0 else float32(0.0)
    if t == THREADS - 1:
        tile[THREADS + 1] = a[i + 1] if i + 1 < n else float32(0.0)
    cuda.syncthreads()  # every load of the block is done before anyone reads a neighbour's
    if i < n:
        out[i] = tile[t] + tile[t + 1] + tile[t + 2]
