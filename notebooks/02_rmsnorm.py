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
# # 02 — RMSNorm: a row reduction, and why `eps` matters
#
# **What the source does.** Every encoder block normalises its input twice (`norm0` before attention,
# `norm1` before the MLP), the tower ends with `final_layernorm`, and the projector ends with
# `post_norm`. All four are RMSNorm ([docs/model.md](../docs/model.md), stage 3):
#
# `rmsnorm(x, g) = x · rsqrt(mean(x², over the row) + eps) · g`, computed in float32.
#
# No `eps` is passed in the source, so PyTorch's default applies — and that default **changed**:
# current torch uses `finfo(float32).eps = 1.19e-7` even for bf16 inputs, older torch used
# `finfo(bfloat16).eps = 2⁻⁷ ≈ 0.0078`. Ports that copied the older behaviour differ on rows of small
# magnitude. Here eps is the config field `vit_norm_eps` (default 1.19e-7); the projector's norm uses
# `projector_ln_eps = 1e-5` — a third value, another pitfall.
#
# On a GPU this is a *memory-bound* kernel. The kernel below reads each row of `x` **twice** — once
# to sum the squares, once more to scale it after the reduction — and writes it once: `3·rows·cols·4`
# bytes plus the weight (a 4 KB row of K3 is usually still in L1/L2 for the second read, so DRAM may
# see closer to `2·rows·cols·4`; a kernel that keeps the row in registers or shared memory between the
# two passes reads it from memory once). Its design is one thread block per row.

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
from moonvit_kernels.config import FP32_EPS, VisionConfig
from moonvit_kernels.numba_backend import rmsnorm as rmsnorm_module
from moonvit_kernels.numba_backend.rmsnorm import rmsnorm
from moonvit_kernels.plots import (
    error_heatmap,
    markdown_table,
    median_seconds,
    plot_eps_effect,
    plot_timings,
    rmsnorm_output_rms,
)
from moonvit_kernels.weights import load_checkpoint

rng = np.random.default_rng(0)
on_gpu = gpu_available() and not simulator_enabled()

print(f"kernels run on: {where()}")

# %% [markdown]
# ## Sizes
#
# On a GPU: the K3 shape, 4096 tokens × `D = 1024`. On the simulator the kernel's tree reduction runs
# one Python thread per CUDA thread with a barrier per step, so rows are few and short — and awkward
# (1, 7 and 13 rows; widths that are no power of two).

# %%
if on_gpu:
    shapes = [(1, 1000), (7, 1024), (33, 1000), (4096, 1024)]
else:
    shapes = [(1, 24), (7, 37), (13, 40)]
print(f"{where()}: shapes {shapes}")

# %% [markdown]
# ## The NumPy reference
#
# `reference.rmsnorm(x, weight, eps, return_rstd=True)` also returns the per-row
# `rstd = rsqrt(mean(x²) + eps)` — a side output kept by kernels (a backward pass needs it), and
# checked here too (side outputs are checked wherever they exist).

# %%
print(inspect.getsource(reference.rmsnorm))

# %% [markdown]
# ## The kernel: `moonvit_kernels/numba_backend/rmsnorm.py`
#
# One block per row, in three steps:
#
# 1. each thread sums the squares of a strided subset of the row (`j = tid, tid + THREADS, …`);
# 2. the block adds its partial sums by a **tree reduction** in shared memory — half the threads add
#    the other half's values, `syncthreads`, repeat: `log2(THREADS)` steps. (On a GPU one would finish
#    the last 32 with warp shuffles; the simulator lacks them, so this kernel uses shared memory only);
# 3. every thread scales its columns by `rstd · weight[j]`.
#
# The block size is a power of two baked into each compiled specialisation:

# %%
print(inspect.getsource(rmsnorm_module.kernel_for))

# %% [markdown]
# ### The next rung: warp shuffles in CUDA C (`cuda_backend/rmsnorm.cu`)
#
# The tree above spends `log2(THREADS)` barriers and shared-memory round trips. On a GPU the 32 lanes of a
# warp can exchange registers directly: `__shfl_xor_sync(mask, v, off)` returns lane `lane ^ off`'s `v`,
# so five steps (`off = 16, 8, 4, 2, 1`) leave the warp's sum in every lane — no shared memory, no barrier.
# `block_sum` (in `common.cuh`) does that per warp, writes one value per warp to shared memory, and sums
# those with one more warp shuffle: 2 barriers instead of 8 for 256 threads. The kernel also reads four
# floats per access (`float4`) when `D % 4 == 0`:

# %%
from moonvit_kernels.cuda_backend import launchers
from moonvit_kernels.cuda_backend.sources import KERNEL_DIR
from moonvit_kernels.source_regions import region
from moonvit_kernels.tools import emulation

print(region(KERNEL_DIR / "common.cuh", "reductions"))
print((KERNEL_DIR / "rmsnorm.cu").read_text(encoding="utf-8"))

# %% [markdown]
# Run on the CPU emulator (the same `.cu` text through g++, each CUDA thread a fiber on one OS thread, warp
# shuffles emulated) and checked against the float64 reference — a 5 × 1024 block of rows (vector path)
# and 3 × 75 (scalar path):

# %%
if emulation.compiler() is None:
    print("no C++ compiler (g++ >= 11) here: the CUDA C emulator cannot run")
else:
    for rows_e, cols_e in ((5, 1024), (3, 75)):
        x_e = (rng.standard_normal((rows_e, cols_e)) * rng.uniform(0.1, 3.0, (rows_e, 1))).astype(np.float32)
        w_e = (1 + 0.25 * rng.standard_normal(cols_e)).astype(np.float32)
        got_e, rstd_e = emulation.run(launchers.rmsnorm, x_e, w_e, 1e-6, return_rstd=True)
        want_e = reference.rmsnorm(x_e.astype(np.float64), w_e.astype(np.float64), 1e-6)
        rtol_e = 8 * FP32_EPS * np.sqrt(cols_e)
        np.testing.assert_allclose(got_e, want_e, rtol=rtol_e, atol=rtol_e * np.abs(want_e).max())
        print(
            f"CPU emulator of rmsnorm.cu, {rows_e} × {cols_e}: max rel. error {np.abs(got_e - want_e).max() / np.abs(want_e).max():.1e}"
        )

# %% [markdown]
# ## Check against NumPy — output and rstd
#
# Random rows with a different scale each (never ones: a kernel that forgot to divide by `cols` passes on
# ones-like data of the right size) and a random weight. Tolerance: an fp32 sum of `cols` squares,
# so `8·eps·√cols` relative.

# %%
config = VisionConfig.k3()
eps = config.vit_norm_eps
rows_table, checked = [], {}
for rows, cols in shapes:
    x = (rng.standard_normal((rows, cols)) * rng.uniform(0.1, 3.0, (rows, 1))).astype(np.float32)
    w = (1 + 0.25 * rng.standard_normal(cols)).astype(np.float32)
    start = time.perf_counter()
    out_d, rstd_d = rmsnorm(x, w, eps, return_rstd=True)
    out, rstd = out_d.copy_to_host(), rstd_d.copy_to_host()
    seconds = time.perf_counter() - start
    want, want_rstd = reference.rmsnorm(x.astype(np.float64), w.astype(np.float64), eps, return_rstd=True)
    rtol = 8 * FP32_EPS * np.sqrt(cols)
    np.testing.assert_allclose(out, want, rtol=rtol, atol=rtol * np.abs(want).max(), err_msg="out")
    np.testing.assert_allclose(rstd, want_rstd, rtol=rtol, err_msg="rstd")
    checked[rows, cols] = (x, w, out, want)
    rel = np.abs(out - want).max() / np.abs(want).max()
    rows_table.append(
        [
            f"{rows} × {cols}",
            rmsnorm_module.threads_for(cols),
            rel,
            (np.abs(rstd - want_rstd) / want_rstd).max(),
            seconds * 1e3,
        ]
    )
header = ["x", "threads/block", "out rel. error", "rstd rel. error", "ms (first call)"]
display(Markdown(markdown_table(header, rows_table)))

# %% [markdown]
# The launcher also computes in place (`out=x`) — each thread reads its columns before writing them,
# after the barrier that ends the reduction — and rejects bad input with a `ValueError`:

# %%
x, w, _, want = checked[shapes[1]]
x_d = cuda.to_device(x)
rmsnorm(x_d, w, eps, out=x_d)
np.testing.assert_allclose(x_d.copy_to_host(), want, rtol=1e-5, atol=1e-6)
print("in place: ok")
for bad in (lambda: rmsnorm(x, w[:-1], eps), lambda: rmsnorm(x, w, -1.0), lambda: rmsnorm(x.T, w, eps)):
    try:
        bad()
    except ValueError as e:
        print("ValueError:", e)

# %%
x, w, out, want = checked[shapes[-1]]
rtol = 8 * FP32_EPS * np.sqrt(x.shape[1])  # the check's bound above, per element
error_heatmap(out, want, bound=rtol * (np.abs(want) + np.abs(want).max()),
              title=f"rmsnorm kernel vs float64, {x.shape[0]} × {x.shape[1]}: error / bound")  # fmt: skip

# %% [markdown]
# ## Pictures: why eps matters
#
# For a row of RMS `r` and weight 1 the output has RMS `r / √(r² + eps)`: 1 when `r ≫ √eps`, shrinking
# towards 0 when `r` approaches `√eps`. With the fp32 eps that threshold is `3.5e-4`; with `2⁻⁷` it is
# `0.088` — inside the range of real activations. The curves are `plots.rmsnorm_output_rms`; the
# dots are the **kernel** run on random rows of chosen RMS, once with each eps.

# %%
eps_values = {"fp32 eps (current torch)": FP32_EPS, "2⁻⁷ (bf16 eps, older torch)": 2.0**-7}
row_rms = np.logspace(-4.5, 0.5, 10 if not on_gpu else 40)
cols = 32
x = rng.standard_normal((len(row_rms), cols))
x = (x * (row_rms / np.sqrt(np.mean(x**2, axis=1)))[:, None]).astype(np.float32)
ones = np.ones(cols, dtype=np.float32)
measured = {}
for label, e in eps_values.items():
    y = rmsnorm(x, ones, e).copy_to_host()
    got = np.sqrt(np.mean(y.astype(np.float64) ** 2, axis=1))
    np.testing.assert_allclose(got, rmsnorm_output_rms(row_rms, e), rtol=1e-4)
    measured[f"kernel, {label.split(' (')[0]}"] = (row_rms, got)
plot_eps_effect(eps_values, measured=measured)

# %% [markdown]
# Does it matter for the model? Run the bundled tiny checkpoint with both eps values and compare the
# outputs. (Its activations are of order 1, so the effect is modest there; real activations of
# low-variance tokens — flat image regions — sit closer to the threshold.)

# %%
tiny, weights = load_checkpoint(DATA / "tiny")
inputs = np.load(DATA / "tiny" / "inputs.npz")
pv, grid = inputs["pixel_values"], inputs["grid_thws"]
runs = {
    e: np.concatenate(reference.vision_forward(pv, grid, weights, tiny.replace(vit_norm_eps=e)))
    for e in eps_values.values()
}
a, b = runs.values()
print(f"tiny model output, eps 2⁻⁷ vs fp32 eps: max |Δ| / max |out| = {np.abs(a - b).max() / np.abs(a).max():.2e}")
print("(for scale: one bfloat16 rounding is up to 2⁻⁸ = 3.9e-03 relative, one fp32 rounding 2⁻²⁴ = 6.0e-08)")

# %% [markdown]
# ## Speed
#
# RMSNorm does almost no maths, so its yardstick is memory bandwidth (GB/s), not FLOP/s. The bytes it
# asks for: `x` read twice and `out` written once (`3·rows·cols·4`), plus the weight once per block
# (`rows·cols·4`, served by L2 after the first block; the second read of `x` may hit a cache too). On a GPU the baseline is a
# device-to-device copy (`2·rows·cols·4` bytes). On the simulator the time measures Python threads —
# not performance — so only one labelled line is printed there and no chart is drawn.

# %%
rows, cols = shapes[-1]
x = rng.standard_normal((rows, cols)).astype(np.float32)
w = rng.standard_normal(cols).astype(np.float32)
x_d, w_d, o_d = cuda.to_device(x), cuda.to_device(w), cuda.device_array_like(x)
repeat, warmup = (50, 3) if on_gpu else (1, 0)
seconds = {
    "rmsnorm kernel": median_seconds(lambda: rmsnorm(x_d, w_d, eps, out=o_d), repeat, warmup, cuda.synchronize)[
        "median"
    ]
}
if on_gpu:
    seconds["device-to-device copy"] = median_seconds(
        lambda: o_d.copy_to_device(x_d), repeat, warmup, cuda.synchronize
    )["median"]
moved = {"rmsnorm kernel": 3 * rows * cols * 4 + rows * cols * 4, "device-to-device copy": 2 * rows * cols * 4}
if on_gpu:
    for name, sec in seconds.items():
        print(
            f"{where()}: {name:22s} {sec * 1e3:9.3f} ms  {moved[name] / sec / 1e9:9.1f} GB/s  ({moved[name]:,} bytes)"
        )
    display(plot_timings(seconds, where(), title=f"RMSNorm {rows} × {cols}"))
else:
    sec = seconds["rmsnorm kernel"]
    print(
        f"{where()} (Python threads, not GPU performance): one call took {sec * 1e3:.0f} ms; {moved['rmsnorm kernel']:,} bytes requested"
    )

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

header, rows, note = prediction_rows("02")
display(Markdown(markdown_table(header, rows)))
print(note)

# %% [markdown]
# ## Exercises
#
# ### Your turn: write the kernel
#
# Each cell below is the RMSNorm kernel (one block of 32 threads per row) with a gap between `▼` and `▲`.
# Fill it and run the cell: `check(name, kernel)` launches it on the simulator (or the GPU) on two cases —
# 75 columns (not a multiple of 32) and 20 (fewer columns than threads), each with a nearly-zero row where
# eps matters — compares with `reference.rmsnorm` under an fp32 bound and says what is wrong: rows and
# columns that differ, outputs never written, NaN, a race when the output changes with the threads run in
# the opposite order, a per-row scale that is off. As committed the gaps are empty and the checks report failures. A failing check shows a first
# hint; `hint("rmsnorm_reduction")` shows them all, `solution("rmsnorm_reduction")` prints a solution.
#
# **A.** The block reduction: the 32 partial sums sit in `partial[]`; after your code, `partial[0]` must hold
# their total for every thread to read.

# %%
# YOUR TURN: rmsnorm_reduction — launched by check() as rmsnorm_reduction[rows, 32](x, weight, out, rows, cols, eps)
import math

from numba import float32

from moonvit_kernels.exercises import check, hint, solution

THREADS = 32


@cuda.jit
def rmsnorm_reduction(x, weight, out, rows, cols, eps):
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    partial = cuda.shared.array(THREADS, float32)
    acc = float32(0.0)
    for j in range(tid, cols, THREADS):
        v = x[row, j]
        acc += v * v
    partial[tid] = acc
    cuda.syncthreads()
    # ▼ your code
    pass
    # ▲
    r = float32(1.0) / math.sqrt(partial[0] / float32(cols) + eps)
    for j in range(tid, cols, THREADS):
        out[row, j] = x[row, j] * r * weight[j]


result = check("rmsnorm_reduction", rmsnorm_reduction)

# %% [markdown]
# **B.** The loops around the reduction: a block of 32 threads must cover a whole row of any length —
# first summing `x²`, at the end scaling and storing.


# %%
# YOUR TURN: rmsnorm_sum_and_scale — launched by check() as rmsnorm_sum_and_scale[rows, 32](x, weight, out, rows, cols, eps)
@cuda.jit
def rmsnorm_sum_and_scale(x, weight, out, rows, cols, eps):
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    partial = cuda.shared.array(THREADS, float32)
    acc = float32(0.0)
    # ▼ your code (1): this thread's share of the row's sum of squares
    pass
    # ▲
    partial[tid] = acc
    cuda.syncthreads()
    stride = THREADS // 2
    while stride > 0:
        if tid < stride:
            partial[tid] += partial[tid + stride]
        cuda.syncthreads()
        stride //= 2
    # ▼ your code (2): the row's scale, and the scaled outputs
    pass
    # ▲


result = check("rmsnorm_sum_and_scale", rmsnorm_sum_and_scale)

# %% [markdown]
# **C. CUDA C: a warp-shuffle reduction.** When a whole row fits one warp, its 32 lanes can add their partial
# sums without shared memory or barriers: `__shfl_xor_sync(mask, v, k)` hands each lane the value `v` of lane
# `lane XOR k`. The CUDA C kernel of the package (`rmsnorm.cu`) reduces this way inside each warp. Write
# `rmsnorm_warp_sum`: one block of one warp per row, `out = x · rsqrt(mean(x²) + eps) · weight`. The source
# is compiled and run by the CPU emulator (g++, every CUDA thread a fiber, shuffles exchanged through the
# emulated warp); `check` takes the **source text**.

# %%
# YOUR TURN: rmsnorm_warp_sum — launched by check() as rmsnorm_warp_sum<<<rows, 32>>>(x, weight, out, cols, eps)
rmsnorm_warp_sum = r"""
extern "C" __global__ void rmsnorm_warp_sum(const float* x, const float* weight, float* out, int cols, float eps) {
  const int row = blockIdx.x;
  const int lane = threadIdx.x;
  const float* xr = x + (long long)row * cols;
  float s = 0.0f;
  for (int j = lane; j < cols; j += 32) s += xr[j] * xr[j];
  // ▼ your code: every lane needs the row's total
  // ▲
  const float r = rsqrtf(s / cols + eps);
  for (int j = lane; j < cols; j += 32) out[(long long)row * cols + j] = xr[j] * r * weight[j];
}
"""

result = check("rmsnorm_warp_sum", rmsnorm_warp_sum)

# %% [markdown]
# ### Worked exercises
#
# Each cell below holds a worked answer; replace it with your own and rerun — the `assert` checks it.
#
# **1.** Below which row RMS does the fp32 eps shrink a row's output RMS by more than 1%?
# (Solve `r / √(r² + eps) = 0.99` for `r`.)

# %%
r_answer = np.sqrt(FP32_EPS * 0.99**2 / (1 - 0.99**2))  # worked answer

assert np.isclose(rmsnorm_output_rms(r_answer, FP32_EPS), 0.99)
r_bf16 = np.sqrt(2**-7 * 0.99**2 / (1 - 0.99**2))
print(f"rows with RMS below {r_answer:.2e} lose more than 1% (with eps = 2⁻⁷: below {r_bf16:.2f})")

# %% [markdown]
# **2.** The kernel returns `rstd` per row. Recover each row's mean square `mean(x²)` from it.

# %%
x, w, _, _ = checked[shapes[1]]
_, rstd_d = rmsnorm(x, w, eps, return_rstd=True)
rstd = rstd_d.copy_to_host().astype(np.float64)
mean_square_answer = 1 / rstd**2 - eps  # worked answer

np.testing.assert_allclose(mean_square_answer, np.mean(x.astype(np.float64) ** 2, axis=1), rtol=1e-5)
print(mean_square_answer)

# %% [markdown]
# **3.** Use the kernel for the projector's final norm (`mm_projector.post_norm`) of the tiny checkpoint.
# Which eps? The projector output must match `reference.projector`.

# %%
_, stages = reference.vision_forward(pv, grid, weights, tiny, return_intermediates=True)
h = stages["merged"] @ weights["mm_projector.proj.0.weight"].T
h = np.ascontiguousarray(reference.gelu_erf(h) @ weights["mm_projector.proj.2.weight"].T, dtype=np.float32)
eps_answer = tiny.projector_ln_eps  # worked answer: not vit_norm_eps

got = rmsnorm(h, weights["mm_projector.post_norm.weight"], eps_answer).copy_to_host()
np.testing.assert_allclose(got, stages["projected"], rtol=1e-4, atol=1e-5)
print("projector output reproduced with eps =", eps_answer)
