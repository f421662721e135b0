// attention.cu — packed, non-causal, flash-style attention forward (docs/model.md §5), reading q, k, v
// straight out of the qkv projection.
//
// region: attn_layout
// Layouts (Q = H·HD):
//   qkv [L, 3Q]  element (token l, slot s ∈ {q,k,v}, head h, dim d) at l·3Q + s·Q + h·HD + d
//   out [L, Q]   at l·Q + h·HD + d          lse [L, H]   natural-log log-sum-exp of the scaled scores
//   cu_seqlens [N + 1] int32: item i owns tokens cu_seqlens[i] .. cu_seqlens[i+1]-1 and sees only them.
// Grid: x = query tile inside the item, y = head, z = item (tiles past an item's end exit at once).
// Scores are kept in the log2 domain: s2 = (q·k)·scale·log2(e), so exp(x) becomes exp2(x).
// Online softmax per query row (fp32): m = running max, l = running Σ 2^(s2 − m), o = running
// Σ 2^(s2 − m)·v; a new key tile rescales l and o by 2^(m_old − m_new). lse = (m + log2 l)·ln 2.
// endregion
//
// flash_attn_bf16<HD>: tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate) for S = Q·Kᵀ
//   and O = P·V. 4 warps x 16 query rows, 64-key tiles double-buffered with cp.async. Head dims
//   are padded to HDP = round_up(HD, 16) with zeros in shared memory, so any HD % 8 == 0 works.
// flash_attn_fp32<HD>: the same algorithm on SIMT cores in fp32 (for the fp32 backend and as a
//   readable version): 4 warps x 4 query rows, 32-key tiles, lane j owns key j for the scores.
#include "common.cuh"
#include "ptx.cuh"

// ================================================================ bf16, tensor cores
template <int HD>
struct AttnBf16Cfg {
  static constexpr int BQ = 64, BKV = 64, WARPS = 4, THREADS = 32 * WARPS;
  static constexpr int HDP = (HD + 15) / 16 * 16;  // K dimension of Q·Kᵀ in k16 steps
  static constexpr int LDS = HDP + 8;              // padded shared row: conflict-free ldmatrix
  static constexpr int SMEM_BYTES = (BQ + 2 * 2 * BKV) * LDS * 2;  // Q + 2 stages of K and V
};

// Stage `rows` rows x HDP dims of one head into dst[rows][LDS] (row r at src + r·row_stride),
// zero-filling rows >= valid_rows and dims >= HD.
template <int HD, int ROWS>
__device__ __forceinline__ void attn_load_rows(bf16* dst, const bf16* src, int valid_rows, int row_stride) {
  using Cfg = AttnBf16Cfg<HD>;
  constexpr int CHUNKS = Cfg::HDP / 8;  // 16-byte chunks per row
  for (int c = threadIdx.x; c < ROWS * CHUNKS; c += Cfg::THREADS) {
    const int r = c / CHUNKS, d = (c % CHUNKS) * 8;
    const bool ok = r < valid_rows && d < HD;
    cp_async_16(dst + r * Cfg::LDS + d, ok ? src + (size_t)r * row_stride + d : src, ok);
  }
}

template <int HD>
__global__ void __launch_bounds__(AttnBf16Cfg<HD>::THREADS)
    flash_attn_bf16(const bf16* __restrict__ qkv, bf16* __restrict__ out, float* __restrict__ lse,
                    const int* __restrict__ cu_seqlens, int H, float scale_log2) {
  using Cfg = AttnBf16Cfg<HD>;
  constexpr int BQ = Cfg::BQ, BKV = Cfg::BKV, HDP = Cfg::HDP, LDS = Cfg::LDS;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);  // [BQ][LDS]
  bf16* Ks = Qs + BQ * LDS;                       // [2][BKV][LDS]
  bf16* Vs = Ks + 2 * BKV * LDS;                  // [2][BKV][LDS]

  const int item = blockIdx.z, head = blockIdx.y;
  const int start = cu_seqlens[item], n = cu_seqlens[item + 1] - start;
  const int q0 = blockIdx.x * BQ;
  if (q0 >= n) return;  // whole block: before any barrier

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int Q = H * HD, stride = 3 * Q;
  const bf16* qbase = qkv + (size_t)start * stride + head * HD;
  const bf16* kbase = qbase + Q;
  const bf16* vbase = qbase + 2 * Q;

  attn_load_rows<HD, BQ>(Qs, qbase + (size_t)q0 * stride, n - q0, stride);
  cp_async_commit();
  attn_load_rows<HD, BKV>(Ks, kbase, n, stride);
  attn_load_rows<HD, BKV>(Vs, vbase, n, stride);
  cp_async_commit();
  cp_async_wait<1>();  // the Q group has landed
  __syncthreads();

  // This warp's 16 query rows as mma A fragments, one per 16 head dims.
  unsigned qf[HDP / 16][4];
#pragma unroll
  for (int kd = 0; kd < HDP / 16; ++kd) ldmatrix_x4(qf[kd], Qs + (warp * 16 + lane % 16) * LDS + kd * 16 + (lane / 16) * 8);

  // Rows owned by this thread: r = lane/4 (accumulator entries 0, 1) and r + 8 (entries 2, 3).
  float o[HDP / 8][4];
#pragma unroll
  for (int dt = 0; dt < HDP / 8; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[dt][e] = 0.0f;
  float m_run[2] = {NEG_INF_F, NEG_INF_F}, l_run[2] = {0.0f, 0.0f};

  const int ntiles = (n + BKV - 1) / BKV;
  for (int j = 0; j < ntiles; ++j) {
    const int cur = j & 1;
    if (j + 1 < ntiles) {
      const size_t next = (size_t)(j + 1) * BKV * stride;
      attn_load_rows<HD, BKV>(Ks + (cur ^ 1) * BKV * LDS, kbase + next, n - (j + 1) * BKV, stride);
      attn_load_rows<HD, BKV>(Vs + (cur ^ 1) * BKV * LDS, vbase + next, n - (j + 1) * BKV, stride);
    }
    cp_async_commit();
    cp_async_wait<1>();  // K, V tile j has landed
    __syncthreads();
    const bf16* Kt = Ks + cur * BKV * LDS;
    const bf16* Vt = Vs + cur * BKV * LDS;

    // S = Q·Kᵀ for 16 rows x 64 keys: s[nt] is the 16x8 tile of keys nt·8 .. nt·8+7.
    float s[BKV / 8][4];
#pragma unroll
    for (int nt = 0; nt < BKV / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
#pragma unroll
    for (int kd = 0; kd < HDP / 16; ++kd)
#pragma unroll
      for (int nt = 0; nt < BKV / 8; nt += 2) {  // Kt[key][d] is B in "col" layout: no transpose
        unsigned r[4];
        ldmatrix_x4(r, Kt + (nt * 8 + lane % 8 + (lane / 16) * 8) * LDS + kd * 16 + ((lane / 8) % 2) * 8);
        mma_bf16_16816(s[nt], qf[kd], r[0], r[1]);
        mma_bf16_16816(s[nt + 1], qf[kd], r[2], r[3]);
      }

    // region: attn_bf16_online_softmax
    // Scale into the log2 domain; keys past the item's end get -inf.
    const int kv0 = j * BKV;
    float m_new[2] = {m_run[0], m_run[1]};
#pragma unroll
    for (int nt = 0; nt < BKV / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kv0 + nt * 8 + (lane % 4) * 2 + (e & 1);
        s[nt][e] = key < n ? s[nt][e] * scale_log2 : NEG_INF_F;
        m_new[e / 2] = fmaxf(m_new[e / 2], s[nt][e]);
      }
    // The 4 lanes of a quad hold the same two rows.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m_new[h] = fmaxf(m_new[h], __shfl_xor_sync(FULL_MASK, m_new[h], 1));
      m_new[h] = fmaxf(m_new[h], __shfl_xor_sync(FULL_MASK, m_new[h], 2));
    }
    // Every tile holds at least one valid key, so m_new is finite; at j = 0, 2^(-inf) = 0.
    float corr[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      corr[h] = exp2f(m_run[h] - m_new[h]);
      m_run[h] = m_new[h];
      l_run[h] *= corr[h];
    }
#pragma unroll
    for (int dt = 0; dt < HDP / 8; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[dt][e] *= corr[e / 2];
#pragma unroll
    for (int nt = 0; nt < BKV / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2f(s[nt][e] - m_run[e / 2]);  // P, unnormalised
        l_run[e / 2] += s[nt][e];                   // this lane's part of the row sum
      }
    // endregion

    // region: attn_bf16_pv
    // O += P·V. The accumulators of key tiles 2kk, 2kk+1 are exactly the A fragment of a
    // 16x16 P tile (a0 = tile 2kk rows g, a1 = rows g+8, a2/a3 = tile 2kk+1).
#pragma unroll
    for (int kk = 0; kk < BKV / 16; ++kk) {
      const unsigned pa[4] = {pack_bf16x2(s[2 * kk][0], s[2 * kk][1]), pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                              pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dt = 0; dt < HDP / 8; dt += 2) {  // Vt[key][d] is B in "row" layout: ldmatrix .trans
        unsigned r[4];
        ldmatrix_x4_trans(r, Vt + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * LDS + dt * 8 + (lane / 16) * 8);
        mma_bf16_16816(o[dt], pa, r[0], r[1]);
        mma_bf16_16816(o[dt + 1], pa, r[2], r[3]);
      }
    }
    // endregion
    __syncthreads();  // buffer `cur` is refilled by the next iteration's prefetch
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(FULL_MASK, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(FULL_MASK, l_run[h], 2);
  }
  // Normalised O goes to global memory as whole 16-byte chunks of rows, so that a warp's store covers
  // contiguous rows of out (the fragment holds only 4-byte pairs): staged through Qs, free since the
  // Q fragments were loaded; each warp restages its own 16 rows.
  bf16* Os = Qs;  // [BQ][LDS]
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = warp * 16 + lane / 4 + h * 8;
    const float inv = 1.0f / l_run[h];  // finite for every row: rows past n saw zero queries, not no keys
#pragma unroll
    for (int dt = 0; dt < HDP / 8; ++dt) store_float2(Os + r * LDS + dt * 8 + (lane % 4) * 2, o[dt][2 * h] * inv,
                                                      o[dt][2 * h + 1] * inv);
    if (q0 + r < n && lane % 4 == 0) lse[(size_t)(start + q0 + r) * H + head] = (m_run[h] + log2f(l_run[h])) * LN2_F;
  }
  __syncthreads();
  constexpr int CHUNKS = HD / 8;  // 16-byte chunks per output row (HD % 8 == 0)
  for (int c = lane; c < 16 * CHUNKS; c += 32) {
    const int r = warp * 16 + c / CHUNKS, d = (c % CHUNKS) * 8;
    if (q0 + r < n)
      *reinterpret_cast<uint4*>(out + (size_t)(start + q0 + r) * Q + head * HD + d) =
          *reinterpret_cast<const uint4*>(Os + r * LDS + d);
  }
}

// ================================================================ fp32, SIMT
template <int HD>
struct AttnFp32Cfg {
  static constexpr int BQ = 16, BKV = 32, WARPS = 4, THREADS = 32 * WARPS, ROWS = BQ / WARPS;
  static constexpr int NI = (HD + 31) / 32;  // output dims per lane: d = lane + 32·i
  static constexpr int KLD = HD + 1;         // padded K row: lane j reads Ks[j][d] conflict-free
  static constexpr int SMEM_BYTES = (BQ * HD + BKV * KLD + BKV * HD) * 4;
};

template <int HD>
__global__ void __launch_bounds__(AttnFp32Cfg<HD>::THREADS)
    flash_attn_fp32(const float* __restrict__ qkv, float* __restrict__ out, float* __restrict__ lse,
                    const int* __restrict__ cu_seqlens, int H, float scale_log2) {
  using Cfg = AttnFp32Cfg<HD>;
  constexpr int BQ = Cfg::BQ, BKV = Cfg::BKV, ROWS = Cfg::ROWS, NI = Cfg::NI, KLD = Cfg::KLD;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* Qs = reinterpret_cast<float*>(smem_raw);  // [BQ][HD], pre-scaled by scale·log2(e)
  float* Ks = Qs + BQ * HD;                         // [BKV][KLD]
  float* Vs = Ks + BKV * KLD;                       // [BKV][HD]

  const int item = blockIdx.z, head = blockIdx.y;
  const int start = cu_seqlens[item], n = cu_seqlens[item + 1] - start;
  const int q0 = blockIdx.x * BQ;
  if (q0 >= n) return;

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int Q = H * HD, stride = 3 * Q;
  const float* qbase = qkv + (size_t)start * stride + head * HD;
  const float* kbase = qbase + Q;
  const float* vbase = qbase + 2 * Q;

  for (int e = threadIdx.x; e < BQ * HD; e += Cfg::THREADS) {
    const int r = e / HD, d = e % HD;
    Qs[e] = q0 + r < n ? qbase[(size_t)(q0 + r) * stride + d] * scale_log2 : 0.0f;
  }

  float o[ROWS][NI], m_run[ROWS], l_run[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    m_run[r] = NEG_INF_F;
    l_run[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < NI; ++i) o[r][i] = 0.0f;
  }

  for (int kv0 = 0; kv0 < n; kv0 += BKV) {
    __syncthreads();  // the previous tile is consumed (and, the first time, Qs is written)
    for (int e = threadIdx.x; e < BKV * HD; e += Cfg::THREADS) {
      const int r = e / HD, d = e % HD;
      const bool ok = kv0 + r < n;
      Ks[r * KLD + d] = ok ? kbase[(size_t)(kv0 + r) * stride + d] : 0.0f;
      Vs[r * HD + d] = ok ? vbase[(size_t)(kv0 + r) * stride + d] : 0.0f;
    }
    __syncthreads();
    const bool key_ok = kv0 + lane < n;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float* q = Qs + (warp * ROWS + r) * HD;
      float s = 0.0f;
#pragma unroll 8
      for (int d = 0; d < HD; ++d) s = fmaf(q[d], Ks[lane * KLD + d], s);
      s = key_ok ? s : NEG_INF_F;
      const float m_new = fmaxf(m_run[r], warp_max(s));  // finite: key kv0 is valid
      const float p = exp2f(s - m_new);
      const float corr = exp2f(m_run[r] - m_new);
      l_run[r] = l_run[r] * corr + warp_sum(p);
      m_run[r] = m_new;
#pragma unroll
      for (int i = 0; i < NI; ++i) o[r][i] *= corr;
      for (int j = 0; j < BKV; ++j) {
        const float pj = __shfl_sync(FULL_MASK, p, j);
#pragma unroll
        for (int i = 0; i < NI; ++i) {
          const int d = lane + 32 * i;
          if (d < HD) o[r][i] = fmaf(pj, Vs[j * HD + d], o[r][i]);
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int row = q0 + warp * ROWS + r;
    if (row >= n) continue;
    const float inv = 1.0f / l_run[r];
    float* orow = out + (size_t)(start + row) * Q + head * HD;
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      const int d = lane + 32 * i;
      if (d < HD) orow[d] = o[r][i] * inv;
    }
    if (lane == 0) lse[(size_t)(start + row) * H + head] = (m_run[r] + log2f(l_run[r])) * LN2_F;
  }
}
