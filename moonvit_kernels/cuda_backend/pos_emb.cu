// pos_emb.cu — x [L, D] += interpolated position grid (+ time sin/cos for videos), in place (docs/model.md §2).
//
// The learned grid pos_w [H0, W0, D] is resized to each item's (h, w) with F.interpolate
// (align_corners=False) semantics: source coordinate s = (d + 0.5)·(in/out) − 0.5;
//   bilinear (NT = 2 taps): s clamped at 0, taps floor(s) and floor(s)+1 clamped at in−1;
//   bicubic  (NT = 4 taps): A = −0.75, taps floor(s)−1 .. floor(s)+2 clamped into [0, in−1];
//   same size: the identity. Separable: rows (height) first, then columns, as the reference.
// Videos (t > 1) add time[f] (time_tab [T0, D], the 1-D sin/cos table) to frame f; images add nothing.
// token_pos [L, 4] int32 = (item, frame, row, col); grid_thws [N, 3] int32 = (t, h, w).
// One block per token, threads across D.
#include "common.cuh"

// Taps and weights of output index `dst` along an axis resized from in_size to out_size.
template <int NT>
__device__ __forceinline__ void interp_taps(int dst, int in_size, int out_size, int (&idx)[NT], float (&wt)[NT]) {
  if (in_size == out_size) {
#pragma unroll
    for (int k = 0; k < NT; ++k) idx[k] = dst, wt[k] = k == 0 ? 1.0f : 0.0f;
    return;
  }
  float s = (dst + 0.5f) * ((float)in_size / (float)out_size) - 0.5f;
  if (NT == 2) {
    s = fmaxf(s, 0.0f);
    const int i0 = min((int)floorf(s), in_size - 1);
    const float lam = s - (float)i0;
    idx[0] = i0, wt[0] = 1.0f - lam;
    idx[NT - 1] = min(i0 + 1, in_size - 1), wt[NT - 1] = lam;
  } else {
    const float A = -0.75f;
    const float fl = floorf(s), t = s - fl;
    const float x[4] = {t + 1.0f, t, 1.0f - t, 2.0f - t};  // distances to the 4 taps
#pragma unroll
    for (int k = 0; k < NT; ++k) {
      const float a = x[k];
      // |a| <= 1: ((A+2)a − (A+3))a² + 1;   1 < |a| < 2: ((A·a − 5A)a + 8A)a − 4A
      wt[k] = (k == 1 || k == 2) ? ((A + 2.0f) * a - (A + 3.0f)) * a * a + 1.0f
                                 : ((A * a - 5.0f * A) * a + 8.0f * A) * a - 4.0f * A;
      idx[k] = min(max((int)fl - 1 + k, 0), in_size - 1);
    }
  }
}

template <int NT>
__global__ void __launch_bounds__(256)
    add_pos_emb(float* x, const int* __restrict__ token_pos, const int* __restrict__ grid_thws,
                const float* __restrict__ pos_w, const float* __restrict__ time_tab, int D, int H0, int W0) {
  const size_t l = blockIdx.x;
  const int item = token_pos[l * 4], frame = token_pos[l * 4 + 1];
  const int row = token_pos[l * 4 + 2], col = token_pos[l * 4 + 3];
  const int t = grid_thws[item * 3], h = grid_thws[item * 3 + 1], w = grid_thws[item * 3 + 2];

  int ys[NT], xs[NT];
  float wy[NT], wx[NT];
  interp_taps<NT>(row, H0, h, ys, wy);
  interp_taps<NT>(col, W0, w, xs, wx);

  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float v = 0.0f;
#pragma unroll
    for (int b = 0; b < NT; ++b) {
      float column = 0.0f;  // Σ over source rows first, as the reference's einsum order
#pragma unroll
      for (int a = 0; a < NT; ++a) column += wy[a] * pos_w[((size_t)ys[a] * W0 + xs[b]) * D + d];
      v += wx[b] * column;
    }
    if (t > 1) v += time_tab[(size_t)frame * D + d];
    x[l * D + d] += v;
  }
}
