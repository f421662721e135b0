// driver.cpp — C entry points (ctypes) that launch the CUDA C kernels on the CPU emulator with the
// same grid/block/shared-memory geometry as moonvit_kernels/cuda_backend/launchers.py, for the X-ray's traced
// build (tracing.py, with trace_hooks.cpp); prelude.h is force-included.
#include "gemm_bf16.cu"
#include "gemm_fp32.cu"
#include "attention.cu"
#include "rmsnorm.cu"
#include "rope.cu"
#include "pos_emb.cu"
#include "merge.cu"

template <typename OutT, int EPI>
static void gemm_bf16_launch(const void* A, const void* B, void* C, const void* R, int M, int N, int K, int vec) {
  emu::launch(dim3{unsigned((N + 127) / 128), unsigned((M + 127) / 128), 1}, dim3{256, 1, 1}, 0, [&] {
    gemm_bf16_tc<OutT, EPI>((const bf16*)A, (const bf16*)B, (OutT*)C, (const OutT*)R, M, N, K, vec);
  });
}
template <int EPI>
static void gemm_fp32_launch(const void* A, const void* B, void* C, const void* R, int M, int N, int K, int vec) {
  emu::launch(dim3{unsigned((N + 63) / 64), unsigned((M + 63) / 64), 1}, dim3{256, 1, 1}, 0, [&] {
    gemm_fp32_simt<EPI>((const float*)A, (const float*)B, (float*)C, (const float*)R, M, N, K, vec);
  });
}
template <typename T>
static void dispatch_bf16(int epi, const void* A, const void* B, void* C, const void* R, int M, int N, int K, int vec) {
  switch (epi) {
    case 0: gemm_bf16_launch<T, 0>(A, B, C, R, M, N, K, vec); break;
    case 1: gemm_bf16_launch<T, 1>(A, B, C, R, M, N, K, vec); break;
    case 2: gemm_bf16_launch<T, 2>(A, B, C, R, M, N, K, vec); break;
    case 3: gemm_bf16_launch<T, 3>(A, B, C, R, M, N, K, vec); break;
  }
}
template <int HD>
static void attn_launch(int bf16_, const void* qkv, void* out, float* lse, const int* cu, int nitems, int max_len, int H) {
  const float scale_log2 = (1.0f / std::sqrt((float)HD)) * 1.4426950408889634f;
  if (bf16_) {
    using Cfg = AttnBf16Cfg<HD>;
    emu::launch(dim3{unsigned((max_len + Cfg::BQ - 1) / Cfg::BQ), unsigned(H), unsigned(nitems)}, dim3{Cfg::THREADS, 1, 1},
                Cfg::SMEM_BYTES, [&] { flash_attn_bf16<HD>((const bf16*)qkv, (bf16*)out, lse, cu, H, scale_log2); });
  } else {
    using Cfg = AttnFp32Cfg<HD>;
    emu::launch(dim3{unsigned((max_len + Cfg::BQ - 1) / Cfg::BQ), unsigned(H), unsigned(nitems)}, dim3{Cfg::THREADS, 1, 1},
                Cfg::SMEM_BYTES, [&] { flash_attn_fp32<HD>((const float*)qkv, (float*)out, lse, cu, H, scale_log2); });
  }
}
template <typename I, typename O>
static void rms_launch(const void* x, const float* w, void* y, float* rstd, int rows, int D, float eps) {
  emu::launch(dim3{unsigned(rows), 1, 1}, dim3{256, 1, 1}, 0, [&] { rmsnorm_rows<I, O>((const I*)x, w, (O*)y, rstd, D, eps); });
}
template <typename I, typename O>
static void merge_launch(const void* x, void* out, const int* ms, int M, int D, int kh, int kw) {
  emu::launch(dim3{unsigned(M), 1, 1}, dim3{256, 1, 1}, 0, [&] { tpool_merge<I, O>((const I*)x, (O*)out, ms, D, kh, kw); });
}

extern "C" {
void emu_gemm_bf16(int out_bf16, int epi, const void* A, const void* B, void* C, const void* R, int M, int N, int K, int vec) {
  if (out_bf16) dispatch_bf16<bf16>(epi, A, B, C, R, M, N, K, vec);
  else dispatch_bf16<float>(epi, A, B, C, R, M, N, K, vec);
}
void emu_gemm_fp32(int epi, const void* A, const void* B, void* C, const void* R, int M, int N, int K, int vec) {
  switch (epi) {
    case 0: gemm_fp32_launch<0>(A, B, C, R, M, N, K, vec); break;
    case 1: gemm_fp32_launch<1>(A, B, C, R, M, N, K, vec); break;
    case 2: gemm_fp32_launch<2>(A, B, C, R, M, N, K, vec); break;
    case 3: gemm_fp32_launch<3>(A, B, C, R, M, N, K, vec); break;
  }
}
int emu_attention(int hd, int bf16_, const void* qkv, void* out, float* lse, const int* cu, int nitems, int max_len, int H) {
  switch (hd) {  // the head dims the emulation is built for (HEAD_DIMS in __init__.py)
#define EMU_HD(d) \
  case d:         \
    attn_launch<d>(bf16_, qkv, out, lse, cu, nitems, max_len, H); \
    return 0;
    EMU_HD(8) EMU_HD(16) EMU_HD(24) EMU_HD(40) EMU_HD(64) EMU_HD(128)
#undef EMU_HD
  }
  return 1;
}
void emu_rmsnorm(int in_bf16, int out_bf16, const void* x, const float* w, void* y, float* rstd, int rows, int D, float eps) {
  if (!in_bf16 && !out_bf16) rms_launch<float, float>(x, w, y, rstd, rows, D, eps);
  if (!in_bf16 && out_bf16) rms_launch<float, bf16>(x, w, y, rstd, rows, D, eps);
  if (in_bf16 && !out_bf16) rms_launch<bf16, float>(x, w, y, rstd, rows, D, eps);
  if (in_bf16 && out_bf16) rms_launch<bf16, bf16>(x, w, y, rstd, rows, D, eps);
}
void emu_merge(int in_bf16, int out_bf16, const void* x, void* out, const int* ms, int M, int D, int kh, int kw) {
  if (!in_bf16 && !out_bf16) merge_launch<float, float>(x, out, ms, M, D, kh, kw);
  if (!in_bf16 && out_bf16) merge_launch<float, bf16>(x, out, ms, M, D, kh, kw);
  if (in_bf16 && !out_bf16) merge_launch<bf16, float>(x, out, ms, M, D, kh, kw);
  if (in_bf16 && out_bf16) merge_launch<bf16, bf16>(x, out, ms, M, D, kh, kw);
}
}
