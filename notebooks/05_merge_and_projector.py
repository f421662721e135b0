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
# # 05 — The patch merge and the projector
#
# **What the source does.** After the final norm, `tpool_patch_merger` (docs/model.md, stage 6) turns every
# `kh × kw` (2×2 in K3) block of neighbouring patches into one token, and averages over the frames of a
# video. For an item `(t, h, w)`: view the tokens as `[t, h/kh, kh, w/kw, kw, D]`, permute to
# `[t, h/kh, w/kw, kh, kw, D]`, mean over `t` → `[(h/kh)·(w/kw), kh·kw, D]`. So merged token
# `m = i·(w/kw) + j` holds, in slot `a·kw + b`, source patch `(kh·i + a)·w + (kw·j + b)`.
#
# The projector `PatchMergerMLPV2` (stage 7) flattens each merged token slot-major to `kh·kw·D`, then:
# `Linear(kh·kw·D → kh·kw·D) → GELU (exact erf) → Linear(→ T) → rmsnorm(eps = projector_ln_eps)`.
# No biases, no pre-norm. The output rows are the image tokens the language model reads.
#
# **Pitfalls other ports hit:** wrong merge order (slot order, or rows and columns swapped); the tanh
# GELU of the encoder used here (the projector's is the exact erf one); the encoder's eps in the final
# norm. The kernels are one gather (`numba_backend/merge.py`) and, for the projector, the GEMM and RMSNorm
# kernels of notebooks 01 and 02 — the erf GELU is a GEMM epilogue.

# %%
# Without a GPU, numba.cuda runs on its CPU simulator; the switch must be set before numba is imported.
# Figures (matplotlib Figure objects returned by moonvit_kernels.plots) are drawn inline.
# %matplotlib inline
from moonvit_kernels.device import gpu_available, simulator_enabled, use_simulator_without_gpu, where

use_simulator_without_gpu()

import inspect

import numpy as np
from IPython.display import Markdown, display
from matplotlib.figure import Figure
from numba import cuda

from moonvit_kernels import reference
from moonvit_kernels.bundled import DATA_DIR as DATA  # the bundled files, from any working directory
from moonvit_kernels.config import FP32_EPS, VisionConfig
from moonvit_kernels.numba_backend import merge as merge_module
from moonvit_kernels.numba_backend.gemm import gemm
from moonvit_kernels.numba_backend.launch import item_table
from moonvit_kernels.numba_backend.merge import merge_gather
from moonvit_kernels.numba_backend.rmsnorm import rmsnorm
from moonvit_kernels.plots import (
    error_heatmap,
    flop_table,
    markdown_table,
    merge_index_map,
    merge_index_table,
    merged_to_grid,
)
from moonvit_kernels.weights import load_checkpoint, random_weights

rng = np.random.default_rng(0)
on_gpu = gpu_available() and not simulator_enabled()

print(f"kernels run on: {where()}")

# %% [markdown]
# ## Which source patch lands in which merged slot
#
# `plots.merge_index_map` runs the reference merge on the patch numbers themselves and shows, for every
# patch of a 6×8 grid, the merged token it joins (left) and its slot inside it (right): 2×2 squares,
# numbered row by row; inside each, slots 0 1 / 2 3.

# %%
merge_index_map(6, 8)

# %% [markdown]
# ## Why merge: four times fewer tokens for the language model
#
# The encoder works on 14×14-pixel patches; the language model reads the merged tokens. Every LM layer's work
# and its KV cache grow with the number of tokens, and its attention with their square, so a 2×2 merge cuts the
# image's share of the LM's linear work and KV cache by 4 and its attention by 16 — after the encoder has had its
# full resolution. At K3 sizes (`preprocess.resize_plan`, the processor's shrink-and-pad):

# %%
from moonvit_kernels.preprocess import resize_plan

rows = []
for w_px, h_px in [(448, 448), (896, 896), (1344, 896), (1920, 1080), (4000, 3000)]:
    plan = resize_plan(w_px, h_px)
    patches = plan.grid_hw[0] * plan.grid_hw[1]
    rows.append([f"{w_px}×{h_px}", f"{plan.grid_hw[0]}×{plan.grid_hw[1]}", f"{patches:,}", f"{plan.num_tokens:,}",
                 f"{patches**2 / plan.num_tokens**2:.0f}×"])  # fmt: skip
display(Markdown(markdown_table(["image", "patch grid", "encoder tokens", "LM tokens", "LM attention saved"], rows)))

# %% [markdown]
# ## Sizes
#
# On a GPU: K3 (`D = 1024`, `T = 7168`) with random weights, an 896×896 image packed with a 4-frame
# 448×448 video. On the simulator: the bundled tiny checkpoint (`D = 32`, `T = 40`) and its inputs, a
# 6×8 image and a 2-frame 4×4 video.

# %%
if on_gpu:
    config = VisionConfig.k3()
    weights = random_weights(config.replace(vt_num_hidden_layers=0), seed=0)  # the projector is what we need
    grid_thws = np.array([[1, 64, 64], [4, 32, 32]])
    L = int(np.prod(grid_thws, axis=1).sum())
    x = rng.standard_normal((L, config.vt_hidden_size)).astype(np.float32)  # stands in for final_norm
else:
    config, weights = load_checkpoint(DATA / "tiny")
    inputs = np.load(DATA / "tiny" / "inputs.npz")
    grid_thws = inputs["grid_thws"]
    _, stages = reference.vision_forward(inputs["pixel_values"], grid_thws, weights, config, return_intermediates=True)
    x = stages["final_norm"]
L, D = x.shape
kh, kw = config.merge_kernel_size
M = int(sum((h // kh) * (w // kw) for _, h, w in grid_thws.tolist()))
print(f"{where()}: x [{L}, {D}], items {grid_thws.tolist()}")
print(f"merged [{M}, {kh * kw * D}] -> projected [{M}, {config.text_hidden_size}]")

# %% [markdown]
# ## The NumPy reference

# %%
print(inspect.getsource(reference.tpool_patch_merger))
print(inspect.getsource(reference.projector))

# %% [markdown]
# ## The merge kernel: `moonvit_kernels/numba_backend/merge.py`
#
# One block per merged token. The block finds its media item in a small int32 table
# (`launch.item_table`: `t, h, w`, first token, first merged token per item), and each thread owns
# output columns `slot·D + d`: it sums the `t` frames of the source patch and divides by `t`. The output
# is already the row-major `[M, kh·kw·D]` input of the projector's first GEMM — no reshape, no copy.

# %%
items = item_table(grid_thws, (kh, kw))
print("item table (t, h, w, token_offset, merged_offset):", items.tolist())
print(inspect.getsource(merge_module.merge_gather_kernel.py_func))

# %% [markdown]
# ## Check the merge against NumPy
#
# A gather and a mean of at most 4 values: the result must match the float64 reference to a few fp32
# roundings. Random data first (awkward width `D = 5`, an image, a 3-frame video and a tall item), then
# the model's own `final_norm` tokens.

# %%
awkward_grid = np.array([[1, 4, 6], [3, 2, 4], [1, 6, 2]])
xr = rng.standard_normal((int(np.prod(awkward_grid, axis=1).sum()), 5)).astype(np.float32)
for name, (xs, grid) in {"random, D = 5": (xr, awkward_grid), "final_norm tokens": (x, grid_thws)}.items():
    got = merge_gather(xs, item_table(grid, (kh, kw)), (kh, kw)).copy_to_host()
    want = np.concatenate(
        [m.reshape(m.shape[0], -1) for m in reference.tpool_patch_merger(xs.astype(np.float64), grid, (kh, kw))]
    )
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    print(f"{name:18s} merged {got.shape}: max error {np.abs(got - want).max():.1e}")
merged = got

# %% [markdown]
# ### The CUDA C merge (`cuda_backend/merge.cu`)
#
# The same gather, with the per-token search replaced by a precomputed table: `merge_src [M, 4]` =
# `(base, t, frame_stride, w)`, where `base` is the source token of slot `(0, 0)` in frame 0. A thread's
# source token is then `base + f·frame_stride + a·w + b` — no division by the item's geometry at run
# time. Run on the CPU emulator against the same reference:

# %%
from moonvit_kernels.cuda_backend import launchers
from moonvit_kernels.cuda_backend.sources import KERNEL_DIR
from moonvit_kernels.tools import emulation

print((KERNEL_DIR / "merge.cu").read_text(encoding="utf-8"))
if emulation.compiler() is None:
    print("no C++ compiler (g++ >= 11) here: the CUDA C emulator cannot run")
else:
    src_table = launchers.merge_sources(awkward_grid, (kh, kw))
    print("merge_src rows (base, t, frame_stride, w) of the first 3 merged tokens:", src_table[:3].tolist())
    got_c = emulation.run(launchers.tpool_merge, xr, src_table, (kh, kw))
    want_c = np.concatenate(
        [m.reshape(m.shape[0], -1) for m in reference.tpool_patch_merger(xr.astype(np.float64), awkward_grid, (kh, kw))]
    )
    np.testing.assert_allclose(got_c, want_c, rtol=1e-6, atol=1e-6)
    print(f"CPU emulator of merge.cu, random D = 5: max error {np.abs(got_c - want_c).max():.1e}")

# %% [markdown]
# ## Pictures: the temporal mean and the slot order
#
# Feed the kernel "tokens" we can look at: each patch's mean colour (`D = 3`). Laying the merged tokens
# back on the grid (`plots.merged_to_grid`) must give the image back, and for the video the mean of
# its frames. A port with rows and columns swapped inside the merged token (slot `b·kh + a` instead of
# `a·kw + b`) scrambles each 2×2 block:

# %%
pv = np.load(DATA / "tiny" / "inputs.npz")["pixel_values"]
tiny_grid = np.array([[1, 6, 8], [2, 4, 4]])
colours = np.ascontiguousarray(pv.mean(axis=(2, 3)) * 0.5 + 0.5, dtype=np.float32)  # [L, 3] in [0, 1]
merged_colours = merge_gather(colours, item_table(tiny_grid, (2, 2)), (2, 2)).copy_to_host()

fig = Figure(figsize=(11, 4.6), layout="constrained")
axes = fig.subplots(2, 4)
start, m0 = 0, 0
for row, (t, h, w) in enumerate(tiny_grid.tolist()):
    frames = colours[start : start + t * h * w].reshape(t, h, w, 3)
    m = merged_colours[m0 : m0 + (h // 2) * (w // 2)]
    good = merged_to_grid(m, h, w)
    swapped = m.reshape(-1, 2, 2, 3).transpose(0, 2, 1, 3).reshape(m.shape)  # slot b·kh + a
    assert np.allclose(good, frames.mean(axis=0), atol=1e-6)
    panels = [(f"frame {f}", frames[f]) for f in range(t)] + [("", None)] * (2 - t)
    panels += [("merged (mean over frames)", good), ("slots transposed: wrong", merged_to_grid(swapped, h, w))]
    for ax, (title, img) in zip(axes[row], panels, strict=True):
        ax.set_axis_off()
        if img is not None:
            ax.imshow(np.clip(img, 0, 1), interpolation="nearest")
            ax.set_title(f"item {row}: {title}", fontsize=8)
    start, m0 = start + t * h * w, m0 + len(m)
fig

# %% [markdown]
# ## The projector from kernels
#
# `merged @ proj.0ᵀ` with the erf-GELU epilogue, `@ proj.2ᵀ`, then RMSNorm with `projector_ln_eps` — three
# launches, checked step by step against the reference in float64.

# %%
merged_d = cuda.to_device(np.ascontiguousarray(merged, dtype=np.float32))
w0, w2 = weights["mm_projector.proj.0.weight"], weights["mm_projector.proj.2.weight"]
post = weights["mm_projector.post_norm.weight"]
h_d = gemm(merged_d, w0, epilogue="gelu_erf")
y_d = gemm(h_d, w2)
out = rmsnorm(y_d, post, config.projector_ln_eps).copy_to_host()

m64 = merged.astype(np.float64)
h64 = reference.gelu_erf(m64 @ w0.astype(np.float64).T)
y64 = h64 @ w2.astype(np.float64).T
want = reference.projector(m64, {k: v.astype(np.float64) for k, v in weights.items()}, config)
rows = []
for name, got_d, ref in (("proj.0 + GELU(erf)", h_d, h64), ("proj.2", y_d, y64), ("post_norm", out, want)):
    got = got_d if isinstance(got_d, np.ndarray) else got_d.copy_to_host()
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    assert np.all(np.isfinite(got)) and rel < 8 * FP32_EPS * np.sqrt(w0.shape[1]), (name, rel)
    rows.append([name, str(got.shape), rel])
display(Markdown(markdown_table(["step", "shape", "max rel. error vs float64"], rows)))

# %%
error_heatmap(out, want, title="projector output (kernels) vs float64 reference")


# %% [markdown]
# ## Fusion: bytes that never touch memory
#
# Each kernel boundary is a round trip through DRAM: the producer writes its output, the consumer reads it
# back. Two such round trips in this model can be removed by *fusing* the cheap step into its neighbour:
#
# - **merge → projector GEMM**: instead of writing `merged [M, 4D]` and reading it as the GEMM's A operand,
#   the GEMM's A-tile load gathers straight from `x [L, D]` through the merge index (you write that kernel
#   in exercise B below; the tiled version does the same inside its A-tile load). Saves one write and one
#   read of `merged`.
# - **RoPE → QKV GEMM epilogue**: the `wqkv` GEMM writes `qkv [L, 3Q]`, then RoPE reads and rewrites the q
#   and k thirds in place. Rotating in the GEMM's epilogue (a thread that owns output columns `2p, 2p + 1`
#   of q or k rotates the pair before storing it) saves one read and one write of `[L, 2Q]`, per layer.
#
# Bytes saved for K3 on one 896×896 image (fp32 activations; the bf16 backend halves every number):

# %%
k3 = VisionConfig.k3()
L3, M3 = 64 * 64, 32 * 32
D3, Q3, n3 = k3.vt_hidden_size, k3.qkv_hidden_size, k3.vt_num_hidden_layers
saved = {
    "merge gather fused into the projector's A load": 2 * M3 * 4 * D3 * 4,
    "RoPE fused into the wqkv epilogue (27 layers)": n3 * 2 * L3 * 2 * Q3 * 4,
}
rows = [[name, f"{b / 2**20:,.1f} MiB", f"{b / 4.8e12 * 1e6:,.1f} µs"] for name, b in saved.items()]
display(Markdown(markdown_table(["fusion", "DRAM traffic saved", "at 4.8 TB/s (H200 datasheet)"], rows)))
print("(one kernel launch saved per fusion too, ~2-5 µs each; datasheet bandwidth, not measured here)")

# %% [markdown]
# ## The pitfalls, measured
#
# Each line is a plausible port with one mistake, compared with the reference projector output:


# %%
def projector_port(merged, gelu, eps):
    y = gelu(merged @ w0.astype(np.float64).T) @ w2.astype(np.float64).T
    return reference.rmsnorm(y, post.astype(np.float64), eps)


def swap_slots(a):  # rows and columns swapped inside each merged token
    return a.reshape(a.shape[0], kh, kw, -1).transpose(0, 2, 1, 3).reshape(a.shape)


ports = {
    "tanh GELU (the encoder's) in the projector": projector_port(m64, reference.gelu_tanh, config.projector_ln_eps),
    "encoder eps in the post norm": projector_port(m64, reference.gelu_erf, config.vit_norm_eps),
    "merge slots transposed": projector_port(swap_slots(m64), reference.gelu_erf, config.projector_ln_eps),
}
for name, y in ports.items():
    print(f"{name:44s} max rel. difference {np.abs(y - want).max() / np.abs(want).max():.1e}")

# %% [markdown]
# The eps difference is small at these activation sizes (the projector's rows have RMS ≫ √eps) —
# a reminder that a test passing on one input proves little: the RMSNorm notebook shows where it bites.

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

header, rows, note = prediction_rows("05")
display(Markdown(markdown_table(header, rows)))
print(note)

# %% [markdown]
# ## Exercises
#
# ### Your turn: write the kernel
#
# Two kernels with a gap between `▼` and `▲`. K3 merges 2×2, but the kernels take any `kh × kw`: the cases
# are a 2-frame video of 6×4 patches (`D = 5`, merge 2×2), then a **3-frame** video of 4×6 patches merged
# **2×3** — so a slip between `kh`, `kw` and `t` that the K3 image case hides shows. `check(name, kernel)`
# runs your kernel (simulator or GPU) against `reference.tpool_patch_merger` and says which merged tokens
# and columns are wrong, never written, out of bounds, racy, or which known bug it reproduces. As committed
# the checks report failures. A failing check shows a first hint; `hint("merge_index")` shows them all,
# `solution("merge_index")` prints a solution.
#
# **A.** The merge index: merged token `m` covers a `kh × kw` block of patches of every frame, its slots
# numbered row-major inside the block, and holds their mean over the frames. The placeholder treats each
# block as `kh·kw` consecutive tokens — the classic misreading of the layout.

# %%
# YOUR TURN: merge_index — launched by check() as merge_index[M, 32](x, out, t, h, w, D, kh, kw)
from numba import float32

from moonvit_kernels.exercises import check, hint, solution


@cuda.jit
def merge_index(x, out, t, h, w, D, kh, kw):
    m = cuda.blockIdx.x  # one block per merged token
    for col in range(cuda.threadIdx.x, kh * kw * D, cuda.blockDim.x):
        slot = col // D
        d = col % D
        # ▼ your code: the patch (row-major index within one frame) that slot `slot` of token m reads
        patch = m * kh * kw + slot  # placeholder: wrong
        # ▲
        acc = float32(0.0)
        for f in range(t):
            acc += x[f * h * w + patch, d]
        out[m, col] = acc / float32(t)


result = check("merge_index", merge_index)

# %% [markdown]
# **B.** Fusion: the projector's first GEMM `C = merged · Bᵀ` reading `merged[m, k]` straight from `x`
# through the merge index, so the `[M, kh·kw·D]` merged buffer is never written and read back (it saves
# `2 · M · 4D · 4` bytes of traffic per call at K3's 2×2). The placeholder reads `x[m, k]` as if `x` were
# already merged.


# %%
# YOUR TURN: fused_gather_gemm — launched by check() as fused_gather_gemm[(⌈N/16⌉, ⌈M/16⌉), (16, 16)](x, B, C, t, h, w, D, N, kh, kw)
@cuda.jit
def fused_gather_gemm(x, B, C, t, h, w, D, N, kh, kw):
    n = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    m = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    M = (h // kh) * (w // kw)
    if m < M and n < N:
        acc = float32(0.0)
        for k in range(kh * kw * D):
            # ▼ your code: a = merged[m, k]
            a = x[m, k]  # placeholder: wrong
            # ▲
            acc += a * B[n, k]
        C[m, n] = acc


result = check("fused_gather_gemm", fused_gather_gemm)

# %% [markdown]
# ### Worked exercises
#
# Each cell below holds a worked answer; replace it with your own and rerun — the `assert` checks it.
#
# **1.** On a 6×8 patch grid, which source patch (row-major index) sits in merged token 5, slot 3?

# %%
i, j = divmod(5, 8 // 2)  # merged token 5 = (i, j) on the 3×4 merged grid
a, b = divmod(3, 2)  # slot 3 = (a, b) inside the 2×2 block
patch_answer = (2 * i + a) * 8 + (2 * j + b)  # worked answer

merged_of, slot_of = merge_index_table(6, 8)
assert (merged_of.ravel()[patch_answer], slot_of.ravel()[patch_answer]) == (5, 3)
print("patch", patch_answer)

# %% [markdown]
# **2.** The projector's FLOPs per merged token, in terms of `K = kh·kw·D` and `T` (K3 numbers).

# %%
k3 = VisionConfig.k3()
K, T = k3.merged_hidden_size, k3.text_hidden_size
per_token_answer = 2 * K * K + 2 * K * T  # worked answer

assert per_token_answer == flop_table(k3, [[1, 2, 2]])[3].count  # a 2×2 grid has one merged token
print(f"{per_token_answer / 1e6:.1f} MFLOP per output token")

# %% [markdown]
# **3.** A 4-frame video whose frames are all the same: is its merged output that of the single frame?
# Run the kernel on both and compare.

# %%
frame = rng.standard_normal((4 * 6, 7)).astype(np.float32)
video = np.ascontiguousarray(np.tile(frame, (4, 1)))
as_video = merge_gather(video, item_table([[4, 4, 6]], (2, 2)), (2, 2)).copy_to_host()
as_image = merge_gather(frame, item_table([[1, 4, 6]], (2, 2)), (2, 2)).copy_to_host()
same_answer = True  # worked answer: the mean of equal frames is the frame

assert same_answer == bool(np.allclose(as_video, as_image, rtol=1e-6, atol=1e-6))
print("identical frames merge like one image:", same_answer)
