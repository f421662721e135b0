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
# # 06 — The full encoder: every kernel together, compared stage by stage
#
# `MoonViT(config, weights, backend=...)` assembles the stages of the previous notebooks:
# `"numpy"` is the reference (CPU), `"numba"` runs the numba.cuda kernels (a GPU, or the simulator),
# `"cupy"` the CUDA C kernels (GPU only), `"auto"` picks CuPy on a GPU and NumPy otherwise. With
# `return_intermediates=True` every backend returns the same stage dict — `patch_embed`, `pos_emb`,
# `layer_0 …`, `final_norm`, `merged`, `projected` — so `compare.compare_stages` can say **where** a
# port first goes wrong, not just that its output differs.
#
# This notebook: the one stage without its own notebook (the position embedding), then the assembled
# model, its stage-by-stage comparison against a float64 reference (table and plot), how the
# comparison pinpoints a bug, and timings labelled with where they ran.

# %%
# Without a GPU, numba.cuda runs on its CPU simulator; the switch must be set before numba is imported.
# Figures (matplotlib Figure objects returned by moonvit_kernels.plots) are drawn inline.
# %matplotlib inline
from moonvit_kernels.device import gpu_available, simulator_enabled, use_simulator_without_gpu, where

use_simulator_without_gpu()

import time

import numpy as np
from IPython.display import Markdown, display
from numba import cuda

from moonvit_kernels import reference
from moonvit_kernels.bundled import DATA_DIR as DATA  # the bundled files, from any working directory
from moonvit_kernels.compare import compare_stages, tolerance_for
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.model import MoonViT, cupy_importable
from moonvit_kernels.numba_backend import backend as backend_numba
from moonvit_kernels.numba_backend.launch import item_table
from moonvit_kernels.numba_backend.pos_emb import add_position_embedding, time_table
from moonvit_kernels.plots import (
    flop_table,
    markdown_table,
    median_seconds,
    plot_position_grids,
    plot_stage_report,
    plot_timings,
)
from moonvit_kernels.preprocess import patchify, unpatchify
from moonvit_kernels.weights import load_checkpoint, random_weights

rng = np.random.default_rng(0)
on_gpu = gpu_available() and not simulator_enabled()

print(f"kernels run on: {where()}")

# %% [markdown]
# ## Sizes
#
# On the simulator a whole forward pass launches ~30 kernels, each one Python thread per CUDA thread, so
# the bundled tiny checkpoint runs on a cropped copy of its inputs: the top 2×4 patches of the image and
# the top-left 2×2 of both video frames (16 tokens). On a GPU: K3's dimensions with random weights, the
# first 4 of its 27 layers (so that the float64 NumPy reference stays quick), on a 448×448 image packed
# with a 4-frame 224×224 video chunk (2048 tokens).

# %%
if on_gpu:
    config = VisionConfig.k3().replace(vt_num_hidden_layers=4)
    weights = random_weights(config, seed=0)
    grid_thws = np.array([[1, 32, 32], [4, 16, 16]])
    L = int(np.prod(grid_thws, axis=1).sum())
    pixel_values = rng.uniform(-1, 1, (L, 3, config.patch_size, config.patch_size)).astype(np.float32)
else:
    config, weights = load_checkpoint(DATA / "tiny")
    inputs = np.load(DATA / "tiny" / "inputs.npz")
    pv, p = inputs["pixel_values"], config.patch_size
    image = unpatchify(pv[:48], (1, 6, 8))[:, : 2 * p, : 4 * p]  # top 2×4 patches
    video = unpatchify(pv[48:], (2, 4, 4))[:, : 2 * p, : 2 * p]  # top-left 2×2 of each frame
    (a, grid_a), (b, grid_b) = patchify(np.ascontiguousarray(image), p), patchify(np.ascontiguousarray(video), p)
    pixel_values, grid_thws = np.concatenate([a, b]), np.array([grid_a, grid_b])
L = pixel_values.shape[0]
print(
    f"{where()}: {config.vt_num_hidden_layers} layers, D = {config.vt_hidden_size}, items {grid_thws.tolist()}, L = {L}"
)

# %% [markdown]
# ## The position embedding (docs/model.md, stage 2)
#
# The checkpoint holds a learned `H0 × W0` grid (64×64 in K3, 6×6 in the tiny model). An item of `h × w`
# patches gets the grid resized to `h × w` — `F.interpolate(mode="bilinear", align_corners=False)`:
# source coordinate `s = (d + 0.5)·(in/out) − 0.5`, clamped; same size is exactly the identity. A video
# frame `f` also gets the sin/cos row `time[f]` (computed, never stored; frame 0 gets +1 on the cos
# half, an image nothing). Pitfalls: the half-pixel offset, and the bicubic coefficient (−0.75, not −0.5).
# One channel of the tiny model's grid, as learned and resized to this run's items:

# %%
pos_weight = weights["vision_tower.patch_embed.pos_emb.weight"]
plot_position_grids(pos_weight, [(6, 8), (2, 4), (2, 2)] if not on_gpu else [(32, 32), (16, 16)], channel=0)

# %% [markdown]
# The numba kernel (`numba_backend/pos_emb.py`): one block per token, adding in place. The block finds the
# token's item, frame, row and column; each thread takes channels `d = tid, tid + blockDim, …` and sums
# the interpolation taps (2 per axis for bilinear, 4 for bicubic) of the learned grid, then adds the time
# row for video frames. One specialisation per interpolation mode:

# %%
import inspect

from moonvit_kernels.numba_backend import pos_emb as pos_emb_module

print(inspect.getsource(pos_emb_module._make_kernel))

# %% [markdown]
# Checked against the reference, on random tokens:

# %%
x = rng.standard_normal((L, config.vt_hidden_size)).astype(np.float32)
table = time_table(config.vt_hidden_size, config.init_pos_emb_time)
got = add_position_embedding(x.copy(), pos_weight, table, item_table(grid_thws)).copy_to_host()
want = reference.add_position_embedding(x.astype(np.float64), grid_thws, pos_weight.astype(np.float64), config)
np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
print(f"position embedding kernel: max error {np.abs(got - want).max():.1e}")

# %% [markdown]
# The CUDA C version (`cuda_backend/pos_emb.cu`) computes the same taps with a templated tap count
# (`NT = 2` or `4`) and reads the token's `(item, frame, row, col)` from a table instead of searching;
# run here on the CPU emulator (g++) and checked the same way:

# %%
from moonvit_kernels.cuda_backend import launchers
from moonvit_kernels.cuda_backend.sources import KERNEL_DIR
from moonvit_kernels.tools import emulation

src = (KERNEL_DIR / "pos_emb.cu").read_text(encoding="utf-8")
print(src)
if emulation.compiler() is None:
    print("no C++ compiler (g++ >= 11) here: the CUDA C emulator cannot run")
else:
    # A small packed input of its own (on a GPU this notebook's input is far too big for the emulator).
    grid_e = np.array([[1, 3, 5], [2, 2, 2]])
    x_e = rng.standard_normal((int(np.prod(grid_e, axis=1).sum()), config.vt_hidden_size)).astype(np.float32)
    mode = config.pos_emb_interpolation_mode
    got_c = x_e.copy()  # the kernel adds in place
    tables = (launchers.token_positions(grid_e), grid_e.astype(np.int32), pos_weight, table)
    emulation.run(launchers.add_position_embedding_inplace, got_c, *tables, mode)
    want_e = reference.add_position_embedding(x_e.astype(np.float64), grid_e, pos_weight.astype(np.float64), config)
    np.testing.assert_allclose(got_c, want_e, rtol=1e-5, atol=1e-5)
    print(f"CPU emulator of pos_emb.cu, items {grid_e.tolist()}: max error {np.abs(got_c - want_e).max():.1e}")

# %% [markdown]
# ## The assembled model
#
# The numba backend keeps activations on the device from the patch GEMM to the projector's norm;
# residual additions are fused into the GEMMs (`x = o·woᵀ + x` in one launch), RoPE works in place in the
# `qkv` buffer. Its stage order, from the module:

# %%
print(backend_numba.__doc__)

# %%
models = {
    "numpy float64": MoonViT(config, weights, backend="numpy", dtype="float64"),
    "numpy float32": MoonViT(config, weights, backend="numpy"),
    "numba": MoonViT(config, weights, backend="numba"),
}
if on_gpu and cupy_importable():
    models["cupy float32"] = MoonViT(config, weights, backend="cupy", dtype="float32")
    models["cupy bfloat16"] = MoonViT(config, weights, backend="cupy", dtype="bfloat16")

runs, first_seconds = {}, {}
for name, model in models.items():
    start = time.perf_counter()
    outputs, stages = model.forward(pixel_values, grid_thws, return_intermediates=True, as_numpy=True)
    first_seconds[name] = time.perf_counter() - start
    runs[name] = (outputs, stages)
    print(f"{name:14s} outputs {[tuple(o.shape) for o in outputs]}  first call {first_seconds[name]:8.2f} s")

# %% [markdown]
# ## Stage by stage: numba against the float64 reference
#
# For each stage: max abs error, relative error `max|a − b| / max|b|`, and the tolerance. The tolerance
# grows by 1.15× per stage (`compare.tolerance_for`) because every layer adds rounding — a fixed bound
# would flag the late stages of a correct port. The float32 NumPy reference shows how much of the
# difference is plain fp32 rounding.

# %%
reference64 = runs["numpy float64"][1]
compute_dtype = {name: "bfloat16" if "bfloat16" in name else "float32" for name in models}
reports = {
    name: compare_stages(runs[name][1], reference64, dtype=compute_dtype[name], names=(name, "numpy float64"))
    for name in models
    if name != "numpy float64"
}
print(reports["numba"].table())
rows = [
    [s.stage, str(s.shape)] + [reports[n].rows[i].max_rel for n in reports] + [s.tolerance, s.ok]
    for i, s in enumerate(reports["numba"].rows)
]
display(
    Markdown(
        markdown_table(["stage", "shape", *(f"{n}: rel. error" for n in reports), "fp32 tolerance", "numba ok"], rows)
    )
)
assert reports["numba"].ok, reports["numba"].first_divergence

# %%
plot_stage_report(reports["numba"], title=f"numba ({where()}) vs numpy float64, stage by stage")

# %% [markdown]
# ## What a bug looks like in this report
#
# A port with one mistake — here `fc1` of block 1 loaded 1% too large (a wrong scale, a bf16 mishap) —
# run through the same comparison. Everything before `layer_1` is exact to rounding; the report names the
# first stage beyond tolerance, which is where to start looking.

# %%
broken = dict(weights)
name = (
    "vision_tower.encoder.blocks.1.mlp.fc1.weight" if config.vt_num_hidden_layers > 1 else "mm_projector.proj.2.weight"
)
broken[name] = weights[name] * 1.01
_, broken_stages = MoonViT(config, broken, backend="numpy").forward(pixel_values, grid_thws, return_intermediates=True)
report = compare_stages(broken_stages, reference64, names=("numpy, fc1 of block 1 off by 1%", "numpy float64"))
print(report.table())
plot_stage_report(report)

# %% [markdown]
# ## Bring your own kernel
#
# Your kernel belongs in the tower too. `own_kernel(stage, launcher)` (`numba_backend.own_kernels`) runs the
# numba tower with one launcher replaced by yours, for as long as the `with` block lasts; `compare_stages`
# (or `compare.compare_backends`) then says whether the whole model still matches, and if not, the first stage
# that went wrong. Your launcher takes what the tower passes the one it replaces (here `rmsnorm(x, weight,
# eps, out=, rstd=)`: the names are checked) and writes where that one does. Below, a one-thread-per-row
# RMSNorm — slower than the module's block-per-row kernel, but correct — runs every norm of the tower:

# %%
from math import sqrt

from moonvit_kernels.numba_backend.own_kernels import own_kernel


@cuda.jit
def my_rmsnorm_kernel(x, weight, out, rstd, eps):
    row = cuda.grid(1)
    if row < x.shape[0]:
        total = 0.0
        for c in range(x.shape[1]):
            total += x[row, c] * x[row, c]
        r = 1.0 / sqrt(total / x.shape[1] + eps)
        rstd[row] = r
        for c in range(x.shape[1]):
            out[row, c] = x[row, c] * r * weight[c]


def my_rmsnorm(x, weight, eps, out=None, rstd=None):
    """The tower's rmsnorm launcher, by my kernel: out [rows, cols] (in place when out is x), rstd [rows]."""
    out = cuda.device_array_like(x) if out is None else out
    rstd = cuda.device_array(x.shape[0], np.float32) if rstd is None else rstd
    my_rmsnorm_kernel[(x.shape[0] + 31) // 32, 32](x, weight, out, rstd, np.float32(eps))
    return out


# the first two patch rows of the image (16 patches: a 2×8 grid), to keep the simulator quick
small_pixels, small_grid = pixel_values[: 2 * int(grid_thws[0, 2])], np.array([[1, 2, int(grid_thws[0, 2])]])
with own_kernel("rmsnorm", my_rmsnorm):
    _, mine = MoonViT(config, weights, backend="numba").forward(
        small_pixels, small_grid, return_intermediates=True, as_numpy=True
    )
_, small64 = models["numpy float64"].forward(small_pixels, small_grid, return_intermediates=True)
report = compare_stages(mine, small64, names=("numba, my rmsnorm", "numpy float64"))
print(report.table())
assert report.ok, report.first_divergence

# %% [markdown]
# ## Debugging a kernel
#
# - **Under the simulator** (no GPU) a kernel is plain Python run by one thread per CUDA thread: `print`
#   works inside it (guard it, `if cuda.grid(1) == 5:`, or every thread prints), and so does a breakpoint —
#   `import pdb; pdb.set_trace()` under the same guard stops that one thread with the others waiting at
#   their next barrier. An index out of bounds raises `IndexError` named by thread and block
#   (`tid=[37, 0, 0] ctaid=[0, 0, 0]`). Negative indices wrap silently, as in NumPy.
# - **On the CPU emulator** (CUDA C) a launch that goes wrong raises `LaunchError` with the kernel's name and
#   what broke: a block too large for the registers it declares, dynamic shared memory above the raised
#   limit, a misaligned vector access (the launchers check alignment before launching), an argument the
#   kernel does not take. `printf` inside a `.cu` kernel prints from the emulator too.
# - **The checker** (`check(name, kernel)`) compares against NumPy on several cases and names the case, the
#   wrong rows or columns, NaN, outputs never written, writes past the end and known bugs; `hint(name)` and
#   `solution(name)` when stuck.
# - **Stage by stage** (`compare_stages`, above): the first stage beyond tolerance is where to look.

# %% [markdown]
# ## Time, labelled with where it ran
#
# The NumPy reference always runs on the CPU; the numba backend runs on `where()`. On a GPU the first call
# compiles every kernel, so the GPU backends are timed after a warm-up, median of several calls, and
# drawn on a logarithmic axis (the backends differ by orders of magnitude). On the simulator the numba
# time measures Python threads — not performance — so there it is one labelled line and no chart.

# %%
seconds = {}
for name, model in models.items():
    place = "CPU" if name.startswith("numpy") else where()
    if on_gpu and not name.startswith("numpy"):
        if name == "numba":
            sync = cuda.synchronize
        else:
            import cupy

            sync = cupy.cuda.Device().synchronize
        t = median_seconds(lambda model=model: model.forward(pixel_values, grid_thws), 5, 1, sync)["median"]
    else:
        t = first_seconds[name]  # includes returning the intermediates
    seconds[f"{name} ({place})"] = t
total_flops = sum(r.count for r in flop_table(config, grid_thws))
print(f"({total_flops:,} FLOP per forward, from docs/model.md's cost formulas)")
if on_gpu:
    for label, sec in seconds.items():
        print(f"{label:40s} {sec * 1e3:10.1f} ms  {total_flops / sec / 1e12:10.4g} TFLOP/s")
    display(plot_timings(seconds, f"{where()} and CPU", unit="ms", title="one forward pass", log=True))
else:
    for label, sec in seconds.items():
        kind = "the CPU reference" if label.startswith("numpy") else "Python threads, not GPU performance"
        print(f"{label:40s} {sec:8.2f} s  ({kind})")

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

header, rows, note = prediction_rows("06")
display(Markdown(markdown_table(header, rows)))
print(note)

# %% [markdown]
# ## Exercises
#
# ### Your turn: write the kernel
#
# Two kernels of the encoder that no earlier notebook had you write, each with a gap between `▼` and `▲`.
# `check(name, kernel)` runs your kernel (simulator or GPU) on two cases against the NumPy reference and
# says which outputs are wrong, never written, NaN, out of bounds, racy, or which known bug it reproduces.
# As committed the checks report failures. A failing check shows a first hint; `hint("pos_emb_bilinear")`
# shows them all, `solution("pos_emb_bilinear")` prints a solution.
#
# **A.** The position grid resize with `F.interpolate(mode="bilinear", align_corners=False)`: a learned
# 6×6 grid of `D = 7` channels resized to 4×9 patches, then a 5×8 grid resized to 7×3. The placeholder uses
# the `align_corners=True` formula — a pitfall that samples a different grid and shifts almost every
# value; `align_corners=False` measures between cell centres.

# %%
# YOUR TURN: pos_emb_bilinear — launched by check() as pos_emb_bilinear[h·w, 32](grid, out, h, w)
import math

from numba import float32

from moonvit_kernels.exercises import check, hint, solution


@cuda.jit
def pos_emb_bilinear(grid, out, h, w):
    patch = cuda.blockIdx.x  # one block per output patch
    r = patch // w
    c = patch % w
    H0 = grid.shape[0]
    W0 = grid.shape[1]
    # ▼ your code: source coordinates sy, sx, taps y0, y1, x0, x1 and weights ly, lx
    sy = float32(r) * float32(H0 - 1) / float32(h - 1)  # placeholder: align_corners=True
    sx = float32(c) * float32(W0 - 1) / float32(w - 1)
    y0 = min(int(math.floor(sy)), H0 - 1)
    x0 = min(int(math.floor(sx)), W0 - 1)
    y1 = min(y0 + 1, H0 - 1)
    x1 = min(x0 + 1, W0 - 1)
    ly = sy - float32(y0)
    lx = sx - float32(x0)
    # ▲
    for d in range(cuda.threadIdx.x, grid.shape[2], cuda.blockDim.x):
        top = (float32(1.0) - lx) * grid[y0, x0, d] + lx * grid[y0, x1, d]
        bottom = (float32(1.0) - lx) * grid[y1, x0, d] + lx * grid[y1, x1, d]
        out[patch, d] = (float32(1.0) - ly) * top + ly * bottom


result = check("pos_emb_bilinear", pos_emb_bilinear)

# %% [markdown]
# **B.** The MLP's first GEMM with its activation fused into the store: `C = gelu_tanh(A·Bᵀ)` — the tanh
# form (the projector uses the erf form: swapping them is a real bug, see notebook 01). The placeholder
# stores the product without the activation.

# %%
# YOUR TURN: gelu_tanh_epilogue — launched by check() as gelu_tanh_epilogue[(⌈N/16⌉, ⌈M/16⌉), (16, 16)](A, B, C, M, N, K)
GELU_C = float32(math.sqrt(2.0 / math.pi))


@cuda.jit
def gelu_tanh_epilogue(A, B, C, M, N, K):
    n = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    m = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    if m < M and n < N:
        v = float32(0.0)
        for k in range(K):
            v += A[m, k] * B[n, k]
        # ▼ your code: apply gelu_tanh to v
        pass
        # ▲
        C[m, n] = v


result = check("gelu_tanh_epilogue", gelu_tanh_epilogue)

# %% [markdown]
# ### Worked exercises
#
# Each cell below holds a worked answer; replace it with your own and rerun — the `assert` checks it.
#
# **1.** Break the model yourself: scale one weight by 1.01 and predict the first stage the report will
# flag. (Worked answer: the final norm's weight only affects `final_norm` and later.)

# %%
weight_to_break = "vision_tower.encoder.final_layernorm.weight"  # worked answer
predicted_first_divergence = "final_norm"

broken = {**weights, weight_to_break: weights[weight_to_break] * 1.01}
_, s = MoonViT(config, broken, backend="numpy").forward(pixel_values, grid_thws, return_intermediates=True)
assert compare_stages(s, reference64).first_divergence == predicted_first_divergence
print("first divergence:", predicted_first_divergence)

# %% [markdown]
# **2.** The tolerance of stage `k` (0-based, in the reference's order) is `base · 1.15**k`. What is the
# tolerance of `final_norm` for a float32 backend?

# %%
base, growth = tolerance_for("float32")
k = list(reference64).index("final_norm")
tolerance_answer = base * growth**k  # worked answer

assert np.isclose(tolerance_answer, next(r.tolerance for r in reports["numba"].rows if r.stage == "final_norm"))
print(f"final_norm is stage {k}: tolerance {tolerance_answer:.2e}")

# %% [markdown]
# **3.** The full K3 tower on one 896×896 image: how long would it take at the H200's datasheet peaks —
# ≈ 989 TFLOP/s dense bf16 on the tensor cores, and the ≈ 67 TFLOP/s fp32 CUDA-core peak that bounds this
# workbook's fp32 numba kernels? (Datasheet figures, model, no GPU: a floor, not a prediction; what cuBLAS
# really reaches, `gpu_check` measures on the GPU it runs on.)

# %%
k3 = VisionConfig.k3()
tower_flops = sum(r.count for r in flop_table(k3, [[1, 64, 64]]))
floor_ms_answer = {  # worked answer
    "bf16 datasheet": tower_flops / 989e12 * 1e3,
    "fp32 SIMT": tower_flops / 67e12 * 1e3,
}

assert 6.0 < floor_ms_answer["bf16 datasheet"] < 6.4  # docs/model.md: ≥ 6.2 ms
assert 88 < floor_ms_answer["fp32 SIMT"] < 95  # docs/model.md: ≥ 92 ms
print(", ".join(f"{k}: {v:.1f} ms" for k, v in floor_ms_answer.items()))
