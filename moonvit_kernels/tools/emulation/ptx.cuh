// ptx.cuh stand-in for the CPU emulation, written from the PTX ISA description (not from the
// kernels). cp.async: the destination holds garbage from the issue until the wait that retires
// the group, when the data lands — so reading a tile before waiting for it, and refilling a
// buffer other warps still read, both show up as wrong results. ldmatrix and mma.sync are warp
// collectives that gather every lane's operands and compute from the PTX fragment tables.
#pragma once
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 || (valid && reinterpret_cast<uintptr_t>(src) % 16)) std::abort();
  std::memset(dst, 0xCD, 16);  // undefined until the wait
  emu::cp_open().push_back({dst, src, valid});
}
__device__ __forceinline__ void cp_async_commit() {
  emu::cp_groups().push_back(std::move(emu::cp_open()));
  emu::cp_open().clear();
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  while ((int)emu::cp_groups().size() > N) {
    for (auto& c : emu::cp_groups().front()) {
      if (c.valid) std::memcpy(c.dst, c.src, 16);
      else std::memset(c.dst, 0, 16);
    }
    emu::cp_groups().erase(emu::cp_groups().begin());
  }
}
inline unsigned short emu_b16(const void* row, int col) {
  unsigned short v;
  std::memcpy(&v, static_cast<const unsigned char*>(row) + 2 * col, 2);
  return v;
}
inline void emu_ldmatrix(unsigned (&r)[4], const void* row, bool trans) {
  if (reinterpret_cast<uintptr_t>(row) % 16) std::abort();
  *emu::slot<const void*>(emu::lane()) = row;
  emu::warp_sync();
  const int l = emu::lane();
  for (int i = 0; i < 4; ++i) {
    unsigned short e[2];
    for (int k = 0; k < 2; ++k) {
      if (!trans)  // lane l: row l/4, columns 2(l%4)+k of matrix i
        e[k] = emu_b16(*emu::slot<const void*>(8 * i + l / 4), 2 * (l % 4) + k);
      else  // transposed: element (row 2(l%4)+k, column l/4)
        e[k] = emu_b16(*emu::slot<const void*>(8 * i + 2 * (l % 4) + k), l / 4);
    }
    r[i] = e[0] | (unsigned(e[1]) << 16);
  }
  emu::warp_sync();
}
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) { emu_ldmatrix(r, p, false); }
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) { emu_ldmatrix(r, p, true); }

struct EmuMma { unsigned a[4]; unsigned b[2]; };
inline float emu_bf(unsigned reg, int half) {
  return __bfloat162float(__nv_bfloat16{static_cast<unsigned short>(half ? reg >> 16 : reg & 0xffff)});
}
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  EmuMma* me = emu::slot<EmuMma>(emu::lane());
  for (int i = 0; i < 4; ++i) me->a[i] = a[i];
  me->b[0] = b0, me->b[1] = b1;
  emu::warp_sync();
  float(*A)[16] = reinterpret_cast<float(*)[16]>(emu::warp_scratch());           // [16][16]
  float(*B)[8] = reinterpret_cast<float(*)[8]>(emu::warp_scratch() + 16 * 16);  // [16][8]
  if (emu::lane() == 0) {  // one lane rebuilds the whole A and B tiles from every lane's fragments
    for (int lane = 0; lane < 32; ++lane) {
      const EmuMma* o = emu::slot<EmuMma>(lane);
      const int g = lane / 4, c = lane % 4;
      for (int i = 0; i < 8; ++i) {  // a_i: row g (+8 for i in {2,3,6,7}), col 2c + (i&1) (+8 for i >= 4)
        const int row = g + 8 * ((i / 2) % 2), col = 2 * c + (i & 1) + 8 * (i / 4);
        A[row][col] = emu_bf(o->a[i / 2], i % 2);
      }
      for (int i = 0; i < 4; ++i)  // b_i: k = 2c + (i&1) (+8 for i >= 2), n = g
        B[2 * c + (i & 1) + 8 * (i / 2)][g] = emu_bf(o->b[i / 2], i % 2);
    }
  }
  emu::warp_sync();
  const int g = emu::lane() / 4, c = emu::lane() % 4;
  for (int i = 0; i < 4; ++i) {  // c_i: row g (+8 for i >= 2), col 2c + (i&1)
    const int row = g + 8 * (i / 2), col = 2 * c + (i & 1);
    float acc = d[i];
    for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];
    d[i] = acc;
  }
  emu::warp_sync();  // the scratch is reused by the next collective
}
