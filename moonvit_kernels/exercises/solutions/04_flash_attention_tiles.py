"""Solution of exercise "flash_attention_tiles" (notebook 04): attention v2's tiled loop, online softmax."""

import math

from moonvit_kernels.numba_backend._cuda import cuda, float32

HD, BQ, BK = 8, 4, 8  # head dim; query rows and keys per tile (BK == HD: thread tx also owns output dim tx)


@cuda.jit
def flash_attention_tiles(q, k, v, cu_seqlens, tiles, out, scale):
    q_s = cuda.shared.array((BQ, HD), float32)  # the query tile, pre-scaled
    k_s = cuda.shared.array((BK, HD), float32)  # the current key tile
    v_s = cuda.shared.array((BK, HD), float32)  # and its values
    s_s = cuda.shared.array((BQ, BK), float32)  # scores of the tile
    p_s = cuda.shared.array((BQ, BK), float32)  # their exp-weights
    tx = cuda.threadIdx.x  # key tx of the key tile; output dim tx
    ty = cuda.threadIdx.y  # query row ty of the tile
    item = tiles[cuda.blockIdx.x, 0]
    row = tiles[cuda.blockIdx.x, 1] + ty
    kv_start = cu_seqlens[item]
    kv_end = cu_seqlens[item + 1]
    m_i = float32(-math.inf)  # running max of row ty's scores
    l_i = float32(0.0)  # running Σ exp(s − m_i)
    acc = float32(0.0)  # running Σ exp(s − m_i)·v[:, tx]

    q_s[ty, tx] = q[row, tx] * scale if row < kv_end else float32(0.0)
    for k0 in range(kv_start, kv_end, BK):
        cuda.syncthreads()  # q_s is loaded; the previous tile's k_s, v_s, p_s are no longer read
        for r in range(ty, BK, BQ):  # rows ty and ty + 4 of the key and value tiles
            key = k0 + r
            k_s[r, tx] = k[key, tx] if key < kv_end else float32(0.0)
            v_s[r, tx] = v[key, tx] if key < kv_end else float32(0.0)
        cuda.syncthreads()
        s = float32(0.0)
        for d in range(HD):
            s += q_s[ty, d] * k_s[tx, d]
        if k0 + tx >= kv_end:  # past the item's end: no weight at all
            s = float32(-math.inf)
        s_s[ty, tx] = s
        cuda.syncthreads()
        m_new = m_i
        for j in range(BK):
            m_new = max(m_new, s_s[ty, j])
        p_s[ty, tx] = math.exp(s - m_new)
        alpha = math.exp(m_i - m_new)  # 0 on the first tile (m_i = −inf), 1 when the max did not grow
        cuda.syncthreads()
        row_sum = float32(0.0)
        pv = float32(0.0)
        for j in range(BK):
            p = p_s[ty, j]
            row_sum += p
            pv += p * v_s[j, tx]
        l_i = l_i * alpha + row_sum
        acc = acc * alpha + pv
        m_i = m_new
    if row < kv_end:
        out[row, tx] = acc / l_i
