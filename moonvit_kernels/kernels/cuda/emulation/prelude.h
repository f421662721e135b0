// prelude.h — runs the CUDA C kernels of moonvit_kernels on the CPU (force-included by g++).
//
// Execution model: blocks run one after another; each CUDA thread of a block is a std::thread;
// __syncthreads is a barrier over the block; warp collectives (__shfl_*_sync, ldmatrix, mma.sync
// in ptx.cuh) exchange values through a per-warp buffer between two warp barriers. Static
// __shared__ arrays become function statics (one copy, reused by the next block, like real
// shared memory holding stale data); dynamic shared memory is filled with 0xCD garbage.
// cp.async copies are deferred until the wait that retires their group, so a kernel that reads
// a tile before waiting for it sees garbage here too. Not modelled: memory races between
// threads beyond what the barriers order, performance.
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cuda_bf16.h"
using std::max;
using std::min;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};

namespace emu {
constexpr int SLOT_BYTES = 64;  // per-lane exchange space for warp collectives

struct Block {
  std::unique_ptr<std::barrier<>> bar;
  std::vector<std::unique_ptr<std::barrier<>>> warp_bar;
  std::vector<std::vector<unsigned char>> exchange;  // per warp: 32 lanes x SLOT_BYTES
  std::vector<unsigned char> dyn_smem;
};
inline Block* g_block = nullptr;

struct CpAsync {
  void* dst;
  const void* src;
  bool valid;
};
inline thread_local std::vector<std::vector<CpAsync>> t_groups;  // committed, not yet waited for
inline thread_local std::vector<CpAsync> t_open;                  // issued, not yet committed
inline thread_local int t_warp = 0, t_lane = 0;

inline unsigned char* dynamic_smem() { return g_block->dyn_smem.data(); }
inline void warp_sync() { g_block->warp_bar[t_warp]->arrive_and_wait(); }
template <typename T>
inline T* slot(int lane) {
  static_assert(sizeof(T) <= SLOT_BYTES, "exchange slot too small");
  return reinterpret_cast<T*>(g_block->exchange[t_warp].data() + SLOT_BYTES * lane);
}
}  // namespace emu

inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

inline void __syncthreads() { emu::g_block->bar->arrive_and_wait(); }

template <typename T>
inline T __shfl_sync(unsigned, T v, int src_lane) {
  *emu::slot<T>(emu::t_lane) = v;
  emu::warp_sync();
  const T r = *emu::slot<T>(src_lane & 31);
  emu::warp_sync();
  return r;
}
template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  *emu::slot<T>(emu::t_lane) = v;
  emu::warp_sync();
  const T r = *emu::slot<T>((emu::t_lane ^ lane_mask) & 31);
  emu::warp_sync();
  return r;
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}

namespace emu {
// Run `kernel` (a callable taking no arguments) over grid x block; `smem` bytes of dynamic shared memory.
template <typename F>
void launch(dim3 grid, dim3 block, size_t smem, F kernel) {
  gridDim = grid;
  blockDim = block;
  const int nthreads = block.x * block.y * block.z;
  if (nthreads % 32) throw std::runtime_error("block size must be a multiple of 32");
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        Block b;
        b.bar = std::make_unique<std::barrier<>>(nthreads);
        for (int w = 0; w < nthreads / 32; ++w) {
          b.warp_bar.push_back(std::make_unique<std::barrier<>>(32));
          b.exchange.emplace_back(32 * SLOT_BYTES);
        }
        b.dyn_smem.assign(smem, 0xCD);
        g_block = &b;
        std::vector<std::thread> threads;
        for (int t = 0; t < nthreads; ++t)
          threads.emplace_back([&, t] {
            threadIdx = dim3{unsigned(t % block.x), unsigned((t / block.x) % block.y), unsigned(t / (block.x * block.y))};
            blockIdx = dim3{bx, by, bz};
            t_warp = t / 32;
            t_lane = t % 32;
            t_groups.clear();
            t_open.clear();
            kernel();
            for (auto& g : t_groups)
              if (!g.empty()) std::abort();  // the kernel exited with a cp.async never waited for
            if (!t_open.empty()) std::abort();
          });
        for (auto& th : threads) th.join();
        g_block = nullptr;
      }
}
}  // namespace emu
