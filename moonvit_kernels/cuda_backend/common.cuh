// common.cuh — plain C++ device helpers shared by the kernels: types, conversions, GELUs,
// warp and block reductions. No inline PTX here (that lives in ptx.cuh).
#pragma once
#include <cuda_bf16.h>

typedef __nv_bfloat16 bf16;

// Epilogues the GEMMs fuse into their stores (the launcher passes the number as a template argument).
#define EPI_NONE 0       // C = A·Bᵀ
#define EPI_GELU_TANH 1  // C = gelu_tanh(A·Bᵀ)   (encoder MLP, docs/model.md §3)
#define EPI_GELU_ERF 2   // C = gelu_erf(A·Bᵀ)    (projector, docs/model.md §7)
#define EPI_RESIDUAL 3   // C = R + A·Bᵀ          (R may be C itself: x += o·woᵀ)

#define FULL_MASK 0xffffffffu
#define LN2_F 0.69314718055994531f
#define NEG_INF_F (-__int_as_float(0x7f800000))

// ---------------------------------------------------------------- conversions
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) { return __bfloat162float(v); }

__device__ __forceinline__ void store_float(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_float(bf16* p, float v) { *p = __float2bfloat16_rn(v); }

// Two consecutive elements p[0], p[1] (p must be 8-byte aligned for float, 4-byte for bf16).
__device__ __forceinline__ float2 load_float2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float2 load_float2(const bf16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}
__device__ __forceinline__ void store_float2(float* p, float a, float b) {
  *reinterpret_cast<float2*>(p) = make_float2(a, b);
}
__device__ __forceinline__ void store_float2(bf16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}

// Four consecutive elements p[0..3] (p must be 16-byte aligned for float, 8-byte for bf16).
__device__ __forceinline__ float4 load_float4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 load_float4(const bf16* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ __forceinline__ void store_float4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ void store_float4(bf16* p, float4 v) {
  __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);
  __nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
  uint2 raw;
  raw.x = *reinterpret_cast<unsigned*>(&lo);
  raw.y = *reinterpret_cast<unsigned*>(&hi);
  *reinterpret_cast<uint2*>(p) = raw;
}

// Two floats rounded to bf16 and packed into one 32-bit register: `lo` in bits 0..15
// (the element with the smaller column index, as mma.sync fragments expect).
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&v);
}

// ---------------------------------------------------------------- activations (fp32 maths)
// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
__device__ __forceinline__ float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // √(2/π)
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}
// 0.5·x·(1 + erf(x/√2))
__device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f)); }

template <int EPI>
__device__ __forceinline__ float activate(float v) {
  if (EPI == EPI_GELU_TANH) return gelu_tanh(v);
  if (EPI == EPI_GELU_ERF) return gelu_erf(v);
  return v;
}

// A GEMM's fused epilogue on outputs (row, col) and (row, col + 1) of C [M, N], then their store (col even): the
// mma.sync and the wgmma GEMMs both hold accumulator pairs of adjacent columns.
template <typename OutT, int EPI>
__device__ __forceinline__ void gemm_store_pair(OutT* C, const OutT* R, int row, int col, int N, float v0, float v1) {
  const size_t i = (size_t)row * N + col;
  if ((N % 2 == 0) && col + 1 < N) {  // even N: the pair is 2-element aligned
    if (EPI == EPI_RESIDUAL) {
      const float2 r = load_float2(R + i);
      v0 += r.x;
      v1 += r.y;
    }
    store_float2(C + i, activate<EPI>(v0), activate<EPI>(v1));
    return;
  }
  if (col < N) store_float(C + i, EPI == EPI_RESIDUAL ? v0 + to_float(R[i]) : activate<EPI>(v0));
  if (col + 1 < N) store_float(C + i + 1, EPI == EPI_RESIDUAL ? v1 + to_float(R[i + 1]) : activate<EPI>(v1));
}

// ---------------------------------------------------------------- reductions
// region: reductions
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, off));
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  v = warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < nwarps ? partial[lane] : 0.0f;
  v = warp_sum(v);
  __syncthreads();  // `partial` may be reused by a later call
  return v;
}
// endregion
