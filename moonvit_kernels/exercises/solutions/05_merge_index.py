"""Solution of exercise "merge_index" (notebook 05): the kh×kw patch merge gather, mean over frames."""

from moonvit_kernels.numba_backend._cuda import cuda, float32


@cuda.jit
def merge_index(x, out, t, h, w, D, kh, kw):
    m = cuda.blockIdx.x  # one block per merged token
    i = m // (w // kw)  # its place (i, j) in the (h/kh) × (w/kw) merged grid
    j = m % (w // kw)
    for col in range(cuda.threadIdx.x, kh * kw * D, cuda.blockDim.x):
        slot = col // D
        d = col % D
        a = slot // kw  # slots run row-major over the kh × kw block
        b = slot % kw
        patch = (kh * i + a) * w + (kw * j + b)
        acc = float32(0.0)
        for f in range(t):
            acc += x[f * h * w + patch, d]
        out[m, col] = acc / float32(t)
