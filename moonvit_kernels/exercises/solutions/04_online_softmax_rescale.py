"""Solution of exercise "online_softmax_rescale" (notebook 04): one pass, rescaling the running sums."""

import math

from moonvit_kernels.numba_backend._cuda import cuda, float32

HD = 16


@cuda.jit
def online_softmax_rescale(q, k, v, out, L, scale):
    i = cuda.grid(1)
    if i >= L:
        return
    acc = cuda.local.array(HD, float32)
    for d in range(HD):
        acc[d] = float32(0.0)
    m = float32(-math.inf)
    l = float32(0.0)
    for j in range(L):
        s = float32(0.0)
        for d in range(HD):
            s += q[i, d] * k[j, d]
        s *= scale
        m_new = max(m, s)
        alpha = math.exp(m - m_new)  # 0 on the first key (m = −inf), 1 when the maximum did not grow
        p = math.exp(s - m_new)
        l = l * alpha + p
        for d in range(HD):
            acc[d] = acc[d] * alpha + p * v[j, d]
        m = m_new
    for d in range(HD):
        out[i, d] = acc[d] / l
