"""Solution of exercise "pos_emb_bilinear" (notebook 06): F.interpolate(bilinear, align_corners=False)."""

import math

from moonvit_kernels.numba_backend._cuda import cuda, float32


@cuda.jit
def pos_emb_bilinear(grid, out, h, w):
    patch = cuda.blockIdx.x  # one block per output patch
    r = patch // w
    c = patch % w
    H0 = grid.shape[0]
    W0 = grid.shape[1]
    sy = max((float32(r) + float32(0.5)) * float32(H0) / float32(h) - float32(0.5), float32(0.0))
    sx = max((float32(c) + float32(0.5)) * float32(W0) / float32(w) - float32(0.5), float32(0.0))
    y0 = min(int(math.floor(sy)), H0 - 1)
    x0 = min(int(math.floor(sx)), W0 - 1)
    y1 = min(y0 + 1, H0 - 1)
    x1 = min(x0 + 1, W0 - 1)
    ly = sy - float32(y0)
    lx = sx - float32(x0)
    for d in range(cuda.threadIdx.x, grid.shape[2], cuda.blockDim.x):
        top = (float32(1.0) - lx) * grid[y0, x0, d] + lx * grid[y0, x1, d]
        bottom = (float32(1.0) - lx) * grid[y1, x0, d] + lx * grid[y1, x1, d]
        out[patch, d] = (float32(1.0) - ly) * top + ly * bottom
