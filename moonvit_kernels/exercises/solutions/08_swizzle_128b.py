"""Solution of exercise "swizzle_128b" (notebook 08): the 128-byte swizzle of a K-major bf16 tile."""

from moonvit_kernels.numba_backend._cuda import cuda


@cuda.jit
def swizzle_128b(base, out):
    r = cuda.grid(1)  # one thread per tile row
    if r >= out.shape[0]:
        return
    for k in range(64):
        byte = 2 * k  # bf16: two bytes per element
        chunk = byte // 16
        out[r, k] = base + 128 * r + 16 * (chunk ^ (r % 8)) + byte % 16
