"""Solution of warm-up "warm_scan" (notebook 00a): Hillis–Steele inclusive scan inside a block."""

from moonvit_kernels.numba_backend._cuda import cuda, float32

THREADS = 32


@cuda.jit
def warm_scan(a, out, n):
    buf = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * THREADS + t
    buf[t] = a[i] if i < n else float32(0.0)
    d = 1
    while d < THREADS:
        cuda.syncthreads()  # the previous step's writes are visible
        v = buf[t - d] if t >= d else float32(0.0)
        cuda.syncthreads()  # every thread has read before anyone writes
        buf[t] += v
        d *= 2
    if i < n:
        out[i] = buf[t]
