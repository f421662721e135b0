// prelude.h — runs the CUDA C kernels of moonvit_kernels on the CPU (force-included by g++).
//
// Execution model: blocks run one after another; the CUDA threads of a block are cooperative
// fibers (ucontext) on one OS thread. A fiber runs until it reaches a barrier: __syncthreads
// (the block) or a warp collective (__shfl_*_sync, and ldmatrix / mma.sync in ptx.cuh, which
// exchange operands through a per-warp buffer between two warp barriers). The scheduler runs one
// warp at a time as far as it can go — to its next __syncthreads — before the next warp starts,
// warps in alternating order (0..last, then last..0) from one block barrier to the next, lanes
// in alternating order within a warp. So warps drift as far apart as the barriers allow, and a
// read that no barrier orders after another thread's write tends to see the wrong value.
// `emu_set_thread_order(1)` runs the next launches in the opposite order: warps and lanes start from the
// other end and blocks run last to first; a correct kernel's output does not change, a racy one's does.
// Static __shared__ arrays become function statics (stale from the previous block, like real
// shared memory); dynamic shared memory starts as 0xCD garbage. Hardware's rules are enforced (the macros at
// the end record each call's __FILE__:__LINE__): the live threads of a block must wait at the same __syncthreads
// (threads that exited do not count), and a shuffle or vote's mask must name exactly lanes that execute it with
// that mask — each violation aborts the launch naming the intrinsic and its line(s). cp.async copies are deferred
// until the wait that retires their group. Not modelled: speed, the device's exact maths.
// Denormals: the kernels are compiled with -ftz=true (sources.compile_options, as CuPy does), so
// fp32 arithmetic reads and writes subnormals as signed zero; a launch sets the CPU's
// flush-to-zero and denormals-are-zero modes (x86 MXCSR FTZ|DAZ, AArch64 FPCR.FZ) for its fibers
// and restores them afterwards (each fiber's context inherits them from getcontext).
#pragma once
#include <ucontext.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <vector>

#include "cuda_bf16.h"
using std::max;
using std::min;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
inline dim3 threadIdx, blockIdx, blockDim, gridDim;  // threadIdx is switched with the running fiber

namespace emu {
constexpr int SLOT_BYTES = 64;          // per-lane exchange space for warp collectives
constexpr size_t STACK_BYTES = 1 << 17;  // per emulated thread

struct CpAsync {
  void* dst;
  const void* src;
  bool valid;
};
enum Wait { RUNNABLE, AT_BLOCK_BARRIER, AT_WARP_BARRIER, DONE };

// Where a thread waits: the intrinsic and its source line (__FILE__/__LINE__ of the call, through the macros
// at the end of this file). `what` is null when the thread is in no barrier or shuffle/vote these record.
struct Site {
  const char* what = nullptr;
  const char* file = "";
  int line = 0;
};
inline const char* base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}
inline bool same_site(const Site& a, const Site& b) {
  return a.what && b.what && a.line == b.line && std::strcmp(a.what, b.what) == 0 && std::strcmp(a.file, b.file) == 0;
}

struct Fiber {
  ucontext_t ctx;
  std::unique_ptr<char[]> stack;  // uninitialised: only the pages a thread touches are committed
  dim3 tid;
  int warp = 0, lane = 0;
  Wait state = RUNNABLE;
  Site site;          // the __syncthreads / warp shuffle or vote this thread waits at
  unsigned mask = 0;  // the member mask of its warp shuffle or vote
  std::vector<std::vector<CpAsync>> groups;  // committed cp.async groups, not yet waited for
  std::vector<CpAsync> open;                 // issued, not yet committed
};

struct Block {
  std::vector<Fiber> fibers;
  std::vector<std::vector<unsigned char>> exchange;  // per warp: 32 lanes x SLOT_BYTES
  std::vector<std::vector<float>> scratch;           // per warp: operands a collective decoded once
  std::vector<unsigned char> dyn_smem;
};
inline Block* g_block = nullptr;
inline Fiber* g_cur = nullptr;
inline ucontext_t g_scheduler;
inline std::function<void()>* g_kernel = nullptr;
inline int g_reversed = 0;  // 1: warps, lanes and blocks in the opposite order (emu_set_thread_order)

inline unsigned char* dynamic_smem() { return g_block->dyn_smem.data(); }
inline int lane() { return g_cur->lane; }
inline void wait_at(Wait w) {
  g_cur->state = w;
  swapcontext(&g_cur->ctx, &g_scheduler);
}
inline void warp_sync() { wait_at(AT_WARP_BARRIER); }
template <typename T>
inline T* slot(int lane_id) {
  static_assert(sizeof(T) <= SLOT_BYTES, "exchange slot too small");
  return reinterpret_cast<T*>(g_block->exchange[g_cur->warp].data() + SLOT_BYTES * lane_id);
}
inline float* warp_scratch() { return g_block->scratch[g_cur->warp].data(); }
inline std::vector<std::vector<CpAsync>>& cp_groups() { return g_cur->groups; }
inline std::vector<CpAsync>& cp_open() { return g_cur->open; }

inline void fiber_entry() {
  (*g_kernel)();
  for (auto& g : g_cur->groups)
    if (!g.empty()) {
      std::fprintf(stderr, "emulation: a thread exited with a cp.async group never waited for\n");
      std::abort();
    }
  if (!g_cur->open.empty()) std::abort();
  g_cur->state = DONE;  // returning switches to uc_link = the scheduler
}

// Flush-to-zero for the lifetime of the object (what -ftz=true does on the GPU); a no-op elsewhere.
struct FlushDenormals {
#if defined(__x86_64__) || defined(__i386__)
  unsigned saved = _mm_getcsr();
  FlushDenormals() { _mm_setcsr(saved | 0x8040u); }  // FTZ (bit 15) | DAZ (bit 6)
  ~FlushDenormals() { _mm_setcsr(saved); }
#elif defined(__aarch64__)
  unsigned long saved = fpcr();
  static unsigned long fpcr() {
    unsigned long v;
    asm volatile("mrs %0, fpcr" : "=r"(v));
    return v;
  }
  FlushDenormals() { asm volatile("msr fpcr, %0" ::"r"(saved | (1ul << 24))); }  // FZ
  ~FlushDenormals() { asm volatile("msr fpcr, %0" ::"r"(saved)); }
#endif
};

inline void deadlock(const char* why) {
  std::fprintf(stderr, "emulation: deadlock: %s\n", why);
  std::abort();
}

// Before a block barrier opens: every live thread must wait at the same __syncthreads (hardware requires it;
// a barrier inside divergent code is undefined behaviour, commonly a hang). Threads that exited do not count.
inline void check_block_barrier(Block& b) {
  const Fiber* first = nullptr;
  for (const Fiber& f : b.fibers) {
    if (f.state != AT_BLOCK_BARRIER) continue;
    if (!first) {
      first = &f;
    } else if (!same_site(first->site, f.site)) {
      std::fprintf(stderr,
                   "emulation: divergent barrier: thread (%u, %u, %u) waits at %s at %s:%d while thread (%u, %u, %u) "
                   "waits at %s at %s:%d; every thread of a block that has not exited must reach the same "
                   "__syncthreads (on a GPU this is undefined behaviour, commonly a hang)\n",
                   f.tid.x, f.tid.y, f.tid.z, f.site.what ? f.site.what : "a barrier", base_name(f.site.file),
                   f.site.line, first->tid.x, first->tid.y, first->tid.z,
                   first->site.what ? first->site.what : "a barrier", base_name(first->site.file), first->site.line);
      std::abort();
    }
  }
}

// Inside a warp shuffle or vote, once its warp barrier opened (every live lane of the warp is in a collective):
// the running lane's mask must name itself and only lanes that execute the same intrinsic with the same mask.
// A lane named in the mask that has exited, or waits elsewhere, is an error, as is a lane left out of its own mask.
inline void check_warp_mask() {
  const Fiber& me = *g_cur;
  const Site& s = me.site;
  auto fail = [&](const char* why, int other, const char* detail) {
    std::fprintf(stderr,
                 "emulation: bad warp mask: %s(0x%08x, ...) at %s:%d, executed by lane %d of warp %d (block thread "
                 "(%u, %u, %u)): %s lane %d%s; every lane a shuffle or vote names must execute it with the same "
                 "mask, and every lane that executes it must be named\n",
                 s.what, me.mask, base_name(s.file), s.line, me.lane, me.warp, me.tid.x, me.tid.y, me.tid.z, why, other,
                 detail);
    std::abort();
  };
  if (!(me.mask >> me.lane & 1u)) fail("the mask leaves out", me.lane, ", which executes it");
  for (int l = 0; l < 32; ++l) {
    if (!(me.mask >> l & 1u) || l == me.lane) continue;
    const Fiber& o = g_block->fibers[32 * me.warp + l];
    if (o.state == DONE) fail("the mask names", l, ", which has exited");
    if (!o.site.what || std::strcmp(o.site.what, s.what) != 0) {
      char where[256];
      std::snprintf(where, sizeof where, ", which waits at %s at %s:%d instead",
                    o.site.what ? o.site.what : "another warp collective", base_name(o.site.file), o.site.line);
      fail("the mask names", l, where);
    }
    if (o.mask != me.mask) {
      char other[64];
      std::snprintf(other, sizeof other, ", which executes it with mask 0x%08x", o.mask);
      fail("the mask names", l, other);
    }
  }
}

// Run the 32 threads of warp `w` (lanes in alternating order, warp barriers released as they
// fill) until each one waits at __syncthreads or has exited. Warps run one after another,
// as far apart as the block barriers allow.
inline void run_warp_to_block_barrier(Block& b, int w) {
  for (int round = 0;; ++round) {
    bool ran = false;
    for (int i = 0; i < 32; ++i) {
      Fiber& f = b.fibers[32 * w + ((round + g_reversed) % 2 ? 31 - i : i)];
      if (f.state != RUNNABLE) continue;
      g_cur = &f;
      threadIdx = f.tid;
      swapcontext(&g_scheduler, &f.ctx);
      ran = true;
    }
    g_cur = nullptr;
    int live = 0, at_warp = 0;
    for (int l = 0; l < 32; ++l) {
      const Wait s = b.fibers[32 * w + l].state;
      live += s != DONE, at_warp += s == AT_WARP_BARRIER;
    }
    if (at_warp > 0 && at_warp == live) {
      for (int l = 0; l < 32; ++l)
        if (b.fibers[32 * w + l].state == AT_WARP_BARRIER) b.fibers[32 * w + l].state = RUNNABLE;
      continue;
    }
      if (at_warp > 0 && !ran) {
      // Every live lane waits somewhere. A shuffle or vote may run on part of a warp (its mask says which
      // lanes); it opens, and each lane checks its mask. A ldmatrix / mma.sync needs the whole warp.
      bool masked = true;
      for (int l = 0; l < 32; ++l) {
        const Fiber& f = b.fibers[32 * w + l];
        masked &= f.state != AT_WARP_BARRIER || f.site.what != nullptr;
      }
      if (masked) {
        for (int l = 0; l < 32; ++l)
          if (b.fibers[32 * w + l].state == AT_WARP_BARRIER) b.fibers[32 * w + l].state = RUNNABLE;
        continue;
      }
      std::fprintf(stderr, "emulation: in warp %d:", w);
      for (int l = 0; l < 32; ++l) {
        const Fiber& f = b.fibers[32 * w + l];
        if (f.state != DONE && (l == 0 || !same_site(f.site, b.fibers[32 * w + l - 1].site)))
          std::fprintf(stderr, " lane %d waits at %s at %s:%d;", l, f.site.what ? f.site.what : "a warp collective",
                       base_name(f.site.file), f.site.line);
      }
      std::fprintf(stderr, "\n");
      deadlock("threads of one warp wait at different barriers");
    }
    if (!ran) return;
  }
}

// Run `kernel` (a callable taking no arguments) over grid x block with `smem` bytes of dynamic shared memory.
template <typename F>
void launch(dim3 grid, dim3 block, size_t smem, F kernel) {
  gridDim = grid;
  blockDim = block;
  const int n = block.x * block.y * block.z;
  if (n % 32) throw std::runtime_error("block size must be a multiple of 32");
  std::function<void()> k = kernel;
  g_kernel = &k;
  const FlushDenormals ftz;
  Block b;
  b.fibers.resize(n);
  b.exchange.assign(n / 32, std::vector<unsigned char>(32 * SLOT_BYTES));
  b.scratch.assign(n / 32, std::vector<float>(16 * 16 + 16 * 8));
  for (int t = 0; t < n; ++t) {
    b.fibers[t].stack.reset(new char[STACK_BYTES]);
    b.fibers[t].tid = dim3{unsigned(t % block.x), unsigned((t / block.x) % block.y), unsigned(t / (block.x * block.y))};
    b.fibers[t].warp = t / 32;
    b.fibers[t].lane = t % 32;
  }
  g_block = &b;
  const unsigned long long blocks = 1ull * grid.x * grid.y * grid.z;
  for (unsigned long long i = 0; i < blocks; ++i) {
    const unsigned long long linear = g_reversed ? blocks - 1 - i : i;
    blockIdx = dim3{unsigned(linear % grid.x), unsigned(linear / grid.x % grid.y),
                    unsigned(linear / (1ull * grid.x * grid.y))};
    b.dyn_smem.assign(smem, 0xCD);
    for (auto& f : b.fibers) {
      f.state = RUNNABLE;
      f.groups.clear();
      f.open.clear();
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack.get();
      f.ctx.uc_stack.ss_size = STACK_BYTES;
      f.ctx.uc_link = &g_scheduler;
      makecontext(&f.ctx, fiber_entry, 0);
    }
    for (int phase = 0;; ++phase) {  // a phase ends when every live thread waits at __syncthreads
      for (int wi = 0; wi < n / 32; ++wi) {
        const int w = (phase + g_reversed) % 2 ? n / 32 - 1 - wi : wi;
        run_warp_to_block_barrier(b, w);
      }
      int live = 0, at_block = 0;
      for (auto& f : b.fibers) live += f.state != DONE, at_block += f.state == AT_BLOCK_BARRIER;
      if (live == 0) break;
      if (at_block != live) deadlock("a warp waits at a warp collective that some of its threads never reach");
      check_block_barrier(b);
      for (auto& f : b.fibers)
        if (f.state == AT_BLOCK_BARRIER) f.state = RUNNABLE;
    }
  }
  g_block = nullptr;
  g_kernel = nullptr;
}
}  // namespace emu

// The order of the next launches: 0 as described at the top, 1 the opposite (emitted in every library).
extern "C" __attribute__((used, visibility("default"))) inline void emu_set_thread_order(int reversed) {
  emu::g_reversed = reversed ? 1 : 0;
}

namespace emu {
inline void syncthreads_at(Site s) {
  g_cur->site = s;
  wait_at(AT_BLOCK_BARRIER);
  g_cur->site = Site{};
}
// A shuffle or vote passes two warp barriers: after the first (exchanged), every lane has published its value,
// site and mask, and the running lane's mask is checked; after the second (finish), every lane has read what
// it needs, so the exchange slots may be reused.
inline void begin_collective(Site s, unsigned mask) {
  g_cur->site = s;
  g_cur->mask = mask;
}
inline void exchanged() {
  warp_sync();
  check_warp_mask();
}
inline void finish_collective() {
  warp_sync();
  g_cur->site = Site{};
}
template <typename T>
inline T shfl_sync(Site s, unsigned mask, T v, int src_lane) {
  begin_collective(s, mask);
  *slot<T>(lane()) = v;
  exchanged();
  const T r = *slot<T>(src_lane & 31);
  finish_collective();
  return r;
}
template <typename T>
inline T shfl_xor_sync(Site s, unsigned mask, T v, int lane_mask) {
  begin_collective(s, mask);
  *slot<T>(lane()) = v;
  exchanged();
  const T r = *slot<T>((lane() ^ lane_mask) & 31);
  finish_collective();
  return r;
}
template <typename T>
inline T shfl_down_sync(Site s, unsigned mask, T v, unsigned delta) {  // width 32: lanes past 31 keep their value
  begin_collective(s, mask);
  *slot<T>(lane()) = v;
  exchanged();
  const T r = lane() + delta < 32 ? *slot<T>(lane() + delta) : v;
  finish_collective();
  return r;
}
template <typename T>
inline T shfl_up_sync(Site s, unsigned mask, T v, unsigned delta) {  // lanes below delta keep their value
  begin_collective(s, mask);
  *slot<T>(lane()) = v;
  exchanged();
  const T r = unsigned(lane()) >= delta ? *slot<T>(lane() - delta) : v;
  finish_collective();
  return r;
}
inline unsigned ballot_sync(Site s, unsigned mask, int pred) {
  begin_collective(s, mask);
  *slot<int>(lane()) = pred != 0;
  exchanged();
  unsigned r = 0;
  for (int l = 0; l < 32; ++l)
    if (mask >> l & 1u && *slot<int>(l)) r |= 1u << l;
  finish_collective();
  return r;
}
inline void syncwarp(Site s, unsigned mask = 0xffffffffu) {
  begin_collective(s, mask);
  exchanged();
  finish_collective();
}
}  // namespace emu

// Each barrier, shuffle and vote records its call site, so a divergent barrier or a wrong member mask fails the
// launch naming the intrinsic and its line.
#define EMU_SITE(what) (emu::Site{what, __FILE__, __LINE__})
#define __syncthreads() emu::syncthreads_at(EMU_SITE("__syncthreads"))
#define __shfl_sync(mask, ...) emu::shfl_sync(EMU_SITE("__shfl_sync"), mask, __VA_ARGS__)
#define __shfl_xor_sync(mask, ...) emu::shfl_xor_sync(EMU_SITE("__shfl_xor_sync"), mask, __VA_ARGS__)
#define __shfl_down_sync(mask, ...) emu::shfl_down_sync(EMU_SITE("__shfl_down_sync"), mask, __VA_ARGS__)
#define __shfl_up_sync(mask, ...) emu::shfl_up_sync(EMU_SITE("__shfl_up_sync"), mask, __VA_ARGS__)
#define __ballot_sync(mask, pred) emu::ballot_sync(EMU_SITE("__ballot_sync"), mask, pred)
#define __any_sync(mask, pred) (emu::ballot_sync(EMU_SITE("__any_sync"), mask, pred) != 0u)
#define __all_sync(mask, pred) (emu::ballot_sync(EMU_SITE("__all_sync"), mask, pred) == (mask))
#define __syncwarp(...) emu::syncwarp(EMU_SITE("__syncwarp") __VA_OPT__(, ) __VA_ARGS__)
// __trap() ends the launch with an error on a GPU; here it aborts (the launch's child, see device.py).
[[noreturn]] inline void __trap() {
  std::fprintf(stderr, "emulation: __trap() called\n");
  std::abort();
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
