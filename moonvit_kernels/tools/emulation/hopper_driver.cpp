// hopper_driver.cpp — small probes (ctypes) that expose each model of hopper.cuh on its own for the
// layout tests (descriptor bits, swizzle, K-major addressing, bulk tensor copies, mbarrier phases, the
// wgmma accumulator fragment, setmaxnreg). Built by emulation/hopper.py with prelude.h force-included.
#include "ptx_sm90.cuh"
#include "sm90.cuh"

namespace hx = emu::hopper;

namespace {
// Shared memory of the probes: a 1024-byte-aligned region (dynamic shared memory already is one).
unsigned char* aligned_smem() {
  unsigned char* raw = emu::dynamic_smem();
  return raw + ((1024u - (hx::smem_addr(raw) & 1023u)) & 1023u);
}
}  // namespace

extern "C" {
// ---------------------------------------------------------------- pure functions
unsigned long long hop_desc_encode(unsigned addr, unsigned lbo, unsigned sbo, int mode) {
  return wgmma_desc(addr, lbo, sbo, mode);  // the kernels' encoder (sm90.cuh)
}
void hop_desc_decode(unsigned long long d, unsigned* out5) {  // start, lbo, sbo, base offset, mode
  const hx::SmemDesc s = hx::decode_desc(d);
  out5[0] = s.start, out5[1] = s.lbo, out5[2] = s.sbo, out5[3] = s.base_offset, out5[4] = unsigned(s.mode);
}
unsigned hop_swizzle(unsigned addr, int span) { return hx::swizzle(addr, span); }
unsigned hop_kmajor_addr(unsigned long long d, int mn, int k) { return hx::kmajor_addr(hx::decode_desc(d), mn, k); }
int hop_encode_tiled(void* out128, unsigned esize, unsigned rank, const void* g, const unsigned long long* dims,
                     const unsigned long long* strides, const unsigned* box, int span, int oob_nan, char* why,
                     int why_len) {
  std::string w;
  const int rc = hx::encode_tiled(out128, esize, rank, g, reinterpret_cast<const uint64_t*>(dims),
                                  reinterpret_cast<const uint64_t*>(strides), box, span, oob_nan, &w);
  std::snprintf(why, why_len, "%s", w.c_str());
  return rc;
}

// ---------------------------------------------------------------- bulk tensor copy
// One 2-D box load of a 16-bit tensor [rows][cols] (row pitch `pitch` bytes) at (c0, c1), box
// box0 x box1, swizzle span, into a 1024-aligned shared buffer (+ dst_off). Returns in out_raw the
// box's shared bytes as they land (not unswizzled), in before_raw the same bytes between the issue
// and the wait, and in state[0..2] the barrier's tx-count before the wait (no data landed yet),
// try_wait.parity(0) and try_wait.parity(1) after the wait.
int hop_tma_probe(const void* g, unsigned long long rows, unsigned long long cols, unsigned long long pitch,
                  unsigned box0, unsigned box1, int span, int oob_nan, int c0, int c1, unsigned dst_off,
                  void* out_raw, void* before_raw, int* state) {
  TmaMap map;
  std::string why;
  const uint64_t dims[2] = {cols, rows}, strides[1] = {pitch};
  const uint32_t box[2] = {box0, box1};
  if (hx::encode_tiled(&map, 2, 2, g, dims, strides, box, span, oob_nan, &why)) {
    std::fprintf(stderr, "emulation (hopper): cuTensorMapEncodeTiled: %s\n", why.c_str());
    return 1;
  }
  const size_t bytes = size_t(box0) * box1 * 2;
  hx::launch_async(dim3{1, 1, 1}, dim3{128, 1, 1}, 1024 + dst_off + bytes + 64, 168, [&] {
    unsigned char* s = aligned_smem();
    auto* bar = reinterpret_cast<unsigned long long*>(s + ((dst_off + bytes + 7) / 8) * 8);
    if (threadIdx.x == 0) {
      mbar_init(bar, 1);
      fence_mbarrier_init();
      mbar_arrive_expect_tx(bar, unsigned(bytes));
      tma_load_2d(s + dst_off, &map, c0, c1, bar);
      std::memcpy(before_raw, s + dst_off, bytes);
      state[0] = int(hx::g_state->bars[hx::smem_addr(bar)].tx);  // bytes expected, none landed yet
      mbar_wait(bar, 0);
      std::memcpy(out_raw, s + dst_off, bytes);
      state[1] = mbar_try_wait(bar, 0);
      state[2] = mbar_try_wait(bar, 1);
    }
  });
  return 0;
}

// ---------------------------------------------------------------- mbarrier
// Thread 0 runs a script of (op, arg) pairs on one barrier: 0 init(arg), 1 arrive, 2 expect_tx(arg),
// 3 complete_tx(arg), 4 try_wait.parity(arg) -> results[r++], 5 arrive.expect_tx(arg).
void hop_mbar_script(const int* ops, const int* args, int n, int* results) {
  hx::launch_async(dim3{1, 1, 1}, dim3{128, 1, 1}, 1024 + 64, 168, [&] {
    if (threadIdx.x != 0) return;
    auto* bar = reinterpret_cast<unsigned long long*>(aligned_smem());
    const unsigned a = hx::smem_addr(bar);
    int r = 0;
    for (int i = 0; i < n; ++i) {
      switch (ops[i]) {
        case 0: hx::mbar_init(a, unsigned(args[i])); break;
        case 1: hx::mbar_arrive(a); break;
        case 2: hx::mbar_expect_tx(a, unsigned(args[i])); break;
        case 3: hx::mbar_complete_tx(a, unsigned(args[i])); break;
        case 4: results[r++] = hx::mbar_try_wait_parity(a, unsigned(args[i])); break;
        case 5: mbar_arrive_expect_tx(bar, unsigned(args[i])); break;
      }
    }
  });
}
// A bulk tensor copy by thread 0 (after a __syncthreads) into the first 1024 bytes of shared memory,
// completing on a barrier thread 0 initialised. `how`: 0 no fence after the init, 1 fence.mbarrier_init,
// 2 fence.proxy.async, 3 fence.mbarrier_init by thread 1 (not the initialiser), 4 fence.mbarrier_init
// before the init; 5 fence.mbarrier_init, and thread 0 first stores into the copy's destination with no
// fence.proxy.async after the store; 6 as 5 with that fence.
void hop_tma_order_probe(int how) {
  alignas(16) static unsigned short g[8 * 64] = {};
  TmaMap map;
  const uint64_t dims[2] = {64, 8}, pitch[1] = {128};
  const uint32_t box[2] = {64, 8};
  hx::encode_tiled(&map, 2, 2, g, dims, pitch, box, 128, 0, nullptr);
  hx::launch_async(dim3{1, 1, 1}, dim3{128, 1, 1}, 2048, 168, [&] {
    unsigned char* s = aligned_smem();
    auto* bar = reinterpret_cast<unsigned long long*>(s + 1024);
    if (threadIdx.x == 0) {
      if (how == 4) fence_mbarrier_init();
      mbar_init(bar, 1);
      if (how == 1 || how >= 5) fence_mbarrier_init();
      if (how == 2) fence_proxy_async();
      if (how >= 5) std::memset(s + 256, 0x5A, 16);  // ordinary stores into the copy's destination
      if (how == 6) fence_proxy_async();
    }
    if (threadIdx.x == 1 && how == 3) fence_mbarrier_init();
    __syncthreads();
    if (threadIdx.x == 0) {
      mbar_arrive_expect_tx(bar, 1024);
      tma_load_2d(s, &map, 0, 0, bar);
      mbar_wait(bar, 0);
    }
  });
}
// A wait on a barrier nobody arrives at (the scheduler must report a deadlock).
void hop_mbar_deadlock() {
  hx::launch_async(dim3{1, 1, 1}, dim3{128, 1, 1}, 1024 + 64, 168, [&] {
    auto* bar = reinterpret_cast<unsigned long long*>(aligned_smem());
    if (threadIdx.x == 0) mbar_init(bar, 2);
    __syncthreads();
    if (threadIdx.x == 0) mbar_arrive(bar);
    mbar_wait(bar, 0);
  });
}

// ---------------------------------------------------------------- wgmma
// One warpgroup: shared memory (1024-aligned) holds `image` (image_bytes); A and B descriptors are
// (offset from that base, lbo, sbo, mode); each thread starts with acc = init[t][0..n/2), issues one
// m64nNk16 (n = 128 through the kernels' wrapper, other n through the model directly), and returns
// its registers in out[t][0..n/2) after the wait and in early[t][...] right after the issue.
// flags: 1 = skip wgmma.fence, 2 = thread 5 gives a different B descriptor, 4 = thread 0 starts a
// bulk tensor copy into B's bytes (offset b_desc[0], 128-aligned) before waiting for the wgmma.
// 8 = A from registers: thread t passes a_regs[4t .. 4t + 4) (the m64nNk16 A fragment) instead of a_desc;
// 16 = thread 0 stores into B's first element (offset b_desc[0]) before the wait; 32 = no fence.proxy.async
// after thread 0's ordinary stores of the image.
void hop_wgmma_probe(const void* image, int image_bytes, int n, const unsigned* a_desc, const unsigned* b_desc,
                     int scale_d, const float* init, float* out, float* early, int flags, const unsigned* a_regs) {
  alignas(16) static unsigned short g[8 * 64] = {};
  TmaMap map;
  const uint64_t dims[2] = {64, 8}, pitch[1] = {128};
  const uint32_t box[2] = {64, 8};
  hx::encode_tiled(&map, 2, 2, g, dims, pitch, box, 128, 0, nullptr);
  const int bar_off = (image_bytes + 7) / 8 * 8;
  hx::launch_async(dim3{1, 1, 1}, dim3{128, 1, 1}, 1024 + bar_off + 8, 168, [&] {
    unsigned char* s = aligned_smem();
    const int t = threadIdx.x, r = n / 2;
    if (t == 0) {
      std::memcpy(s, image, image_bytes);  // ordinary stores: wgmma may read them after the proxy fence
      if (!(flags & 32)) fence_proxy_async();
    }
    __syncthreads();
    const unsigned base = hx::smem_addr(s);
    const unsigned long long da = wgmma_desc(base + a_desc[0], a_desc[1], a_desc[2], int(a_desc[3]));
    unsigned long long db = wgmma_desc(base + b_desc[0], b_desc[1], b_desc[2], int(b_desc[3]));
    if ((flags & 2) && t == 5) db = wgmma_desc(base + b_desc[0] + 16, b_desc[1], b_desc[2], int(b_desc[3]));
    float acc[128];
    for (int i = 0; i < r; ++i) acc[i] = init[t * r + i];
    if (!(flags & 1)) wgmma_fence();
    if (flags & 8) {
      const unsigned(&a)[4] = *reinterpret_cast<const unsigned(*)[4]>(a_regs + 4 * t);
      if (n == 128) wgmma_m64n128k16_rs(*reinterpret_cast<float(*)[64]>(acc), a, db, scale_d);
      else if (n == 64) wgmma_m64n64k16_rs(*reinterpret_cast<float(*)[32]>(acc), a, db, scale_d);
      else hx::wgmma_issue(acc, n, 0, db, scale_d, a);
    } else if (n == 128) {
      float(&d)[64] = *reinterpret_cast<float(*)[64]>(acc);
      wgmma_m64n128k16_ss(d, da, db, scale_d);
    } else {
      hx::wgmma_issue(acc, n, da, db, scale_d);
    }
    for (int i = 0; i < r; ++i) early[t * r + i] = acc[i];
    if ((flags & 16) && t == 0) s[b_desc[0]] ^= 0xFF;  // an ordinary store into B's first element
    if ((flags & 4) && t == 0) {
      auto* bar = reinterpret_cast<unsigned long long*>(s + bar_off);
      mbar_init(bar, 1);
      fence_mbarrier_init();
      mbar_arrive_expect_tx(bar, 1024);
      tma_load_2d(s + b_desc[0], &map, 0, 0, bar);
      mbar_wait(bar, 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    for (int i = 0; i < r; ++i) out[t * r + i] = acc[i];
  });
}

// ---------------------------------------------------------------- setmaxnreg
// Warpgroup w calls setmaxnreg with counts[w] (negative: .dec) once, or twice when twice[w];
// thread 7 of warpgroup 0 asks for counts[0] + 8 when `diverge`.
void hop_setmaxnreg_probe(int nwg, int regs_at_entry, const int* counts, int diverge) {
  hx::launch_async(dim3{1, 1, 1}, dim3{unsigned(128 * nwg), 1, 1}, 64, regs_at_entry, [&] {
    const int w = threadIdx.x / 128;
    int c = counts[w];
    if (diverge && threadIdx.x == 7) c += 8;
    hx::setmaxnreg(c < 0 ? -c : c, c > 0);
  });
}
}
