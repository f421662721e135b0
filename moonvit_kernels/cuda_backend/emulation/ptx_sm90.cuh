// ptx_sm90.cuh stand-in for the CPU emulation: the functions of cuda_backend/ptx_sm90.cuh on the
// models of hopper.cuh (written from the PTX ISA, not from the kernels). Kernels using these run
// under emu::hopper::launch_async, which lets threads blocked on an mbarrier or a wgmma park.
#pragma once
#include "hopper.cuh"
#include "sm90.cuh"

#define __grid_constant__
inline unsigned sm90_smem_addr(const void* p) { return emu::hopper::smem_addr(p); }

inline void mbar_init(unsigned long long* bar, unsigned count) { emu::hopper::mbar_init(sm90_smem_addr(bar), count); }
inline void fence_mbarrier_init() {}
inline void mbar_arrive(unsigned long long* bar) { emu::hopper::mbar_arrive(sm90_smem_addr(bar)); }
inline void mbar_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
  emu::hopper::mbar_expect_tx(sm90_smem_addr(bar), bytes);
  emu::hopper::mbar_arrive(sm90_smem_addr(bar));
}
inline bool mbar_try_wait(unsigned long long* bar, unsigned parity) {
  return emu::hopper::mbar_try_wait_parity(sm90_smem_addr(bar), parity);
}
inline void mbar_wait(unsigned long long* bar, unsigned parity) {
  while (!mbar_try_wait(bar, parity)) emu::hopper::park();
}

inline void tma_load_2d(void* dst, const TmaMap* map, int c0, int c1, unsigned long long* bar) {
  emu::hopper::tma_load_2d(sm90_smem_addr(dst), map, c0, c1, sm90_smem_addr(bar));
}
inline void tma_load_3d(void* dst, const TmaMap* map, int c0, int c1, int c2, unsigned long long* bar) {
  const int c[3] = {c0, c1, c2};
  emu::hopper::tma_load(sm90_smem_addr(dst), map, 3, c, sm90_smem_addr(bar));
}
inline void tma_prefetch_map(const TmaMap* map) { emu::hopper::read_map(map); }
inline void fence_proxy_async() {}

inline void wgmma_fence() { emu::hopper::wgmma_fence(); }
inline void wgmma_commit() { emu::hopper::wgmma_commit(); }
template <int N>
inline void wgmma_wait() {
  emu::hopper::wgmma_wait(N);
}
template <int R>
inline void wgmma_fence_operands(float (&)[R]) {}
inline void wgmma_m64n128k16_ss(float (&d)[64], unsigned long long desc_a, unsigned long long desc_b, int scale_d) {
  emu::hopper::wgmma_issue(d, 128, desc_a, desc_b, scale_d != 0);
}

inline void wgmma_m64n256k16_ss(float (&d)[128], unsigned long long desc_a, unsigned long long desc_b, int scale_d) {
  emu::hopper::wgmma_issue(d, 256, desc_a, desc_b, scale_d != 0);
}
inline void wgmma_m64n64k16_ss(float (&d)[32], unsigned long long desc_a, unsigned long long desc_b, int scale_d) {
  emu::hopper::wgmma_issue(d, 64, desc_a, desc_b, scale_d != 0);
}
inline void wgmma_m64n64k16_rs(float (&d)[32], const unsigned (&a)[4], unsigned long long desc_b, int scale_d) {
  emu::hopper::wgmma_issue(d, 64, 0, desc_b, scale_d != 0, a);
}
inline void wgmma_m64n128k16_rs(float (&d)[64], const unsigned (&a)[4], unsigned long long desc_b, int scale_d) {
  emu::hopper::wgmma_issue(d, 128, 0, desc_b, scale_d != 0, a);
}

template <int REGS>
inline void setmaxnreg_inc() {
  emu::hopper::setmaxnreg(REGS, true);
}
template <int REGS>
inline void setmaxnreg_dec() {
  emu::hopper::setmaxnreg(REGS, false);
}
