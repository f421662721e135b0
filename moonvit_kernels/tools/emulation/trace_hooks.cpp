// trace_hooks.cpp — address recording for the CPU emulator (linked into a module's traced build,
// build.build_module(..., traced=True); NOT instrumented itself).
//
// The module's unit (its kernels, the launch thunks and the stand-ins) is compiled with GCC's
// -fsanitize=thread, which makes the compiler call __tsan_readN / __tsan_writeN(address) before every
// memory access. No ThreadSanitizer runtime is linked: these hooks are that runtime. Each access made
// by an emulated CUDA thread that falls inside a registered region (a device array, a static
// __shared__ array) or the block's dynamic shared memory is kept as one record: the instruction
// address (mapped to a source line afterwards), region, byte offset, size, load/store, block, thread.
// ldmatrix and cp.async stand-ins report their own accesses (trace_explicit) with the caller's
// file and line, as the hardware sees them: one 16-byte row per lane.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

struct EmuTraceRecord {
  std::uint64_t pc;    // instruction address (0 for explicit records)
  const char* file;    // explicit records: caller's file
  std::int32_t line;   // explicit records: caller's line
  std::int32_t region; // index of the registered region, -1 = dynamic shared memory
  std::int64_t offset; // bytes from the region's start
  std::int32_t size;
  std::int32_t store;
  std::int32_t block;  // linear block index
  std::int32_t thread; // linear thread index in the block
};

namespace {
struct Region {
  std::uintptr_t lo, hi;
};
std::vector<Region> g_regions;
std::vector<EmuTraceRecord> g_records;
bool g_on = false;
long long g_blocks = -1;  // record blocks of linear index below this only (-1: all)

inline bool current(std::int32_t& block, std::int32_t& thread, std::uintptr_t& dyn_lo, std::uintptr_t& dyn_hi) {
  if (!g_on || emu::g_cur == nullptr || emu::g_block == nullptr) return false;
  block = std::int32_t(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
  if (g_blocks >= 0 && block >= g_blocks) return false;
  thread = emu::g_cur->warp * 32 + emu::g_cur->lane;
  auto& dyn = emu::g_block->dyn_smem;
  dyn_lo = reinterpret_cast<std::uintptr_t>(dyn.data());
  dyn_hi = dyn_lo + dyn.size();
  return true;
}

inline void record(const void* addr, int size, int store, std::uint64_t pc, const char* file, int line) {
  std::int32_t block, thread;
  std::uintptr_t dyn_lo, dyn_hi;
  if (!current(block, thread, dyn_lo, dyn_hi)) return;
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  std::int32_t region = -2;
  std::int64_t offset = 0;
  if (a >= dyn_lo && a < dyn_hi) {
    region = -1;
    offset = std::int64_t(a - dyn_lo);
  } else {
    for (std::size_t i = 0; i < g_regions.size(); ++i)
      if (a >= g_regions[i].lo && a < g_regions[i].hi) {
        region = std::int32_t(i);
        offset = std::int64_t(a - g_regions[i].lo);
        break;
      }
  }
  if (region == -2) return;
  g_records.push_back({pc, file, line, region, offset, size, store, block, thread});
}
}  // namespace

#define EMU_PC reinterpret_cast<std::uint64_t>(__builtin_return_address(0))
extern "C" {
// ---- the ThreadSanitizer entry points GCC's instrumentation calls
void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void*, void*) {}
void __tsan_vptr_read(void*) {}
#define EMU_RW(n)                                                                   \
  void __tsan_read##n(void* a) { record(a, n, 0, EMU_PC, nullptr, 0); }             \
  void __tsan_write##n(void* a) { record(a, n, 1, EMU_PC, nullptr, 0); }            \
  void __tsan_unaligned_read##n(void* a) { record(a, n, 0, EMU_PC, nullptr, 0); }   \
  void __tsan_unaligned_write##n(void* a) { record(a, n, 1, EMU_PC, nullptr, 0); }  \
  void __tsan_volatile_read##n(void* a) { record(a, n, 0, EMU_PC, nullptr, 0); }    \
  void __tsan_volatile_write##n(void* a) { record(a, n, 1, EMU_PC, nullptr, 0); }
EMU_RW(1)
EMU_RW(2)
EMU_RW(4)
EMU_RW(8)
EMU_RW(16)
#undef EMU_RW
void __tsan_read_range(void*, unsigned long) {}
void __tsan_write_range(void*, unsigned long) {}
void* __tsan_memcpy(void* d, const void* s, std::size_t n) { return std::memcpy(d, s, n); }
void* __tsan_memmove(void* d, const void* s, std::size_t n) { return std::memmove(d, s, n); }
void* __tsan_memset(void* d, int c, std::size_t n) { return std::memset(d, c, n); }

// ---- explicit records from the ldmatrix / cp.async stand-ins
void emu_trace_explicit(const void* addr, int size, int store, const char* file, int line) {
  record(addr, size, store, 0, file, line);
}

// ---- control from Python (ctypes)
void emu_trace_reset() {
  g_regions.clear();
  g_records.clear();
  g_on = false;
  g_blocks = -1;
}
int emu_trace_region(const void* lo, long long bytes) {
  const auto a = reinterpret_cast<std::uintptr_t>(lo);
  g_regions.push_back({a, a + std::uintptr_t(bytes)});
  return int(g_regions.size() - 1);
}
void emu_trace_blocks(long long below) { g_blocks = below; }
void emu_trace_enable(int on) { g_on = on != 0; }
long long emu_trace_count() { return (long long)g_records.size(); }
int emu_trace_record_size() { return int(sizeof(EmuTraceRecord)); }
void emu_trace_copy(EmuTraceRecord* out) {
  if (!g_records.empty()) std::memcpy(out, g_records.data(), g_records.size() * sizeof(EmuTraceRecord));
}
void* emu_trace_anchor() { return reinterpret_cast<void*>(&emu_trace_anchor); }
}
