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
# # 01 — Patch embedding is one GEMM; the GEMM ladder
#
# **What the source does.** MoonViT's patch embedding is a `Conv2d(3, D, kernel_size=p, stride=p,
# bias=False)`. But its input is not an image: the processor has already cut the image into
# `p×p` patches, `pixel_values [L, 3, p, p]`. A `p×p` kernel with stride `p` on a `p×p` input has
# exactly one output position, so each output is one dot product of the whole patch with one filter:
#
# `x[l, d] = Σ_{c, ky, kx} pixel_values[l, c, ky, kx] · W[d, c, ky, kx]`
#
# — a matrix product `x = P · Wᵀ` with `P = pixel_values.reshape(L, 3·p·p)` and
# `W.reshape(D, 3·p·p)`, both flattened in the order `(c, ky, kx)` (docs/model.md, stage 1). Every linear
# layer of the encoder (`wqkv`, `wo`, `fc0`, `fc1`) and the projector is the same product `A · Bᵀ`
# with the weight in its checkpoint layout `[out, in]`, so this one kernel does most of the model's
# FLOPs. This notebook: the convolution → GEMM step, checked numerically; the NumPy reference;
# three kernels, each changing one thing; checks against NumPy; where the error lands; speed.

# %%
# Without a GPU, numba.cuda runs on its CPU simulator; the switch must be set before numba is imported.
# Figures (matplotlib Figure objects returned by moonvit_kernels.plots) are drawn inline.
# %matplotlib inline
from moonvit_kernels.device import gpu_available, simulator_enabled, use_simulator_without_gpu, where

use_simulator_without_gpu()

import inspect
import time

import numpy as np
from IPython.display import Markdown, display
from numba import cuda

from moonvit_kernels import reference
from moonvit_kernels.bundled import DATA_DIR as DATA  # the bundled files, from any working directory
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.numba_backend import gemm as gemm_module
from moonvit_kernels.numba_backend.gemm import gemm
from moonvit_kernels.plots import error_heatmap, markdown_table, median_seconds, plot_timings
from moonvit_kernels.weights import load_checkpoint, random_weights

rng = np.random.default_rng(0)

print(f"kernels run on: {where()}")

# %% [markdown]
# ## Sizes: real on a GPU, tiny on the simulator
#
# The simulator runs one Python thread per CUDA thread, so there the notebook uses the bundled tiny
# checkpoint (80 patches of 4×4, `D = 32`: a `[80, 48] · [32, 48]ᵀ` product). On a GPU it uses the
# K3 shapes: one 896×896 image, `[4096, 588] · [1024, 588]ᵀ`, with random weights.

# %%
if gpu_available() and not simulator_enabled():
    config = VisionConfig.k3()
    weights = random_weights(config.replace(vt_num_hidden_layers=0), seed=0)  # no encoder blocks needed
    L = 64 * 64
    pixel_values = rng.standard_normal((L, 3, config.patch_size, config.patch_size)).astype(np.float32)
else:
    config, weights = load_checkpoint(DATA / "tiny")
    pixel_values = np.load(DATA / "tiny" / "inputs.npz")["pixel_values"]
    L = pixel_values.shape[0]
W = weights["vision_tower.patch_embed.proj.weight"]  # [D, 3, p, p]
D, p = W.shape[0], config.patch_size
print(f"{where()}: L = {L} patches of 3×{p}×{p}, D = {D}: a [{L}, {3 * p * p}] · [{D}, {3 * p * p}]ᵀ GEMM")


# %% [markdown]
# ## A convolution with stride = kernel = input size is a matrix product
#
# A literal convolution, written out as loops (a few patches and filters only: it is slow), against the
# reshape-and-multiply of the reference:


# %%
def conv2d_stride_p(patches, weight):
    """Conv2d(kernel=p, stride=p, no padding, no bias), one loop per index; out [n, D, 1, 1]."""
    n, C, H, Wd = patches.shape
    Dout, _, kh, kw = weight.shape
    out_h, out_w = (H - kh) // kh + 1, (Wd - kw) // kw + 1  # = 1 × 1 here
    out = np.zeros((n, Dout, out_h, out_w))
    for i in range(n):
        for d in range(Dout):
            for oy in range(out_h):
                for ox in range(out_w):
                    for c in range(C):
                        for ky in range(kh):
                            for kx in range(kw):
                                out[i, d, oy, ox] += patches[i, c, oy * kh + ky, ox * kw + kx] * weight[d, c, ky, kx]
    return out


few = pixel_values[:3].astype(np.float64)
conv = conv2d_stride_p(few, W[:5].astype(np.float64))
as_gemm = reference.patch_embed(few, W[:5].astype(np.float64))
print("conv output shape", conv.shape, "-> squeeze to", conv[:, :, 0, 0].shape)
print("max |conv − GEMM| =", np.abs(conv[:, :, 0, 0] - as_gemm).max())
assert np.allclose(conv[:, :, 0, 0], as_gemm, rtol=1e-12, atol=1e-12)

# %% [markdown]
# **Pitfall: the flattening order.** Both operands must be flattened the same way. The checkpoint's
# weight is `[D, 3, p, p]` (channel first) and the processor's patches are `[L, 3, p, p]`, so a plain
# reshape of both works. Flattening the patches channel-last (`[p, p, 3]`, how images are stored)
# while keeping the weight channel-first silently mixes up pixels:

# %%
hwc = pixel_values.transpose(0, 2, 3, 1).reshape(L, -1)  # patches flattened (ky, kx, c)
wrong = hwc @ W.reshape(D, -1).T
right = reference.patch_embed(pixel_values, W)
print(f"relative error of the channel-last flattening: {np.abs(wrong - right).max() / np.abs(right).max():.2f}")

# %% [markdown]
# ## The NumPy reference
#
# `reference.patch_embed(pixel_values, proj_weight)` is the two reshapes and `@`. Computed in float64
# it is the oracle every kernel is compared with.

# %%
A = np.ascontiguousarray(pixel_values.reshape(L, -1), dtype=np.float32)  # [M, K]
B = np.ascontiguousarray(W.reshape(D, -1), dtype=np.float32)  # [N, K]
M, K = A.shape
N = B.shape[0]
ref64 = reference.patch_embed(pixel_values.astype(np.float64), W.astype(np.float64))
print(inspect.getsource(reference.patch_embed))

# %% [markdown]
# ## The kernels: `moonvit_kernels/numba_backend/gemm.py`
#
# The module keeps every version (as in llm.c's `dev/cuda/` and siboehm's SGEMM walk); each changes
# one thing. All compute `C[M, N] = A[M, K] · B[N, K]ᵀ` in float32 and bounds-check M, N, K, so no size
# has to be a tile multiple (80 × 32 × 48 here on the simulator; 588 is not a multiple of 16 either).
#
# | version | idea | why it is faster |
# |---|---|---|
# | v1 | one thread per output `C[m, n]`, a K-loop over global memory | — the baseline: each A value is read N times from DRAM/L2 |
# | v2 | a 16×16 block stages 16-wide slabs of A and B in **shared memory** | each global load is reused 16 times; `+1` column of padding avoids bank conflicts |
# | v3 | **register blocking**: a block owns 64×64 outputs, each thread 4×4 | per k-step a thread loads 4 + 4 values and does 16 FMAs: more math per load |
#
# Every rung is printed below, each after the idea it adds. First v1 — read it next to the formula above:

# %%
print(gemm_module.__doc__.split("Epilogues")[0])
print(inspect.getsource(gemm_module._make_gemm_v1))

# %% [markdown]
# ### Coalescing: which addresses does one warp touch?
#
# A warp is 32 threads that issue each load together; the memory system serves it in 32-byte *sectors*,
# so a load is cheap when the warp's 32 addresses fall in few sectors. v1 launches blocks of 16×16
# threads with `threadIdx.x` along `n`, so one warp is **two rows of 16 lanes**: at a fixed `k` it reads
# `A[m, k]` at two `m` (two addresses, each broadcast to 16 lanes: fine) and `B[n, k]` for 16 consecutive
# `n`, shared by the two rows — addresses `K·4` bytes apart, **one sector per distinct `n`**: 16 sectors
# (512 bytes) for 16 floats (64 bytes), 8× the traffic the maths needs. v2 stages its tiles with
# `threadIdx.x` along `k` (`a_tile[ty, tx] = A[m0 + ty, k0 + tx]`): 2 rows × 16 consecutive floats, 64
# contiguous bytes each, two or three sectors per row. Counted for the K3 patch embedding (`K = 588`), with
# lane `l` of the warp at `tx = l mod 16`, `ty = l // 16` (notebook 07 traces the same numbers):


# %%
def sectors_per_warp_load(byte_addresses):
    """32-byte sectors one warp's load touches (what the memory system actually moves)."""
    return len({int(a) // 32 for a in byte_addresses})


K3_K = 3 * 14 * 14
lanes = np.arange(32)
v1_b = sectors_per_warp_load((lanes % 16) * K3_K * 4)  # B[n0 + tx, k]: stride K, 16 distinct rows
v1_a = sectors_per_warp_load((lanes // 16) * K3_K * 4)  # A[m0 + ty, k]: two rows, one address each
v2_tile = sectors_per_warp_load(((lanes // 16) * K3_K + lanes % 16) * 4)  # 2 rows × 16 consecutive k
rows = [
    ["v1, B[n, k] (x along n)", v1_b, f"{16 * 4 / (v1_b * 32):.0%}"],
    ["v1, A[m, k] (broadcast)", v1_a, "one value per 16 lanes"],
    ["v2 tile load (x along k)", v2_tile, f"{32 * 4 / (v2_tile * 32):.0%}"],
]
display(Markdown(markdown_table(["warp load", "32-byte sectors", "useful bytes / moved"], rows)))
assert v1_b == 16 and v1_a == 2 and v2_tile <= 6  # v2: 2 rows of 64 bytes, 2 sectors each (3 when one straddles)

# %% [markdown]
# **A coalesced v1.** The smallest change that makes every load of v1 coalesced: turn the warp sideways.
# A block of 32 threads (one warp) computes **one** output; lane `t` takes `k = t, t + 32, …`, so at each
# step the warp reads 32 consecutive floats of row `m` of A and of row `n` of B — one 128-byte segment, 4
# sectors, 100% useful. The price: the 32 partial sums must be added (a shared-memory tree, as RMSNorm's in
# notebook 02), and A and B are still re-read from memory for every output. v2 keeps the coalesced loads
# *and* reuses each value 16 times. Defined here (not in the package), checked on a small awkward case:

# %%
WARP = 32


@cuda.jit
def gemm_v1_coalesced(A, B, C, M, N, K):
    n = cuda.blockIdx.x  # one block (one warp) per output C[m, n]
    m = cuda.blockIdx.y
    t = cuda.threadIdx.x
    partial = cuda.shared.array(WARP, np.float32)
    acc = np.float32(0.0)
    for k in range(t, K, WARP):  # lane t reads A[m, k] and B[n, k]: 32 consecutive floats per step
        acc += A[m, k] * B[n, k]
    partial[t] = acc
    cuda.syncthreads()
    stride = WARP // 2
    while stride > 0:
        if t < stride:
            partial[t] += partial[t + stride]
        cuda.syncthreads()
        stride //= 2
    if t == 0:
        C[m, n] = partial[0]


a_c, b_c = rng.standard_normal((5, 45)).astype(np.float32), rng.standard_normal((7, 45)).astype(np.float32)
c_c = cuda.device_array((5, 7), dtype=np.float32)
gemm_v1_coalesced[(7, 5), WARP](cuda.to_device(a_c), cuda.to_device(b_c), c_c, 5, 7, 45)
want_c = a_c.astype(np.float64) @ b_c.astype(np.float64).T
bound_c = (
    8
    * float(np.finfo(np.float32).eps)
    * np.sqrt(45)
    * (np.abs(a_c.astype(np.float64)) @ np.abs(b_c.astype(np.float64)).T)
)
assert np.all(np.abs(c_c.copy_to_host() - want_c) <= bound_c)
coalesced = sectors_per_warp_load((lanes + 0) * 4)
print(
    f"coalesced v1 matches NumPy; each warp load touches {coalesced} sectors ({32 * 4 / (coalesced * 32):.0%} useful)"
)

# %% [markdown]
# ### v2: shared-memory tiles
#
# A 16×16 block stages a 16-wide slab of A and of B in shared memory (the coalesced loads counted above),
# waits at `cuda.syncthreads()`, and every thread then reads 16 pairs from shared memory: each global
# value is used 16 times. B's tile is read "transposed" (`b_tile[tx, kk]`): the `+1` column of padding
# makes the 16 threads of a half-warp hit 16 different banks instead of one. Out-of-range elements are
# staged as zeros, so no size must be a tile multiple (you write these loads yourself in exercise B).

# %%
print(inspect.getsource(gemm_module._make_gemm_v2))

# %% [markdown]
# ### v3: register blocking
#
# v2 does one FMA per shared-memory read. v3 gives each thread a 4×4 patch of outputs held in registers:
# per k step it reads 4 values of A and 4 of B from shared memory and does 16 FMAs. The block owns 64×64
# outputs with 256 threads and stages 16-deep slabs stored k-major (`a_tile[kk, i]`), so the 4 values a
# thread needs at one `kk` sit side by side.

# %%
print(inspect.getsource(gemm_module._make_gemm_v3))

# %% [markdown]
# The launcher `gemm(a, b, epilogue="none", residual=None, out=None, version=3)` checks every argument
# (dtype float32, 2-D, C-contiguous, matching K) and raises a `ValueError` naming the problem —
# numba itself checks nothing at launch. It returns a device array.

# %%
try:
    gemm(A, B[:, :-1])
except ValueError as e:
    print("ValueError:", e)
try:
    gemm(A.astype(np.float64), B)
except ValueError as e:
    print("ValueError:", e)

# %% [markdown]
# ## Check every version against NumPy
#
# Two cases: the patch embedding itself, and a random product of awkward sizes (no dimension a multiple
# of any tile) where edge handling is tested. The tolerance for an fp32 dot product of length K is a
# small multiple of `eps·√K` relative to the size of the terms: the bound below is
# `8·eps·√K · (|A|·|B|ᵀ)`, elementwise. NaN or Inf fails.

# %%
FP32_EPS = float(np.finfo(np.float32).eps)
m2, n2, k2 = (37, 33, 45) if simulator_enabled() else (1001, 999, 1027)
cases = {
    "patch embed": (A, B, ref64),
    "awkward random": (
        a2 := rng.standard_normal((m2, k2)).astype(np.float32),
        b2 := rng.standard_normal((n2, k2)).astype(np.float32),
        a2.astype(np.float64) @ b2.astype(np.float64).T,
    ),
}
results, first_run_seconds, rows = {}, {}, []
for case, (a, b, want) in cases.items():
    bound = 8 * FP32_EPS * np.sqrt(a.shape[1]) * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T)
    a_d, b_d = cuda.to_device(a), cuda.to_device(b)
    for version in gemm_module.VERSIONS:
        start = time.perf_counter()
        out_d = gemm(a_d, b_d, version=version)
        cuda.synchronize()
        first_run_seconds[case, version] = time.perf_counter() - start
        got = results[case, version] = out_d.copy_to_host()
        err = np.abs(got - want)
        assert np.all(np.isfinite(got)), f"{case} v{version}: NaN/Inf"
        assert np.all(err <= bound), f"{case} v{version}: max error {err.max():.3e} beyond the bound"
        blocks, threads = gemm_module.launch_config(version, *got.shape)
        rows.append([case, str(a.shape), f"v{version}", f"{blocks} × {threads}", err.max(), (err / bound).max()])
header = ["case", "A", "kernel", "blocks × threads", "max abs error", "error / bound"]
display(Markdown(markdown_table(header, rows)))

# %% [markdown]
# The same kernels carry the *epilogues* the encoder needs, fused into the store so the output is
# written once: `gelu_tanh` (MLP `fc0`), `gelu_erf` (projector — the two GELUs differ on purpose, a
# pitfall of other ports), and `residual` (`x + o·woᵀ`, `x + fc1(·)`). Checked on an awkward small
# shape:

# %%
m, n, k = 7, 33, 24
a = rng.standard_normal((m, k)).astype(np.float32)
b = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
r = rng.standard_normal((m, n)).astype(np.float32)
prod = a.astype(np.float64) @ b.astype(np.float64).T
expected = {
    "gelu_tanh": reference.gelu_tanh(prod),
    "gelu_erf": reference.gelu_erf(prod),
    "residual": prod + r,
}
for epilogue, want in expected.items():
    got = gemm(a, b, epilogue=epilogue, residual=r if epilogue == "residual" else None).copy_to_host()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=epilogue)
    print(f"{epilogue:9s} max error {np.abs(got - want).max():.2e}")
tanh_vs_erf = np.abs(expected["gelu_tanh"] - expected["gelu_erf"]).max()
print(f"and the two GELUs differ by up to {tanh_vs_erf:.1e} on these values: swapping them is a real bug")

# %% [markdown]
# ## Pictures: where does the error land?
#
# The error of v3 against the float64 reference, per output, divided by the bound the check uses
# (`8·eps·√K·|A|·|B|ᵀ`) and drawn on a **fixed** logarithmic scale from 10⁻³ to 10³: blue is within the
# bound, red beyond it. A correct kernel is blue everywhere — rounding noise with no pattern.

# %%
a, b, want = cases["awkward random"]
bound2 = 8 * FP32_EPS * np.sqrt(k2) * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T)
error_heatmap(results["awkward random", 3], want, bound=bound2, title=f"gemm v3, [{m2}, {k2}] · [{n2}, {k2}]ᵀ")

# %% [markdown]
# And what a real bug looks like, on the same scale: a launch whose grid is sized with floor division,
# `grid = (N // 16, M // 16)` instead of `ceil` — the classic when sizes are not tile multiples. The last
# partial tile of rows and of columns is never computed, so those outputs keep whatever the buffer held
# (zeros here). Simulated in NumPy on the awkward case: the bug draws an L-shaped band along the bottom and
# right edges, and a test on sizes that are tile multiples would never see it.

# %%
floor_rows, floor_cols = (m2 // 16) * 16, (n2 // 16) * 16
buggy = want.copy()
buggy[floor_rows:, :] = 0.0
buggy[:, floor_cols:] = 0.0
print(f"M = {m2}, N = {n2}: rows {floor_rows}… and columns {floor_cols}… are never computed")
error_heatmap(buggy, want, bound=bound2, title="grid sized N // 16, M // 16 (floor instead of ceil)")

# %% [markdown]
# ## The top rungs: the CUDA C GEMMs
#
# The CuPy backend (`moonvit_kernels/cuda_backend/`) carries two more GEMMs, written in CUDA C: the fp32 SIMT
# one below, and the bf16 tensor-core one in notebook 04 (its operands are spread over a warp's lanes, which
# is easier to follow after the warp shuffles of notebook 02). On a GPU
# they run through CuPy; on a laptop the **CPU emulator** (`tools.emulation`) compiles the same
# `.cu` text with g++ against stand-ins for the CUDA built-ins and PTX instructions (every CUDA thread a
# fiber, all of a block's fibers taking turns on one OS thread), so every index, fragment layout and pipeline wait below runs and is checked here.
#
# **fp32 SIMT (`gemm_fp32.cu`)** is numba v3 in C: a 64×64 block tile, 4×4 outputs per thread, 16-deep
# slabs stored K-major — plus two things numba cannot express: `float4` loads (four floats in one
# 16-byte instruction when `K % 4 == 0`) and a shared layout that pads every *quad* of 4 k-rows by 8
# floats (`LDQ = 4 * BM + 8`) rather than every row. A warp's transposing store then writes 8 consecutive
# rows into each of the 4 quads, and the quads start 8 banks apart: all 32 banks, no conflict. A uniform
# row padding cannot get there: the 16-byte reads need a row stride that is a multiple of 4 floats, and
# then quads 0 and 2 always start in the same bank (2-way). The epilogue writes each thread's 4 columns
# of a row as one `float4` too: a warp's 16 lanes then cover 256 contiguous bytes of a row, the fewest
# 32-byte sectors possible, where storing one column at a time touched 4× as many (`N % 4 != 0` or an
# unaligned output falls back to scalar stores). Its ceiling is the fp32 CUDA-core peak (≈ 67 TFLOP/s on
# an H200, datasheet).

# %%
from moonvit_kernels.cuda_backend.sources import KERNEL_DIR
from moonvit_kernels.source_regions import region

print(region(KERNEL_DIR / "gemm_fp32.cu", "kernel"))

# %% [markdown]
# It runs on the CPU emulator at a tiny awkward size (`37 × 21`, `K = 40`: one block, partial tiles
# everywhere), checked against NumPy under the fp32 bound.

# %%
from moonvit_kernels.cuda_backend import launchers
from moonvit_kernels.tools import emulation

m_e, n_e, k_e = 37, 21, 40
a_e = rng.standard_normal((m_e, k_e)).astype(np.float32)
b_e = rng.standard_normal((n_e, k_e)).astype(np.float32)
exact = a_e.astype(np.float64) @ b_e.astype(np.float64).T
bound_e = 8 * FP32_EPS * np.sqrt(k_e) * (np.abs(a_e.astype(np.float64)) @ np.abs(b_e.astype(np.float64)).T)
if emulation.compiler() is None:
    print("no C++ compiler (g++ >= 11) here: the CUDA C emulator cannot run")
else:
    got_fp32 = emulation.run(launchers.gemm, a_e, b_e)  # the CuPy launcher, on the CPU emulator
    assert np.all(np.abs(got_fp32 - exact) <= bound_e), "gemm_fp32.cu beyond the fp32 bound"
    print(
        f"CPU emulator, gemm_fp32.cu on [{m_e}, {k_e}] · [{n_e}, {k_e}]ᵀ: max abs error "
        f"{np.abs(got_fp32 - exact).max():.2e}, {(np.abs(got_fp32 - exact) / bound_e).max():.2f} of the fp32 bound"
    )

# %% [markdown]
# ## FLOPs and time
#
# A GEMM does `2·M·N·K` FLOPs. On a GPU each kernel is timed after a warm-up, and compared with cuBLAS
# (through CuPy) when CuPy is installed; the taught kernels are fp32 on the CUDA cores, so their ceiling
# is the fp32 SIMT peak (≈ 67 TFLOP/s on an H200, datasheet), not the bf16 tensor-core one (≈ 989). On the
# simulator the times measure Python threads — not performance: they are printed, labelled, only to show
# the machinery, and no chart is drawn.

# %%
flops = 2 * M * N * K
on_gpu = gpu_available() and not simulator_enabled()
repeat, warmup = 20, 2
seconds = {}
A_d, B_d = cuda.to_device(A), cuda.to_device(B)
for version in gemm_module.VERSIONS:
    if on_gpu:
        t = median_seconds(lambda v=version: gemm(A_d, B_d, version=v), repeat, warmup, cuda.synchronize)
        seconds[f"numba v{version}"] = t["median"]
    else:  # the simulator is far too slow to repeat: reuse the one run of the check above
        seconds[f"numba v{version}"] = first_run_seconds["patch embed", version]
cublas_note = "no GPU here, so no cuBLAS number exists"
if on_gpu:
    try:
        import cupy as cp

        A_cp, B_cp = cp.asarray(A), cp.asarray(B)
        t = median_seconds(lambda: A_cp @ B_cp.T, repeat, warmup, cp.cuda.Device().synchronize)
        seconds["cuBLAS (cupy.matmul)"] = t["median"]
        cublas_note = "% of cuBLAS = cuBLAS time / kernel time"
    except ImportError:
        cublas_note = "CuPy is not installed: no cuBLAS number (pip install -e '.[cuda13]')"
print(f"{where()}: M = {M}, N = {N}, K = {K}, 2·M·N·K = {flops:,} FLOP; {cublas_note}")
if on_gpu:
    rows = []
    for name, sec in seconds.items():
        share = f"{seconds['cuBLAS (cupy.matmul)'] / sec:.0%}" if "cuBLAS (cupy.matmul)" in seconds else "—"
        rows.append([name, sec * 1e3, flops / sec / 1e12, share])
    display(Markdown(markdown_table(["kernel", "ms", "TFLOP/s", "% of cuBLAS"], rows)))
else:
    times = ", ".join(f"{name} {sec:.1f} s" for name, sec in seconds.items())
    print(f"{where()} — Python threads, not GPU performance (no FLOP/s is computed from these): {times}")

# %%
if on_gpu:
    display(plot_timings(seconds, where(), title=f"GEMM [{M}, {K}] · [{N}, {K}]ᵀ"))
else:
    print(f"{where()}: no chart — simulator times measure Python threads, not GPU performance")

# %% [markdown]
# ## Predicted, and measured
#
# What the X-ray (notebook 07) predicts for this stage's kernels at K3 shapes: the roofline on the H200's
# datasheet peaks — the time floor from the traffic no tiling can avoid, and the bound of each kernel as
# written (its global loads as requested). Model, no GPU: floors, not timings. Beside them, what `gpu_check`
# measured on a real GPU (its reports under `benchmarks/results/`; the first, an H200, on 2026-12-04), each
# at its own shape and named: how far a measurement sits above its floor is the kernel's distance from the
# roofline.
#
# First time here? A **roofline** bound is the least time a kernel could take on a GPU: its FLOPs at the
# chip's peak FLOP rate, or its bytes at the peak memory bandwidth, whichever is longer (the *limit* column
# says which). No kernel beats it; a good one comes close. Notebook 07 shows how the X-ray counts the FLOPs
# and bytes; here, read each row as "at best this fast".

# %%
from IPython.display import Markdown, display

from moonvit_kernels.plots import markdown_table, prediction_rows

header, rows, note = prediction_rows("01")
display(Markdown(markdown_table(header, rows)))
print(note)

# %% [markdown]
# ## Exercises
#
# ### Your turn: write the kernel
#
# Each cell below is a kernel with its signature and launch written and a gap between the `▼` and `▲`
# marks. Fill the gap and run the cell: `check(name, kernel)` launches your kernel (on the CUDA simulator
# without a GPU, on the GPU where there is one) on two or three cases — square and non-square, one block
# and several, sizes that are no multiple of a tile — compares it with NumPy under the fp32 error bound
# `8·eps·√K·(|A|·|B|ᵀ)`, and says what is wrong: which case, which rows and columns differ, NaN, outputs
# never written, an index out of bounds, a race, and the bug it looks like when it knows one. Exercise B
# is also traced for coalescing: a correct kernel with scattered loads fails it. As committed, the gaps are
# empty, so the checks report failures — that is expected. A failing check shows a first hint;
# `hint("gemm_naive")` shows them all, `solution("gemm_naive")` prints a solution (from
# `moonvit_kernels/exercises/solutions/`). If you have not written a kernel before, start with the warm-ups of 00a.
#
# **A.** GEMM v1: one thread per output, `C[m, n] = Σ_k A[m, k]·B[n, k]`, on a 2-D grid of 16×16-thread
# blocks laid out like C (`x` across the columns).

# %%
# YOUR TURN: gemm_naive — launched by check() as gemm_naive[(⌈N/bx⌉, ⌈M/by⌉), (bx, by)](A, B, C, M, N, K)
from numba import float32

from moonvit_kernels.exercises import check, hint, solution


@cuda.jit
def gemm_naive(A, B, C, M, N, K):
    # ▼ your code
    pass
    # ▲


result = check("gemm_naive", gemm_naive)

# %% [markdown]
# **B.** GEMM v2's tile loads. The block owns a 16×16 block of C; per K step its 256 threads stage a 16×16
# tile of A and one of B in shared memory, and every thread then reads its 16 pairs from there. You write
# the staging: which element each thread copies, and what goes where the tile hangs over the edge of A or
# B (here `K = 35` and `K = 37`: the last tile is partial). The check also traces the loads: a warp
# should read neighbouring addresses.

# %%
# YOUR TURN: gemm_tile_loads — launched by check() as gemm_tile_loads[(⌈N/16⌉, ⌈M/16⌉), (16, 16)](A, B, C, M, N, K)
TILE = 16


@cuda.jit
def gemm_tile_loads(A, B, C, M, N, K):
    a_tile = cuda.shared.array((TILE, TILE), float32)  # a_tile[r, kk] = A[m0 + r, k0 + kk]
    b_tile = cuda.shared.array((TILE, TILE + 1), float32)  # b_tile[r, kk] = B[n0 + r, k0 + kk]; +1: no bank conflicts
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    m0 = cuda.blockIdx.y * TILE  # this block's first row of C
    n0 = cuda.blockIdx.x * TILE  # and first column
    acc = float32(0.0)
    for k0 in range(0, K, TILE):
        # ▼ your code: stage this K step's tiles
        pass
        # ▲
        cuda.syncthreads()
        for kk in range(TILE):
            acc += a_tile[ty, kk] * b_tile[tx, kk]
        cuda.syncthreads()
    m = m0 + ty
    n = n0 + tx
    if m < M and n < N:
        C[m, n] = acc


result = check("gemm_tile_loads", gemm_tile_loads)

# %% [markdown]
# **C.** GEMM v3's idea, register blocking, at a small scale: a block of 16×16 threads owns **32×32**
# outputs, each thread a 2×2 patch held in registers (`acc`), so per `kk` a thread reads `TM + TN` values
# from shared memory and does `TM·TN` multiply-adds. The declarations are written; the rest — where the
# block's outputs start, the staging of 32-row tiles, the register-tile multiply, the stores — is yours.
# The cases: one block, then several.

# %%
# YOUR TURN: gemm_register_tile — launched by check() as gemm_register_tile[(⌈N/32⌉, ⌈M/32⌉), (16, 16)](A, B, C, M, N, K)
TM, TN = 2, 2  # outputs per thread: TM rows × TN columns


@cuda.jit
def gemm_register_tile(A, B, C, M, N, K):
    a_tile = cuda.shared.array((TM * TILE, TILE), float32)  # a_tile[r, kk] = A[m0 + r, k0 + kk]
    b_tile = cuda.shared.array((TN * TILE, TILE + 1), float32)  # b_tile[r, kk] = B[n0 + r, k0 + kk]
    acc = cuda.local.array((TM, TN), float32)
    a_reg = cuda.local.array(TM, float32)
    b_reg = cuda.local.array(TN, float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    for i in range(TM):
        for j in range(TN):
            acc[i, j] = float32(0.0)
    # ▼ your code
    pass
    # ▲


result = check("gemm_register_tile", gemm_register_tile)

# %% [markdown]
# ### Worked exercises
#
# Each cell below holds a worked answer; replace it with your own and rerun — the `assert` checks it.
#
# **1.** The processor gave you patches flattened channel-last, `hwc = pixel_values.transpose(0, 2, 3, 1)`.
# Rearrange the **weight** (not the patches) so that one GEMM still gives the right embedding.

# %%
hwc = np.ascontiguousarray(pixel_values.transpose(0, 2, 3, 1).reshape(L, -1))
W_hwc = np.ascontiguousarray(W.transpose(0, 2, 3, 1).reshape(D, -1))  # worked answer

got = gemm(hwc, W_hwc).copy_to_host()
np.testing.assert_allclose(got, ref64, rtol=1e-4, atol=1e-4)
print("channel-last patches × channel-last weight = the embedding")

# %% [markdown]
# **2.** How many times is each element of `A` read from global memory by v1, and by v2 (tile 16)?
# (v1: every thread of output row m reads all of row m of A; v2: once per block column.)

# %%
reads_v1 = N  # worked answer: one read per output column
reads_v2 = -(-N // gemm_module.TILE)  # once per 16-wide block of columns

(blocks_x, _), _ = gemm_module.launch_config(2, M, N)
assert reads_v1 == N and reads_v2 == blocks_x
print(f"A is read {reads_v1}× by v1 and {reads_v2}× by v2 (N = {N})")

# %% [markdown]
# **3.** The FLOPs of K3's patch embedding for one 896×896 image, as `2·M·N·K` with the right sizes.

# %%
k3 = VisionConfig.k3()
patch_flops_answer = 2 * (64 * 64) * k3.vt_hidden_size * (3 * 14 * 14)  # worked answer

from moonvit_kernels.plots import flop_table

assert patch_flops_answer == flop_table(k3, [[1, 64, 64]])[0].count
print(f"{patch_flops_answer / 1e9:.2f} GFLOP — under 0.1% of the tower: the encoder GEMMs dominate")
