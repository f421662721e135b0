// Solution of exercise "mma_fragments" (notebook 04): C = A·Bᵀ, one warp per 16×8 tile, mma.sync.m16n8k16.
// A [M, K] and B [N, K] are bf16 bit patterns (K a multiple of 16), C [M, N] float32.
#include "ptx.cuh"

// Two bf16 values of one row, at columns k and k + 1, packed as mma wants them (lower k in the low half);
// zero outside the matrix.
__device__ unsigned pair(const unsigned short* X, int rows, int K, int r, int k) {
  if (r >= rows) return 0u;
  return (unsigned)X[(long long)r * K + k] | ((unsigned)X[(long long)r * K + k + 1] << 16);
}

extern "C" __global__ void mma_fragments(const unsigned short* A, const unsigned short* B, float* C, int M, int N,
                                         int K) {
  const int lane = threadIdx.x;
  const int g = lane / 4, c = lane % 4;  // the fragment tables' group and thread-in-group
  const int m0 = blockIdx.y * 16, n0 = blockIdx.x * 8;
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int k0 = 0; k0 < K; k0 += 16) {
    unsigned a[4];
    a[0] = pair(A, M, K, m0 + g, k0 + 2 * c);
    a[1] = pair(A, M, K, m0 + g + 8, k0 + 2 * c);
    a[2] = pair(A, M, K, m0 + g, k0 + 2 * c + 8);
    a[3] = pair(A, M, K, m0 + g + 8, k0 + 2 * c + 8);
    const unsigned b0 = pair(B, N, K, n0 + g, k0 + 2 * c);
    const unsigned b1 = pair(B, N, K, n0 + g, k0 + 2 * c + 8);
    mma_bf16_16816(d, a, b0, b1);
  }
  const int rows[2] = {m0 + g, m0 + g + 8};
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 2; ++j) {
      const int m = rows[h], n = n0 + 2 * c + j;
      if (m < M && n < N) C[(long long)m * N + n] = d[2 * h + j];
    }
}
