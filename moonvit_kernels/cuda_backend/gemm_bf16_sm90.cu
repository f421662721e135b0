// gemm_bf16_sm90.cu — C[M, N] = epilogue(A[M, K] · B[N, K]ᵀ) on Hopper (sm_90a): TMA + wgmma.
//
// Same contract as gemm_bf16_tc (gemm_bf16.cu): A activations [M, K] and B an nn.Linear weight [N, K],
// both K-contiguous bf16; fp32 accumulation; output fp32 or bf16; epilogues EPI_NONE, EPI_GELU_TANH,
// EPI_GELU_ERF, EPI_RESIDUAL (C = R + A·Bᵀ, R may alias C). Any M, N; K % 8 == 0 and 16-byte aligned
// A, B (the tensor maps need 16-byte global strides); other K take the mma.sync kernel.
//
// region: gemm_sm90_tiles
// Block tile 128 x BN (BN = 128 or 256, a template argument), K step 64 (64 bf16 = 128 bytes: one
// 128-byte-swizzled row), a 4-stage ring.
// 3 warpgroups, specialised:
//   warpgroup 0, the producer: gives registers back (setmaxnreg.dec), and one thread loops over the
//     K tiles: wait until stage s is empty, announce its bytes on full[s] (arrive.expect_tx), and
//     issue two tensor copies (A 128 x 64 box, B 128 x 64 box) that complete on full[s]; the copy
//     engine zero-fills rows past M / N and columns past K, so tails need no code. (B's box is BN rows.)
//   warpgroups 1, 2, the consumers (rows 0..63 and 64..127 of the tile): take registers
//     (setmaxnreg.inc), wait for full[s], issue 4 wgmma m64nBNk16 from shared-memory descriptors
//     (one per 16-wide K slice: the descriptor's start address moves 32 bytes within the swizzled
//     rows), commit, keep one group in flight (wait_group 1) and release the previous stage
//     (one arrival per consumer warpgroup on empty[s]).
// Stage s of K tile kt is refilled in round kt / STAGES; both barriers' phases flip once per round,
// so waits use the round's parity (the producer's first wait, on a fresh barrier, uses parity 1,
// which counts as already complete).
// The epilogue reads the accumulators in wgmma's fragment layout and stores with bounds checks.
// endregion
#include "common.cuh"
#include "ptx_sm90.cuh"

// BN_ = 128 or 256 (the N extent of the block tile and of each consumer's wgmma).
template <int BN_>
// region: gemm_sm90_config
struct GemmSm90Cfg {
  static constexpr int BM = 128, BN = BN_, BK = 64, STAGES = 4;
  static constexpr int CONSUMERS = 2, THREADS = 128 * (1 + CONSUMERS);
  static constexpr int A_STAGE_BYTES = BM * BK * 2, B_STAGE_BYTES = BN * BK * 2;
  static constexpr int STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES;  // what one full[s] phase expects
  static constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + 2 * STAGES * 8;  // the ring, then its barriers
  static constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;  // 128 x (40 + 2 x 232) = 64512 <= 65536
  static constexpr int SWIZZLE_ROW_BYTES = 128;                  // BK * 2: rows of the 128-byte swizzle pattern
  static constexpr int SBO = 8 * SWIZZLE_ROW_BYTES;             // bytes between 8-row groups of a K-major tile
  static_assert(BN == 128 || BN == 256, "gemm_bf16_sm90: BN is 128 or 256");
  static_assert(SMEM_BYTES <= 227 * 1024, "shared memory of one block on sm_90");
  static_assert(128 * (PRODUCER_REGS + CONSUMERS * CONSUMER_REGS) <= 65536, "setmaxnreg budget");
  static_assert(BK * 2 == SWIZZLE_ROW_BYTES, "a K tile row is one 128-byte swizzle row");
  static_assert(A_STAGE_BYTES % 1024 == 0 && B_STAGE_BYTES % 1024 == 0, "every tile starts on a 1024-byte boundary");
};
// endregion

// acc (+)= the consumer's 64 rows x BN columns for one k16 slice.
template <int BN>
__device__ __forceinline__ void gemm_sm90_mma(float (&acc)[BN / 2], unsigned long long da, unsigned long long db) {
  if constexpr (BN == 128) {
    wgmma_m64n128k16_ss(acc, da, db, 1);
  } else {
    wgmma_m64n256k16_ss(acc, da, db, 1);
  }
}

// tma_a: A as a 2-D tensor {K, M} (K innermost), box {64, 128}, 128-byte swizzle, zero fill;
// tma_b: B likewise {K, N}, box {64, BN} (tensor_maps.py). Grid (ceil(N / BN), ceil(M / 128)),
// 384 threads, GemmSm90Cfg<BN>::SMEM_BYTES of dynamic shared memory.
template <typename OutT, int EPI, int BN_ = 128>
__global__ void __launch_bounds__(GemmSm90Cfg<BN_>::THREADS, 1)
    gemm_bf16_sm90(const __grid_constant__ TmaMap tma_a, const __grid_constant__ TmaMap tma_b, OutT* C, const OutT* R,
                   int M, int N, int K) {
  using Cfg = GemmSm90Cfg<BN_>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES, CONSUMERS = Cfg::CONSUMERS;
  constexpr int A_STAGE_BYTES = Cfg::A_STAGE_BYTES, STAGE_BYTES = Cfg::STAGE_BYTES, SBO = Cfg::SBO;
  SM90_DYNAMIC_SMEM(smem);  // 1024-aligned, as the 128-byte swizzle of every stage (a multiple of 1024 bytes) needs
  bf16* sA = reinterpret_cast<bf16*>(smem);                             // [STAGES][BM][BK], swizzled
  bf16* sB = reinterpret_cast<bf16*>(smem + STAGES * A_STAGE_BYTES);     // [STAGES][BN][BK], swizzled
  unsigned long long* full = reinterpret_cast<unsigned long long*>(smem + STAGES * STAGE_BYTES);
  unsigned long long* empty = full + STAGES;

  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int ktiles = (K + BK - 1) / BK;

  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 1);             // the producer's arrive.expect_tx (+ the copies' bytes)
      mbar_init(&empty[s], CONSUMERS);    // one arrival per consumer warpgroup
    }
    fence_mbarrier_init();
  }
  __syncthreads();

  // region: gemm_sm90_roles
  if (wg == 0) {  // ------------------------------------------------ producer
    setmaxnreg_dec<Cfg::PRODUCER_REGS>();
    if (t == 0) {
      tma_prefetch_map(&tma_a);
      tma_prefetch_map(&tma_b);
      for (int kt = 0; kt < ktiles; ++kt) {
        const int s = kt % STAGES;
        const unsigned round = kt / STAGES;
        mbar_wait(&empty[s], (round & 1u) ^ 1u);  // round 0: the fresh barrier's "previous" phase
        mbar_arrive_expect_tx(&full[s], STAGE_BYTES);
        tma_load_2d(sA + s * (BM * BK), &tma_a, kt * BK, m0, &full[s]);
        tma_load_2d(sB + s * (BN * BK), &tma_b, kt * BK, n0, &full[s]);
      }
    }
  } else {  // ------------------------------------------------------ consumers
    setmaxnreg_inc<Cfg::CONSUMER_REGS>();
    const int rows = (wg - 1) * 64;  // this warpgroup's rows within the tile
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;

    for (int kt = 0; kt < ktiles; ++kt) {
      const int s = kt % STAGES;
      mbar_wait(&full[s], (kt / STAGES) & 1u);
      const unsigned a_base = sm90_smem_addr(sA + s * (BM * BK) + rows * BK);
      const unsigned b_base = sm90_smem_addr(sB + s * (BN * BK));
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {  // 16 bf16 = 32 bytes further along the swizzled rows
        const unsigned long long da = wgmma_desc(a_base + kk * 32, 16, SBO, WGMMA_SWIZZLE_128B);
        const unsigned long long db = wgmma_desc(b_base + kk * 32, 16, SBO, WGMMA_SWIZZLE_128B);
        gemm_sm90_mma<BN>(acc, da, db);
      }
      wgmma_commit();
      wgmma_wait<1>();  // tile kt - 1's MMAs are done: its stage may be refilled
      if (kt > 0 && t == 0) mbar_arrive(&empty[(kt - 1) % STAGES]);
    }
    wgmma_wait<0>();
    wgmma_fence_operands(acc);
  // endregion

    const int warp = t / 32, lane = t % 32;
#pragma unroll
    for (int i = 0; i < BN / 8; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + rows + warp * 16 + lane / 4 + 8 * h;
        const int col = n0 + 8 * i + 2 * (lane % 4);
        if (row < M) gemm_store_pair<OutT, EPI>(C, R, row, col, N, acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]);
      }
  }
}
