// ptx_sm90.cuh stand-in for the CPU emulation: the functions of cuda_backend/ptx_sm90.cuh on the
// models of hopper.cuh (written from the PTX ISA, not from the kernels). Kernels using these run
// under emu::hopper::launch_async, which lets threads blocked on an mbarrier or a wgmma park.
#pragma once
#include "hopper.cuh"
#include "sm90.cuh"

#define __grid_constant__
// Dynamic shared memory is the emulated block's window, starting at hopper.cuh's SMEM_BASE (1024-aligned).
#define SM90_DYNAMIC_SMEM(name) unsigned char* name = emu::dynamic_smem()
inline unsigned sm90_smem_addr(const void* p) { return emu::hopper::smem_addr(p); }

// Each instruction that the hardware rules of hopper.cuh concern takes its caller's file:line (EMU_SITE_ARG)
// for the messages.
inline void mbar_init(unsigned long long* bar, unsigned count, EMU_SITE_ARG) {
  emu::hopper::mbar_init(sm90_smem_addr(bar), count, site);
}
inline void fence_mbarrier_init() { emu::hopper::fence_mbarrier_init(); }
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

inline void tma_load_2d(void* dst, const TmaMap* map, int c0, int c1, unsigned long long* bar, EMU_SITE_ARG) {
  emu::hopper::tma_load_2d(sm90_smem_addr(dst), map, c0, c1, sm90_smem_addr(bar), site);
}
inline void tma_load_3d(void* dst, const TmaMap* map, int c0, int c1, int c2, unsigned long long* bar, EMU_SITE_ARG) {
  const int c[3] = {c0, c1, c2};
  emu::hopper::tma_load(sm90_smem_addr(dst), map, 3, c, sm90_smem_addr(bar), site);
}
inline void tma_prefetch_map(const TmaMap* map) { emu::hopper::read_map(map); }
inline void fence_proxy_async() { emu::hopper::fence_proxy_async(); }

inline void wgmma_fence() { emu::hopper::wgmma_fence(); }
inline void wgmma_commit() { emu::hopper::wgmma_commit(); }
template <int N>
inline void wgmma_wait() {
  emu::hopper::wgmma_wait(N);
}
template <int R>
inline void wgmma_fence_operands(float (&)[R]) {}
inline void wgmma_m64n128k16_ss(float (&d)[64], unsigned long long desc_a, unsigned long long desc_b, int scale_d,
                                EMU_SITE_ARG) {
  emu::hopper::wgmma_issue(d, 128, desc_a, desc_b, scale_d != 0, nullptr, site);
}
inline void wgmma_m64n256k16_ss(float (&d)[128], unsigned long long desc_a, unsigned long long desc_b, int scale_d,
                                EMU_SITE_ARG) {
  emu::hopper::wgmma_issue(d, 256, desc_a, desc_b, scale_d != 0, nullptr, site);
}
inline void wgmma_m64n64k16_ss(float (&d)[32], unsigned long long desc_a, unsigned long long desc_b, int scale_d,
                               EMU_SITE_ARG) {
  emu::hopper::wgmma_issue(d, 64, desc_a, desc_b, scale_d != 0, nullptr, site);
}
inline void wgmma_m64n64k16_rs(float (&d)[32], const unsigned (&a)[4], unsigned long long desc_b, int scale_d,
                               EMU_SITE_ARG) {
  emu::hopper::wgmma_issue(d, 64, 0, desc_b, scale_d != 0, a, site);
}
inline void wgmma_m64n128k16_rs(float (&d)[64], const unsigned (&a)[4], unsigned long long desc_b, int scale_d,
                                EMU_SITE_ARG) {
  emu::hopper::wgmma_issue(d, 128, 0, desc_b, scale_d != 0, a, site);
}

template <int REGS>
inline void setmaxnreg_inc() {
  emu::hopper::setmaxnreg(REGS, true);
}
template <int REGS>
inline void setmaxnreg_dec() {
  emu::hopper::setmaxnreg(REGS, false);
}
