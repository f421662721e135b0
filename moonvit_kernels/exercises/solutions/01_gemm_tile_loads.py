"""Solution of exercise "gemm_tile_loads" (notebook 01): GEMM v2's shared-memory tile loads."""

from moonvit_kernels.numba_backend._cuda import cuda, float32

TILE = 16


@cuda.jit
def gemm_tile_loads(A, B, C, M, N, K):
    a_tile = cuda.shared.array((TILE, TILE), float32)  # a_tile[r, kk] = A[m0 + r, k0 + kk]
    b_tile = cuda.shared.array((TILE, TILE + 1), float32)  # b_tile[r, kk] = B[n0 + r, k0 + kk], padded
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    m0 = cuda.blockIdx.y * TILE  # this block's first row of C
    n0 = cuda.blockIdx.x * TILE  # and first column
    acc = float32(0.0)
    for k0 in range(0, K, TILE):
        # consecutive tx read consecutive k: one contiguous row segment per half-warp (coalesced)
        a_tile[ty, tx] = A[m0 + ty, k0 + tx] if (m0 + ty < M and k0 + tx < K) else float32(0.0)
        b_tile[ty, tx] = B[n0 + ty, k0 + tx] if (n0 + ty < N and k0 + tx < K) else float32(0.0)
        cuda.syncthreads()
        for kk in range(TILE):
            acc += a_tile[ty, kk] * b_tile[tx, kk]
        cuda.syncthreads()
    m = m0 + ty
    n = n0 + tx
    if m < M and n < N:
        C[m, n] = acc
