// rmsnorm.cu — y = x · rsqrt(mean(x²) + eps) · w over each row of x [rows, D], in fp32 (docs/model.md §3).
//
// One block of 256 threads per row: a block-wide sum of squares (warp shuffles, then one value per
// warp through shared memory), then a second pass that scales and stores. Also writes the per-row
// rstd [rows] (a side output the tests check). Input and output types are template arguments
// (fp32 residual stream in, bf16 GEMM operand out, ...); y may alias x when the types match.
// When D % 4 == 0 the rows are read and written four elements per access.
#include "common.cuh"

template <typename InT, typename OutT>
__global__ void __launch_bounds__(256)
    rmsnorm_rows(const InT* x, const float* __restrict__ w, OutT* y, float* __restrict__ rstd, int D, float eps) {
  const size_t row = blockIdx.x;
  const InT* xr = x + row * D;
  OutT* yr = y + row * D;
  const bool vec = D % 4 == 0;

  float ss = 0.0f;
  if (vec) {
    for (int i = 4 * threadIdx.x; i < D; i += 4 * blockDim.x) {
      const float4 v = load_float4(xr + i);
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
      const float v = to_float(xr[i]);
      ss += v * v;
    }
  }
  const float r = rsqrtf(block_sum(ss) / D + eps);
  if (threadIdx.x == 0) rstd[row] = r;

  if (vec) {
    for (int i = 4 * threadIdx.x; i < D; i += 4 * blockDim.x) {
      const float4 v = load_float4(xr + i);
      const float4 g = load_float4(w + i);
      store_float4(yr + i, make_float4(v.x * r * g.x, v.y * r * g.y, v.z * r * g.z, v.w * r * g.w));
    }
  } else {
    for (int i = threadIdx.x; i < D; i += blockDim.x) store_float(yr + i, to_float(xr[i]) * r * w[i]);
  }
}
