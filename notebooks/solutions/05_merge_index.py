"""Solution of exercise "merge_index" (notebook 05): the 2×2 patch merge gather, mean over frames."""

from moonvit_kernels.numba_backend._cuda import cuda, float32

KH, KW = 2, 2


@cuda.jit
def merge_index(x, out, t, h, w, D):
    m = cuda.blockIdx.x  # one block per merged token
    i = m // (w // KW)  # its place in the merged grid
    j = m % (w // KW)
    for col in range(cuda.threadIdx.x, KH * KW * D, cuda.blockDim.x):
        slot = col // D
        d = col % D
        patch = (KH * i + slot // KW) * w + (KW * j + slot % KW)
        acc = float32(0.0)
        for f in range(t):
            acc += x[f * h * w + patch, d]
        out[m, col] = acc / float32(t)
