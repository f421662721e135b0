// merge.cu — tpool_patch_merger (docs/model.md §6): mean over frames + kh x kw gather, flattened for the
// projector: out [M, kh·kw·D], merged token m, slot a·kw + b, dim d at m·(kh·kw·D) + (a·kw + b)·D + d.
//
// merge_src [M, 4] int32 = (base, t, frame_stride, w): slot (a, b) of merged token m reads tokens
// base + f·frame_stride + a·w + b for frames f < t, where base is the token of slot (0, 0) in
// frame 0 (= item start + kh·i·w + kw·j for merged position (i, j)) and frame_stride = h·w.
// The mean is a fp32 sum divided by t. One block per merged token.
#include "common.cuh"

template <typename InT, typename OutT>
__global__ void __launch_bounds__(256)
    tpool_merge(const InT* __restrict__ x, OutT* __restrict__ out, const int* __restrict__ merge_src, int D, int kh,
                int kw) {
  const size_t m = blockIdx.x;
  const int base = merge_src[m * 4], t = merge_src[m * 4 + 1];
  const int frame_stride = merge_src[m * 4 + 2], w = merge_src[m * 4 + 3];
  const int width = kh * kw * D;
  for (int e = threadIdx.x; e < width; e += blockDim.x) {
    const int slot = e / D, d = e % D;
    const int src = base + (slot / kw) * w + (slot % kw);
    float sum = 0.0f;
    for (int f = 0; f < t; ++f) sum += to_float(x[(size_t)(src + f * frame_stride) * D + d]);
    store_float(out + m * width + e, sum / (float)t);
  }
}
