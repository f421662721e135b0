// flash_attn_sm90.cu — packed, non-causal attention forward on Hopper (sm_90a): TMA + wgmma.
//
// Same contract as flash_attn_bf16 (attention.cu): qkv [L, 3Q] bf16 (Q = H·HD), out [L, Q] bf16,
// lse [L, H] fp32 (natural log), cu_seqlens [N + 1]; grid x = 64-query tile of the item, y = head,
// z = item; scores in the log2 domain (scale_log2 = scale·log2 e), online softmax in fp32.
// HD a multiple of 8 up to 128 (the tensor copies zero-fill head dims HD..HDP).
//
// The tensor maps view qkv as a 3-D tensor {HD, 3H, L} (dims innermost first; strides 2·HD and
// 2·3Q bytes) with a {64, 1, 64} box: 64 head dims x one (slot, head) x 64 tokens. `tm_sw` writes
// boxes with the 128-byte swizzle (Q and K: K-major wgmma operands, one 128-byte row per token and
// 64-dim block), `tm_raw` without (V, which the producer transposes).
// 2 warpgroups:
//   warpgroup 0, the producer: thread 0 loads Q once and, per key tile j (stage s = j % 2), waits
//     until s is empty, then loads K (-> kfull[s]) and V (-> vraw[s]); all 128 threads then
//     transpose V into Vt[s] = [HDP dims][64 keys] (K-major for P·V, 128-byte swizzle), fence the
//     writes for the async proxy and arrive on vfull[s].
//   warpgroup 1, the consumer (64 query rows): S = Q·Kᵀ by wgmma m64n64k16 from shared memory, the
//     online softmax on S's fragment (rows 16w + l/4 and +8), P packed to bf16 straight from that
//     fragment into wgmma's A-register layout, O += P·Vt by wgmma m64nHDPk16 with A in registers,
//     then the stage is released (empty[s]). The epilogue normalises O and stores out and lse.
#include "common.cuh"
#include "ptx_sm90.cuh"

template <int HD>
struct AttnSm90Cfg {
  static_assert(HD % 8 == 0 && HD >= 8 && HD <= 128, "flash_attn_sm90: head_dim a multiple of 8 in 8..128");
  static constexpr int BQ = 64, BKV = 64, STAGES = 2, THREADS = 256;
  static constexpr int DB = (HD + 63) / 64;  // 64-dim blocks (one 128-byte swizzled row each)
  static constexpr int HDP = 64 * DB;        // padded head dim: N of P·V
  static constexpr int Q_BYTES = DB * BQ * 128, K_BYTES = DB * BKV * 128, VRAW_BYTES = DB * BKV * 128;
  static constexpr int VT_BYTES = HDP * BKV * 2;
  static constexpr int STAGE_BYTES = K_BYTES + VRAW_BYTES + VT_BYTES;
  static constexpr int SMEM_BYTES = Q_BYTES + STAGES * STAGE_BYTES + 8 * (1 + 4 * STAGES);  // tiles, then barriers
  // 2 blocks per SM on sm_90: 228 KB of shared memory per SM, 1 KB of it reserved per block, and
  // __launch_bounds__(THREADS, BLOCKS_PER_SM) caps registers at 65536 / (2 x 256) = 128 per thread.
  static constexpr int BLOCKS_PER_SM = 2;
  static_assert(BLOCKS_PER_SM * (SMEM_BYTES + 1024) <= 228 * 1024, "flash_attn_sm90: 2 blocks per sm_90 SM");
  static_assert(Q_BYTES % 1024 == 0 && STAGE_BYTES % 1024 == 0 && K_BYTES % 1024 == 0 && VRAW_BYTES % 1024 == 0,
                "every swizzled tile starts on a 1024-byte boundary");
};

// D (+)= A·Bᵀ for P·V: m64n64k16 or m64n128k16 with A (P) in registers.
template <int HDP>
__device__ __forceinline__ void attn_sm90_pv(float (&o)[HDP / 2], const unsigned (&a)[4], unsigned long long db) {
  if constexpr (HDP == 64) {
    wgmma_m64n64k16_rs(o, a, db, 1);
  } else {
    wgmma_m64n128k16_rs(o, a, db, 1);
  }
}

template <int HD>
__global__ void __launch_bounds__(AttnSm90Cfg<HD>::THREADS, AttnSm90Cfg<HD>::BLOCKS_PER_SM)
    flash_attn_sm90(const __grid_constant__ TmaMap tm_sw, const __grid_constant__ TmaMap tm_raw, bf16* __restrict__ out,
                    float* __restrict__ lse, const int* __restrict__ cu_seqlens, int H, float scale_log2) {
  using Cfg = AttnSm90Cfg<HD>;
  constexpr int BQ = Cfg::BQ, BKV = Cfg::BKV, DB = Cfg::DB, HDP = Cfg::HDP, STAGES = Cfg::STAGES;
  SM90_DYNAMIC_SMEM(smem);  // 1024-aligned; every tile below is a multiple of 1024 bytes
  unsigned char* sQ = smem;  // [DB][BQ][64] swizzled
  auto sK = [&](int s) { return smem + Cfg::Q_BYTES + s * Cfg::STAGE_BYTES; };  // [DB][BKV][64] swizzled
  auto sV = [&](int s) { return sK(s) + Cfg::K_BYTES; };                       // [DB][BKV][64] plain
  auto sVt = [&](int s) { return sV(s) + Cfg::VRAW_BYTES; };                   // [HDP][BKV] swizzled
  unsigned long long* bars = reinterpret_cast<unsigned long long*>(smem + Cfg::Q_BYTES + STAGES * Cfg::STAGE_BYTES);
  unsigned long long* qfull = bars;
  unsigned long long* kfull = bars + 1;
  unsigned long long* vraw = kfull + STAGES;
  unsigned long long* vfull = vraw + STAGES;
  unsigned long long* empty = vfull + STAGES;

  const int item = blockIdx.z, head = blockIdx.y;
  const int start = cu_seqlens[item], n = cu_seqlens[item + 1] - start;
  const int q0 = blockIdx.x * BQ;
  if (q0 >= n) return;  // whole block: before any barrier
  const int ntiles = (n + BKV - 1) / BKV;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;

  if (threadIdx.x == 0) {
    mbar_init(qfull, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&kfull[s], 1);
      mbar_init(&vraw[s], 1);
      mbar_init(&vfull[s], 128);  // every producer thread, after its part of the transpose
      mbar_init(&empty[s], 1);    // the consumer, once P·V has read the stage
    }
    fence_mbarrier_init();
  }
  __syncthreads();

  if (wg == 0) {  // ------------------------------------------------ producer
    if (t == 0) {
      mbar_arrive_expect_tx(qfull, Cfg::Q_BYTES);
      for (int d = 0; d < DB; ++d) tma_load_3d(sQ + d * BQ * 128, &tm_sw, 64 * d, head, start + q0, qfull);
    }
    for (int j = 0; j < ntiles; ++j) {
      const int s = j % STAGES;
      const unsigned par = (j / STAGES) & 1u;
      if (t == 0) {
        mbar_wait(&empty[s], par ^ 1u);
        mbar_arrive_expect_tx(&kfull[s], Cfg::K_BYTES);
        for (int d = 0; d < DB; ++d)
          tma_load_3d(sK(s) + d * BKV * 128, &tm_sw, 64 * d, H + head, start + j * BKV, &kfull[s]);
        mbar_arrive_expect_tx(&vraw[s], Cfg::VRAW_BYTES);
        for (int d = 0; d < DB; ++d)
          tma_load_3d(sV(s) + d * BKV * 128, &tm_raw, 64 * d, 2 * H + head, start + j * BKV, &vraw[s]);
      }
      mbar_wait(&vraw[s], par);
      // region: attn_sm90_v_transpose
      // Vt[dim][key]: row `dim` of 128 bytes, 16-byte chunk c (keys 8c..8c+7) at chunk c ^ (dim % 8)
      const unsigned short* v = reinterpret_cast<const unsigned short*>(sV(s));
      for (int idx = t; idx < HDP * (BKV / 8); idx += 128) {
        const int dim = idx / (BKV / 8), c = idx % (BKV / 8);
        const unsigned short* col = v + (dim / 64) * BKV * 64 + dim % 64;
        unsigned w[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) w[e] = col[(8 * c + 2 * e) * 64] | (unsigned(col[(8 * c + 2 * e + 1) * 64]) << 16);
        *reinterpret_cast<uint4*>(sVt(s) + dim * 128 + 16 * (c ^ (dim % 8))) = make_uint4(w[0], w[1], w[2], w[3]);
      }
      fence_proxy_async();  // the generic-proxy stores above are read by wgmma (async proxy)
      mbar_arrive(&vfull[s]);
      // endregion
    }
  } else {  // ------------------------------------------------------ consumer
    const int warp = t / 32, lane = t % 32;
    float o[HDP / 2];
#pragma unroll
    for (int i = 0; i < HDP / 2; ++i) o[i] = 0.0f;
    float m_run[2] = {NEG_INF_F, NEG_INF_F}, l_run[2] = {0.0f, 0.0f};
    const unsigned q_addr = sm90_smem_addr(sQ);
    mbar_wait(qfull, 0);

    for (int j = 0; j < ntiles; ++j) {
      const int s = j % STAGES;
      const unsigned par = (j / STAGES) & 1u;
      mbar_wait(&kfull[s], par);
      const unsigned k_addr = sm90_smem_addr(sK(s));
      float sc[BKV / 2];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < HDP / 16; ++kk) {  // 16 head dims per step: 32 bytes along a swizzled row
        const unsigned off = (kk / 4) * BQ * 128 + (kk % 4) * 32;
        wgmma_m64n64k16_ss(sc, wgmma_desc(q_addr + off, 16, 1024, WGMMA_SWIZZLE_128B),
                           wgmma_desc(k_addr + off, 16, 1024, WGMMA_SWIZZLE_128B), kk > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operands(sc);

      // sc[4i + e]: row 16·warp + lane/4 + 8·(e/2), key 8i + 2(lane%4) + e%2 of this tile
      const int kv0 = j * BKV;
      float m_new[2] = {m_run[0], m_run[1]};
#pragma unroll
      for (int i = 0; i < BKV / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = kv0 + 8 * i + 2 * (lane % 4) + e % 2;
          sc[4 * i + e] = key < n ? sc[4 * i + e] * scale_log2 : NEG_INF_F;
          m_new[e / 2] = fmaxf(m_new[e / 2], sc[4 * i + e]);
        }
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // the 4 lanes of a quad hold the same two rows
        m_new[h] = fmaxf(m_new[h], __shfl_xor_sync(FULL_MASK, m_new[h], 1));
        m_new[h] = fmaxf(m_new[h], __shfl_xor_sync(FULL_MASK, m_new[h], 2));
      }
      float corr[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        corr[h] = exp2f(m_run[h] - m_new[h]);
        m_run[h] = m_new[h];
        l_run[h] *= corr[h];
      }
#pragma unroll
      for (int i = 0; i < HDP / 2; ++i) o[i] *= corr[(i % 4) / 2];
      // region: attn_sm90_pv
      // P (unnormalised), packed into the A fragment of wgmma: slice kk = keys 16kk..16kk+15 is
      // {keys 8(2kk) row r, row r+8, keys 8(2kk+1) row r, row r+8} = sc[8kk + 0..7] in pairs.
      unsigned pa[BKV / 16][4];
#pragma unroll
      for (int kk = 0; kk < BKV / 16; ++kk)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float p0 = exp2f(sc[8 * kk + 2 * q] - m_run[q % 2]);
          const float p1 = exp2f(sc[8 * kk + 2 * q + 1] - m_run[q % 2]);
          l_run[q % 2] += p0 + p1;
          pa[kk][q] = pack_bf16x2(p0, p1);
        }

      mbar_wait(&vfull[s], par);
      const unsigned vt_addr = sm90_smem_addr(sVt(s));
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BKV / 16; ++kk)
        attn_sm90_pv<HDP>(o, pa[kk], wgmma_desc(vt_addr + kk * 32, 16, 1024, WGMMA_SWIZZLE_128B));
      // endregion
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operands(o);
      if (t == 0) mbar_arrive(&empty[s]);
    }

#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_run[h] += __shfl_xor_sync(FULL_MASK, l_run[h], 1);
      l_run[h] += __shfl_xor_sync(FULL_MASK, l_run[h], 2);
    }
    const int Q = H * HD;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = q0 + warp * 16 + lane / 4 + 8 * h;
      if (row >= n) continue;
      const float inv = 1.0f / l_run[h];
      bf16* orow = out + (size_t)(start + row) * Q + head * HD;
#pragma unroll
      for (int i = 0; i < HDP / 8; ++i) {
        const int d = 8 * i + 2 * (lane % 4);
        if (d < HD) store_float2(orow + d, o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv);
      }
      if (lane % 4 == 0) lse[(size_t)(start + row) * H + head] = (m_run[h] + log2f(l_run[h])) * LN2_F;
    }
  }
}
