// gemm_fp32.cu — C[M, N] = epilogue(A[M, K] · B[N, K]ᵀ) in fp32 on the SIMT cores.
//
// The CUDA C twin of the numba "v3" GEMM: shared-memory tiles + register blocking.
//   block tile 64x64, K step 16, 256 threads as 16x16; each thread owns a 4x4 block of C
//   (rows ty·4..ty·4+3, columns tx·4..tx·4+3) and keeps it in 16 registers.
// Tiles are stored K-major in shared memory so the inner loop reads four consecutive m (or n) with
// one 16-byte load; the k-rows come in quads of 4 rows padded by 8 floats, which makes the
// transposing stores conflict-free (see gemm_fp32_load_tile). Out-of-range A/B elements load as
// zero, out-of-range C elements are not stored. `vec` (K % 4 == 0, 16-byte aligned A and B) enables float4 loads;
// C is stored (and R read) as float4 runs along n when N % 4 == 0 and C, R are 16-byte aligned.
// Same epilogues as gemm_bf16.cu.
#include "common.cuh"

// region: kernel
namespace gemm_fp32_cfg {
constexpr int BM = 64, BN = 64, BK = 16, TM = 4, TN = 4;
constexpr int THREADS = (BM / TM) * (BN / TN);  // 256
constexpr int LDQ = 4 * BM + 8;                 // one k-quad: 4 K-major rows of BM floats + 8 of padding
static_assert(BM == BN, "one tile loader stages both A and B");
}  // namespace gemm_fp32_cfg

// Stage rows [row0, row0 + 64) x columns [k0, k0 + 16) of src[rows, K] K-major into dst[BK / 4][LDQ]:
// element (row r, k0 + k) goes to dst[k / 4][(k % 4) * BM + r].
// Each thread loads 4 consecutive k of one row (a warp: 8 rows x 64 contiguous bytes, coalesced) and
// stores them down 4 k-rows. One store instruction of a warp writes 8 consecutive r into each of the 4
// quads; quad q starts at q * LDQ = q * 264 floats, 8q banks along, so the quads fill banks 0-7, 8-15,
// 16-23 and 24-31: conflict-free. (Uniformly padded rows cannot do this: with a stride that is a
// multiple of 4 floats, as the 16-byte reads need, quads 0 and 2 always start in the same bank.)
__device__ __forceinline__ void gemm_fp32_load_tile(float (*dst)[gemm_fp32_cfg::LDQ], const float* __restrict__ src,
                                                    int rows, int row0, int K, int k0, int vec) {
  using namespace gemm_fp32_cfg;
  const int r = threadIdx.x / (BK / 4);  // 0..63: one row of the tile
  const int q = threadIdx.x % (BK / 4);  // 0..3: the k-quad, k = 4q .. 4q + 3
  const int kq = q * 4;
  const int gr = row0 + r, gk = k0 + kq;
  float v[4];
  if (vec && gr < rows && gk < K) {  // K % 4 == 0: the four are all inside
    const float4 f = *reinterpret_cast<const float4*>(src + (size_t)gr * K + gk);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = (gr < rows && gk + e < K) ? src[(size_t)gr * K + gk + e] : 0.0f;
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) dst[q][e * BM + r] = v[e];
}

template <int EPI>
__global__ void __launch_bounds__(gemm_fp32_cfg::THREADS)
    gemm_fp32_simt(const float* __restrict__ A, const float* __restrict__ B, float* C, const float* R, int M, int N,
                   int K, int vec) {
  using namespace gemm_fp32_cfg;
  __shared__ __align__(16) float As[BK / 4][LDQ];  // As[k / 4][(k % 4) * BM + m] = A[m0 + m][k0 + k]
  __shared__ __align__(16) float Bs[BK / 4][LDQ];  // Bs[k / 4][(k % 4) * BN + n] = B[n0 + n][k0 + k]

  const int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;

  float acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

  for (int k0 = 0; k0 < K; k0 += BK) {
    gemm_fp32_load_tile(As, A, M, m0, K, k0, vec);
    gemm_fp32_load_tile(Bs, B, N, n0, K, k0, vec);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      const float4 a = *reinterpret_cast<const float4*>(&As[k / 4][(k % 4) * BM + ty * TM]);
      const float4 b = *reinterpret_cast<const float4*>(&Bs[k / 4][(k % 4) * BN + tx * TN]);
      const float av[TM] = {a.x, a.y, a.z, a.w}, bv[TN] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }

  // Epilogue. A warp is 16 (tx) x 2 (ty) threads and each thread owns 4 consecutive columns of a row,
  // so one float4 per row makes the 16 lanes of a row cover 256 contiguous bytes: 16 sectors of 32 bytes
  // for the warp's 512 bytes, the fewest possible. (Storing column j of every thread at once would put
  // each lane's 4 bytes in its own sector: 4x the sectors for the same bytes.) The float4 path needs
  // 16-byte aligned C and R rows: N % 4 == 0 (col is a multiple of 4, so col < N means col + 3 < N) and
  // aligned base pointers; otherwise the scalar loop stores element by element, skipping columns >= N.
  const bool vec_c = N % 4 == 0 && ((reinterpret_cast<size_t>(C) | reinterpret_cast<size_t>(R)) % 16) == 0;
  const int col = n0 + tx * TN;
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int row = m0 + ty * TM + i;
    if (row >= M || col >= N) continue;
    const size_t idx = (size_t)row * N + col;
    if (vec_c) {
      float4 o = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
      if (EPI == EPI_RESIDUAL) {
        const float4 r = *reinterpret_cast<const float4*>(R + idx);
        o = make_float4(r.x + o.x, r.y + o.y, r.z + o.z, r.w + o.w);
      } else {
        o = make_float4(activate<EPI>(o.x), activate<EPI>(o.y), activate<EPI>(o.z), activate<EPI>(o.w));
      }
      *reinterpret_cast<float4*>(C + idx) = o;
    } else {
#pragma unroll
      for (int j = 0; j < TN; ++j)
        if (col + j < N) C[idx + j] = EPI == EPI_RESIDUAL ? R[idx + j] + acc[i][j] : activate<EPI>(acc[i][j]);
    }
  }
}
// endregion
