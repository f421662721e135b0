// rope.cu — 2D rotary position embedding, in place on the packed qkv [L, 3Q] (docs/model.md §4).
//
// Element (token l, slot s ∈ {q, k}, head h, dim d) sits at l·3Q + s·Q + h·hd + d; v (s = 2) is
// untouched. Per head, dims (4i, 4i+1) turn by col·f_i and dims (4i+2, 4i+3) by row·f_i, as
// interleaved complex pairs (a, b) -> (a·cos − b·sin, a·sin + b·cos) — NOT rotate-half.
// f_i = 10000^(−4i/hd) comes precomputed in fp32 (freqs [hd/4]); angles, sin/cos and the rotation
// are fp32. token_pos [L, 4] int32 = (item, frame, row, col) of each token's patch: every frame of a
// video reuses the same (row, col). One thread per group of 4 dims (one i), loaded as one vector.
#include "common.cuh"

template <typename T>
__global__ void __launch_bounds__(256)
    rope_2d_inplace(T* qkv, const int* __restrict__ token_pos, const float* __restrict__ freqs, int L, int H, int hd) {
  const int quarter = hd / 4;
  const long long total = (long long)L * 2 * H * quarter;
  const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (id >= total) return;
  const int i = id % quarter;
  long long rest = id / quarter;
  const int head = rest % H;
  rest /= H;
  const int s = rest % 2;  // 0: q, 1: k
  const long long l = rest / 2;

  const float f = freqs[i];
  const float row = (float)token_pos[l * 4 + 2], col = (float)token_pos[l * 4 + 3];
  float sin_w, cos_w, sin_h, cos_h;
  sincosf(col * f, &sin_w, &cos_w);  // width pair (4i, 4i+1)
  sincosf(row * f, &sin_h, &cos_h);  // height pair (4i+2, 4i+3)

  const int Q = H * hd;
  T* p = qkv + l * 3 * Q + s * Q + head * hd + 4 * i;
  const float4 x = load_float4(p);
  store_float4(p, make_float4(x.x * cos_w - x.y * sin_w, x.x * sin_w + x.y * cos_w, x.z * cos_h - x.w * sin_h,
                              x.z * sin_h + x.w * cos_h));
}
