// hopper.cuh — CPU models of the Hopper (sm_90a) machinery the sm90 kernels use, written from the
// PTX ISA and the CUDA driver API documentation (not from the kernels):
//   - shared-memory addresses: dynamic shared memory is a window starting at shared address
//     SMEM_BASE, 1024-byte aligned as the kernels' `extern __shared__ __align__(1024)` asks;
//   - swizzling (PTX ISA "Shared Memory Matrix Layout"; driver CU_TENSOR_MAP_SWIZZLE_*): the 16-byte
//     chunk bits [4, 4 + b) of a shared address are XORed with bits [7, 7 + b), b = 1, 2, 3 for the
//     32, 64, 128-byte modes — a function of the address, shared by the copy engine and wgmma;
//   - the wgmma matrix descriptor ("Matrix Descriptor Format") and K-major operand addressing;
//   - mbarrier: expected count, pending arrivals, tx-count, phase; a phase completes when the
//     pending arrivals and the tx-count are both zero, then the phase flips and the arrivals reset;
//     try_wait.parity(P) is true once the phase of parity P is complete (current phase parity != P);
//   - tensor maps (cuTensorMapEncodeTiled's requirements checked) and cp.async.bulk.tensor 2-D box
//     loads: elements outside the tensor are zeros; the whole box's bytes complete on the mbarrier;
//     the destination holds garbage from the issue until the data lands, which is modelled as late
//     as a correct program allows: when some thread next polls the completion barrier;
//   - wgmma.mma_async (m64nNk16, bf16 -> fp32, B K-major from a descriptor, A likewise or from
//     registers in the documented A fragment layout): asynchronous — at
//     the issue the accumulators read as NaN and the result lands at the issuing thread's
//     wgmma.wait_group that retires its group; an operation runs only when all 128 threads of the
//     warpgroup have issued it (their descriptors must agree), and reads shared memory then;
//     a wgmma after the thread's last retired group must follow a wgmma.fence; a bulk copy into
//     shared memory that an issued, incomplete wgmma reads, or any change of the elements it reads
//     between its issue and its completion (ordinary stores too), is reported as a race;
//   - setmaxnreg: a no-op with checks (24..256, multiple of 8, the same value across the warpgroup,
//     .inc never below / .dec never above the current count); an .inc waits until the block's
//     register pool (registers at entry x threads) has room, so asking for too many deadlocks.
// Threads blocked on an mbarrier or on an incomplete wgmma park and the scheduler (launch_async)
// runs the other warps; when nothing can move it reports a deadlock. An arrival that completes a
// phase hands control to the parked threads at once (so a buffer released before its wgmma has
// read it gets overwritten first). Every misuse aborts with a
// message on stderr (tests of misuse run in a subprocess).
//
// Hardware rules checked (PTX ISA 9.x section titles; the kernel's call site is named in the message):
//   - proxies ("Async Proxy" of wgmma, 9.7.15.4, and of cp.async.bulk, 9.7.9.25.2; membar/fence,
//     9.7.13.4; wgmma.fence: "An async proxy fence must be used to establish an ordering between
//     prior writes to shared memory matrices and subsequent reads of the same matrices in a
//     wgmma.mma_async instruction"): wgmma operand reads and bulk-copy writes are async-proxy
//     accesses; shared bytes last written by a thread's ordinary stores (generic proxy) may be
//     accessed by them only after that thread's fence.proxy.async following the stores. The
//     stores are attributed by comparing shared memory with a shadow copy whenever the running
//     thread changes (a store that leaves a byte's value unchanged is invisible to this model);
//     the async proxy's own writes (a copy landing) are not generic stores, and a completed
//     operation's results need no fence (its completion is followed by an implicit fence).
//     Generic reads before async writes are not tracked.
//   - mbarrier initialisation (membar/fence 9.7.13.4: fence.mbarrier_init.release.cluster orders the
//     executing thread's prior mbarrier.init operations; cp.async.bulk.tensor: the complete-tx on its
//     mbarrier is performed with .release semantics at .cluster scope; the CUDA C++ Programming
//     Guide's TMA example instead issues fence.proxy.async.shared::cta after the init "to make the
//     initialized barrier visible in the async proxy"): a bulk tensor copy may complete on a barrier
//     only after the thread that initialised it executed either fence. Other threads' arrivals and
//     waits need only a barrier (the ISA's mbarrier.init example orders them with bar.sync).
//   - swizzle pattern alignment ("Matrix Descriptor Format", 9.7.15.5.1.2.2): with base offset 0
//     the repeating pattern of a 128B / 64B / 32B-swizzled operand starts on a 1024 / 512 / 256-byte
//     boundary; an operand whose pattern (the descriptor start with its offset within a `span`-byte
//     row removed) starts elsewhere needs a non-zero base offset, which is not modelled: both abort.
#pragma once
#include <list>
#include <map>
#include <string>

namespace emu::hopper {

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "emulation (hopper): %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// Where a kernel called an instruction (file:line of the call), for messages.
struct Site {
  const char* file = "?";
  int line = 0;
};
inline std::string where(const Site& s) {
  const char* slash = std::strrchr(s.file, '/');
  return std::string(slash ? slash + 1 : s.file) + ":" + std::to_string(s.line);
}
#define EMU_SITE_ARG emu::hopper::Site site = {__builtin_FILE(), __builtin_LINE()}

// ============================================================================ shared addresses
constexpr uint32_t SMEM_BASE = 0x400;

inline uint32_t smem_addr(const void* p) {
  const unsigned char* base = emu::dynamic_smem();
  const auto* q = static_cast<const unsigned char*>(p);
  const size_t size = emu::g_block->dyn_smem.size();
  if (q < base || q > base + size) fail("shared address of an object outside dynamic shared memory");
  return SMEM_BASE + uint32_t(q - base);
}
inline unsigned char* smem_ptr(uint32_t addr, size_t bytes, const char* who) {
  const size_t size = emu::g_block->dyn_smem.size();
  if (addr < SMEM_BASE || addr - SMEM_BASE + bytes > size)
    fail(std::string(who) + ": shared address " + std::to_string(addr) + " outside the block's shared memory");
  return emu::dynamic_smem() + (addr - SMEM_BASE);
}

// ============================================================================ swizzling
// span: 0 or 16 (none), 32, 64, 128 bytes.
inline uint32_t swizzle(uint32_t addr, int span) {
  const int bits = span == 128 ? 3 : span == 64 ? 2 : span == 32 ? 1 : 0;
  const uint32_t mask = (1u << bits) - 1u;
  return addr ^ (((addr >> 7) & mask) << 4);
}

// ============================================================================ wgmma descriptors
struct SmemDesc {
  uint32_t start, lbo, sbo, base_offset;
  int mode;  // WGMMA_SWIZZLE_* (0 none, 1 128B, 2 64B, 3 32B)
  int span() const { return mode == 1 ? 128 : mode == 2 ? 64 : mode == 3 ? 32 : 16; }
};
inline SmemDesc decode_desc(uint64_t d) {
  SmemDesc s;
  s.start = uint32_t(d & 0x3FFF) << 4;
  s.lbo = uint32_t((d >> 16) & 0x3FFF) << 4;
  s.sbo = uint32_t((d >> 32) & 0x3FFF) << 4;
  s.base_offset = uint32_t((d >> 49) & 7);
  s.mode = int(d >> 62);
  return s;
}
// Shared address of element (mn, k) (16-bit elements, k < 16) of a K-major operand:
//   no swizzle: 8x8 core matrices of 8 rows x 16 contiguous bytes; SBO steps 8 rows, LBO steps 8 k;
//   swizzled:   rows of `span` bytes, 8 rows per pattern repeat, SBO steps 8 rows; the k16 slice
//               (32 bytes) lies within a row; the address is then swizzled.
inline uint32_t kmajor_addr(const SmemDesc& d, int mn, int k) {
  if (d.mode == 0) return d.start + (mn / 8) * d.sbo + (k / 8) * d.lbo + (mn % 8) * 16 + (k % 8) * 2;
  return swizzle(d.start + (mn / 8) * d.sbo + (mn % 8) * d.span() + k * 2, d.span());
}

// ============================================================================ per-block state
struct CopyJob {  // one cp.async.bulk.tensor in flight
  uint32_t dst;
  int c[3];
  unsigned char map[128];
};
struct Mbar {
  uint32_t expected = 0, pending = 0, phase = 0;
  int64_t tx = 0;
  std::vector<CopyJob> copies;  // issued, not yet landed
  int init_thread = -1;         // who ran mbarrier.init, and where
  Site init_site;
  bool init_fenced = false;     // that thread has run fence.mbarrier_init (or fence.proxy.async) since
};
struct WgOp {  // one wgmma.mma_async of a warpgroup
  uint64_t da = 0, db = 0;
  int n = 0, scale_d = 1, issued = 0;
  bool done = false;
  std::vector<float*> shadow;  // per thread of the warpgroup: where its accumulators live meanwhile
  uint32_t lo[2] = {0, 0}, hi[2] = {0, 0};  // shared bytes [lo, hi) of A and B it reads
  bool a_in_regs = false;
  std::vector<unsigned> a_regs;   // A from registers: thread t's 4 registers at [4t, 4t + 4)
  std::vector<uint16_t> snap;     // the A (from shared memory) and B elements as they were at the issue
};
struct Shadow {  // accumulators of one wgmma chain of one thread while operations are in flight
  float* regs;
  int n;
  std::vector<float> value;
};
struct ThreadState {
  std::vector<std::vector<int>> groups;  // committed wgmma groups (op indices), oldest first
  std::vector<int> open;                 // issued, not yet committed
  int issued = 0;                        // wgmma operations issued so far (= next op index)
  bool fenced = false;                   // wgmma.fence since the last retirement
  std::list<Shadow> shadows;
  int setmaxnreg_calls = 0;
  bool parked = false;
  bool preempted = false;
  uint32_t proxy_fences = 0;  // fence.proxy.async executed so far
};
struct Warpgroup {
  std::vector<WgOp> ops;
  std::vector<int> setmaxnreg;  // value of the k-th call (negative: .dec)
  int applied = 0;              // calls whose count is in force
  int regs = 0;
};
struct BlockState {
  std::map<uint32_t, Mbar> bars;
  std::vector<ThreadState> threads;
  std::vector<Warpgroup> wgs;
  int regs_at_entry = 0;
  uint64_t events = 0;  // bumps on anything that may unblock a parked thread
  // Generic-proxy stores, per byte of dynamic shared memory: the contents as last attributed,
  // 1 + the thread whose ordinary store wrote the byte last (0: none since an async write or the
  // launch), and that thread's fence.proxy.async count at the store.
  std::vector<unsigned char> seen;
  std::vector<uint16_t> writer;
  std::vector<uint32_t> write_fences;
};
inline BlockState* g_state = nullptr;

inline int thread_index() { return int(emu::g_cur - emu::g_block->fibers.data()); }
inline ThreadState& me() { return g_state->threads[thread_index()]; }

// ============================================================================ proxies
// Bytes of shared memory that changed since the last attribution were stored by thread t (the
// only one that ran meanwhile): called when a thread yields and before every async-proxy access.
inline void attribute_generic_stores(int t) {
  const unsigned char* now = emu::dynamic_smem();
  unsigned char* seen = g_state->seen.data();
  const size_t n = g_state->seen.size();
  if (std::memcmp(now, seen, n) == 0) return;
  constexpr size_t CHUNK = 256;
  for (size_t c = 0; c < n; c += CHUNK) {
    const size_t len = std::min(CHUNK, n - c);
    if (std::memcmp(now + c, seen + c, len) == 0) continue;
    for (size_t i = c; i < c + len; ++i)
      if (now[i] != seen[i]) {
        seen[i] = now[i];
        g_state->writer[i] = uint16_t(t + 1);
        g_state->write_fences[i] = g_state->threads[t].proxy_fences;
      }
  }
}
inline void attribute_my_stores() {
  if (emu::g_cur) attribute_generic_stores(thread_index());
}
// The async proxy wrote shared bytes [addr, addr + bytes): not generic stores.
inline void async_wrote(uint32_t addr, size_t bytes) {
  const size_t off = addr - SMEM_BASE;
  std::memcpy(g_state->seen.data() + off, emu::dynamic_smem() + off, bytes);
  std::fill_n(g_state->writer.begin() + off, bytes, uint16_t(0));
}
// An async-proxy access (`what`, issued at `site`) to shared byte `addr`: the generic store that
// wrote it last must be followed by a fence.proxy.async of the storing thread.
inline void check_proxy_order(uint32_t addr, const std::string& what, const Site& site) {
  const size_t off = addr - SMEM_BASE;
  const int w = int(g_state->writer[off]) - 1;
  if (w < 0 || g_state->threads[w].proxy_fences > g_state->write_fences[off]) return;
  fail(what + " at " + where(site) + " (async proxy) accesses shared byte " + std::to_string(off) +
       " of dynamic shared memory, last written by an ordinary store (generic proxy) of thread " +
       std::to_string(w) + " with no fence.proxy.async in that thread after the store: a cross-proxy "
       "fence is required (PTX ISA, wgmma Async Proxy / membar-fence)");
}
// fence.proxy.async{.shared::cta}: orders this thread's prior generic accesses before later
// async-proxy accesses; by the CUDA Programming Guide's TMA example it also publishes its prior
// mbarrier.init to the copy engine.
void release_my_barrier_inits();  // below, with the mbarrier
inline void fence_proxy_async() {
  attribute_my_stores();
  ++me().proxy_fences;
  release_my_barrier_inits();
}

// A thread that cannot go on yields to the scheduler; it is resumed later to look again.
inline void park() {
  me().parked = true;
  swapcontext(&emu::g_cur->ctx, &emu::g_scheduler);
}
// A thread whose arrival completed a phase yields so that the threads waiting for that phase run
// at once (the adversarial order: a stage released too early is refilled before its readers finish).
inline void preempt() {
  me().preempted = true;
  swapcontext(&emu::g_cur->ctx, &emu::g_scheduler);
}

// ============================================================================ mbarrier
constexpr uint64_t MBAR_TAG = 0x4d42415200000000ull;  // "MBAR" + the address: what init leaves in the word

inline Mbar& bar_at(uint32_t addr, const char* who) {
  if (addr % 8) fail(std::string(who) + ": mbarrier address not 8-byte aligned");
  uint64_t word;
  std::memcpy(&word, smem_ptr(addr, 8, who), 8);
  auto it = g_state->bars.find(addr);
  if (it == g_state->bars.end() || word != (MBAR_TAG | addr))
    fail(std::string(who) + ": mbarrier at " + std::to_string(addr) + " used before mbarrier.init (or overwritten)");
  return it->second;
}
inline void bar_check_phase(Mbar& b) {
  if (b.pending == 0 && b.tx == 0) {
    b.phase ^= 1u;
    b.pending = b.expected;
    ++g_state->events;
  } else if (b.pending == 0 && b.tx < 0) {
    fail("mbarrier: more transaction bytes completed than expected (tx-count below zero)");
  }
}
inline void mbar_init(uint32_t addr, uint32_t count, EMU_SITE_ARG) {
  if (addr % 8) fail("mbarrier.init: address not 8-byte aligned");
  if (count < 1 || count > (1u << 20) - 1) fail("mbarrier.init: count outside 1 .. 2^20 - 1");
  Mbar b;
  b.expected = b.pending = count;
  b.init_thread = emu::g_cur ? thread_index() : -1;
  b.init_site = site;
  g_state->bars[addr] = b;
  const uint64_t word = MBAR_TAG | addr;
  std::memcpy(smem_ptr(addr, 8, "mbarrier.init"), &word, 8);
  ++g_state->events;
}
// fence.mbarrier_init.release.cluster (or fence.proxy.async): this thread's prior inits are published.
inline void release_my_barrier_inits() {
  const int t = thread_index();
  for (auto& [addr, b] : g_state->bars)
    if (b.init_thread == t) b.init_fenced = true;
}
inline void fence_mbarrier_init() { release_my_barrier_inits(); }
inline void mbar_expect_tx(uint32_t addr, uint32_t bytes) {
  Mbar& b = bar_at(addr, "mbarrier.expect_tx");
  if (bytes > (1u << 20) - 1) fail("mbarrier.expect_tx: more than 2^20 - 1 bytes");
  b.tx += bytes;
}
inline void mbar_complete_tx(uint32_t addr, uint32_t bytes) {
  Mbar& b = bar_at(addr, "mbarrier.complete_tx");
  b.tx -= bytes;
  ++g_state->events;
  bar_check_phase(b);
}
inline void mbar_arrive(uint32_t addr) {
  Mbar& b = bar_at(addr, "mbarrier.arrive");
  if (b.pending == 0) fail("mbarrier.arrive: more arrivals than the expected count in one phase");
  --b.pending;
  ++g_state->events;
  const uint32_t phase = b.phase;
  bar_check_phase(b);
  if (b.phase != phase) preempt();
}
void land_copies(uint32_t bar);  // below, with the tensor maps
inline bool mbar_try_wait_parity(uint32_t addr, uint32_t parity) {
  bar_at(addr, "mbarrier.try_wait");
  land_copies(addr);
  return (g_state->bars[addr].phase & 1u) != (parity & 1u);
}

// ============================================================================ tensor maps and bulk tensor copies
struct TensorMap {  // what our cuTensorMapEncodeTiled stores in the 128 opaque bytes
  uint32_t magic, esize, rank, span;
  uint64_t gaddr;
  uint64_t dims[3], strides[3];  // strides in bytes, strides[0] = esize
  uint32_t box[3];
  uint32_t oob_nan;
};
static_assert(sizeof(TensorMap) <= 128, "tensor map fields exceed CUtensorMap's 128 bytes");
constexpr uint32_t TMAP_MAGIC = 0x544d4150;  // "TMAP"

// cuTensorMapEncodeTiled for the model (rank <= 3, element strides 1, no interleave): 0 on success,
// 1 (CUDA_ERROR_INVALID_VALUE) with `why` filled when an argument breaks the driver's requirements.
inline int encode_tiled(void* out128, uint32_t esize, uint32_t rank, const void* gaddr, const uint64_t* dims,
                        const uint64_t* strides_above0, const uint32_t* box, int swizzle_span, int oob_nan,
                        std::string* why) {
  auto bad = [&](const std::string& w) {
    if (why) *why = w;
    return 1;
  };
  if (reinterpret_cast<uintptr_t>(out128) % 64) return bad("tensorMap address not 64-byte aligned");
  if (esize != 1 && esize != 2 && esize != 4 && esize != 8) return bad("element size not 1, 2, 4 or 8 bytes");
  if (rank < 1 || rank > 3) return bad("rank outside 1..3 (the model's limit)");
  if (reinterpret_cast<uintptr_t>(gaddr) % 16) return bad("globalAddress not 16-byte aligned");
  TensorMap m{};
  m.magic = TMAP_MAGIC;
  m.esize = esize;
  m.rank = rank;
  m.span = uint32_t(swizzle_span);
  m.gaddr = reinterpret_cast<uintptr_t>(gaddr);
  m.oob_nan = uint32_t(oob_nan != 0);
  for (uint32_t i = 0; i < rank; ++i) {
    if (dims[i] == 0 || dims[i] > (1ull << 32)) return bad("globalDim[" + std::to_string(i) + "] not in 1..2^32");
    if (box[i] == 0 || box[i] > 256) return bad("boxDim[" + std::to_string(i) + "] not in 1..256");
    m.dims[i] = dims[i];
    m.box[i] = box[i];
    m.strides[i] = i == 0 ? esize : strides_above0[i - 1];
    if (i > 0 && (m.strides[i] % 16 || m.strides[i] >= (1ull << 40)))
      return bad("globalStrides[" + std::to_string(i - 1) + "] not a multiple of 16 below 2^40");
  }
  if (box[0] * esize % 16) return bad("boxDim[0] * elementSize not a multiple of 16 bytes");
  if (swizzle_span != 0 && swizzle_span != 32 && swizzle_span != 64 && swizzle_span != 128)
    return bad("swizzle not none, 32, 64 or 128 bytes");
  if (swizzle_span && box[0] * esize > uint32_t(swizzle_span))
    return bad("boxDim[0] * elementSize exceeds the swizzle span");
  if (swizzle_span && box[0] * esize != uint32_t(swizzle_span))
    return bad("inner box narrower than the swizzle span (not modelled)");
  std::memset(out128, 0, 128);
  std::memcpy(out128, &m, sizeof m);
  return 0;
}
inline TensorMap read_map(const void* p) {
  TensorMap m;
  std::memcpy(&m, p, sizeof m);
  if (m.magic != TMAP_MAGIC) fail("cp.async.bulk.tensor: the tensor map was not made by cuTensorMapEncodeTiled");
  return m;
}
inline uint32_t box_bytes(const TensorMap& m) {
  uint32_t n = m.esize;
  for (uint32_t i = 0; i < m.rank; ++i) n *= m.box[i];
  return n;
}
void check_no_reader_in_flight(uint32_t lo, uint32_t hi, const char* who);  // below, with wgmma
// cp.async.bulk.tensor.{2d,3d}.shared::cluster.global.mbarrier::complete_tx::bytes (rank = the map's rank)
inline void tma_load(uint32_t dst, const void* map, int rank, const int* coords, uint32_t bar, EMU_SITE_ARG) {
  const TensorMap m = read_map(map);
  if (int(m.rank) != rank)
    fail("cp.async.bulk.tensor." + std::to_string(rank) + "d with a tensor map of rank " + std::to_string(m.rank));
  check_no_reader_in_flight(dst, dst + box_bytes(m), "cp.async.bulk.tensor");
  if (dst % 128) fail("cp.async.bulk.tensor: shared destination not 128-byte aligned");
  const Mbar& b = bar_at(bar, "cp.async.bulk.tensor");
  if (!b.init_fenced)
    fail("cp.async.bulk.tensor at " + where(site) + " completes on the mbarrier initialised at " + where(b.init_site) +
         " by thread " + std::to_string(b.init_thread) + ", which ran no fence.mbarrier_init.release.cluster (nor "
         "fence.proxy.async) after mbarrier.init: the copy engine's complete-tx may not see the initialised barrier");
  attribute_my_stores();
  smem_ptr(dst, box_bytes(m), "cp.async.bulk.tensor");
  for (uint32_t a = dst; a < dst + box_bytes(m); ++a) check_proxy_order(a, "cp.async.bulk.tensor (shared write)", site);
  std::memset(smem_ptr(dst, box_bytes(m), "cp.async.bulk.tensor"), 0xCD, box_bytes(m));  // undefined until it lands
  async_wrote(dst, box_bytes(m));
  CopyJob j;
  j.dst = dst;
  for (int i = 0; i < 3; ++i) j.c[i] = i < rank ? coords[i] : 0;
  std::memcpy(j.map, map, 128);
  g_state->bars[bar].copies.push_back(j);
}
inline void tma_load_2d(uint32_t dst, const void* map, int c0, int c1, uint32_t bar, EMU_SITE_ARG) {
  const int c[2] = {c0, c1};
  tma_load(dst, map, 2, c, bar, site);
}
// The box lands in shared memory in element order (x fastest, then y, then z), each element's
// address swizzled; elements outside the tensor are zeros (or NaN with the NaN fill).
inline void land(const CopyJob& j) {
  const TensorMap m = read_map(j.map);
  const uint32_t es = m.esize;
  const uint32_t bz = m.rank > 2 ? m.box[2] : 1;
  const unsigned char nan_bits[8] = {0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff, 0x7f};
  for (uint32_t z = 0; z < bz; ++z)
    for (uint32_t y = 0; y < m.box[1]; ++y)
      for (uint32_t x = 0; x < m.box[0]; ++x) {
        const int64_t g[3] = {int64_t(j.c[0]) + x, int64_t(j.c[1]) + y, int64_t(j.c[2]) + z};
        bool inside = true;
        uint64_t off = 0;
        for (uint32_t i = 0; i < m.rank; ++i) {
          inside &= g[i] >= 0 && uint64_t(g[i]) < m.dims[i];
          off += uint64_t(g[i]) * m.strides[i];
        }
        const uint32_t a = swizzle(j.dst + ((z * m.box[1] + y) * m.box[0] + x) * es, int(m.span));
        unsigned char* d = smem_ptr(a, es, "cp.async.bulk.tensor");
        if (inside)
          std::memcpy(d, reinterpret_cast<const unsigned char*>(m.gaddr) + off, es);
        else if (m.oob_nan)
          std::memcpy(d, nan_bits + 8 - es, es);
        else
          std::memset(d, 0, es);
        async_wrote(a, es);
      }
}
inline void land_copies(uint32_t bar) {
  attribute_my_stores();  // the waiting thread's own stores so far are not the copy's
  std::vector<CopyJob> jobs;
  jobs.swap(g_state->bars[bar].copies);
  for (const CopyJob& j : jobs) {
    land(j);
    mbar_complete_tx(bar, box_bytes(read_map(j.map)));
  }
}

// ============================================================================ wgmma
inline uint16_t bits_at(uint32_t addr) {
  uint16_t v;
  std::memcpy(&v, smem_ptr(addr, 2, "wgmma.mma_async"), 2);
  return v;
}
// The shared-memory elements an operation reads, in order: A (64 x 16, unless from registers), then B (n x 16).
inline std::vector<uint16_t> operand_bits(uint64_t da, uint64_t db, int n, bool a_in_regs) {
  std::vector<uint16_t> v;
  const SmemDesc a = decode_desc(da), b = decode_desc(db);
  if (!a_in_regs)
    for (int r = 0; r < 64; ++r)
      for (int k = 0; k < 16; ++k) v.push_back(bits_at(kmajor_addr(a, r, k)));
  for (int r = 0; r < n; ++r)
    for (int k = 0; k < 16; ++k) v.push_back(bits_at(kmajor_addr(b, r, k)));
  return v;
}
inline float bf16_of(uint16_t v) { return __bfloat162float(__nv_bfloat16{v}); }
// Run op `k` of warpgroup `wg` for all its threads: D = A·Bᵀ (+ D), thread t's fragment
// d[4i + j] = D[16(t/32) + (t%32)/4 + 8(j/2)][8i + 2(t%4) + j%2] (PTX ISA, wgmma .m64nNk16 accumulator D).
inline void run_op(int wg, int k) {
  Warpgroup& W = g_state->wgs[wg];
  for (int i = 0; i < k; ++i)
    if (!W.ops[i].done) run_op(wg, i);
  WgOp& op = W.ops[k];
  if (op.done) return;
  // On the GPU the MMA reads its operands at some time between the issue and the completion: a
  // change in between is a race whichever value the model picked.
  const std::vector<uint16_t> now = operand_bits(op.da, op.db, op.n, op.a_in_regs);
  if (now != op.snap)
    fail("shared memory that a wgmma in flight reads was written between its issue and its completion");
  std::vector<float> A(64 * 16), B(size_t(op.n) * 16);
  size_t next = 0;
  if (op.a_in_regs) {  // thread t's a[i/2] half i%2 = A[16w + l/4 + 8((i/2)%2)][2(l%4) + i%2 + 8(i/4)]
    for (int t = 0; t < 128; ++t) {
      const int w = t / 32, l = t % 32;
      for (int i = 0; i < 8; ++i) {
        const unsigned reg = op.a_regs[4 * t + i / 2];
        const unsigned short h = static_cast<unsigned short>(i % 2 ? reg >> 16 : reg & 0xffff);
        A[(16 * w + l / 4 + 8 * ((i / 2) % 2)) * 16 + 2 * (l % 4) + i % 2 + 8 * (i / 4)] = __bfloat162float({h});
      }
    }
  } else {
    for (int i = 0; i < 64 * 16; ++i) A[i] = bf16_of(now[next++]);
  }
  for (int i = 0; i < op.n * 16; ++i) B[i] = bf16_of(now[next++]);
  for (int t = 0; t < 128; ++t) {
    float* d = op.shadow[t];
    const int w = t / 32, l = t % 32;
    for (int i = 0; i < op.n / 8; ++i)
      for (int j = 0; j < 4; ++j) {
        const int row = 16 * w + l / 4 + 8 * (j / 2), col = 8 * i + 2 * (l % 4) + j % 2;
        float acc = op.scale_d ? d[4 * i + j] : 0.0f;
        for (int kk = 0; kk < 16; ++kk) acc += A[row * 16 + kk] * B[col * 16 + kk];
        d[4 * i + j] = acc;
      }
  }
  op.done = true;
  ++g_state->events;
}
// The shared bytes an operand of `rows` rows x 16 K-major elements occupies: [lo, hi).
inline void footprint(uint64_t desc, int rows, uint32_t& lo, uint32_t& hi) {
  const SmemDesc d = decode_desc(desc);
  lo = UINT32_MAX, hi = 0;
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < 16; ++k) {
      const uint32_t a = kmajor_addr(d, r, k);
      lo = std::min(lo, a), hi = std::max(hi, a + 2);
    }
}
// A write to shared bytes [lo, hi) while a wgmma that reads them is in flight (issued by some
// thread of its warpgroup, not yet complete) is a race: on the GPU the MMA may read either value.
inline void check_no_reader_in_flight(uint32_t lo, uint32_t hi, const char* who) {
  for (const Warpgroup& W : g_state->wgs)
    for (const WgOp& op : W.ops)
      for (int o = 0; o < 2 && !op.done; ++o)
        if (lo < op.hi[o] && op.lo[o] < hi)
          fail(std::string(who) + " overwrites shared memory a wgmma in flight reads (a buffer released before "
                                  "wgmma.wait_group retired its readers)");
}
// An operand's descriptor against "Matrix Descriptor Format": a swizzled operand's repeating
// pattern (8 rows of `span` bytes) starts where row 0 starts — the start address with its offset
// within the row (the K slice) removed — and with base offset 0 that must be a pattern boundary.
inline void check_pattern_start(uint64_t desc, const char* operand, const Site& site) {
  const SmemDesc d = decode_desc(desc);
  if (d.base_offset) fail(std::string("wgmma at ") + where(site) + ": operand " + operand +
                          " has matrix base offset " + std::to_string(d.base_offset) + " (non-zero base offsets are not modelled)");
  if (d.mode == 0) return;
  const uint32_t pattern = d.start & ~uint32_t(d.span() - 1), repeat = 8u * uint32_t(d.span());
  if (pattern % repeat)
    fail(std::string("wgmma at ") + where(site) + ": operand " + operand + " is " + std::to_string(d.span()) +
         "B-swizzled with base offset 0, but its repeating pattern starts at shared address " + std::to_string(pattern) +
         " (dynamic shared memory byte " + std::to_string(pattern - SMEM_BASE) + "), not on a " + std::to_string(repeat) +
         "-byte boundary (PTX ISA, Matrix Descriptor Format)");
}
// The async-proxy reads of an operation: every element of A (unless in registers) and B.
inline void check_operand_proxy_order(uint64_t da, uint64_t db, int n, bool a_in_regs, const Site& site) {
  attribute_my_stores();
  const SmemDesc a = decode_desc(da), b = decode_desc(db);
  const std::string what = "wgmma.mma_async m64n" + std::to_string(n) + "k16";
  for (int r = 0; r < 64 && !a_in_regs; ++r)
    for (int k = 0; k < 16; ++k)
      for (uint32_t i = 0; i < 2; ++i) check_proxy_order(kmajor_addr(a, r, k) + i, what + " (operand A)", site);
  for (int r = 0; r < n; ++r)
    for (int k = 0; k < 16; ++k)
      for (uint32_t i = 0; i < 2; ++i) check_proxy_order(kmajor_addr(b, r, k) + i, what + " (operand B)", site);
}
inline void wgmma_fence() { me().fenced = true; }
inline void wgmma_issue(float* d, int n, uint64_t da, uint64_t db, int scale_d, const unsigned* a_regs = nullptr,
                        EMU_SITE_ARG) {
  const int tid = thread_index(), wg = tid / 128;
  ThreadState& T = me();
  if (T.groups.empty() && T.open.empty() && !T.fenced)
    fail("wgmma.mma_async without a wgmma.fence before it (the accumulators may still be in use)");
  Shadow* sh = nullptr;
  for (Shadow& s : T.shadows)
    if (s.regs == d) sh = &s;
  if (!sh) {  // the chain starts: its values move to the shadow, the registers read as NaN until the wait
    T.shadows.push_back(Shadow{d, n, std::vector<float>(d, d + n / 2)});
    sh = &T.shadows.back();
    for (int i = 0; i < n / 2; ++i) d[i] = std::nanf("");
  } else if (sh->n != n) {
    fail("wgmma: one accumulator chain with two shapes");
  }
  Warpgroup& W = g_state->wgs[wg];
  const int k = T.issued++;
  if (int(W.ops.size()) <= k) {  // the warpgroup's first thread to issue it: check the operands once
    if (a_regs) da = 0;
    if (!a_regs) check_pattern_start(da, "A", site);
    check_pattern_start(db, "B", site);
    check_operand_proxy_order(da, db, n, a_regs != nullptr, site);
    W.ops.push_back(WgOp{da, db, n, scale_d, 0, false, std::vector<float*>(128, nullptr)});
    if (!a_regs) footprint(da, 64, W.ops[k].lo[0], W.ops[k].hi[0]);
    footprint(db, n, W.ops[k].lo[1], W.ops[k].hi[1]);
    W.ops[k].a_in_regs = a_regs != nullptr;
    if (a_regs) W.ops[k].a_regs.assign(4 * 128, 0);
    W.ops[k].snap = operand_bits(da, db, n, a_regs != nullptr);
  } else {
    const WgOp& o = W.ops[k];
    if ((!a_regs && o.da != da) || o.db != db || o.n != n || o.scale_d != scale_d || o.a_in_regs != (a_regs != nullptr))
      fail("wgmma.mma_async: threads of one warpgroup issued different operations (descriptors, shape or scale-d)");
  }
  if (a_regs) std::memcpy(&W.ops[k].a_regs[4 * (tid % 128)], a_regs, 16);  // registers read at the issue
  W.ops[k].shadow[tid % 128] = sh->value.data();
  ++W.ops[k].issued;
  T.open.push_back(k);
  ++g_state->events;
}
inline void wgmma_commit() {
  ThreadState& T = me();
  T.groups.push_back(std::move(T.open));
  T.open.clear();
}
inline void wgmma_wait(int n_pending) {
  const int wg = thread_index() / 128;
  ThreadState& T = me();
  if (!T.open.empty()) fail("wgmma.wait_group with wgmma operations not committed to a group");
  while (int(T.groups.size()) > n_pending) {
    for (int k : T.groups.front()) {
      while (g_state->wgs[wg].ops[k].issued < 128) park();  // the warpgroup has not issued it yet
      run_op(wg, k);
    }
    T.groups.erase(T.groups.begin());
  }
  // chains with no operation in flight any more: their results land in the registers
  std::vector<int> live;
  for (auto& g : T.groups) live.insert(live.end(), g.begin(), g.end());
  for (auto it = T.shadows.begin(); it != T.shadows.end();) {
    bool busy = false;
    for (int k : live) busy |= g_state->wgs[wg].ops[k].shadow[thread_index() % 128] == it->value.data();
    if (busy) {
      ++it;
      continue;
    }
    std::memcpy(it->regs, it->value.data(), sizeof(float) * it->n / 2);
    it = T.shadows.erase(it);
  }
  T.fenced = false;
}

// ============================================================================ setmaxnreg
inline void setmaxnreg(int regs, bool inc) {
  if (regs < 24 || regs > 256 || regs % 8) fail("setmaxnreg: count not a multiple of 8 in 24..256");
  const int wg = thread_index() / 128;
  ThreadState& T = me();
  Warpgroup& W = g_state->wgs[wg];
  const int k = T.setmaxnreg_calls++;
  const int code = inc ? regs : -regs;
  if (int(W.setmaxnreg.size()) > k) {
    if (W.setmaxnreg[k] != code) fail("setmaxnreg: threads of one warpgroup asked for different counts");
  } else {
    W.setmaxnreg.push_back(code);
  }
  while (W.applied <= k) {  // the warpgroup's first thread here applies it (an .inc waits for free registers)
    if (inc && regs < W.regs) fail("setmaxnreg.inc below the current register count");
    if (!inc && regs > W.regs) fail("setmaxnreg.dec above the current register count");
    int others = 0;
    for (const Warpgroup& o : g_state->wgs) others += &o == &W ? 0 : 128 * o.regs;
    if (others + 128 * regs <= g_state->regs_at_entry * int(emu::g_block->fibers.size())) {
      W.regs = regs;
      W.applied = k + 1;
      ++g_state->events;
    } else {
      park();
    }
  }
}

// ============================================================================ the scheduler
// Like emu::launch (denormals flushed as -ftz=true does), plus parking: a warp runs until each of its threads waits at __syncthreads,
// has exited, or is parked with nothing new to see; warps take turns in alternating order.
// `regs_at_entry` is the kernel's register count at entry (its __launch_bounds__ cap), the pool
// setmaxnreg redistributes.
template <typename F>
void launch_async(dim3 grid, dim3 block, size_t smem, int regs_at_entry, F kernel) {
  gridDim = grid;
  blockDim = block;
  const int n = block.x * block.y * block.z;
  if (n % 128) fail("launch_async: the block must be whole warpgroups (a multiple of 128 threads)");
  std::function<void()> k = kernel;
  emu::g_kernel = &k;
  const emu::FlushDenormals ftz;  // as emu::launch: the kernels are built with -ftz=true
  emu::Block b;
  b.fibers.resize(n);
  b.exchange.assign(n / 32, std::vector<unsigned char>(32 * emu::SLOT_BYTES));
  b.scratch.assign(n / 32, std::vector<float>(16 * 16 + 16 * 8));
  for (int t = 0; t < n; ++t) {
    b.fibers[t].stack.reset(new char[emu::STACK_BYTES]);
    b.fibers[t].tid = dim3{unsigned(t % block.x), unsigned((t / block.x) % block.y), unsigned(t / (block.x * block.y))};
    b.fibers[t].warp = t / 32;
    b.fibers[t].lane = t % 32;
  }
  emu::g_block = &b;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        blockIdx = dim3{bx, by, bz};
        b.dyn_smem.assign(smem, 0xCD);
        BlockState st;
        st.threads.resize(n);
        st.wgs.resize(n / 128);
        for (auto& w : st.wgs) w.regs = regs_at_entry;
        st.regs_at_entry = regs_at_entry;
        st.seen = b.dyn_smem;
        st.writer.assign(smem, 0);
        st.write_fences.assign(smem, 0);
        g_state = &st;
        for (auto& f : b.fibers) {
          f.state = emu::RUNNABLE;
          f.groups.clear();
          f.open.clear();
          getcontext(&f.ctx);
          f.ctx.uc_stack.ss_sp = f.stack.get();
          f.ctx.uc_stack.ss_size = emu::STACK_BYTES;
          f.ctx.uc_link = &emu::g_scheduler;
          makecontext(&f.ctx, emu::fiber_entry, 0);
        }
        // Run thread t until it blocks; false if it was parked and parked again with nothing new to see.
        auto resume = [&](int t) {
          emu::Fiber& f = b.fibers[t];
          const bool was_parked = st.threads[t].parked;
          const uint64_t ev = st.events;
          st.threads[t].parked = false;
          emu::g_cur = &f;
          threadIdx = f.tid;
          swapcontext(&emu::g_scheduler, &f.ctx);
          emu::g_cur = nullptr;
          const bool idle = was_parked && st.threads[t].parked && st.events == ev;
          if (!idle) attribute_generic_stores(t);  // an idle thread only re-polled: it stored nothing
          return !idle;
        };
        for (int sweep = 0;; ++sweep) {
          bool progress = false;
          for (int wi = 0; wi < n / 32; ++wi) {
            const int w = sweep % 2 ? n / 32 - 1 - wi : wi;
            for (int round = 0;; ++round) {  // run warp w as far as it goes
              bool moved = false;
              for (int i = 0; i < 32; ++i) {
                const int t = 32 * w + (round % 2 ? 31 - i : i);
                if (b.fibers[t].state != emu::RUNNABLE) continue;
                moved |= resume(t);
                if (st.threads[t].preempted) {  // it completed a phase: the waiters go first
                  st.threads[t].preempted = false;
                  for (int u = 0; u < n; ++u)
                    if (b.fibers[u].state == emu::RUNNABLE && st.threads[u].parked) {
                      resume(u);
                      st.threads[u].preempted = false;
                    }
                }
              }
              int live = 0, at_warp = 0;
              for (int l = 0; l < 32; ++l) {
                const emu::Fiber& f = b.fibers[32 * w + l];
                live += f.state != emu::DONE;
                at_warp += f.state == emu::AT_WARP_BARRIER;
              }
              if (at_warp > 0 && at_warp == live) {
                for (int l = 0; l < 32; ++l)
                  if (b.fibers[32 * w + l].state == emu::AT_WARP_BARRIER) b.fibers[32 * w + l].state = emu::RUNNABLE;
                moved = true;
              }
              progress |= moved;
              if (!moved) break;
            }
          }
          int live = 0, at_block = 0;
          for (auto& f : b.fibers) live += f.state != emu::DONE, at_block += f.state == emu::AT_BLOCK_BARRIER;
          if (live == 0) break;
          if (at_block == live) {
            emu::check_block_barrier(b);
            for (auto& f : b.fibers)
              if (f.state == emu::AT_BLOCK_BARRIER) f.state = emu::RUNNABLE;
            continue;
          }
          if (!progress) {
            std::string who;
            for (int t = 0; t < n && who.size() < 300; ++t)
              if (b.fibers[t].state != emu::DONE)
                who += " t" + std::to_string(t) + (st.threads[t].parked ? "(parked)" : "(at a barrier)");
            fail("deadlock: no thread can move;" + who);
          }
        }
        for (auto& [addr, bar] : st.bars)
          if (!bar.copies.empty()) fail("a bulk tensor copy was never waited for");
        for (int t = 0; t < n; ++t)
          if (!st.threads[t].groups.empty() || !st.threads[t].open.empty())
            fail("a thread exited with wgmma operations never waited for");
        g_state = nullptr;
      }
  emu::g_block = nullptr;
  emu::g_kernel = nullptr;
}

}  // namespace emu::hopper
