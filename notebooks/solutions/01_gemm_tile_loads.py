"""Solution of exercise "gemm_tile_loads" (notebook 01): GEMM v2's shared-memory tile loads."""

from moonvit_kernels.numba_backend._cuda import cuda, float32

TILE = 16


@cuda.jit
def gemm_tile_loads(A, B, C, M, N, K):
    a_tile = cuda.shared.array((TILE, TILE), float32)  # a_tile[r, kk] = A[m0 + r, k0 + kk]
    b_tile = cuda.shared.array((TILE, TILE + 1), float32)  # b_tile[r, kk] = B[n0 + r, k0 + kk], padded
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    m = cuda.blockIdx.y * TILE + ty
    n = cuda.blockIdx.x * TILE + tx
    n_load = cuda.blockIdx.x * TILE + ty  # the row of B this thread stages
    acc = float32(0.0)
    for k0 in range(0, K, TILE):
        k = k0 + tx  # consecutive tx read consecutive k: one coalesced row segment per warp
        a_tile[ty, tx] = A[m, k] if (m < M and k < K) else float32(0.0)
        b_tile[ty, tx] = B[n_load, k] if (n_load < N and k < K) else float32(0.0)
        cuda.syncthreads()
        for kk in range(TILE):
            acc += a_tile[ty, kk] * b_tile[tx, kk]
        cuda.syncthreads()
    if m < M and n < N:
        C[m, n] = acc
