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
# 5. **Roofs** — how long a launch at the real (K3) sizes must take at least: FLOPs at the peak of
#    its instruction class, DRAM bytes at the datasheet bandwidth, and — from the SASS and the traces —
#    shared-memory wavefronts at one per clock per SM and warp-instructions at four per clock per SM.
#
# Every number below is labelled **model, no GPU**: it comes from the compiler, from the
# architecture tables of the CUDA C++ Programming Guide, from addresses recorded on the CPU, or
# from datasheets — never from a measurement. Section 6 works the roofs of one kernel by hand. The whole report for every kernel, both backends and
# three architectures is one command:
#
# ```
# python -m moonvit_kernels.tools.xray --arch sm_80,sm_89,sm_90 --out xray_report
# ```
#
# This notebook reads each view on the two ladders of the workbook: the GEMM versions (notebook 01)
# and the attention versions (notebook 04), plus the CUDA C kernels for comparison.

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
from moonvit_kernels.tools.xray import (
    arch,
    build,
    calibration,
    catalogue,
    counters,
    jobs_numba,
    launch_counts,
    occupancy,
    roofline,
    sass,
    trace,
)

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
# An SM holds as many blocks as the scarcest of four resources allows: the register file, shared
# memory (each block also costs a 1 KiB system reserve), the warp slots (64 per SM; 48 on sm_89) and
# the block slots (32; 24 on sm_89). The register file is 65,536 registers split into **4
# sub-partitions** of 16,384; each warp is handed its registers in units of 256, all in one
# sub-partition. So a sub-partition holds floor(16,384 / registers per warp) warps, an SM four times
# that — and a block launches only if its warps fit (`moonvit_kernels.launch_rules`, checked against
# the CUDA occupancy calculator's own header). At 80 registers a warp takes 2,560: 6 per
# sub-partition, 24 per SM, so at most 768 threads — not the 800 that 80 × 800 ≤ 65,536 suggests.
# The limits live in one table, `moonvit_kernels.tools.xray.arch`, with their source.
# GEMM v3 launches 256 threads; with ~96 registers a warp needs 3,072 registers, 5 fit in a
# sub-partition, 20 per SM, i.e. 2 blocks: **register-limited** at 25 % occupancy — fine for a
# kernel that keeps a 4×4 tile of accumulators in registers, but worth knowing. The CUDA C flash attention (bf16) is the
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
from moonvit_kernels import registry
from moonvit_kernels.tools import nvrtc_check
from moonvit_kernels.tools.xray.cubin import kernel_resources

(spec,) = [s for s in registry.kernel_specs((128,)) if s.label == "flash_attn_bf16_hd128"]
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
from moonvit_kernels import launch_rules

print(
    "80 registers: at most", launch_rules.max_threads_for(80), "threads per block;",
    "768 fit:", launch_rules.register_problem(80, 768) is None, "| 800:", launch_rules.register_problem(80, 800),
)  # fmt: skip

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
# ## 5. Roofs: what each launch must take at least
#
# A launch can go no faster than any one of the resources it uses allows. `catalogue` holds the FLOP
# and byte formulas of every kernel at K3 shapes (one 896×896 image, L = 4096 tokens); the roofs of
# `roofline` turn them — and the SASS — into lower-bound times (**model, no GPU**):
#
# | roof | time ≥ | rate (H100/H200) |
# |---|---|---|
# | compute | FLOPs / peak of the kernel's instruction class | FFMA 67 TFLOP/s; mma.sync 494.5 (a model: half the wgmma rate, no datasheet gives it); wgmma 989 |
# | DRAM | compulsory bytes / bandwidth | 3.35 / 4.8 TB/s |
# | shared | shared-memory wavefronts / (1 per clock per SM × SMs × clock) | 128 B per clock per SM |
# | issue | warp-instructions / (4 per clock per SM × SMs × clock) | 4 schedulers, 1 instruction each per clock |
#
# The last two need the launch's instruction counts. `launch_counts` takes the loops that do the
# FMAs, scales them until they do the launch's FLOPs (trips = FLOPs / 2 / multiply-adds per trip),
# and counts their instructions and shared wavefronts (an LDS of one word per lane is one
# wavefront, LDS.128 or ldmatrix.x4 four, times the conflict factor traced in section 4). It leaves
# out the staging loops, prologue and epilogue: a lower bound, as a roof must be. The roof that
# gives the longest time **binds**.

# %%
h200 = arch.GPUS["H200"]


def sass_of(cubin_bytes):
    return max(sass.disassemble(cubin_bytes), key=lambda f: len(f.instructions))


functions = {
    ("numba", lb): sass_of(by_label[lb].cubin) for lb in ("gemm_v1_none", "gemm_v3_none", "attention_v2_hd128_q32_k16")
}
functions[("cuda", "flash_attn_bf16_hd128")] = sass_of(cubin)  # built with NVRTC in section 2
traces_of = {
    ("numba", "gemm_v1_none"): traced["gemm_v1"],
    ("numba", "gemm_v3_none"): traced["gemm_v3"],
    ("numba", "attention_v2_hd128_q32_k16"): traced["attention_v2"],
}
labels = [
    ("numba", "gemm_v1_none"), ("numba", "gemm_v3_none"), ("numba", "attention_v2_hd128_q32_k16"),
    ("cuda", "flash_attn_bf16_hd128"), ("cuda", "gemm_bf16_sm90_bn128_bf16_none"), ("numba", "rmsnorm_kernel_t256"),
]  # fmt: skip
points, rows = [], []
for backend, label in labels:
    info = catalogue.describe(backend, label)
    fn = functions.get((backend, label))
    counts = launch_counts.count(fn, info.flops, info.fma_shares, traces_of.get((backend, label))) if fn else None
    bd = roofline.bound(info, h200, counts)
    points.append((info, bd))
    us = {k: f"{v * 1e6:,.1f}" for k, v in bd.roofs.items()}
    compute = roofline.COMPUTE_ROOFS[info.peak]
    rows.append(
        (f"{backend}: {label}", f"{compute} {us[compute]}", us["DRAM"], us.get("shared", "no SASS here"),
         us.get("issue", "-"), f"**{bd.seconds * 1e6:,.1f}**", bd.limit)
    )  # fmt: skip
display(
    Markdown(
        "Lower bounds per launch on an H200 in µs, K3 shapes (model, no GPU)\n\n"
        + markdown_table(("kernel", "compute", "DRAM", "shared", "issue", "bound", "binds"), rows)
    )
)
png = roofline.plot(points, h200, work / "roofline_H200.png")
display(Image(filename=str(png)))
print(calibration.results_files() or calibration.NO_GPU_RUN)

# %% [markdown]
# Reading it: the fp32 GEMMs and attention are not FLOP-bound at all — **shared memory binds**.
# GEMM v3 issues one single-word shared load per two FFMAs, and an SM serves one wavefront per clock
# while it retires four warp-FFMAs: twice the FFMA roof. Attention v2's QK loop reads both q and k
# from shared memory for every FFMA, six times its FFMA roof. The tensor-core flash attention
# (mma.sync) reads K and V with `ldmatrix.x4` — 64 of them (4 wavefronts each) per 128 MMAs per warp
# and key tile — and is held by shared memory too, just above its mma.sync roof; measured against the
# wgmma peak it could never reach, its bound would have been half as long. The Hopper GEMM is not
# compiled here (the X-ray report has its SASS); its wgmma reads operands through matrix
# descriptors, which the shared roof does not count, and its wgmma roof binds. GEMM v1 has no
# shared memory but so many instructions per FFMA that issue binds. RMSNorm streams x in and out:
# DRAM. (Triangles in the picture: each kernel's own
# shared-memory roof; crosses: its issue roof.) Section 6 takes one of them apart by hand.

# %% [markdown]
# ## 6. One kernel's roofs by hand: GEMM v3 at the wqkv shape
#
# The hot loop of GEMM v3 (section 3) is one trip of 8 k-steps: 128 FFMAs, 64 single-word LDS. The
# launch multiplies M × N × K = 4096 × 4608 × 1024 pairs, 32 per warp-FFMA. Everything else
# follows from the SASS and the trace:

# %%
info = catalogue.describe("numba", "gemm_v3_none")
M, N, K, _ = catalogue.GEMM_SHAPES["none"]
fn = functions[("numba", "gemm_v3_none")]
(kloop,) = fn.fma_loops
lds = [i for i in kloop.own if i.opcode == "LDS"]
assert all(launch_counts.wavefronts(i) == 1 for i in lds)  # single-word loads: one wavefront each, conflict-free
load_factor, _ = launch_counts.conflict_factors(traced["gemm_v3"])  # traced in section 4
trips = M * N * K / 32 / kloop.fmas
sm_clocks = h200.sms * h200.clock_hz  # SM-clocks per second of the whole GPU
by_hand = {
    "FFMA": 2 * M * N * K / h200.fp32_flops,
    "DRAM": info.dram_bytes / h200.dram_bytes_per_s,
    "shared": trips * len(lds) * load_factor / (1 * sm_clocks),
    "issue": trips * kloop.size / (4 * sm_clocks),
}
print(f"hot loop: {kloop.size} instructions, {kloop.fmas} FFMA, {len(lds)} LDS per trip; {trips:.3g} trips per launch")
print(f"traced conflict factor of its shared loads: {load_factor:.2f}; clock {h200.clock_hz / 1e9:.2f} GHz (model)")
for roof, t in by_hand.items():
    print(f"  {roof:6s} {t * 1e6:8.1f} µs")
model = roofline.bound(info, h200, launch_counts.count(fn, info.flops, trace=traced["gemm_v3"]))
assert all(abs(model.roofs[r] - t) <= 1e-9 * t for r, t in by_hand.items())
print(f"roofline.bound agrees: {model.seconds * 1e6:.1f} µs, bound by {model.limit} (model, no GPU)")

# %% [markdown]
# Per FFMA the loop spends 64 / 128 = 0.5 wavefronts, and shared memory serves 1 per clock per SM
# while the FP32 units retire 4 warp-FFMAs per clock: shared memory needs 2 clocks where the FFMAs
# need 1. Issue comes next: 199 / 128 ≈ 1.55 instructions per FFMA against 4 issue slots. DRAM is
# 50× further down: at K3 sizes a tiled GEMM never waits for memory. The fix the roofs point to is
# a bigger register tile — each thread loading more values per k-step and reusing them more — not
# fewer FLOPs. These are bounds, not predictions: what a GPU did is measured by `gpu_check`, and its reports
# under `benchmarks/results/` are read back here (the first, an H200, 2026-12-04), at exactly this shape.

# %%
from moonvit_kernels.plots.prediction import measured_reports
from moonvit_kernels.tools.xray import calibration

bound_rate = info.flops / model.seconds / 1e12
for path in measured_reports():
    for row in calibration.read_kernel_rows(path):
        if row["item"] == "gemm v3 qkv" and row["shape"] == f"{M}x{N}x{K}":
            rate = float(row["rate"])
            print(
                f"{path.parent.name} (gpu_check, real GPU): GEMM v3 at {row['shape']}: {rate:.1f} TFLOP/s measured; "
                f"the bound allows {bound_rate:.1f} (model): measured / bound = {rate / bound_rate:.2f}"
            )

# %% [markdown]
# ## Exercises
#
# 1. A 32×32 tile is read by columns. With a row stride of 32 words that is 32-way; 33 makes it
#    conflict-free. What does a stride of 34 cost, and why? Predict, then check with `counters`.
# 2. GEMM v3 runs 256 threads. What is the largest register count per thread that still fits
#    **three** blocks on an sm_90 SM? (Registers go to warps in units of 256, and each of the 4
#    sub-partitions holds 16,384.)
# 3. Your turn: write a kernel in which each lane reads `src[tid * 2]` and trace it with
#    `trace.run_traced`: how many sectors does one request touch, and how many would hold the data?
# 4. Suppose GEMM v3's threads each owned an 8×8 tile of C: every k-step loads 8 + 8 single words
#    and does 64 FFMAs. What would its shared roof be at the wqkv shape on an H200, and which roof
#    would bind?

# %%
# 1. stride 34 words: bank = 34·i mod 32 = 2·i mod 32, so 16 banks each hold two of the words -> 2 wavefronts
assert counters.wavefronts(counters.strided(4 * 34)) == (2, 1)
# 2. three blocks = 24 warps = 6 per sub-partition; 16,384 / 6 = 2,730 registers per warp, rounded down to
#    256s: 2,560 = 80 per thread
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
# 4. 16 wavefronts per 64 FFMA = 0.25 per warp-FFMA; shared memory serves 1 per clock, the FFMAs retire 4:
#    the shared roof equals the FFMA roof (577 µs), so neither binds alone: the two tie.
shared_8x8 = (M * N * K / 32) * (16 / 64) / sm_clocks
assert abs(shared_8x8 - by_hand["FFMA"]) < 1e-9 * shared_8x8 and shared_8x8 < by_hand["shared"] / 1.9
print(f"notebook ran in {time.perf_counter() - t_start:.0f} s on the CPU (model, no GPU)")
