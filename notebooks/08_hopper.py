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
# # 08 — The Hopper rung: wgmma, TMA and warp specialisation
#
# The tensor-core kernels of notebooks 01 and 04 (`gemm_bf16.cu`, `attention.cu`) use Ampere's
# instructions: `mma.sync` on one warp's register fragments, fed by `ldmatrix` from shared memory,
# which `cp.async` filled. They run on an H100/H200 too, but the kernels that reach cuBLAS there
# (CUTLASS 3, FlashAttention-3) are built on what Hopper (sm_90a) added — by their authors' accounts,
# `mma.sync` alone leaves much of Hopper's tensor-core rate unused; this project has not measured that
# yet. This notebook is about those additions, as two kernels of this package use them:
# `cuda_backend/gemm_bf16_sm90.cu` and `cuda_backend/flash_attn_sm90.cu`.
#
# | | Ampere (sm_80), `gemm_bf16.cu` | Hopper (sm_90a), `gemm_bf16_sm90.cu` |
# |---|---|---|
# | MMA instruction | `mma.sync.m16n8k16`, one warp (32 threads) | `wgmma.mma_async.m64nNk16`, one warpgroup (4 warps, 128 threads), N ≤ 256 |
# | operands | registers: every lane loads its fragment with `ldmatrix` | shared memory, named by 64-bit **matrix descriptors** (A may also be in registers) |
# | completion | synchronous: the result is in registers after the instruction | asynchronous: `wgmma.fence`, `commit_group`, `wait_group N` |
# | global → shared | `cp.async` 16 bytes per thread per instruction, every thread computes addresses and bounds | **TMA** `cp.async.bulk.tensor`: one thread copies a whole box described by a **tensor map**; out-of-range elements arrive as zeros |
# | knowing the data landed | `cp.async.wait_group` + `__syncthreads()` | an **mbarrier** that counts arrivals *and* bytes (`expect_tx`) |
# | who does what | every warp loads and computes | **warp specialisation**: a producer warpgroup loads, consumer warpgroups compute; `setmaxnreg` moves registers to the consumers |
# | bank conflicts | padded rows (40 bf16 instead of 32) | the **128-byte swizzle**, applied by TMA on the way in and undone by wgmma on the way out |
#
# **Nothing computed in this notebook runs on a GPU.** There are three kinds of numbers below, each labelled:
# results of the **CPU emulator** (the `.cu` files compiled by g++ against models of the Hopper
# instructions, written from the PTX ISA), facts of the **compiled binary** (NVRTC → cubin for sm_90a,
# disassembled: "compile-only, no GPU"), and **models** (occupancy from the architecture tables). None
# of them is a speed. The speeds were measured once, on an H200 (`benchmarks/results/H200-2026-12-04-full`):
# at 4096 tokens `gemm_bf16_sm90` ran the encoder GEMMs at 359-511 TFLOP/s (its faster tile width per shape;
# 54-68% of cuBLAS in the same run), up to 2.4x the mma.sync GEMM of notebook 01; `flash_attn_sm90` ran at
# 157 TFLOP/s, **slower** than the mma.sync flash kernel of notebook 04 (238 TFLOP/s). A new instruction set is
# a higher ceiling, not a faster kernel: what keeps this one below it is the next thing to find out.

# %%
# Without a GPU, numba.cuda runs on its CPU simulator (the exercises at the end use it); the switch
# must be set before numba is imported. The Hopper kernels themselves run on the g++ CPU emulator.
# %matplotlib inline
from moonvit_kernels.device import use_simulator_without_gpu, where

use_simulator_without_gpu()

import math
import time
import warnings

import numpy as np
from IPython.display import Markdown, display

from moonvit_kernels import reference
from moonvit_kernels.cuda_backend import tensor_maps
from moonvit_kernels.cuda_backend.sources import KERNEL_DIR
from moonvit_kernels.plots import markdown_table
from moonvit_kernels.plots.hopper import plot_swizzle, swizzle_layout
from moonvit_kernels.source_regions import region
from moonvit_kernels.tools.emulation import compiler
from moonvit_kernels.weights import bf16_bits_to_float32, float32_to_bf16_bits

t_start = time.perf_counter()
rng = np.random.default_rng(8)
HAVE_CXX = compiler() is not None
if HAVE_CXX:
    from moonvit_kernels.cuda_backend import hopper_launchers, launchers
    from moonvit_kernels.tools import emulation
    from moonvit_kernels.tools.emulation import hopper

    trusted = emulation.OnEmulator(launchers)  # the mma.sync kernels' launchers, run on the CPU emulator
    sm90 = emulation.OnEmulator(hopper_launchers)  # the Hopper kernels' launchers, run on the CPU emulator
    t0 = time.perf_counter()
    hopper.library()  # the probes of the Hopper models, built once per source version, then cached
    emulation.library()
    print(f"CPU emulators ready in {time.perf_counter() - t0:.1f} s (CPU)")
else:
    print("no C++ compiler (g++ >= 11) here: the emulator cells below say so and skip")
print(f"numba kernels (the exercises) run on: {where()}; the Hopper kernels below run on the CPU emulator")


def show(filename: str, name: str) -> None:
    """Print region `name` of a kernel file (its `// region: name` ... `// endregion` lines)."""
    print(f"// ---- {filename}\n" + region(KERNEL_DIR / filename, name))


# %% [markdown]
# ## 1. From `mma.sync` to `wgmma.mma_async`
#
# Ampere's MMA is a *warp* instruction with every operand in registers. Each lane holds a piece (a
# *fragment*) of A, B and the accumulator, so before every `mma.sync` the warp runs `ldmatrix` to move
# A and B from shared memory into those registers; one instruction multiplies 16×16 by 16×8
# (2,048 multiply-adds):

# %%
show("ptx.cuh", "mma_sync_16x8x16")

# %% [markdown]
# Hopper's `wgmma.mma_async` is a *warpgroup* instruction: the 4 warps of a warpgroup (128 threads)
# issue it together, and it multiplies a 64×16 tile of A by a 16×N tile of B (N up to 256: with
# N = 128, 131,072 multiply-adds, 64 times one `mma.sync`). A and B are **not** in registers: the
# instruction reads them from shared memory itself, and each operand is named by one 64-bit *matrix
# descriptor* (section 2). Only the accumulator lives in registers — 64×N fp32 spread over 128 threads,
# N/2 registers each, in the layout written in the comment below.
#
# It is also **asynchronous**: the instruction is issued and the warpgroup runs on while the tensor
# cores work. Three instructions order it:
# - `wgmma.fence` before the first wgmma that touches accumulators written by ordinary instructions
#   (and after shared-memory writes the wgmma will read);
# - `wgmma.commit_group` closes a group of issued wgmmas;
# - `wgmma.wait_group N` blocks until at most N groups are still running — only then may the
#   accumulators (or the shared memory the group reads) be touched.
#
# The wrappers in `ptx_sm90.cuh` (the operand list of the 64 accumulators is cut after its first line):

# %%
show("ptx_sm90.cuh", "wgmma_fence")
print("  ...")
show("ptx_sm90.cuh", "wgmma_m64n128k16")
print("      ...")
show("ptx_sm90.cuh", "wgmma_operands")

# %% [markdown]
# `"}, %64, %65, p, 1, 1, 0, 0"`: descriptor of A, descriptor of B, `scale-d` (0: ignore the old
# accumulators), then `imm-scale-a`, `imm-scale-b` (1: no negation) and `tnspA`, `tnspB` (0: both
# operands are **K-major**, i.e. K is the contiguous dimension — `A[M, K]` and an `nn.Linear` weight
# `B[N, K]` are stored that way, so no transposition is needed).
#
# Where do the results land? One wgmma m64n16k16 on the emulator, with A and B chosen so that
# `D[m, n] = 64·m + n` (exact in bf16 and fp32: `A[m] = (m, 1, 0, …)`, `B[n] = (64, n, 0, …)`), both
# placed in shared memory with the 128-byte swizzle of section 3; each thread's registers then say
# which elements it holds. Warp `w` holds rows `16w…16w+15`; lane `l` holds rows `l/4` and `l/4 + 8`
# of them, columns `2·(l%4)` and `+1` of every 8-column block — the same per-warp pattern as
# `mma.sync`'s accumulator, repeated 4 warps down. The GEMM's epilogue and the attention kernel's
# softmax index their registers exactly this way.

# %%
from moonvit_kernels.plots.hopper import accumulator_owners, plot_accumulator_owners


def place_swizzled(image: np.ndarray, x: np.ndarray, offset: int) -> None:
    """Store x [rows, 16] (float32, rounded to bf16) K-major with the 128-byte swizzle at `offset`."""
    bits = float32_to_bf16_bits(x)
    for r in range(x.shape[0]):
        for k in range(x.shape[1]):
            addr = offset + 128 * r + 16 * ((2 * k // 16) ^ (r % 8)) + (2 * k) % 16
            image[addr : addr + 2] = np.frombuffer(bits[r, k].tobytes(), np.uint8)


if HAVE_CXX:
    n_acc = 16
    a_codes = np.zeros((64, 16), np.float32)
    a_codes[:, 0], a_codes[:, 1] = np.arange(64), 1
    b_codes = np.zeros((n_acc, 16), np.float32)
    b_codes[:, 0], b_codes[:, 1] = 64, np.arange(n_acc)
    image = np.zeros(64 * 128 + n_acc * 128, np.uint8)
    place_swizzled(image, a_codes, 0)
    place_swizzled(image, b_codes, 64 * 128)
    # descriptors as (offset in the image, LBO, SBO, swizzle span): 8-row groups 1024 bytes apart
    acc, before_wait = hopper.wgmma_probe(image, n_acc, (0, 16, 1024, 128), (64 * 128, 16, 1024, 128))
    thread, register = accumulator_owners(acc)
    print(f"thread 5 holds {acc[5].astype(int).tolist()} = D[1, 2], D[1, 3], D[9, 2], D[9, 3], D[1, 10], ...")
    print(f"before wgmma.wait_group the model's accumulators are NaN: {bool(np.isnan(before_wait).all())}")
    fig = plot_accumulator_owners(thread, register)
else:
    fig = None
    print("no C++ compiler: the wgmma model is not built")
fig

# %% [markdown]
# ## 2. The matrix descriptor
#
# A descriptor tells the tensor cores where a 64×16 (or N×16) operand tile lies in shared memory and
# how it is laid out. The encoder, shared by the GPU build and the emulator (`sm90.cuh`):

# %%
show("sm90.cuh", "smem_descriptor")

# %% [markdown]
# The GEMM's consumer warpgroup builds one descriptor per 16-wide K slice of a 64-wide K tile. The
# tile's rows are 64 bf16 = 128 bytes, so slice `kk` starts `32·kk` bytes into row 0, and the 8-row
# groups of the tile are `SBO = 8 · 128 = 1024` bytes apart. Encoded by the kernels' own `wgmma_desc`
# (compiled into the emulator) and read back by the emulator's model of the hardware's decoder:

# %%
if HAVE_CXX:
    ring = 0x400  # the ring opens dynamic shared memory, declared __align__(1024); the emulator's window starts there
    rows = []
    for kk in range(4):
        d = hopper.desc_encode(ring + 32 * kk, 16, 1024, 128)
        f = hopper.desc_decode(d)
        rows.append((kk, f"{ring + 32 * kk:#07x}", f"{d:#018x}", f"{f['start']:#07x}", *list(f.values())[1:]))
    display(
        Markdown(
            markdown_table(("kk", "shared address", "descriptor", "start", "LBO", "SBO", "base off.", "mode"), rows)
        )
    )
else:
    print("no C++ compiler: the descriptor model is not built")

# %% [markdown]
# Only the start address moves (by 2 in 16-byte units). That is enough even though the rows are
# swizzled (next section): the swizzle is a function of the *final* address bits, so wgmma applies it
# after adding the row and chunk offsets to the start — which is why the tile must start on a
# 1024-byte boundary (`base offset = 0`), and why the kernels declare their dynamic shared memory
# `__align__(1024)` (the emulator refuses a 128B-swizzled operand off such a boundary).
#
# ## 3. The 128-byte swizzle
#
# A K-major tile with 128-byte rows has a bank problem: shared memory has 32 banks of 4 bytes, so a
# 128-byte row covers each bank exactly once, and the same 16 bytes of 8 consecutive rows — the
# 8×8 bf16 "core matrix" an MMA consumes — all sit in the same 4 banks: 8 accesses one after the
# other. Ampere's kernel pads each row by 16 bytes (notebook 01). Hopper's TMA and wgmma instead agree
# on a permutation: in row `r`, 16-byte chunk `j` is stored at chunk position `j XOR (r mod 8)`. The
# table below is read off the emulator's model of the hardware (`hopper.swizzle`), one address at a
# time (`tests/test_hopper_layouts.py` checks the model against the documentation's figures):

# %%
if HAVE_CXX:
    layouts = {
        "no swizzle: chunk j always in banks 4j..4j+3": swizzle_layout(lambda a, span: hopper.swizzle(a, 0)),
        "128-byte swizzle (emulator model)": swizzle_layout(hopper.swizzle, 128),
    }
    print("position of logical chunk j (columns) in row r (rows), 128-byte swizzle:")
    print(layouts["128-byte swizzle (emulator model)"])
    fig = plot_swizzle(layouts)
else:
    fig = None
    print("no C++ compiler: the swizzle model is not built")
fig

# %% [markdown]
# Follow one colour: chunk 0 (elements k 0–7) of rows 0…7 is now in 8 different slots, so 8
# different groups of banks. The cost of reading that column of chunks, with the bank model of
# notebook 07 (`xray.counters`: 8 lanes reading 16 bytes each form one phase of a request):

# %%
from moonvit_kernels.tools.xray import counters

rows = []
for j in (0, 3):
    plain = [(r, 128 * r + 16 * j, 16) for r in range(8)]
    if HAVE_CXX:
        swz = [(r, hopper.swizzle(4096 + 128 * r + 16 * j, 128) - 4096, 16) for r in range(8)]
    else:  # the documented formula, when the model is not built
        swz = [(r, 128 * r + 16 * (j ^ r), 16) for r in range(8)]
    rows.append(
        (
            f"chunk {j} of rows 0–7",
            "{} ({})".format(*counters.wavefronts(plain)),
            "{} ({})".format(*counters.wavefronts(swz)),
        )
    )
display(Markdown(markdown_table(("8 × 16-byte read", "wavefronts, plain rows (ideal)", "swizzled (ideal)"), rows)))

# %% [markdown]
# (How wgmma's operand reads are scheduled inside the SM is not documented at this level; what the
# swizzle guarantees is that an 8-row core matrix is spread over all 32 banks — the property the
# table measures, "model, no GPU".) Exercise A at the end asks you to write the swizzled address.
#
# ## 4. From `cp.async` to the tensor memory accelerator (TMA)
#
# In the Ampere GEMM every thread copies 16-byte chunks and does the bookkeeping itself — addresses,
# bounds, zero-filling the tail:

# %%
show("gemm_bf16.cu", "cp_async_stage")

# %% [markdown]
# On Hopper the host describes the whole global tensor once, in a 128-byte **tensor map**
# (`cuTensorMapEncodeTiled`: base address, sizes, row pitch, box size, swizzle), and passes it to the
# kernel by value. One thread then copies a whole box with one instruction, and the copy engine does
# the addressing, the swizzle, and the **zero fill** of every element outside the tensor — the GEMM's
# tails in M, N and K need no code at all. The GEMM's maps (`cuda_backend/tensor_maps.py`):

# %%
M, N, K = 77, 150, 136  # tails in all three: 77 = 128·0 + 77, 150 = 128 + 22, 136 = 2·64 + 8
for name, m in (("A", tensor_maps.gemm_operand_map(M, K)), ("B", tensor_maps.gemm_operand_map(N, K))):
    print(f"{name}: dims {m.dims} (innermost first), row pitch {m.strides[0]} B, box {m.box}, "
          f"{m.swizzle}-byte swizzle, {m.box_bytes:,} bytes per box")  # fmt: skip
show("ptx_sm90.cuh", "tma_load_2d")

# %% [markdown]
# The copy is asynchronous too, and it does not count in `cp.async` groups: it **completes on an
# mbarrier**, a 64-bit object in shared memory that counts two things per *phase* — pending arrivals
# and pending transaction bytes. The producer announces the bytes it is about to load
# (`mbarrier.arrive.expect_tx`), each box adds its bytes when it lands (`complete_tx`), and the phase
# completes when both counts reach zero. Consumers wait on the phase's parity (`try_wait.parity`).
# The emulator's model, stepped by hand for one stage of the GEMM (two boxes of 16 KiB):

# %%
if HAVE_CXX:
    stage = 2 * tensor_maps.gemm_operand_map(M, K).box_bytes
    script = [("init", 1), ("arrive_expect_tx", stage), ("try_wait", 0), ("complete_tx", stage // 2), ("try_wait", 0),
              ("complete_tx", stage // 2), ("try_wait", 0), ("try_wait", 1)]  # fmt: skip
    waits = iter(hopper.mbar_script(script))
    for op, arg in script:
        shown = f"  -> {'phase complete' if next(waits) else 'not yet'}" if op == "try_wait" else ""
        print(f"{op:17s} {arg:6d}{shown}")
else:
    print("no C++ compiler: the mbarrier model is not built")

# %% [markdown]
# (The last line: right after phase 0 completes, phase 1 is in progress, so waiting on parity 1 fails.)
# And a box that hangs over the edge of its tensor: a 6×24 bf16 matrix (a tensor map's row pitch must be a
# multiple of 16 bytes: 48 here — the reason the Hopper GEMM needs `K % 8 == 0`), a box of 8 rows × 16
# columns at column 16, row 2, no swizzle. The bytes expected are the **whole box's**, including the
# zero-filled part — exactly what the kernel passes to `arrive.expect_tx` for every stage, tails
# included. Announcing only the in-range bytes would be a bug: more bytes would complete than were
# expected (undefined in the PTX ISA; the emulator's model aborts with "more transaction bytes"), and
# the phase could complete before the box has landed. Announcing too many never completes the phase:
# a deadlock, which the emulator also reports.

# %%
if HAVE_CXX:
    g = (np.arange(6 * 24, dtype=np.uint16) + 1).reshape(6, 24)
    landed, _, state = hopper.tma_probe(g, box=(16, 8), coords=(16, 2), span=0)
    print("box as it landed in shared memory (0 = filled by the copy engine):")
    print(landed.reshape(8, 16))
    print(f"bytes the barrier waited for: {state[0]} = 8 x 16 x 2 (in range: 4 x 8 x 2 = 64)")
    assert (
        state[0] == 8 * 16 * 2 and (landed.reshape(8, 16)[4:] == 0).all() and (landed.reshape(8, 16)[:, 8:] == 0).all()
    )
else:
    print("no C++ compiler: the tensor-copy model is not built")

# %% [markdown]
# ## 5. Warp specialisation and `setmaxnreg`: the GEMM kernel
#
# With copies issued by one thread and MMAs that run asynchronously, there is no reason for every warp
# to do both. `gemm_bf16_sm90` runs 3 warpgroups per 128×128 output tile: **warpgroup 0 produces**
# (one of its threads issues the TMA copies into a 4-stage ring), **warpgroups 1 and 2 consume** (each
# multiplies 64 rows of the tile). Its configuration and header:

# %%
show("gemm_bf16_sm90.cu", "gemm_sm90_tiles")
show("gemm_bf16_sm90.cu", "gemm_sm90_config")

# %% [markdown]
# Two barriers per stage: `full[s]` (the producer's `arrive.expect_tx` plus the bytes of both boxes)
# and `empty[s]` (one arrival per consumer warpgroup when it no longer needs stage `s`). Stage `s` is
# reused every 4 K tiles, so each barrier goes through one phase per round and the waits use the
# round's parity. `setmaxnreg` redistributes the register file: all threads start with 168 registers
# (65,536 / 384, rounded down to a multiple of 8), the producer gives them back down to 40 and the
# consumers take 232, enough for their 64 fp32 accumulators per thread and the epilogue without
# spilling: `128 · (40 + 2 · 232) = 64,512 ≤ 65,536`.

# %%
show("gemm_bf16_sm90.cu", "gemm_sm90_roles")

# %% [markdown]
# Read the consumer loop in order: wait until stage `s` is full; `wgmma.fence`; 4 wgmmas (one per 16 of
# the 64 K columns, the descriptor's start advancing 32 bytes each); `commit`; `wait_group 1` — which
# returns once the *previous* tile's group is done, so the tensor cores always have the next group
# queued — and only then release the previous stage to the producer.
#
# ## 6. The attention kernel
#
# `flash_attn_sm90` keeps the algorithm of the Ampere flash kernel (notebook 04: exp2 domain, online
# softmax, P reused from the S accumulators) and changes the machinery: Q and K arrive by TMA into
# 128-byte-swizzled tiles; `S = Q·Kᵀ` is a wgmma m64n64k16 with both operands in shared memory; the
# online softmax runs on S's accumulator fragment; `P` is packed to bf16 **in registers** and fed to
# `O += P·V` as wgmma's A operand from registers (the `_rs` form); V must be K-major for that product,
# so the producer warpgroup transposes it in shared memory — writing the swizzle itself, since these
# are ordinary stores — then `fence.proxy.async` makes the stores visible to wgmma:

# %%
show("flash_attn_sm90.cu", "attn_sm90_v_transpose")
show("flash_attn_sm90.cu", "attn_sm90_pv")

# %% [markdown]
# ## 7. Both kernels on the CPU emulator, against NumPy
#
# The Hopper kernels' real launchers (`hopper_launchers`) run on the emulated device
# (`emulation.OnEmulator`), which compiles the two `.cu` files unchanged with g++, against models of
# wgmma (descriptor decoding, swizzle modes, fence/commit/wait: accumulators read as NaN until the
# wait that retires their group, and a copy or store into shared memory that a running wgmma reads is
# reported as a race), tensor maps and bulk copies (zero fill), mbarriers (phases, tx counts,
# deadlocks) and setmaxnreg (the register pool, checked). Every CUDA thread is a fiber; see `emulation/hopper.cuh`.
#
# GEMM at sizes with tails everywhere, compared with a float64 product of the **bf16-rounded** inputs,
# so the bound covers fp32 accumulation (`8·eps·√K·(|A|·|B|ᵀ)`, as in notebook 01) plus the rounding
# of the output: `2⁻⁸·|C|` for a bf16 output, `16·eps·|C|` for fp32 (and the GELU's own rounding).
# For bf16 outputs the error sits close to the bound: rounding to bf16 itself reaches `2⁻⁸·|C|` for
# values just above a power of two — that is the format, not the kernel.

# %%
FP32_EPS = float(np.finfo(np.float32).eps)
BF16_ULP = 2.0**-8


def bf16_inputs(shape, scale=1.0):
    """Random non-uniform float32 values as bf16 bits, and the float64 values the bits hold."""
    x = (rng.standard_normal(shape) * scale + rng.uniform(-0.3, 0.3)).astype(np.float32)
    bits = float32_to_bf16_bits(x)
    return bits, bf16_bits_to_float32(bits).astype(np.float64)


gemm_rows = []
if HAVE_CXX:
    cases = [((77, 150, 136), "none", "float32", 128), ((131, 9, 8), "gelu_tanh", "bfloat16", 128),
             ((70, 300, 72), "none", "bfloat16", 256)]  # fmt: skip
    for (M, N, K), epilogue, out_dtype, block_n in cases:
        a, a64 = bf16_inputs((M, K))
        b, b64 = bf16_inputs((N, K), 1 / math.sqrt(K))
        lin = a64 @ b64.T
        want = reference.gelu_tanh(lin) if epilogue == "gelu_tanh" else lin
        got = sm90.gemm(a, b, epilogue=epilogue, out_dtype=out_dtype, block_n=block_n)
        got = bf16_bits_to_float32(got) if got.dtype == np.uint16 else got
        rel = BF16_ULP if out_dtype == "bfloat16" else 16 * FP32_EPS
        bound = 1.2 * 8 * FP32_EPS * math.sqrt(K) * (np.abs(a64) @ np.abs(b64).T) + rel * np.abs(want) + 1e-30
        err = np.abs(got - want)
        assert np.all(np.isfinite(got)) and np.all(err <= bound), (M, N, K, epilogue, out_dtype)
        gemm_rows.append((f"{M}×{N}×{K}", epilogue, out_dtype, block_n, float(err.max()), float((err / bound).max())))
    display(Markdown("**gemm_bf16_sm90 on the CPU emulator** (no GPU)\n\n" + markdown_table(
        ("M×N×K", "epilogue", "output", "BN", "max abs error", "max error / bound"), gemm_rows)))  # fmt: skip
else:
    print("no C++ compiler: the emulator cannot run here")

# %% [markdown]
# Attention over packed items that end inside tiles (including a 1-token item), head dims below one
# 64-dim block (24) and exactly one (64). The bound follows the bf16 rounding of P before `P·V` and of
# the output: `2⁻⁸·|o| + 2·2⁻⁸·max|v|`; the log-sum-exp is fp32 throughout.

# %%
attn_rows = []
if HAVE_CXX:
    for head_dim, heads, lens in ((64, 1, [70, 3]), (24, 2, [1, 70, 33])):
        L, Q = sum(lens), heads * head_dim
        qkv, qkv64 = bf16_inputs((L, 3 * Q), 1.5)
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        q, k, v = (qkv64[:, s * Q : (s + 1) * Q].reshape(L, heads, head_dim) for s in range(3))
        want, want_lse = reference.attention(q, k, v, cu, return_lse=True)
        out, lse = sm90.attention(qkv, cu, heads, head_dim)
        out = bf16_bits_to_float32(out).reshape(L, heads, head_dim)
        err, lse_err = np.abs(out - want), np.abs(lse - want_lse)
        bound = BF16_ULP * np.abs(want) + 2 * BF16_ULP * np.abs(v).max()
        lse_bound = 64 * FP32_EPS * math.sqrt(head_dim) * np.abs(q).max() * np.abs(k).max()
        assert np.all(np.isfinite(out)) and np.all(err <= bound) and np.all(lse_err <= lse_bound), (head_dim, lens)
        attn_rows.append(
            (head_dim, heads, str(lens), float(err.max()), float((err / bound).max()), float(lse_err.max()))
        )
    display(Markdown("**flash_attn_sm90 on the CPU emulator** (no GPU)\n\n" + markdown_table(
        ("head dim", "heads", "item lengths", "o: max abs error", "max error / bound", "lse: max abs error"), attn_rows)))  # fmt: skip
else:
    print("no C++ compiler: the emulator cannot run here")

# %% [markdown]
# ## 8. Trust nothing unverified: the first-use self-check
#
# An emulator that agrees with NumPy is not a GPU. So on an sm_90 device the backend will not simply
# switch to the Hopper kernels: `cuda_backend/selfcheck.FirstUseCheck` runs a small awkward problem
# (`gemm_probe`: 70×136×72 with an fp32 and a bf16-GELU output) through the new kernel and through the
# trusted mma.sync kernel the first time it is called, and if they disagree — or the new kernel
# raises — it warns once, naming the kernel, and uses the trusted one for the rest of the process.
# Here both sides run on the emulators, and a planted bug shows the fallback: the kernel is given B as
# it would read it if B's tensor map started 8 elements late (`hopper.read_late(b)`: every element of B
# off by 8, the last ones zero).
#
# Which calls go to the Hopper kernels at all is decided in `cuda_backend/routing.py`: bf16 GEMMs with
# `K % 8 == 0` and 16-byte aligned operands, bf16 attention with head dims up to 128, on compute
# capability 9.0 devices only; `hopper=False` or `MOONVIT_HOPPER=0` turn them off.

# %%
from moonvit_kernels.cuda_backend import selfcheck

if HAVE_CXX:
    probe = selfcheck.gemm_probe(np)
    good = selfcheck.FirstUseCheck("gemm_bf16_sm90", sm90.gemm, trusted.gemm, probe, rtol=1e-2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok = good.check()
    print(f"correct kernel: verified={ok}, max relative difference {good.error:.2g}, warnings: {len(caught)}")
    assert ok and not caught

    def planted(a, b, **kwargs):
        return sm90.gemm(a, hopper.read_late(b), **kwargs)

    bad = selfcheck.FirstUseCheck("gemm_bf16_sm90", planted, trusted.gemm, probe, rtol=1e-2)
    a, _ = bf16_inputs((5, 24))
    b, _ = bf16_inputs((3, 24))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        answer = bad(a, b)  # the first call runs the check, then answers with the kernel it trusts
    print(f"planted fault: verified={bad.verified}; the warning:\n  {caught[0].category.__name__}: {caught[0].message}")
    assert bad.verified is False and issubclass(caught[0].category, selfcheck.SelfCheckWarning)
    np.testing.assert_array_equal(answer, trusted.gemm(a, b))  # the answer came from the trusted kernel

    attn = selfcheck.FirstUseCheck(
        "flash_attn_sm90", sm90.attention, trusted.attention, selfcheck.attention_probe(np, 64), rtol=1e-2
    )
    print(f"flash_attn_sm90 (hd 64, items of 70, 1 and 60 tokens): verified={attn.check()}, "
          f"max relative difference {attn.error:.2g}")  # fmt: skip
    assert attn.verified
else:
    print("no C++ compiler: the emulators cannot run here")

# %% [markdown]
# ## 9. The X-ray: what the compiler made of each generation
#
# Compiled with NVRTC from the pip wheels — `gemm_bf16_tc` (mma.sync) for sm_90 and `gemm_bf16_sm90`
# (wgmma) for **sm_90a**, the target with Hopper's arch-specific instructions (a plain sm_90 build
# rejects wgmma and setmaxnreg). Registers, spills and shared memory come from ptxas and from the cubin
# itself (`xray.cubin`); occupancy from the architecture tables (`xray.occupancy`); the instruction
# mix from the SASS (`nvdisasm`, `xray.sass`). **Compile-only, no GPU**: these are facts about the
# binaries, not speeds.

# %%
from moonvit_kernels.cuda_backend import hopper_launchers
from moonvit_kernels.cuda_backend import sources as kcuda
from moonvit_kernels.tools import nvrtc_check
from moonvit_kernels.tools.xray import occupancy, sass
from moonvit_kernels.tools.xray.cubin import kernel_resources

# (label, file, kernel name, arch, threads, dynamic shared memory)
builds = [
    ("mma.sync: gemm_bf16_tc", "gemm_bf16.cu", kcuda.gemm_bf16_name("float32", "none"), "sm_90", 256, 0),
    ("wgmma: gemm_bf16_sm90 (BN 128)", "gemm_bf16_sm90.cu", hopper_launchers.gemm_name("float32", "none", 128),
     "sm_90a", hopper_launchers.GEMM_THREADS, hopper_launchers.gemm_smem_bytes(128)),
]  # fmt: skip
cubins, res_rows = {}, []
try:
    for label, source, name, arch_, threads, dynamic in builds:
        t0 = time.perf_counter()
        cubin, log, lowered = nvrtc_check.compile_cubin(source, [name], arch_)
        info = nvrtc_check.parse_ptxas_log(log)[lowered[name]]
        res = kernel_resources(cubin, arch_)[lowered[name]]
        occ = occupancy.occupancy("sm_90", threads, res["registers"], res["static_shared"], dynamic)
        cubins[label] = cubin
        res_rows.append((label, arch_, threads, res["registers"], f"{info.spill_stores}/{info.spill_loads}",
                         f"{res['static_shared']:,} + {dynamic:,}", occ.blocks_per_sm, occ.limiter,
                         f"{time.perf_counter() - t0:.1f} s"))  # fmt: skip
    display(Markdown("**Resources, compile-only (no GPU)**; occupancy on an H100/H200 SM, model\n\n" + markdown_table(
        ("kernel", "arch", "threads", "registers at entry", "spill st/ld B", "shared B static + dynamic",
         "blocks / SM", "limited by", "NVRTC"), res_rows)))  # fmt: skip
except (RuntimeError, ImportError) as e:  # no cuda-bindings / NVRTC wheel, or a build error
    print(
        f"NVRTC could not build the kernels here ({str(e).splitlines()[0]}); the X-ray needs `pip install -e .[compile]`"
    )

# %% [markdown]
# The registers at entry of the wgmma kernel are what `__launch_bounds__(384, 1)` allows (168); the
# producer then drops to 40 and the consumers rise to 232 — the tensor cores' operands are no longer
# in registers, so 232 buy a 64×128 fp32 accumulator tile per warpgroup (64 per thread) with room for
# the epilogue. The mma.sync kernel keeps its 2 × 2 stages of A and B in 40 KiB of static shared memory;
# the wgmma kernel's 4-stage ring is 129 KiB of dynamic shared memory, one block per SM.
#
# Now the instructions. Per kernel: how many of each opcode that separates the two generations.

# %%
OPCODES = {
    "HMMA": "mma.sync (warp MMA)",
    "HGMMA": "wgmma (warpgroup MMA)",
    "LDSM": "ldmatrix",
    "LDGSTS": "cp.async",
    "UTMALDG": "TMA tensor copy",
    "UBLKCP": "bulk copy (not tensor)",
    "UTMACCTL": "tensor-map prefetch",
    "BAR": "__syncthreads",
    "SYNCS": "mbarrier ops",
    "WARPGROUP": "wgmma fence / arrive / wait",
    "USETMAXREG": "setmaxnreg",
}
if cubins and sass.nvdisasm_path() is None:
    print("nvdisasm is not installed (pip install nvidia-cuda-nvdisasm): no SASS here")
elif cubins:
    funcs = {label: max(sass.disassemble(c), key=lambda f: len(f.instructions)) for label, c in cubins.items()}
    counts = {label: sass.generation_counts(f, tuple(OPCODES)) for label, f in funcs.items()}
    display(Markdown("**SASS opcodes, whole kernel** (compile-only, no GPU)\n\n" + markdown_table(
        ("opcode", "PTX it comes from", *funcs), [(op, what, *(counts[lb][op] for lb in funcs)) for op, what in OPCODES.items()])))  # fmt: skip
    assert (
        counts["wgmma: gemm_bf16_sm90 (BN 128)"]["HGMMA"] > 0 and counts["wgmma: gemm_bf16_sm90 (BN 128)"]["HMMA"] == 0
    )
    loop_rows = []
    for label, f in funcs.items():
        hot = f.hot_loop
        macs = {"HMMA": 16 * 8 * 16, "HGMMA": 64 * 128 * 16 / 4}  # per warp: a wgmma's work is shared by 4 warps
        mma_ops = [i for i in hot.own if i.opcode in macs]
        per_warp = sum(macs[i.opcode] for i in mma_ops)
        loop_rows.append((label, hot.size, len(mma_ops), str(mma_ops[0]).split()[0],
                          int(per_warp), round(per_warp / hot.size)))  # fmt: skip
    display(Markdown("**Hot loop (the loop holding the MMAs), per warp** (compile-only, no GPU)\n\n" + markdown_table(
        ("kernel", "instructions", "MMA instructions", "MMA form", "multiply-adds", "multiply-adds / instruction"), loop_rows)))  # fmt: skip
    hot = funcs["wgmma: gemm_bf16_sm90 (BN 128)"].hot_loop
    print("wgmma kernel, consumer hot loop (MMAs and synchronisation; integer and uniform-datapath work left out):")
    for ins in hot.own:
        if ins.category in ("mma", "bar", "other"):
            print(f"  {ins.address:05x}  {ins}")

# %% [markdown]
# What the SASS says:
# - **HMMA → HGMMA**: no `HMMA` at all in the Hopper kernel. Per warp, its loop issues 4
#   `HGMMA.64x128x16` per 64-wide K tile where the mma.sync kernel issues 32 `HMMA.16816` per 32-wide
#   one; each HGMMA is 64 times the work of an HMMA, shared by the 4 warps of the warpgroup.
# - **LDSM disappears**: wgmma reads its operands from shared memory, no `ldmatrix` into registers.
# - **LDGSTS → UTMALDG**: the cp.async copies (issued by every thread, in a loop) become two tensor
#   copies issued by one producer thread per stage; `UTMACCTL` is the tensor-map prefetch.
#   (`UBLKCP`, the non-tensor bulk copy, is not used.)
# - **BAR → SYNCS**: `__syncthreads` gives way to mbarrier operations (`SYNCS.ARRIVE…`,
#   `SYNCS.PHASECHK` for the waits), and `WARPGROUP.ARRIVE` / `WARPGROUP.DEPBAR` are wgmma's fence and
#   `wait_group`; `USETMAXREG` is setmaxnreg.
# - The full X-ray report (`python -m moonvit_kernels.tools.xray --arch sm_90`, notebook 07) lists these
#   kernels too, as `gemm_bf16_sm90_bn128_f32_none` and friends, with a Hopper-vs-Ampere opcode count.
# - The hot loop issues far more multiply-adds per instruction. That is a property of the binary, not a
#   speed: whether the tensor cores are kept busy depends on the copy engine, the barriers and the
#   memory system, which only a GPU measures (`gpu_check` times both generations against cuBLAS).

# %% [markdown]
# ## Predicted, and measured
#
# What the X-ray (notebook 07) predicts for this stage's kernels at K3 shapes: the roofline on the H200's
# datasheet peaks — the time floor from the traffic no tiling can avoid, and the bound of each kernel as
# written (its global loads as requested). Model, no GPU: floors, not timings. Beside them, what `gpu_check`
# measured on a real GPU (its reports under `benchmarks/results/`; the first, an H200, on 2026-12-04), each
# at its own shape and named: how far a measurement sits above its floor is the kernel's distance from the
# roofline.

# %%
from IPython.display import Markdown, display

from moonvit_kernels.plots import markdown_table, prediction_rows

header, rows, note = prediction_rows("08")
display(Markdown(markdown_table(header, rows)))
print(note)

# %% [markdown]
# ## Exercises
#
# ### Your turn: write the kernel
#
# Two small numba kernels about the layouts above, each with a gap between `▼` and `▲`.
# `check(name, kernel)` runs yours (on the CUDA simulator without a GPU) on two cases against NumPy —
# written from the PTX ISA's figures, not from the kernels — and says which outputs are wrong. As committed,
# the checks report failures; that is expected. A failing check shows a first hint; `hint("swizzle_128b")`
# shows them all, `solution("swizzle_128b")` prints a solution.
#
# **A.** The 128-byte swizzle. Thread `r` writes, for each element `k` (0…63) of row `r` of a bf16 tile
# with 128-byte rows starting at `base` (a multiple of 1024), the shared-memory byte address where TMA
# stores it: row `r` at `base + 128·r`, 16-byte chunk `j` of the row at chunk position `j XOR (r mod 8)`.
# The placeholder writes the plain, unswizzled address.

# %%
# YOUR TURN: swizzle_128b — launched by check() as swizzle_128b[1, 32](base, out), out [rows, 64 columns] int32
from numba import cuda

from moonvit_kernels.exercises import check, hint, solution


@cuda.jit
def swizzle_128b(base, out):
    r = cuda.grid(1)  # one thread per tile row
    if r >= out.shape[0]:
        return
    for k in range(64):
        # ▼ your code: the swizzled address of element (r, k); this placeholder is the unswizzled one
        out[r, k] = base + 128 * r + 2 * k
        # ▲


result = check("swizzle_128b", swizzle_128b)

# %% [markdown]
# **B.** The wgmma matrix descriptor, field by field. Thread `i` encodes `params[i] = (shared address,
# LBO bytes, SBO bytes, swizzle code)` — the code as the descriptor spells it: 0 none, 1 128-byte,
# 2 64-byte, 3 32-byte — and writes the 64-bit descriptor as four 16-bit words `out[i, 0..3]` (bits
# 0–15, 16–31, 32–47, 48–63). The table of section 2 and `sm90.cuh` have the field positions. The
# placeholder copies the raw values in.


# %%
# YOUR TURN: wgmma_desc — launched by check() as wgmma_desc[1, 32](params, out), params [n, 4], out [n, 4] int32
@cuda.jit
def wgmma_desc(params, out):
    i = cuda.grid(1)  # one thread per descriptor
    if i >= params.shape[0]:
        return
    addr, lbo, sbo, mode = params[i, 0], params[i, 1], params[i, 2], params[i, 3]
    # ▼ your code: the four 16-bit words of the descriptor; this placeholder forgets the encoding
    out[i, 0] = addr
    out[i, 1] = lbo
    out[i, 2] = sbo
    out[i, 3] = mode
    # ▲


result = check("wgmma_desc", wgmma_desc)

# %% [markdown]
# ### Worked exercises
#
# Each cell below holds a worked answer; replace it with your own and rerun — the `assert` checks it.
#
# **1.** The GEMM with `BN = 256`: how many bytes must the producer announce with `arrive.expect_tx`
# for one stage, for the *last* K tile of `K = 136` (only 8 of its 64 columns are inside B)?

# %%
box_a = tensor_maps.gemm_operand_map(77, 136).box_bytes  # A [77, 136]: 128 x 64 boxes
box_b = tensor_maps.gemm_operand_map(300, 136, 256).box_bytes  # B [300, 136]: 256 x 64 boxes
expect_tx_answer = 128 * 64 * 2 + 256 * 64 * 2  # worked answer: whole boxes, zero-filled part included

assert expect_tx_answer == box_a + box_b
# the kernel's shared memory is 4 such stages + 8 barriers (no alignment slack: it is declared __align__(1024))
assert hopper_launchers.gemm_smem_bytes(256) == 4 * expect_tx_answer + 8 * 8
print(f"{expect_tx_answer:,} bytes per stage")

# %% [markdown]
# **2.** `setmaxnreg` budget: with the producer at 24 registers instead of 40, what is the largest
# consumer count (a multiple of 8, at most 256) that keeps `128·(producer + 2·consumer) ≤ 65,536`?

# %%
consumer_answer = (65536 // 128 - 24) // 2 // 8 * 8  # worked answer

assert consumer_answer % 8 == 0 and 128 * (24 + 2 * consumer_answer) <= 65536
assert 128 * (24 + 2 * (consumer_answer + 8)) > 65536
print(consumer_answer)

# %% [markdown]
# **3.** Your descriptor kernel against the kernels' own encoder (`sm90.cuh`'s `wgmma_desc`, compiled
# into the emulator): rebuild each 64-bit descriptor from the four words your kernel (or, until it
# works, the solution) wrote.

# %%
from moonvit_kernels.exercises import load_solution

params = np.array([(0x800 + 32 * kk, 16, 1024, 1) for kk in range(4)] + [(0x1230, 128, 256, 0)], np.int32)
words = np.zeros((len(params), 4), np.int32)
kernel = wgmma_desc if check("wgmma_desc", wgmma_desc, verbose=False) else load_solution("wgmma_desc")
kernel[1, 32](params, words)
descriptors_answer = [sum(int(w) << (16 * j) for j, w in enumerate(row)) for row in words]  # worked answer

if HAVE_CXX:
    span = {1: 128, 0: 0}
    assert descriptors_answer == [hopper.desc_encode(int(a), int(lb), int(sb), span[int(m)]) for a, lb, sb, m in params]
print([f"{d:#018x}" for d in descriptors_answer])
print(f"notebook ran in {time.perf_counter() - t_start:.0f} s on the CPU (emulator, simulator, compile-only; no GPU)")
