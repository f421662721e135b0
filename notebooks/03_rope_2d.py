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
    plot_rope_pairing,
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
# ## The kernel: `moonvit_kernels/kernels/rope.py`
#
# It rotates q and k **in place** inside the packed `qkv [L, 3·Q]` buffer that the `wqkv` GEMM wrote
# (column `s·Q + head·hd + d`, s = q, k, v), so no copy of q and k is made. One block per token: the
# block finds the token's media item from `cu_seqlens`, its row and column within its frame, then each
# thread rotates one `(s, head, i)` quad — the width pair and the height pair:

# %%
print(inspect.getsource(rope_module.rope2d_kernel.py_func))

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
error_heatmap(got[:, : 2 * Q], want[:, : 2 * Q], title="rope2d kernel, q | k columns")

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
# ## Pictures: RoPE frequency maps
#
# For each complex slot, `cos(angle)` over the patch grid (`plots.rope_frequency_maps`): width slots vary
# along columns only, height slots along rows only; low `i` turn fast (fine position), high `i` barely
# turn (coarse position). Here `hd = 32` on a 12×16 grid (16 slots):

# %%
rope_frequency_maps(12, 16, 32)

# %% [markdown]
# ## Pictures: why rotate — q·k depends only on the offset
#
# Rotating q at position `a` and k at position `b` by angles linear in position makes
# `rope(q, a) · rope(k, b)` a function of `b − a` only: attention sees *relative* positions, in both
# axes. Four start positions, one curve each — they coincide (`plots.rope_offset_invariance`):

# %%
rope_offset_invariance(32)


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
# ## Exercises
#
# ### Your turn: write the kernel
#
# Each cell below is a kernel with a gap between `▼` and `▲`. Fill it and run the cell: `check(name,
# kernel)` launches it (simulator or GPU), compares it with the NumPy reference and says which tokens and
# dims are wrong, which outputs were never written, NaN, or a race. As committed the gaps are empty (or
# hold a placeholder) and the checks report failures. `solution("rope_rotate_pairs")` prints a solution.
#
# **A.** The pair rotation for one head of `head_dim = 16` on a 5×7 grid: thread `i` owns dims
# `4i … 4i+3`; rotate `(4i, 4i+1)` by `col·f_i` and `(4i+2, 4i+3)` by `row·f_i`,
# `(a, b) → (a·cos − b·sin, a·sin + b·cos)`.

# %%
# YOUR TURN: rope_rotate_pairs — launched by check() as rope_rotate_pairs[L, head_dim/4](x, rows, cols, out, head_dim)
import math

from numba import cuda, float32

from moonvit_kernels.exercises import check, solution

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
# **B.** The position of a token in a packed batch (a 2-frame 3×5 video, then a 4×3 image): find the
# token's item from `cu_seqlens`, then its row and column within its frame — every frame of a video
# restarts at `(0, 0)`. Write `pos[l, 0] = row`, `pos[l, 1] = col`.


# %%
# YOUR TURN: rope_token_position — launched by check() as rope_token_position[⌈L/32⌉, 32](grid_thws, cu_seqlens, n_items, pos, L)
@cuda.jit
def rope_token_position(grid_thws, cu_seqlens, n_items, pos, L):
    l = cuda.grid(1)
    if l >= L:
        return
    # ▼ your code: the item n with cu_seqlens[n] <= l < cu_seqlens[n + 1], then row and col in its frame
    pass
    # ▲


result = check("rope_token_position", rope_token_position)

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
