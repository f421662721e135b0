"""Solution of exercise "gemm_register_tile" (notebook 01): a 2×2 register tile per thread."""

from moonvit_kernels.numba_backend._cuda import cuda, float32

TILE, TM, TN = 16, 2, 2  # 16×16 threads, each owning TM×TN outputs: 32×32 per block


@cuda.jit
def gemm_register_tile(A, B, C, M, N, K):
    a_tile = cuda.shared.array((TM * TILE, TILE), float32)  # a_tile[r, kk] = A[m0 + r, k0 + kk]
    b_tile = cuda.shared.array((TN * TILE, TILE + 1), float32)  # b_tile[r, kk] = B[n0 + r, k0 + kk]
    acc = cuda.local.array((TM, TN), float32)
    a_reg = cuda.local.array(TM, float32)
    b_reg = cuda.local.array(TN, float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    m0 = cuda.blockIdx.y * TM * TILE
    n0 = cuda.blockIdx.x * TN * TILE
    for i in range(TM):
        for j in range(TN):
            acc[i, j] = float32(0.0)
    for k0 in range(0, K, TILE):
        k = k0 + tx
        for s in range(TM):  # each thread stages TM rows of A and TN rows of B
            r = ty + s * TILE
            a_tile[r, tx] = A[m0 + r, k] if (m0 + r < M and k < K) else float32(0.0)
        for s in range(TN):
            r = ty + s * TILE
            b_tile[r, tx] = B[n0 + r, k] if (n0 + r < N and k < K) else float32(0.0)
        cuda.syncthreads()
        for kk in range(TILE):
            for i in range(TM):
                a_reg[i] = a_tile[ty * TM + i, kk]
            for j in range(TN):
                b_reg[j] = b_tile[tx * TN + j, kk]
            for i in range(TM):
                for j in range(TN):
                    acc[i, j] += a_reg[i] * b_reg[j]
        cuda.syncthreads()
    for i in range(TM):
        for j in range(TN):
            m = m0 + ty * TM + i
            n = n0 + tx * TN + j
            if m < M and n < N:
                C[m, n] = acc[i, j]
