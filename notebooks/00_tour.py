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
# # 00 — A tour of MoonViT-V2, the vision tower of Kimi K3
#
# Kimi K3 reads images and videos with **MoonViT-V2**: a 27-layer vision transformer plus a small
# projector that turns image patches into tokens of the language model's width (7168). This
# workbook rebuilds it stage by stage — first in NumPy (`moonvit_kernels.reference`, the oracle),
# then as `numba.cuda` kernels that are checked against that oracle.
#
# | notebook | stage |
# |---|---|
# | 00_tour | the whole model: config, parameters, shapes, a real run |
# | 00a_warmups | your first kernels: map, guard, 2-D blocks, shared memory, reduction, scan, a fast transpose |
# | 01_patch_embed_gemm | patch embedding = one GEMM; the GEMM ladder (naive → shared tiles → register blocking), the CUDA C fp32 GEMM |
# | 02_rmsnorm | the row reduction, and why `eps` matters |
# | 03_rope_2d | 2D rotary position embedding (interleaved pairs) |
# | 04_attention | packed attention, naive and tiled (online softmax, the flash loop); tensor cores (`mma.sync`) |
# | 05_merge_and_projector | the 2×2 patch merge and the MLP projector |
# | 06_full_encoder | everything together, compared stage by stage |
# | 07_performance_without_a_gpu | the X-ray: registers, occupancy, SASS, coalescing and bank conflicts, rooflines |
# | 08_hopper | the sm_90 kernels: TMA, wgmma, the 128-byte swizzle, warp specialisation |
#
# **You write the kernels.** New to CUDA? Start with the warm-ups of 00a. Every stage notebook (01–06, and
# 08) ends with *your turn* cells: a kernel — `@cuda.jit`, or for two of them CUDA C source run on the
# CPU emulator — with its signature and launch written and a marked gap to fill. `check(name, kernel)`
# (from `moonvit_kernels.exercises`) runs it on two or three cases against the NumPy reference and says in
# words what is wrong — which case, which rows or columns differ, NaN, never written, out of bounds, a
# race, the known bug it reproduces, or (where the exercise teaches speed) which access is uncoalesced or
# bank-conflicted; `hint(name)` gives hints from a nudge to the algorithm, `solution(name)` prints a
# solution (kept in `moonvit_kernels/exercises/solutions/`). The list is printed at the end of this notebook.
#
# **No GPU needed.** On a laptop the kernels run on numba's CUDA *simulator* (one Python thread per
# CUDA thread: correct but slow), so the notebooks pick tiny sizes there and real ones on a GPU.
# The first cell of every notebook decides which. The model's definition is
# [docs/model.md](../docs/model.md); each notebook quotes the part it needs. Every notebook finds the
# bundled data through the package, so it runs from any working directory.

# %%
# Without a GPU, numba.cuda runs on its CPU simulator; the switch must be set before numba is imported.
# Figures (matplotlib Figure objects returned by moonvit_kernels.plots) are drawn inline.
# %matplotlib inline
from moonvit_kernels.device import gpu_available, simulator_enabled, use_simulator_without_gpu, where

use_simulator_without_gpu()

import numpy as np
from IPython.display import Markdown, display

from moonvit_kernels import reference
from moonvit_kernels.bundled import DATA_DIR as DATA  # the bundled files, from any working directory
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.plots import flop_table, markdown_table, parameter_table, plot_architecture, stage_shapes
from moonvit_kernels.preprocess import unpatchify
from moonvit_kernels.weights import expected_shapes, load_checkpoint, parameter_count

print(f"kernels run on: {where()}")

# %% [markdown]
# ## The configuration
#
# The model is described by the `vision_config` block of the checkpoint's `config.json`.
# `VisionConfig` uses exactly those keys; `VisionConfig.k3()` is the released model.
# Notation used everywhere: `D` hidden width, `Q` width of q/k/v (not equal to `D` in K3!),
# `H` heads, `hd = Q / H`, `p` patch side, `I` MLP width, `T` the language model's width.

# %%
k3 = VisionConfig.k3()
names = {
    "patch_size": "p",
    "vt_hidden_size": "D",
    "qkv_hidden_size": "Q",
    "vt_num_attention_heads": "H",
    "vt_intermediate_size": "I",
    "vt_num_hidden_layers": "layers",
    "merge_kernel_size": "(kh, kw)",
    "text_hidden_size": "T",
    "init_pos_emb_height": "H0",
    "init_pos_emb_width": "W0",
    "init_pos_emb_time": "max frames",
    "vit_norm_eps": "eps",
    "projector_ln_eps": "projector eps",
}
rows = [[key, symbol, getattr(k3, key)] for key, symbol in names.items()]
rows += [["(derived) head_dim", "hd", k3.head_dim], ["(derived) 3·p·p", "patch_dim", k3.patch_dim]]
display(Markdown(markdown_table(["config key", "symbol", "K3 value"], rows)))

# %% [markdown]
# ## Where the parameters are
#
# Every tensor of the checkpoint, with its shape, comes from `weights.expected_shapes(config)`
# (the table of docs/model.md). Summed by component:

# %%
rows = parameter_table(k3)
total = parameter_count(k3)["total"]
display(
    Markdown(
        markdown_table(
            ["component", "parameters", "share", "tensors"],
            [[r.component, r.count, f"{r.count / total:.1%}", r.detail] for r in rows],
        )
    )
)
assert sum(r.count for r in rows) == total == 447_358_976  # docs/model.md: 401,214,464 + 46,144,512
print(f"{len(expected_shapes(k3))} tensors, {total:,} parameters = {total * 2 / 2**20:.0f} MiB in bfloat16")

# %% [markdown]
# ## The architecture, with shapes
#
# One 896×896 image is a 64×64 grid of 14×14 patches: `L = 4096` tokens. The picture below is drawn
# from the config (`plots.plot_architecture`), so it shows the shapes the code produces. Each encoder
# block is pre-norm with two skip branches: `x = x + wo(attention(rope(wqkv(norm0(x)))))`, then
# `x = x + fc1(gelu_tanh(fc0(norm1(x))))`; the block is drawn once and repeated 27 times.
# Note `qkv` is `[L, 3·Q]` with `Q = 1536 ≠ D = 1024`, so the attention output projection `wo`
# is `[D, Q]` — not square. The 2×2 merge turns 4096 patch tokens into 1024 tokens of width `4·D`.

# %%
plot_architecture(k3, [[1, 64, 64]])

# %% [markdown]
# ## What it costs
#
# docs/model.md gives the FLOPs: per layer `2·L·D·(3Q + Q + 2I)` for the GEMMs and `4·L²·Q` per media item
# for attention. At 64×64 patches attention is already almost half the work, and it grows with `L²`.

# %% [markdown]
# **Which peak?** Two datasheet ceilings matter, and they differ a lot (NVIDIA's H200 datasheet; no GPU
# number is measured here):
#
# | ceiling | TFLOP/s | what it is |
# |---|---|---|
# | dense bf16 tensor cores, datasheet | ≈ 989 | the marketing peak (the 1,979 figure assumes 2:4 sparsity) |
# | fp32 on the CUDA cores (SIMT), datasheet | ≈ 67 | the ceiling of every **fp32 kernel taught in 01–05** |
#
# What a tuned library really reaches is below the datasheet and is a measurement, not a quote:
# `gpu_check` times cuBLAS (bf16, 8192³) on the GPU it runs on, in the same run as the kernels, and its
# reports live under `benchmarks/results/` (none from a real GPU yet). The numba kernels of this workbook
# compute in fp32 on the CUDA cores, so ≈ 67 TFLOP/s is their ceiling — 15× below the bf16 tensor cores;
# only the CUDA C bf16 GEMMs (`mma.sync`, `wgmma`) can approach the first row. The time floors below
# divide the FLOPs by each ceiling (model, no GPU).

# %%
PEAKS = {  # FLOP/s, NVIDIA H200 SXM datasheet (model, no GPU)
    "bf16 datasheet": 989e12,
    "fp32 SIMT datasheet": 67e12,
}
for side in (32, 64, 128):
    rows = flop_table(k3, [[1, side, side]])
    total = sum(r.count for r in rows)
    floors = ", ".join(f"{name} {total / peak * 1e3:6.2f} ms" for name, peak in PEAKS.items())
    print(
        f"{side * 14}×{side * 14} image, L = {side * side:5d}: {total / 1e12:6.2f} TFLOP, "
        f"attention {rows[2].count / total:5.1%}; time floor at {floors}"
    )
rows = flop_table(k3, [[1, 64, 64]])
table = [[r.component, r.count, r.detail] for r in rows]
display(Markdown(markdown_table(["stage", "FLOP", "formula"], table)))

# %% [markdown]
# ## A real run: the bundled tiny checkpoint
#
# `data/tiny/` holds a checkpoint in the real K3 tensor names (stored in bfloat16, like the real one)
# for a *tiny* config with every structural feature of K3: `Q ≠ D`, a head width that is a multiple
# of 4 but not a power of two, a position grid that needs interpolation. Its inputs pack **two media
# items into one sequence**: a 6×8-patch image and a 2-frame 4×4-patch video. `grid_thws` lists
# `(t, h, w)` per item.

# %%
config, weights = load_checkpoint(DATA / "tiny")
inputs = np.load(DATA / "tiny" / "inputs.npz")
pixel_values, grid_thws = inputs["pixel_values"], inputs["grid_thws"]
print("differs from K3 in:", {k: v for k, v in config.to_dict().items() if v != k3.to_dict()[k]})
print("pixel_values", pixel_values.shape, pixel_values.dtype, " grid_thws", grid_thws.tolist())

# %% [markdown]
# `pixel_values` are patches already cut out of the media, in the order frame → patch row → patch
# column. `preprocess.unpatchify` puts them back together, so we can look at what the model sees:

# %%
from matplotlib.figure import Figure

frames = []
bounds = reference.cu_seqlens(grid_thws)
for i, (t, h, w) in enumerate(grid_thws.tolist()):
    item = unpatchify(pixel_values[bounds[i] : bounds[i + 1]], (t, h, w))
    frames += [(f"item {i}, frame {f}, grid {h}×{w}", item[f]) for f in range(t)]
fig = Figure(figsize=(9, 2.6), layout="constrained")
for ax, (title, img) in zip(fig.subplots(1, len(frames)), frames, strict=True):
    ax.imshow(np.clip(img * 0.5 + 0.5, 0, 1))  # pixels are normalised to [-1, 1]
    ax.set_title(title, fontsize=8)
    ax.set_xticks(np.arange(0, img.shape[1], config.patch_size) - 0.5, [])
    ax.set_yticks(np.arange(0, img.shape[0], config.patch_size) - 0.5, [])
    ax.grid(color="w", lw=0.5)
fig

# %% [markdown]
# Now the whole tower. `reference.vision_forward(..., return_intermediates=True)` also returns every
# stage's output — the same names the kernel notebooks and `compare` use. The shapes are checked
# against the architecture picture's (`stage_shapes`) for this config and grid.

# %%
outputs, stages = reference.vision_forward(pixel_values, grid_thws, weights, config, return_intermediates=True)
expected = {s.name: s.shape for s in stage_shapes(config, grid_thws)}
rows = []
for name, value in stages.items():
    key = "layer_i" if name.startswith("layer_") else name
    assert value.shape == expected[key], (name, value.shape, expected[key])
    rows.append([name, str(value.shape), float(np.sqrt(np.mean(value**2))), bool(np.all(np.isfinite(value)))])
display(Markdown(markdown_table(["stage", "shape", "RMS", "finite"], rows)))
print("outputs per media item:", [o.shape for o in outputs])

# %%
plot_architecture(config, grid_thws)

# %% [markdown]
# ## The kernels you will write
#
# The *your turn* exercises of notebooks 00a–08, in order:

# %%
from moonvit_kernels.exercises import catalogue

display(Markdown(catalogue()))

# %% [markdown]
# ## Exercises
#
# Each exercise cell holds a worked answer; replace it with your own and rerun the cell —
# the `assert` checks it against the package.
#
# **1.** A 448×672 image (height × width, already a multiple of 28) goes through K3. How many patch tokens
# `L` does it make, and how many output tokens reach the language model?

# %%
# Your answer (worked): 448/14 = 32 patch rows, 672/14 = 48 columns; the 2×2 merge halves both.
L_answer = (448 // 14) * (672 // 14)
out_answer = (448 // 28) * (672 // 28)

shapes = {s.name: s.shape for s in stage_shapes(k3, [[1, 448 // 14, 672 // 14]])}
assert (L_answer, out_answer) == (shapes["patch_embed"][0], shapes["projected"][0])
print(L_answer, "patch tokens ->", out_answer, "tokens of width", shapes["projected"][1])

# %% [markdown]
# **2.** Write the parameter count of one K3 encoder block as a formula in `D`, `Q`, `I`
# (two norms, `wqkv`, `wo`, `fc0`, `fc1`; no biases).

# %%
D, Q, I = k3.vt_hidden_size, k3.qkv_hidden_size, k3.vt_intermediate_size
block_answer = 2 * D + 3 * Q * D + D * Q + I * D + D * I  # worked answer

blocks = next(r.count for r in parameter_table(k3) if r.component == "encoder blocks")
assert block_answer * k3.vt_num_hidden_layers == blocks
print(f"{block_answer:,} parameters per block")

# %% [markdown]
# **3.** Two 448×448 images packed into one sequence vs one 448×896 image: same number of tokens.
# Which costs more attention FLOPs, and by what factor? (Packed items never attend to each other.)

# %%
n = 32 * 32  # tokens per 448×448 image
ratio_answer = (2 * n) ** 2 / (2 * n**2)  # worked: one item of 2n tokens vs two items of n

packed = flop_table(k3, [[1, 32, 32], [1, 32, 32]])[2].count
single = flop_table(k3, [[1, 32, 64]])[2].count
assert np.isclose(single / packed, ratio_answer)
print(f"the single wide image costs {ratio_answer:.0f}× the attention FLOPs of the two packed images")
