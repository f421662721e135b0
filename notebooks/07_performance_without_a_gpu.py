# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 — Performance without a GPU: the kernel X-ray
#
# Simulator wall time says nothing about a GPU: the CUDA simulator runs every thread as a Python
# thread, so a kernel that does *less* work per FMA on a GPU can easily be *slower* here. Yet almost
# everything that decides a kernel's speed on real hardware can be measured on a laptop:
#
# 1. **Resources** of the compiled binary — registers per thread, shared memory, stack, spills;
# 2. **Occupancy** — how many blocks and warps of the kernel fit on one SM of an A100 (sm_80), an
#    L40S-class part (sm_89) and an H100/H200 (sm_90), and which resource runs out first;
# 3. **SASS** — the machine code of the hot loop: how many instructions it spends per FMA;
# 4. **Bank conflicts and coalescing** — the addresses each warp touches, recorded by running the
#    kernel on the CPU and costed the way the memory system serves them;
# 5. **Roofline** — FLOPs and bytes at the real (K3) sizes against datasheet peaks.
#
# Every number below is labelled **model, no GPU**: it comes from the compiler, from the
# architecture tables of the CUDA C++ Programming Guide, from addresses recorded on the CPU, or
# from datasheets — never from a measurement. The whole report for every kernel, both backends and
# three architectures is one command:
#
# ```
# python -m moonvit_kernels.xray --arch sm_80,sm_89,sm_90 --out xray_report
# ```
#
# This notebook reads each view on the two ladders of the workbook: GEMM v1 → v3 (notebook 01)
# and attention v1 → v2 (notebook 04), plus the CUDA C kernels for comparison.

# %%
# Without a GPU, numba.cuda runs on its CPU simulator (used here to record addresses); the switch
# must be set before numba is imported. Compiling for a real GPU happens in a subprocess.
# %matplotlib inline
from moonvit_kernels.device import use_simulator_without_gpu, where

use_simulator_without_gpu()

import tempfile
import time
from pathlib import Path

import numpy as np
from IPython.display import Image, Markdown, display
from numba import cuda, float32

from moonvit_kernels.plots import markdown_table
from moonvit_kernels.xray import arch, build, catalogue, counters, jobs_numba, occupancy, roofline, sass, trace

t_start = time.perf_counter()
work = Path(tempfile.mkdtemp(prefix="xray_nb_"))
print(f"kernels run on: {where()}")

# %% [markdown]
# ## 1. Resources: what the compiler made of the kernel
#
# We compile, for sm_90 and without a GPU, the three kernels this notebook studies closely — GEMM
# v1 and v3 and attention v2 at head dim 128 — plus two ten-line kernels written below that differ
# only in how their loop is written. `build.compile_numba` runs numba → PTX → nvJitLink in a
# subprocess (numba cannot compile for a GPU in a process where its simulator is on) and reads
# registers, stack and static shared memory **from the cubin itself** (the ELF sections the driver
# reads at launch), spills from ptxas's report.

# %%
snippet = work / "loops.py"
snippet.write_text("""
from numba import cuda, float32, uint32


def dot_range(q, k, out, n):
    s = float32(0.0)
    i = cuda.threadIdx.x
    for d in range(n):              # a Python range(): signed 64-bit index, may wrap
        s += q[d] * k[i, d]
    out[i] = s


def dot_while(q, k, out, n):
    s = float32(0.0)
    i = cuda.threadIdx.x
    d = uint32(0)
    while d < uint32(n):            # an unsigned 32-bit index the compiler can reason about
        s += q[d] * k[i, d]
        d += uint32(1)
    out[i] = s
""")
SIG = "void(float32[::1], float32[:, ::1], float32[::1], int32)"
t0 = time.perf_counter()
binaries = build.compile_numba(
    work / "cubins",
    labels=["gemm_v1_none", "gemm_v3_none", "attention_v2_hd128_q32_k16"],
    file=snippet,
    entries=[("dot_range", SIG), ("dot_while", SIG)],
)
print(f"compiled {len(binaries)} kernels for sm_90 in {time.perf_counter() - t0:.0f} s (CPU)")
by_label = {b.label: b for b in binaries}
display(
    Markdown(
        markdown_table(
            ("kernel", "registers / thread", "static shared B", "stack B", "spill B"),
            [(b.label, b.registers, b.static_shared, b.stack_bytes, b.spill_stores + b.spill_loads) for b in binaries],
        )
    )
)

# %% [markdown]
# ## 2. Occupancy: which resource runs out first
#
# An SM holds as many blocks as the scarcest of four resources allows: the register file (65,536
# registers, handed to each warp in units of 256), shared memory (each block also costs a 1 KiB
# system reserve), the warp slots (64 per SM; 48 on sm_89) and the block slots (32; 24 on sm_89).
# The limits live in one table, `moonvit_kernels.xray.arch`, with their source.
# GEMM v3 launches 256 threads; with ~96 registers a warp needs 3,072 registers, 21 warps fit,
# i.e. 2 blocks: **register-limited** at 25 % occupancy — fine for a kernel that keeps a 4×4 tile
# of accumulators in registers, but worth knowing. The CUDA C flash attention (bf16) is the
# shared-memory example: 87,040 B of tiles per block fit twice into an H100's 228 KiB, only once
# into an A100's 164 KiB.

# %%
launches = [
    ("gemm_v1_none", 256, 0),
    ("gemm_v3_none", 256, 0),
    ("attention_v2_hd128_q32_k16", 512, 0),
]
rows = []
for label, threads, dynamic in launches:
    b = by_label[label]
    for a in arch.ARCHS:
        o = occupancy.occupancy(a, threads, b.registers, b.static_shared, dynamic)
        rows.append((label, a, threads, b.registers, b.static_shared, o.blocks_per_sm, f"{o.occupancy:.0%}", o.limiter))
# The CUDA C flash attention (bf16, hd 128), compiled with NVRTC for sm_90: registers from its cubin,
# dynamic shared memory from the launcher's catalogue.
from moonvit_kernels.cuda_backend import nvrtc_check, sources
from moonvit_kernels.xray.cubin import kernel_resources

(spec,) = [s for s in sources.kernel_specs((128,)) if s.label == "flash_attn_bf16_hd128"]
cubin, _ = nvrtc_check.build_cubin(spec, "sm_90")
flash_regs = next(iter(kernel_resources(cubin).values()))["registers"]
for a in arch.ARCHS:
    o = occupancy.occupancy(a, spec.threads, flash_regs, 0, spec.dynamic_smem)
    rows.append(
        ("CUDA " + spec.label, a, spec.threads, flash_regs, f"{spec.dynamic_smem:,} dyn", o.blocks_per_sm,
         f"{o.occupancy:.0%}", o.limiter)
    )  # fmt: skip
display(
    Markdown(
        markdown_table(("kernel", "arch", "threads", "regs", "shared B", "blocks/SM", "occupancy", "limited by"), rows)
    )
)
print(arch.SOURCE_LIMITS)

# %% [markdown]
# ## 3. SASS: what a loop costs, instruction by instruction
#
# The pip wheel `nvidia-cuda-nvdisasm` disassembles a cubin. A loop in SASS is a branch back to an
# earlier label; an innermost loop contains no other loop. Its cost is **instructions per FFMA**:
# the useful work of a dot product is one FFMA per element, everything else (index arithmetic,
# compares, loads) is overhead. The two snippets compute the same dot product:

# %%
loop_rows = []
for label in ("dot_range", "dot_while", "gemm_v1_none", "gemm_v3_none", "attention_v2_hd128_q32_k16"):
    fn = max(sass.disassemble(by_label[label].cubin), key=lambda f: len(f.instructions))
    for lp in fn.fma_loops:
        mix = ", ".join(f"{k} {v}" for k, v in lp.mix.most_common())
        loop_rows.append((label, f"{lp.start:#06x}", lp.size, lp.fmas, round(lp.per_fma, 1), mix))
display(Markdown(markdown_table(("kernel", "loop at", "instructions", "FFMA", "instr / FFMA", "mix"), loop_rows)))

fn = max(sass.disassemble(by_label["dot_range"].cubin), key=lambda f: len(f.instructions))
hot = max(fn.fma_loops, key=lambda lp: lp.fmas)
print(f"dot_range, hot loop: {hot.size} instructions for {hot.fmas} FFMA (first 24 shown)")
for ins in hot.own[:24]:
    print(f"  {ins.address:05x}  {ins}")

# %% [markdown]
# **Why a `range()` loop can cost several times more.** numba types `range(n)` with a signed 64-bit
# index and Python's semantics, so the compiler must compute 64-bit addresses (`IMAD.WIDE`, pairs of
# `IADD3`/`LEA` with carries) and keep the wrap-around checks of negative indices (`SEL`, `ISETP`):
# around twenty integer instructions surround every FFMA. Both versions are unrolled by 4 (the table's
# main loops hold 4 FFMA each): what differs is the index arithmetic. With an unsigned 32-bit index the
# compiler can prove the index never goes negative, drops the selects and folds the address arithmetic
# into the loads' immediate offsets — several times fewer instructions per FFMA (the table's instr /
# FFMA column) for the same maths.
# The rewritten hot loops of GEMM v3 and attention v2 are held to ≤ 4 instructions per FFMA by a
# compile-tier test (`tests/test_xray.py`).

# %% [markdown]
# ## 4. Bank conflicts and coalescing, measured by execution
#
# Shared memory has 32 banks of 4 bytes; in one request a warp's lanes that want *different* words
# of the same bank are served one after another (lanes that want the same word share it). Global
# memory moves 32-byte sectors; a warp's request costs one sector per distinct 32-byte piece it
# touches. `trace` runs a kernel under the simulator with its arrays wrapped, so that every access
# records (block, thread, source line, address); the lanes of a warp at the same source line in the
# same iteration form one request, costed by `counters`:

# %%
examples = [
    ("stride 1 float", counters.strided(4)),
    ("stride 2 floats", counters.strided(8)),
    ("stride 32 floats (a column of a 32-wide row-major tile)", counters.strided(128)),
    ("stride 33 floats (the same column, rows padded by 1)", counters.strided(132)),
    ("all lanes one address", counters.strided(0)),
    ("float4 per lane, stride 1 (4 phases of 8 lanes)", counters.strided(16, size=16)),
]
display(
    Markdown(
        markdown_table(
            ("request", "wavefronts (ideal)", "sectors (ideal)"),
            [
                (n, "{} ({})".format(*counters.wavefronts(r)), "{} ({})".format(*counters.sectors(r)))
                for n, r in examples
            ],
        )
    )
)


# %% [markdown]
# Padding in one picture: a 32×32 transpose through shared memory. Rows are written by rows (one
# lane per column: conflict-free), then read by columns. Unpadded, a column is 32 words 32 apart —
# all in one bank, 32 wavefronts. One extra word per row moves each row one bank over.


# %%
@cuda.jit
def transpose_padded(a, out):
    tile = cuda.shared.array((32, 33), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    tile[ty, tx] = a[ty, tx]
    cuda.syncthreads()
    out[ty, tx] = tile[tx, ty]


@cuda.jit
def transpose_unpadded(a, out):
    tile = cuda.shared.array((32, 32), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    tile[ty, tx] = a[ty, tx]
    cuda.syncthreads()
    out[ty, tx] = tile[tx, ty]


def site_table(sites):
    return markdown_table(
        ("line", "op", "array", "requests", "cost / request", "× ideal", "code"),
        [
            (s.where, s.kind, s.array, s.requests,
             f"{s.per_request:.1f} {'wavefronts' if s.space == 'shared' else 'sectors'}", round(s.factor, 2),
             s.code[:60])
            for s in sites
        ],
    )  # fmt: skip


a = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
for kernel in (transpose_unpadded, transpose_padded):
    out = np.zeros_like(a)
    sites = trace.merge_sites(trace.analyse(trace.run_traced(kernel, 1, (32, 32), [a, out], ["a", "out"])))
    assert np.array_equal(out, a.T)
    display(Markdown(f"**{kernel.__name__}** (CUDA simulator trace)\n\n" + site_table(sites)))

# %% [markdown]
# ### The GEMM ladder
#
# Each version runs on one block of full tiles (so no lane is masked by an edge), traced under the
# simulator. Read the `× ideal` column: 1 is perfect, 2 means twice the wavefronts or sectors a
# perfect access would need.

# %%
ladder = {j.name: j for j in jobs_numba.jobs()}
traced = {}
for name in ("gemm_v1", "gemm_v2", "gemm_v3"):
    t0 = time.perf_counter()
    traced[name] = jobs_numba.run(ladder[name])
    r = traced[name]
    assert r.error is None, r.error
    display(
        Markdown(f"**{name}** ({r.setup}; {time.perf_counter() - t0:.1f} s on the simulator)\n\n" + site_table(r.sites))
    )

# %% [markdown]
# **Why v1's B loads are uncoalesced.** In v1 `threadIdx.x` runs over output columns n, and the
# thread reads `B[n, k]`: consecutive lanes read elements that are a whole row of B (K floats) apart,
# so every lane lands in its own sector — 16 sectors per request (a warp spans two rows of 16 lanes,
# which share their `B` rows) where 2 would hold the data: 8× the traffic. `A[m, k]` is the same
# element for all 16 lanes of a row: a broadcast. v2 stages both operands through shared memory
# with loads in which consecutive lanes read consecutive k: 4 sectors for 128 bytes, perfect.
# v2's `b_tile` is read "transposed" (`b_tile[tx, kk]`); its row padding (`TILE + 1`) keeps those
# reads conflict-free. v3 stages BK-deep slabs stored k-major: how its staging stores and register
# loads fare is in the table (an unpadded slab layout traced 16-way on its staging stores; every
# shared access of v3 is held to ≤ 2-way by a test).

# %% [markdown]
# ### The attention ladder

# %%
for name in ("attention_v1", "attention_v2"):
    t0 = time.perf_counter()
    traced[name] = r = jobs_numba.run(ladder[name])
    assert r.error is None, r.error
    display(
        Markdown(f"**{name}** ({r.setup}; {time.perf_counter() - t0:.1f} s on the simulator)\n\n" + site_table(r.sites))
    )

# %% [markdown]
# In v1 thread t computes the score of key t: lane t reads `qkv[kv_start + t, k_col + d]`, one key
# row per lane, rows `3·Q` floats apart — one sector per lane again, for every d. v2 loads K and V
# tiles cooperatively (consecutive lanes, consecutive d: coalesced) and then reads them from shared
# memory, where the padded K tile (`HD + 1`) keeps `k_s[tx, d]` conflict-free; `q_s[ty, d]` is read
# by two rows of the score tile per warp, a broadcast within each half-warp.

# %% [markdown]
# ## 5. Roofline: where each version sits
#
# A kernel can go no faster than its FLOPs at peak compute nor its DRAM bytes at peak bandwidth.
# `catalogue` holds the FLOP and byte formulas of every kernel at K3 shapes (one 896×896 image,
# L = 4096 tokens); `roofline` turns them into lower-bound times from datasheet peaks. Points are
# placed at the intensity of the bytes each version's loads *request* (v1 GEMM re-reads A and B K
# times per output; tiles divide that by the tile edge), hollow markers at the compulsory intensity
# (every input read once).

# %%
labels = [
    ("numba", "gemm_v1_none"), ("numba", "gemm_v2_none"), ("numba", "gemm_v3_none"),
    ("cuda", "gemm_fp32_simt_none"), ("cuda", "gemm_bf16_tc_bf16_none"),
    ("numba", "attention_v1_hd128_t128"), ("numba", "attention_v2_hd128_q32_k16"),
    ("cuda", "flash_attn_f32_hd128"), ("cuda", "flash_attn_bf16_hd128"),
    ("numba", "rmsnorm_kernel_t256"), ("cuda", "rmsnorm_rows_bf16_bf16"),
]  # fmt: skip
infos = [catalogue.describe(b, lb) for b, lb in labels]
rows = []
for info in infos:
    bounds = {k: roofline.bound(info, g) for k, g in arch.GPUS.items()}
    rows.append(
        (f"{info.backend}: {info.label}", info.flops / 1e9, info.dram_bytes / 1e6, info.request_bytes / 1e6,
         round(info.flops / info.dram_bytes, 1), *(f"{bounds[k].seconds * 1e6:.0f} ({bounds[k].limit[0]})" for k in arch.GPUS))
    )  # fmt: skip
display(
    Markdown(
        "Lower-bound time per launch in µs (c = compute-bound, m = memory-bound), datasheet peaks, model, no GPU\n\n"
        + markdown_table(("kernel", "GFLOP", "DRAM MB", "requested MB", "FLOP/B", *arch.GPUS), rows)
    )
)
png = roofline.plot(infos, arch.GPUS["H200"], work / "roofline_H200.png")
display(Image(filename=str(png)))

# %% [markdown]
# Reading it: every fp32 GEMM is compute-bound at K3 sizes (its compulsory intensity is hundreds of
# FLOP per byte) and its floor is ~0.5 ms on an H200 at the fp32 SIMT peak; the bf16 tensor-core
# GEMM's floor is 15× lower. As written, GEMM v1 requests 2·K loads per output and would sit far on
# the memory side if caches did not catch the re-reads; tiling moves the points right. Attention is
# compute-bound once K and V tiles are reused across a query tile (v2, flash); v1 re-reads them per
# query row. RMSNorm is memory-bound whatever one does: its floor is the time to stream x in and out.

# %% [markdown]
# ## Exercises
#
# 1. A 32×32 tile is read by columns. With a row stride of 32 words that is 32-way; 33 makes it
#    conflict-free. What does a stride of 34 cost, and why? Predict, then check with `counters`.
# 2. GEMM v3 runs 256 threads. What is the largest register count per thread that still fits
#    **three** blocks on an sm_90 SM? (Registers go to warps in units of 256.)
# 3. Your turn: write a kernel in which each lane reads `src[tid * 2]` and trace it with
#    `trace.run_traced`: how many sectors does one request touch, and how many would hold the data?

# %%
# 1. stride 34 words: bank = 34·i mod 32 = 2·i mod 32, so 16 banks each hold two of the words -> 2 wavefronts
assert counters.wavefronts(counters.strided(4 * 34)) == (2, 1)
# 2. three blocks = 24 warps; 65,536 / 24 = 2,730 registers per warp, rounded down to 256s: 2,560 = 80 per thread
assert occupancy.occupancy("sm_90", 256, 80).blocks_per_sm == 3
assert occupancy.occupancy("sm_90", 256, 81).blocks_per_sm == 2


# 3. stride-2 reads touch 8 sectors where 4 would hold the 128 useful bytes
@cuda.jit
def read_stride_2(src, out):
    tid = cuda.threadIdx.x
    out[tid] = src[tid * 2]


src = np.arange(64, dtype=np.float32)
out = np.zeros(32, np.float32)
(load,) = [
    s
    for s in trace.merge_sites(trace.analyse(trace.run_traced(read_stride_2, 1, 32, [src, out], ["src", "out"])))
    if s.array == "src"
]
assert (load.per_request, load.ideal / load.requests) == (8, 4)
np.testing.assert_array_equal(out, src[::2])
print(f"notebook ran in {time.perf_counter() - t_start:.0f} s on the CPU (model, no GPU)")
