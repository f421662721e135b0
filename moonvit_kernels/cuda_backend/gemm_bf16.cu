// gemm_bf16.cu — C[M, N] = epilogue(A[M, K] · B[N, K]ᵀ) on tensor cores.
//
// A holds activations (row-major, K contiguous), B a weight in nn.Linear layout [out, in], so both
// operands are K-contiguous ("NT" GEMM), which is exactly what mma.sync's row.col form reads.
// bf16 inputs, fp32 accumulation, output fp32 or bf16, epilogue fused into the store:
//   EPI_NONE, EPI_GELU_TANH, EPI_GELU_ERF, EPI_RESIDUAL (C = R + A·Bᵀ, R may alias C).
//
// Block tile 128x128, K step 32, 8 warps as 2 (M) x 4 (N), each warp 64x32 = 4x4 mma tiles of 16x8.
// Tiles are staged in shared memory by cp.async, double-buffered: tile k+1 is in flight while
// tile k is multiplied. Rows padded to 40 bf16 (80 bytes) so the 8 rows one ldmatrix reads fall
// in 8 different 16-byte bank groups. Any M, N, K: out-of-range rows and K columns are
// zero-filled in shared memory, out-of-range outputs are not stored.
// `vec` (K % 8 == 0 and 16-byte aligned A, B) picks 16-byte cp.async loads; otherwise a scalar,
// bounds-checked load fills the same tile (patch embedding has K = 3·14·14 = 588).
#include "common.cuh"
#include "ptx.cuh"

// region: kernel
namespace gemm_bf16_cfg {
constexpr int BM = 128, BN = 128, BK = 32;
constexpr int WARPS_M = 2, WARPS_N = 4, THREADS = 32 * WARPS_M * WARPS_N;
constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;  // 64 x 32 per warp
constexpr int MI = WM / 16, NI = WN / 8;             // 4 x 4 mma tiles per warp
constexpr int LDS = BK + 8;                          // padded shared row, in elements
constexpr int CHUNKS = BK / 8;                       // 16-byte chunks per tile row
}  // namespace gemm_bf16_cfg

// region: cp_async_stage
// Stage rows [row0, row0 + 128) x columns [k0, k0 + 32) of src[rows, K] into dst[128][LDS],
// writing zeros outside [0, rows) x [0, K).
// Which lane copies which 16-byte chunk: a warp copies 8 rows x 4 chunks, and a 16-byte shared store is
// served 8 lanes (a quarter-warp) at a time. Lanes take 8 consecutive rows of one chunk column: with the
// 80-byte row stride, chunk kc/8 of row r starts at 16-byte bank group (5r + kc/8) % 8, different for
// the 8 rows, so the store is conflict-free. (Row-major order, 2 rows x 4 chunks per quarter-warp, puts
// row r+1's last chunk on the banks of row r's first: 2-way.) The warp still reads the same 8 row
// pieces of 64 bytes from global memory, so its loads stay coalesced.
__device__ __forceinline__ void gemm_bf16_load_tile(bf16 (*dst)[gemm_bf16_cfg::LDS], const bf16* __restrict__ src,
                                                    int rows, int row0, int K, int k0, int vec) {
  using namespace gemm_bf16_cfg;
  for (int c = threadIdx.x; c < BM * CHUNKS; c += THREADS) {
    const int r = c / (8 * CHUNKS) * 8 + c % 8, kc = (c / 8) % CHUNKS * 8;
    const int gr = row0 + r, gk = k0 + kc;
    if (vec) {  // K % 8 == 0: a chunk is either wholly inside or wholly outside
      const bool ok = gr < rows && gk < K;
      cp_async_16(&dst[r][kc], ok ? src + (size_t)gr * K + gk : src, ok);
// endregion
    } else {
      const unsigned short* s = reinterpret_cast<const unsigned short*>(src);
      unsigned v[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = (gr < rows && gk + e < K) ? s[(size_t)gr * K + gk + e] : 0u;
      *reinterpret_cast<uint4*>(&dst[r][kc]) =
          make_uint4(v[0] | (v[1] << 16), v[2] | (v[3] << 16), v[4] | (v[5] << 16), v[6] | (v[7] << 16));
    }
  }
}

template <typename OutT, int EPI>
__global__ void __launch_bounds__(gemm_bf16_cfg::THREADS)
    gemm_bf16_tc(const bf16* __restrict__ A, const bf16* __restrict__ B, OutT* C, const OutT* R, int M, int N, int K,
                 int vec) {
  using namespace gemm_bf16_cfg;
  __shared__ __align__(16) bf16 As[2][BM][LDS];
  __shared__ __align__(16) bf16 Bs[2][BN][LDS];

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int ktiles = (K + BK - 1) / BK;

  float acc[MI][NI][4];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

  gemm_bf16_load_tile(As[0], A, M, m0, K, 0, vec);
  gemm_bf16_load_tile(Bs[0], B, N, n0, K, 0, vec);
  cp_async_commit();

  for (int kt = 0; kt < ktiles; ++kt) {
    const int cur = kt & 1;
    if (kt + 1 < ktiles) {  // prefetch the next K tile into the other buffer
      gemm_bf16_load_tile(As[cur ^ 1], A, M, m0, K, (kt + 1) * BK, vec);
      gemm_bf16_load_tile(Bs[cur ^ 1], B, N, n0, K, (kt + 1) * BK, vec);
    }
    cp_async_commit();  // (an empty group on the last step keeps the wait count uniform)
    cp_async_wait<1>();  // tile kt has landed
    __syncthreads();

#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      unsigned a[MI][4], b[NI][2];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)  // rows lane%16, k half lane/16 of a 16x16 A tile
        ldmatrix_x4(a[mi], &As[cur][wm * WM + mi * 16 + lane % 16][kk + (lane / 16) * 8]);
#pragma unroll
      for (int ni = 0; ni < NI; ni += 2) {  // two 8-column B tiles, both k halves
        unsigned r[4];
        ldmatrix_x4(r, &Bs[cur][wn * WN + ni * 8 + lane % 8 + (lane / 16) * 8][kk + ((lane / 8) % 2) * 8]);
        b[ni][0] = r[0];
        b[ni][1] = r[1];
        b[ni + 1][0] = r[2];
        b[ni + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) mma_bf16_16816(acc[mi][ni], a[mi], b[ni][0], b[ni][1]);
    }
    __syncthreads();  // everyone is done with buffer `cur` before it is refilled
  }

#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = m0 + wm * WM + mi * 16 + lane / 4 + half * 8;
        const int col = n0 + wn * WN + ni * 8 + (lane % 4) * 2;
        if (row < M) gemm_store_pair<OutT, EPI>(C, R, row, col, N, acc[mi][ni][2 * half], acc[mi][ni][2 * half + 1]);
      }
}
// endregion
