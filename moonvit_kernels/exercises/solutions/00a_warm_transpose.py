"""Solution of warm-up "warm_transpose" (notebook 00a): coalesced both ways through a padded shared tile."""

from moonvit_kernels.numba_backend._cuda import cuda, float32

TILE, ROWS = 32, 8


@cuda.jit
def warm_transpose(a, out, rows, cols):
    tile = cuda.shared.array((TILE, TILE + 1), float32)  # +1: a column of the tile spans all 32 banks
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    r0 = cuda.blockIdx.y * TILE
    c0 = cuda.blockIdx.x * TILE
    for j in range(0, TILE, ROWS):  # read a row by row: lanes tx along the contiguous columns
        if r0 + ty + j < rows and c0 + tx < cols:
            tile[ty + j, tx] = a[r0 + ty + j, c0 + tx]
    cuda.syncthreads()
    for j in range(0, TILE, ROWS):  # write out row by row: lanes tx along out's contiguous columns
        if c0 + ty + j < cols and r0 + tx < rows:
            out[c0 + ty + j, r0 + tx] = tile[tx, ty + j]
