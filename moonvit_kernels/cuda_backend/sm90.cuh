// sm90.cuh — plain C++ pieces of the Hopper (sm_90a) kernels that are not instructions:
// the tensor-map object the kernels receive, and the encoding of wgmma's shared-memory matrix
// descriptor. Shared verbatim by the GPU build and the CPU emulator (which decodes what this encodes).
#pragma once

// A tensor map (CUtensorMap, built on the host by cuTensorMapEncodeTiled): 128 opaque bytes,
// 64-byte aligned, passed to the kernel by value as a `const __grid_constant__` parameter.
struct __align__(64) TmaMap {
  unsigned long long opaque[16];
};

// Swizzle modes as the descriptor's bits 62..63 spell them (PTX ISA, "Matrix Descriptor Format").
#define WGMMA_SWIZZLE_NONE 0
#define WGMMA_SWIZZLE_128B 1
#define WGMMA_SWIZZLE_64B 2
#define WGMMA_SWIZZLE_32B 3

// region: smem_descriptor
// The 64-bit shared-memory matrix descriptor of wgmma.mma_async (PTX ISA, "Matrix Descriptor Format"):
//   bits  0..13  start address            (shared address >> 4, 18 address bits)
//   bits 16..29  leading-dimension byte offset >> 4
//   bits 32..45  stride-dimension byte offset >> 4
//   bits 49..51  matrix base offset (0: the swizzle pattern starts at a pattern-aligned address)
//   bits 62..63  swizzle mode (WGMMA_SWIZZLE_*)
// For K-major operands: SBO = bytes between consecutive groups of 8 rows (M or N); LBO = bytes between
// the two 8-element K halves of a k16 slice without swizzling (unused, conventionally 1, when swizzled).
__device__ __forceinline__ unsigned long long wgmma_desc(unsigned smem_addr, unsigned lbo_bytes, unsigned sbo_bytes,
                                                         int swizzle_mode) {
  return (unsigned long long)((smem_addr & 0x3FFFFu) >> 4) | ((unsigned long long)((lbo_bytes >> 4) & 0x3FFFu) << 16) |
         ((unsigned long long)((sbo_bytes >> 4) & 0x3FFFu) << 32) | ((unsigned long long)(swizzle_mode & 3) << 62);
}
// endregion
