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
# # 03 — 2D RoPE: interleaved pairs, width on even slots, height on odd
#
# **What the source does.** Before attention, q and k of every head are rotated by the position of
# their patch (docs/model.md, stage 4). Per head the `hd` values form `hd/2` consecutive pairs
# `(x[2j], x[2j+1])`, each turned as a complex number by an angle that depends on the patch:
#
# - frequencies `f_i = 10000^(−4i/hd)` for `i < hd/4` (computed in float32 in the source);
# - complex slot `j = 2i` (even) turns by `column · f_i` — **width**;
# - complex slot `j = 2i + 1` (odd) turns by `row · f_i` — **height**;
# - in real dims: `(4i, 4i+1)` by `c·f_i`, `(4i+2, 4i+3)` by `r·f_i`;
# - every frame of a video reuses the same 2D table (no rotation over time); `h, w ≤ 512`.
#
# **Pitfalls other ports hit:** the *rotate-half* convention (pairs `(j, j + hd/2)`, from 1-D LLM RoPE)
# instead of interleaved pairs; and swapping width and height because the source's **docstring says
# the opposite** of what its code does. The code wins. Both mistakes produce plausible-looking numbers,
# so each gets a demonstration below.

# %%
# Without a GPU, numba.cuda runs on its CPU simulator; the switch must be set before numba is imported.
# Figures (matplotlib Figure objects returned by moonvit_kernels.plots) are drawn inline.
# %matplotlib inline
from moonvit_kernels.device import gpu_available, simulator_enabled, use_simulator_without_gpu, where

use_simulator_without_gpu()

import inspect

import numpy as np
from IPython.display import Markdown, display

from moonvit_kernels import reference
from moonvit_kernels.config import FP32_EPS
from moonvit_kernels.numba_backend import rope as rope_module
from moonvit_kernels.numba_backend.launch import cu_seqlens_table, grid_table
from moonvit_kernels.numba_backend.rope import rope2d
from moonvit_kernels.plots import (
    error_heatmap,
    markdown_table,
    plot_raster_vs_2d,
    plot_rope_comb,
    plot_rope_k3_maps,
    plot_rope_offset_map,
    plot_rope_pairing,
    rope_angle_range,
    rope_frequency_maps,
    rope_offset_invariance,
    rope_pairs,
)

rng = np.random.default_rng(0)
on_gpu = gpu_available() and not simulator_enabled()

print(f"kernels run on: {where()}")

# %% [markdown]
# ## Sizes
#
# On a GPU: K3's 12 heads of `hd = 128`, an 896×896 image packed with a 4-frame 224×224 video.
# On the simulator: 2 heads of `hd = 24` (a multiple of 4, not a power of two), a 3×5 image and a
# 2-frame 2×3 video — 27 tokens, one CUDA block each.

# %%
if on_gpu:
    heads, hd = 12, 128
    grid_thws = np.array([[1, 64, 64], [4, 16, 16]])
else:
    heads, hd = 2, 24
    grid_thws = np.array([[1, 3, 5], [2, 2, 3]])
L = int(np.prod(grid_thws, axis=1).sum())
Q = heads * hd
print(f"{where()}: {heads} heads × hd {hd}, items {grid_thws.tolist()}, L = {L}, qkv [{L}, {3 * Q}]")

# %% [markdown]
# ## Which dims rotate together
#
# Each arc joins two dims that rotate as one complex number; blue arcs turn with the column, orange with
# the row; the number is the frequency index `i`. K3 (top) pairs neighbours; rotate-half (bottom, *not*
# K3) pairs dim `j` with `j + hd/2`. The picture is drawn from `plots.rope_pairs`, which the tests
# check against what `reference.apply_rope` actually rotates.

# %%
plot_rope_pairing(24)

# %% [markdown]
# The angle table of the reference, `reference.rope_angles(h, w, hd)` → `[h·w, hd/2]`: for one token, at
# row 2, column 4 of a 3×5 grid, the even slots hold `4·f_i` and the odd slots `2·f_i`:

# %%
h, w = 3, 5
angles = reference.rope_angles(h, w, 24, dtype=np.float64)
f = reference.rope_frequencies(24, dtype=np.float64)
token = 2 * w + 4
rows = [
    [j, "width" if j % 2 == 0 else "height", j // 2, angles[token, j], (4 if j % 2 == 0 else 2) * f[j // 2]]
    for j in range(12)
]
display(Markdown(markdown_table(["slot j", "axis", "i", "angle", "expected (col or row)·f_i"], rows)))

# %% [markdown]
# ## The NumPy reference
#
# `reference.apply_rope(x [L, heads, hd], angles [L, hd/2])` with the angles of
# `reference.rope_angles_packed(grid_thws, hd)` (every frame of a video reuses its item's 2D table):

# %%
print(inspect.getsource(reference.apply_rope))
print(inspect.getsource(reference.rope_angles_packed))

# %% [markdown]
# ## The kernel: `moonvit_kernels/numba_backend/rope.py`
#
# It rotates q and k **in place** inside the packed `qkv [L, 3·Q]` buffer that the `wqkv` GEMM wrote
# (column `s·Q + head·hd + d`, s = q, k, v), so no copy of q and k is made. One block per token: the
# block finds the token's media item from `cu_seqlens`, its row and column within its frame. Then each
# thread owns **one value**, not a pair or a quad:
#
# - the block is 2D, `(head_dim, heads per pass)`: thread `(x, y)` holds dim `x` of head `y`. The q heads
#   and then the k heads sit side by side in a row of qkv (`s·Q + head·hd = (s·H + head)·hd`), so
#   consecutive threads hold consecutive columns and a warp's load or store covers 32 consecutive floats:
#   4 sectors of 32 bytes, the fewest possible (fully coalesced);
# - the angle depends on the dim only, so a thread computes its `cos` and `sin` once and reuses them for
#   every head;
# - a value's new value needs the other value of its pair (column `j ^ 1`), which another thread
#   overwrites in place: every thread reads both, then `cuda.syncthreads()`, then writes — without the
#   barrier a thread could read a partner already rotated. The launcher keeps `blockDim.x` even, so a pair
#   is never split between two passes;
# - the indices are `uint32` and the loops `while` loops. numba does integer arithmetic in signed 64 bits
#   (`range()` counters, `threadIdx`), and a signed index pays a test for Python's negative indices; with
#   `uint32(...)` around each sum the compiler sees non-negative 32-bit values, and a pass over one value
#   compiles to 29 SASS instructions instead of about 67 (sm_90, compile tier, model, no GPU).

# %%
print(inspect.getsource(rope_module.rope2d_kernel.py_func))

# %% [markdown]
# **Is it coalesced?** The X-ray of notebook 07 runs the kernel on the CUDA simulator, records the address
# every thread touches and counts, per warp request, the 32-byte sectors it needs against the fewest its
# bytes fit in (model, no GPU). One token of K3 (12 heads of `hd = 128`, 128 threads); the earlier version
# of this kernel, one thread per quad with 4-byte loads 16 bytes apart, needed 16 sectors for every 4.

# %%
from moonvit_kernels.tools.xray import jobs_numba

if simulator_enabled():
    (rope_job,) = [j for j in jobs_numba.jobs() if j.name == "rope"]
    traced = [s for s in jobs_numba.run(rope_job).sites if s.array == "qkv"]
    display(Markdown(markdown_table(
        ["code", "op", "warp requests", "sectors per request", "ideal"],
        [(f"`{s.code}`", s.kind, s.requests, f"{s.per_request:.0f}", f"{s.ideal / s.requests:.0f}") for s in traced])))  # fmt: skip
    assert traced and all(s.factor == 1 for s in traced)
else:
    print("address tracing runs on the CUDA simulator only (a GPU is in use here)")

# %% [markdown]
# ## Check against NumPy
#
# q, k and v random; the reference runs in float64 on the same input. The kernel computes angles in
# float32, whose error grows with the angle (`|angle|·eps`), so the bound is
# `8·eps·(1 + max angle)·max|x|`. v must come back bit-for-bit untouched.

# %%
qkv = rng.standard_normal((L, 3 * Q)).astype(np.float32)
grid32, cu32 = grid_table(grid_thws), cu_seqlens_table(grid_thws)
got = rope2d(qkv.copy(), grid32, cu32, heads, hd).copy_to_host()

ang64 = reference.rope_angles_packed(grid_thws, hd, dtype=np.float64)
x64 = qkv.astype(np.float64)
want = x64.copy()
for s in (0, 1):  # q, k
    part = x64[:, s * Q : (s + 1) * Q].reshape(L, heads, hd)
    want[:, s * Q : (s + 1) * Q] = reference.apply_rope(part, ang64).reshape(L, Q)
tol = 8 * FP32_EPS * (1 + ang64.max()) * np.abs(x64).max()
err = np.abs(got - want)
assert np.all(np.isfinite(got)) and err.max() <= tol, (err.max(), tol)
assert np.array_equal(got[:, 2 * Q :], qkv[:, 2 * Q :]), "v was modified"
print(f"q, k max error {err[:, : 2 * Q].max():.2e} (bound {tol:.1e}); v untouched")

# %%
error_heatmap(got[:, : 2 * Q], want[:, : 2 * Q], bound=tol, title="rope2d kernel, q | k columns: error / bound")

# %% [markdown]
# **Frames share positions.** Give both frames of the video the same q, k vectors: after RoPE they are
# still identical — there is no rotation over time (videos get their time signal from the position
# embedding, not from RoPE).

# %%
t, vh, vw = grid_thws[-1]
start = L - t * vh * vw
same = qkv.copy()
same[start + vh * vw : start + 2 * vh * vw] = same[start : start + vh * vw]  # frame 1 := frame 0
out = rope2d(same, grid32, cu32, heads, hd).copy_to_host()
assert np.array_equal(out[start : start + vh * vw], out[start + vh * vw : start + 2 * vh * vw])
print("frame 0 and frame 1 rotated identically")

# %% [markdown]
# ## The CUDA C kernel: `cuda_backend/rope.cu`
#
# The CuPy backend's version is organised differently: the frequencies `f_i` come precomputed
# (`freqs [hd/4]`, fp32, so no `pow` per thread), and each thread owns a quad `(s, head, i)`: it loads its
# 4 dims as one 16-byte `float4` (a warp reads 512 consecutive bytes, again the fewest sectors) and
# computes both angles with `sincosf`, so no partner value and no barrier are needed. Token positions come
# from a `token_pos [L, 4]` table (item, frame, row, col) instead of a search through `cu_seqlens`. Run on
# the CPU emulator against the same reference:

# %%
from moonvit_kernels.cuda_backend import launchers
from moonvit_kernels.cuda_backend.sources import KERNEL_DIR
from moonvit_kernels.tools import emulation

print((KERNEL_DIR / "rope.cu").read_text(encoding="utf-8"))
if emulation.compiler() is None:
    print("no C++ compiler (g++ >= 11) here: the CUDA C emulator cannot run")
else:
    # The simulator-sized input (on a GPU this notebook's input is K3-sized, too big for the emulator).
    heads_e, hd_e, grid_e = 2, 24, np.array([[1, 3, 5], [2, 2, 3]])
    L_e, Q_e = int(np.prod(grid_e, axis=1).sum()), 2 * 24
    qkv_e = rng.standard_normal((L_e, 3 * Q_e)).astype(np.float32)
    ang_e = reference.rope_angles_packed(grid_e, hd_e, dtype=np.float64)
    want_e = qkv_e.astype(np.float64)
    for s_ in (0, 1):
        part = want_e[:, s_ * Q_e : (s_ + 1) * Q_e].reshape(L_e, heads_e, hd_e)
        want_e[:, s_ * Q_e : (s_ + 1) * Q_e] = reference.apply_rope(part, ang_e).reshape(L_e, Q_e)
    tol_e = 8 * FP32_EPS * (1 + ang_e.max()) * np.abs(qkv_e).max()
    qkv_c = qkv_e.copy()
    token_pos_e, freqs_e = launchers.token_positions(grid_e), reference.rope_frequencies(hd_e, dtype=np.float32)
    emulation.run(launchers.rope_inplace, qkv_c, token_pos_e, freqs_e, heads_e, hd_e)  # rotates qkv_c in place
    err_c = np.abs(qkv_c - want_e)
    assert np.all(np.isfinite(qkv_c)) and err_c.max() <= tol_e, (err_c.max(), tol_e)
    print(f"CPU emulator of rope.cu, items {grid_e.tolist()}: q, k max error {err_c.max():.2e} (bound {tol_e:.1e})")

# %% [markdown]
# ## Table or recompute? cos/sin of the angles
#
# The angle depends only on the token's row or column and on `i`. The CUDA C kernel recomputes `cos` and
# `sin` for every (token, q/k, head, frequency), so the same values are computed `2·H = 24` times per token
# in K3; the numba kernel computes them once per (token, dim) and reuses them for every head (`hd` per
# token, each pair's two threads computing the same angle). The alternative is a table
# `cos/sin[position, i]` for positions `0 … 511` (RoPE's grid limit), computed once (even in float64) and
# read by every head. Cost and accuracy, for K3 (`hd = 128`, 12 heads) at the largest grid, 512 patches
# wide:

# %%
H3, hd3, side = 12, 128, 512
f32 = reference.rope_frequencies(hd3)  # the fp32 frequencies of the source
pos = np.arange(side, dtype=np.float32)
angle32 = pos[:, None] * f32[None, :]  # fp32 product, as the kernels form it
exact = np.arange(side, dtype=np.float64)[:, None] * f32.astype(np.float64)[None, :]
recompute_err = np.abs(np.cos(angle32).astype(np.float32) - np.cos(exact)).max()
table = np.cos(exact).astype(np.float32)  # float64 table rounded once to fp32
table_err = np.abs(table - np.cos(exact)).max()
tokens = side * side
sincos_recompute = tokens * 2 * H3 * (hd3 // 4) * 2  # per (token, q/k, head, i): a width and a height sincos
sincos_per_dim = tokens * hd3  # numba: one sincos per (token, dim), shared by the 2·H heads
sincos_table = side * (hd3 // 4)  # one table of (cos, sin) for positions 0..511, shared by rows and columns
table_bytes = side * (hd3 // 4) * 2 * 4
rows = [
    ["recompute per head (rope.cu)", f"{sincos_recompute:,} sincos", f"{recompute_err:.1e}", "none"],
    ["recompute per dim (numba rope.py)", f"{sincos_per_dim:,} sincos", f"{recompute_err:.1e}", "none"],
    [
        "table (float64, rounded to fp32)",
        f"{sincos_table:,} sincos, once",
        f"{table_err:.1e}",
        f"{table_bytes / 1024:.0f} KiB",
    ],
]
display(Markdown(markdown_table(["approach", f"work for a {side}×{side} grid", "max cos error", "memory"], rows)))
print(
    f"the fp32 angle position·f_i carries a relative error ~eps, i.e. up to {side - 1}·eps ≈ "
    f"{(side - 1) * FP32_EPS:.0e} rad at i = 0: that, not sincos, limits the recomputed cos"
)

# %% [markdown]
# ## Pictures: RoPE frequency maps
#
# The real thing: K3's `hd = 128` (32 frequencies, 64 complex slots) on the 64×64 patch grid of an 896×896
# image. How far does each frequency turn across the image? `(63)·f_i` radians:

# %%
K3_HD, SIDE = 128, 64
reach = rope_angle_range(SIDE, SIDE, K3_HD)
print("largest angle per frequency i (rad):", np.array2string(reach, precision=3, max_line_width=110))
fast = int(np.sum(reach > np.pi))
print(
    f"{fast} of {K3_HD // 4} frequencies turn more than half a circle across the image; the slowest turns {reach[-1]:.4f} rad"
)

# %% [markdown]
# So a `cos(angle)` picture of all 64 slots would be flat for most of them: the slow frequencies encode
# *coarse* position, a tiny but smooth angle. Drawn as the angle itself, each slot scaled by its own
# largest angle, every slot shows its gradient (width slots along columns, height slots along rows), and the
# titles read off how many decades apart the frequencies are (63 rad for `i = 0`, thousandths of a radian at
# the end) — 16 slots, `i = 0, 4, …, 28`, each with its width and its height slot:

# %%
slots = [2 * i + s for i in range(0, K3_HD // 4, 4) for s in (0, 1)]
rope_frequency_maps(SIDE, SIDE, K3_HD, "angle", slots=slots)

# %% [markdown]
# And `cos(angle)` — what the rotation actually multiplies by — for the fast width slots `i = 0 … 7`, which
# wrap around several times: fine position.

# %%
rope_frequency_maps(SIDE, SIDE, K3_HD, "cos", slots=[2 * i for i in range(8)])

# %% [markdown]
# Those maps are each one slot over the grid. What the *interleaving* does shows best with slots down and
# positions across: every slot's `cos(angle)` for a token moving along a row (the column grows), and for one
# moving down a column (the row grows). Along a row only the even (width) slots turn — the odd rows of the
# picture are flat — and down a column only the odd ones: a comb (`plots.plot_rope_comb`). Fast slots at
# the top wrap many times across the image; from about slot 40 on, nothing visibly turns within 64 patches.

# %%
plot_rope_comb(K3_HD, SIDE)

# %% [markdown]
# Where do the slow slots turn at all? Each panel below draws one width slot (top) and one height slot
# (bottom) over at least one full period of its own, with the 64×64 image dashed (`plots.plot_rope_k3_maps`,
# what `moonvit-kernels rope` writes): the slowest slot's period is ~47,000 patches, so inside any image it
# only ramps — coarse position, carried by a tiny angle.

# %%
plot_rope_k3_maps(K3_HD, (SIDE, SIDE))

# %% [markdown]
# **Explore it yourself** (needs `ipywidgets`, `pip install ipywidgets`): sliders for the grid side, the
# frequency index `i` and the slot (width or height). Without ipywidgets the cell says so and does nothing.

# %%
try:
    import ipywidgets as widgets
except ImportError:
    widgets = None
    print("ipywidgets is not installed: `pip install ipywidgets` for the interactive explorer")
if widgets is not None:

    def explore(side=64, i=0, axis="width"):
        """One slot of K3's RoPE on a side × side grid: angle (scaled by its largest) and cos."""
        slot = 2 * i + (0 if axis == "width" else 1)
        display(rope_frequency_maps(side, side, K3_HD, "angle", slots=[slot]))
        display(rope_frequency_maps(side, side, K3_HD, "cos", slots=[slot]))

    widgets.interact(
        explore,
        side=widgets.IntSlider(value=64, min=2, max=512, step=2, description="grid side"),
        i=widgets.IntSlider(value=0, min=0, max=K3_HD // 4 - 1, description="frequency i"),
        axis=widgets.ToggleButtons(options=["width", "height"], description="slot"),
    )

# %% [markdown]
# ## Pictures: why rotate — q·k depends only on the offset
#
# Rotating q at position `a` and k at position `b` by angles linear in position makes
# `rope(q, a) · rope(k, b)` a function of `b − a` only: attention sees *relative* positions, in both
# axes. Four start positions, one curve each — they coincide (`plots.rope_offset_invariance`):

# %%
rope_offset_invariance(32)

# %% [markdown]
# In 2-D: `q·k` after RoPE over every (row, column) offset at once, for one query (q = k) whose width slots
# carry more energy than its height slots. With K3's convention the ridge runs down the Δcol = 0 column:
# this query tells horizontal positions apart sharply. A port that swaps the axes (width slots turning by
# the row) gets the **transposed** map — the model would read rows as columns (`plots.plot_rope_offset_map`).

# %%
plot_rope_offset_map(K3_HD, 32)

# %% [markdown]
# ## Why 2-D, and why interleaved
#
# An LLM's RoPE is 1-D: one position per token. Read the patches in raster order and the patch directly
# **below** sits `w` positions away — as far as a patch `w` columns to the right — while the last patch of a
# row sits next to the first patch of the next one. Below: q·k from the centre patch of a 32×32 grid to every
# patch (q = k, equal energy in every slot; `plots.plot_raster_vs_2d`). Raster order draws a horizontal stripe:
# vertical neighbours look far away. 2D RoPE spends half the slots on the column and half on the row, so a
# step down costs exactly what a step right does. A model trained at one image size also meets others: a
# raster position mixes the row with the width of the image, a (row, column) pair does not.
#
# *Interleaved* says which dims share an angle: K3 pairs neighbours `(2j, 2j+1)` and alternates width and
# height slots, so every frequency band carries both axes. Rotate-half would pair `j` with `j + hd/2`: a
# different rotation of the same numbers. Neither is better in itself; the checkpoint was trained with the
# interleaved one, and a kernel that pairs any other way computes another model (the pitfall below).

# %%
plot_raster_vs_2d(K3_HD, 32)


# %% [markdown]
# ## The two pitfalls, measured
#
# A port that trusts the docstring (width on odd slots, height on even) and one that uses rotate-half,
# both compared with the kernel's output on the same input:


# %%
def rotate_half(x, angles):  # the 1-D LLM convention: pairs (j, j + hd/2) — NOT K3
    half = x.shape[-1] // 2
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


swapped = ang64.copy()
swapped[:, 0::2], swapped[:, 1::2] = ang64[:, 1::2], ang64[:, 0::2]
q64 = x64[:, :Q].reshape(L, heads, hd)
q_kernel = got[:, :Q].reshape(L, heads, hd)
ports = {
    "width/height swapped (the docstring)": reference.apply_rope(q64, swapped),
    "rotate-half pairs": rotate_half(q64, ang64),
    "the reference (interleaved, width even)": reference.apply_rope(q64, ang64),
}
for name, q_port in ports.items():
    print(f"{name:42s} max |kernel − port| / max|q| = {np.abs(q_kernel - q_port).max() / np.abs(q64).max():.2e}")

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

header, rows, note = prediction_rows("03")
display(Markdown(markdown_table(header, rows)))
print(note)

# %% [markdown]
# ## Exercises
#
# ### Your turn: write the kernel
#
# Each cell below is a kernel with a gap between `▼` and `▲`. Fill it and run the cell: `check(name,
# kernel)` launches it (simulator or GPU) on two cases (grids wider and taller, head dims 16 and 24; two
# packings of images and videos), compares it with the NumPy reference and says which tokens and dims are
# wrong, which outputs were never written, NaN, a race, or the known bug it reproduces. As committed the
# gaps are empty (or hold a placeholder) and the checks report failures. A failing check shows a first
# hint; `hint("rope_rotate_pairs")` shows them all, `solution("rope_rotate_pairs")` prints a solution.
#
# **A.** The pair rotation for one head (`head_dim` 16 on a 5×7 grid, then 24 on 6×4): thread `i` owns dims
# `4i … 4i+3`; rotate `(4i, 4i+1)` by `col·f_i` and `(4i+2, 4i+3)` by `row·f_i`,
# `(a, b) → (a·cos − b·sin, a·sin + b·cos)`.

# %%
# YOUR TURN: rope_rotate_pairs — launched by check() as rope_rotate_pairs[L, head_dim/4](x, rows, cols, out, head_dim)
import math

from numba import cuda, float32

from moonvit_kernels.exercises import check, hint, solution

THETA = float32(10000.0)


@cuda.jit
def rope_rotate_pairs(x, rows, cols, out, head_dim):
    l = cuda.blockIdx.x  # one block per token
    i = cuda.threadIdx.x  # one thread per quad (4i, 4i+1, 4i+2, 4i+3)
    freq = float32(1.0) / THETA ** (float32(4 * i) / float32(head_dim))
    # ▼ your code: replace this placeholder copy by the two rotations
    for j in range(4 * i, 4 * i + 4):
        out[l, j] = x[l, j]
    # ▲


result = check("rope_rotate_pairs", rope_rotate_pairs)

# %% [markdown]
# **B.** The position of a token in a packed batch (a 2-frame 3×5 video and a 4×3 image; then three items,
# one a 3-frame video): the token's row and column within its own frame. Write `pos[l, 0] = row`,
# `pos[l, 1] = col`.


# %%
# YOUR TURN: rope_token_position — launched by check() as rope_token_position[⌈L/32⌉, 32](grid_thws, cu_seqlens, n_items, pos, L)
@cuda.jit
def rope_token_position(grid_thws, cu_seqlens, n_items, pos, L):
    l = cuda.grid(1)
    if l >= L:
        return
    # ▼ your code
    pass
    # ▲


result = check("rope_token_position", rope_token_position)

# %% [markdown]
# **C.** Fusion (see notebook 05 for the bytes it saves): the `wqkv` GEMM rotates q and k in its epilogue,
# so `qkv` is written once, already rotated, and the RoPE kernel's read-and-rewrite of `[L, 2Q]` disappears.
# Each thread computes the *pair* of output columns `2p, 2p + 1` (a rotation needs both); for q and k
# columns it rotates them before the store, v columns are stored as they are. Two cases: 2 heads of
# `head_dim = 8` on a 3×5 grid, 3 heads of 12 on 4×3. The placeholder stores the pair unrotated.


# %%
# YOUR TURN: rope_qkv_epilogue — launched by check() as rope_qkv_epilogue[(⌈3Q/32⌉, ⌈L/16⌉), (16, 16)](x, W, rows, cols, qkv, L, Din, heads, head_dim)
@cuda.jit
def rope_qkv_epilogue(x, W, rows, cols, qkv, L, Din, heads, head_dim):
    p = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x  # output columns 2p and 2p + 1
    m = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y  # token
    Q = heads * head_dim
    if m < L and 2 * p < 3 * Q:
        c = 2 * p
        c0 = float32(0.0)
        c1 = float32(0.0)
        for k in range(Din):
            c0 += x[m, k] * W[c, k]
            c1 += x[m, k] * W[c + 1, k]
        # ▼ your code: rotate (c0, c1) when they are q or k
        pass
        # ▲
        qkv[m, c] = c0
        qkv[m, c + 1] = c1


result = check("rope_qkv_epilogue", rope_qkv_epilogue)

# %% [markdown]
# ### Worked exercises
#
# Each cell below holds a worked answer; replace it with your own and rerun — the `assert` checks it.
#
# **1.** With `hd = 24`, what angle does complex slot `j = 5` get for the token at row 3, column 7?

# %%
i = 5 // 2  # slot 5 is odd: height, frequency index 2
angle_answer = 3 * 10000.0 ** (-4 * i / 24)  # worked answer: row · f_i

table = reference.rope_angles(8, 10, 24, dtype=np.float64)
assert np.isclose(angle_answer, table[3 * 10 + 7, 5])
print(f"{angle_answer:.6f} rad")

# %% [markdown]
# **2.** Which two real dims does the *height* rotation of frequency `i = 4` touch?

# %%
dims_answer = (4 * 4 + 2, 4 * 4 + 3)  # worked answer

assert dims_answer == next(p.dims for p in rope_pairs(24) if p.axis == "height" and p.freq_index == 4)
print(dims_answer)

# %% [markdown]
# **3.** A library only offers rotate-half RoPE. Find a permutation of the head dims such that
# `rotate_half(x[..., perm], angles)` equals K3's `apply_rope(x, angles)[..., perm]` — the trick used to
# convert weights between the two conventions.

# %%
perm = np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])  # worked answer: evens, then odds

x = rng.standard_normal((L, heads, hd))
np.testing.assert_allclose(rotate_half(x[..., perm], ang64), reference.apply_rope(x, ang64)[..., perm], atol=1e-12)
print("perm =", perm.tolist())
