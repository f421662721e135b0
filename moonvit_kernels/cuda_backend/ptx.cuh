// ptx.cuh — the few Ampere/Hopper instructions the tensor-core kernels use, as inline PTX
// (sm_80+): asynchronous global->shared copies, ldmatrix, and the bf16 mma.sync.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), with g = lane/4, c = lane%4:
//   A (16x16, row-major) in 4 regs of 2 bf16:  a0: (g, 2c..2c+1)   a1: (g+8, 2c..)
//                                               a2: (g, 2c+8..)     a3: (g+8, 2c+8..)
//   B (16x8, "col": k fastest) in 2 regs:      b0: (k=2c..2c+1, n=g)   b1: (k=2c+8.., n=g)
//   C/D (16x8 fp32) in 4 regs:                 c0,c1: (g, 2c..2c+1)    c2,c3: (g+8, 2c..)
// ldmatrix.x4 loads four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i and
// register i receives matrix i, lane l holding row l/4, columns 2(l%4), 2(l%4)+1 (.trans: the
// transposed matrix).
#pragma once

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Copy 16 bytes global -> shared without blocking; when `valid` is false nothing is read and the
// 16 shared bytes are zero-filled (this is how partial tiles get their zeros).
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem_dst)), "l"(gmem_src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem_row))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem_row))
               : "memory");
}

// region: mma_sync_16x8x16
// d += a·b for one 16x8x16 tile: bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
// endregion
}
