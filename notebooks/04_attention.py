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
# # 04 — Attention over packed media: naive, then tiled with an online softmax
#
# **What the source does.** Each encoder block runs multi-head softmax attention ([docs/model.md](../docs/model.md), stage 3):
# `o = softmax(q·kᵀ / √hd) · v` per head, **non-causal**, with the softmax in float32. Several media
# items (images, video chunks) are packed into one sequence of `L` tokens, described by `cu_seqlens`
# (`[0, n₀, n₀+n₁, …]`), and **an item never attends to another** — the mask is block-diagonal.
# The source calls a variable-length flash-attention kernel for this; here it is built in two steps.
#
# **Pitfalls other ports hit:** attention leaking across packed items (one softmax over all `L`
# tokens); materialising the `L×L` score matrix (at 16k tokens and 12 heads that is 12 GiB in fp32).
#
# | version | one block per | scores kept | K/V read from global memory |
# |---|---|---|---|
# | v1 naive | (query row, head) | the whole row of its item, in shared memory (≤ 8192 keys) | once per query row |
# | v2 tiled, online softmax | (tile of query rows, head) | one `block_q × block_k` tile | once per query tile |
#
# Both also return the **log-sum-exp** `lse = log Σ_j exp(s_j)` per (row, head) — the side output a
# backward pass needs, and a sharp check of the softmax.

# %%
# Without a GPU, numba.cuda runs on its CPU simulator; the switch must be set before numba is imported.
# Figures (matplotlib Figure objects returned by moonvit_kernels.plots) are drawn inline.
# %matplotlib inline
from moonvit_kernels.device import gpu_available, simulator_enabled, use_simulator_without_gpu, where

use_simulator_without_gpu()

import inspect
import math
import time

import numpy as np
from IPython.display import Markdown, display
from numba import cuda

from moonvit_kernels import reference
from moonvit_kernels.config import FP32_EPS, VisionConfig
from moonvit_kernels.numba_backend import attention as attention_module
from moonvit_kernels.numba_backend.attention import attention, pack_qkv
from moonvit_kernels.plots import (
    attention_kv_traffic,
    attention_mask_picture,
    attention_memory_table,
    error_heatmap,
    markdown_table,
    median_seconds,
    plot_online_softmax,
    plot_timings,
)

rng = np.random.default_rng(0)
on_gpu = gpu_available() and not simulator_enabled()

print(f"kernels run on: {where()}")

# %% [markdown]
# ## Sizes
#
# On a GPU: K3's 12 heads of `hd = 128`, an 896×896 image (4096 tokens) packed with a 4-frame 224×224
# video chunk (1024 tokens) and a small 112×112 image. On the simulator: 2 heads of `hd = 24`, three
# items of 10, 6 and 2 tokens; v1 with 8 threads (several keys per thread) and v2 with 8×4 tiles, so
# an item spans several query and key tiles.

# %%
if on_gpu:
    heads, hd = 12, 128
    grid_thws = np.array([[1, 64, 64], [4, 16, 16], [1, 8, 8]])
    launches = {"v1": dict(version=1), "v2": dict(version=2)}
else:
    heads, hd = 2, 24
    grid_thws = np.array([[1, 2, 5], [2, 1, 3], [1, 1, 2]])
    launches = {"v1": dict(version=1, threads=8), "v2": dict(version=2, block_q=8, block_k=4)}
cu_seqlens = reference.cu_seqlens(grid_thws).astype(np.int32)
lengths = np.diff(cu_seqlens)
L, Q = int(cu_seqlens[-1]), heads * hd
print(f"{where()}: items of {lengths.tolist()} tokens, L = {L}, {heads} heads × hd {hd}; launches {launches}")

# %% [markdown]
# ## The mask: one block per media item
#
# `plots.attention_mask_picture` draws which key (column) each query (row) may see. Everything off the
# diagonal blocks is forbidden — the kernels never even compute those scores: each query row looks up
# its item in `cu_seqlens` and loops over that item's keys only. The orange outlines are the tiles v2
# works on (the simulator's `block_q = 8` query rows × `block_k = 4` keys): a query tile never straddles
# two items, and the last tile of an item is partial (its missing rows and keys are masked).

# %%
mask_grid = grid_thws if not on_gpu else np.array([[1, 6, 8], [2, 4, 4], [1, 2, 2]])
attention_mask_picture(mask_grid, block_q=8, block_k=4)

# %% [markdown]
# ## Why pack: native resolution, no padding
#
# K3 keeps every image at its own resolution and aspect ratio (NaViT-style: `preprocess.resize_plan` only
# shrinks, and pads to a multiple of 28 pixels), so a batch holds items of very different lengths. A padded
# batch stretches every item to the longest one: the padding costs tokens in every linear layer and query–key
# pairs in attention, and buys nothing. Packing puts the items end to end and `cu_seqlens` tells the kernel
# where each one starts: no token is wasted. For a batch of mixed shapes at K3 sizes:

# %%
from moonvit_kernels.preprocess import resize_plan

sizes = [(1344, 448), (448, 1344), (896, 896), (448, 448), (224, 224)]
plans = [resize_plan(w, h) for w, h in sizes]
lens = [p.grid_hw[0] * p.grid_hw[1] for p in plans]
rows = [[f"{w}×{h}", f"{p.grid_hw[0]}×{p.grid_hw[1]}", n] for (w, h), p, n in zip(sizes, plans, lens, strict=True)]
display(Markdown(markdown_table(["image", "patch grid", "patches"], rows)))
packed_tokens, padded_tokens = sum(lens), len(lens) * max(lens)
packed_pairs, padded_pairs = sum(n * n for n in lens), len(lens) * max(lens) ** 2
print(
    f"tokens (every linear layer): packed {packed_tokens:,}, padded {padded_tokens:,} (×{padded_tokens / packed_tokens:.2f})"
)
print(
    f"query-key pairs (attention): packed {packed_pairs:,}, padded {padded_pairs:,} (×{padded_pairs / packed_pairs:.2f})"
)

# %% [markdown]
# Measured on the NumPy reference (CPU; each side halved so it runs in a second, 2 heads of 64): the packed
# batch, and the same items each stretched to the longest (what a padded batch computes):

# %%
small = [max(1, (p.grid_hw[0] // 2) * (p.grid_hw[1] // 2)) for p in plans]
heads_m, hd_m = 2, 64


def time_attention(item_lens: list[int]) -> float:
    """Median seconds of `reference.attention` over items of these lengths, packed end to end."""
    q, k, v = (rng.standard_normal((sum(item_lens), heads_m, hd_m)).astype(np.float32) for _ in range(3))
    cu = np.concatenate([[0], np.cumsum(item_lens)])
    return median_seconds(lambda: reference.attention(q, k, v, cu), 3, 1)["median"]


t_packed, t_padded = time_attention(small), time_attention([max(small)] * len(small))
print(
    f"reference attention (CPU): packed {t_packed * 1e3:.1f} ms, padded {t_padded * 1e3:.1f} ms (×{t_padded / t_packed:.1f})"
)

# %% [markdown]
# ## Memory per approach
#
# Score memory for K3 on a few inputs, every column counted the same way — **all 12 heads, all query
# rows** (`plots.attention_memory_table`): the naive `L×L` matrix, one item's `n×n` at a time, and v2's
# tiles (one `block_q × block_k` tile plus running max and sum per (query tile, head) block — linear in
# `L`, and only the blocks resident on the SMs hold one at any moment). Output and lse (`L·H·(hd + 1)`
# floats) are the same for all and not counted. The last two columns are the bytes of K and V read from
# global memory: v1 reads its item's K and V once per query *row*, v2 once per query *tile*.

# %%
k3 = VisionConfig.k3()
inputs = {
    "896×896 image": [4096],
    "1792×1792 image": [16384],
    "4 images 896×896 packed": [4096] * 4,
    "video, 4 chunks of 4 frames 448²": [4 * 1024] * 4,
}
bq, bk = attention_module.V2_BLOCK_Q, attention_module.V2_BLOCK_K
rows = []
for name, lens in inputs.items():
    table = {r.approach: r for r in attention_memory_table(lens, k3.vt_num_attention_heads, k3.head_dim, bq, bk)}
    kv = attention_kv_traffic(lens, k3.vt_num_attention_heads, k3.head_dim, bq)
    rows.append(
        [name, sum(lens)]
        + [f"{table[a].nbytes / 2**20:,.1f} MiB" for a in table]
        + [f"{kv['v1'] / 2**30:,.2f} GiB", f"{kv['v2'] / 2**30:,.3f} GiB (÷{kv['v1'] / kv['v2']:.0f})"]
    )
header = ["input", "L", *(f"scores: {a}" for a in table), "K/V reads v1", "K/V reads v2"]
display(Markdown(markdown_table(header, rows)))
shared = attention_module.v2_shared_bytes(k3.head_dim, bq, bk)
print(
    f"v2 with {bq}×{bk} tiles at hd = {k3.head_dim}: {shared:,} bytes of shared memory per block "
    f"(Q tile, K tile, V tile, scores) — the same for any L"
)

# %% [markdown]
# ## The online softmax
#
# v2 never sees a whole row of scores. It keeps, per query row, the running max `m`, the running sum
# `l = Σ exp(s_j − m)` and an unnormalised output `acc = Σ exp(s_j − m)·v_j`. When a new key tile raises
# the max to `m'`, the old sum and output are rescaled by `exp(m − m')`:
#
# `l ← l·exp(m − m') + Σ_tile exp(s_j − m')`,  `acc ← acc·exp(m − m') + Σ_tile exp(s_j − m')·v_j`
#
# and at the end `o = acc / l`, `lse = m + log l`. Nothing is approximated: after the last tile the
# result is the softmax exactly (up to rounding). The recurrence, written out in NumPy for one row of 29
# random scores in key tiles of 8:

# %%
s = rng.standard_normal(29) * 2
vals = rng.standard_normal((29, 4))
m, l_sum, acc, running_max = -np.inf, 0.0, np.zeros(vals.shape[1]), []
for start in range(0, s.size, 8):
    tile, v_tile = s[start : start + 8], vals[start : start + 8]
    m_new = max(m, tile.max())
    alpha = np.exp(m - m_new)  # rescale what was summed against the old max (0 on the first tile)
    p_tile = np.exp(tile - m_new)
    l_sum = l_sum * alpha + p_tile.sum()
    acc = acc * alpha + p_tile @ v_tile
    m = m_new
    running_max.append(m)
p = np.exp(s - s.max())
print("running max per tile:", np.round(running_max, 3))
print("final lse", m + math.log(l_sum), " direct", math.log(np.exp(s).sum()))
print("final output", np.round(acc / l_sum, 6), " direct", np.round(p @ vals / p.sum(), 6))
assert np.allclose(acc / l_sum, p @ vals / p.sum(), rtol=1e-12)
plot_online_softmax(s, 8)

# %% [markdown]
# ## The NumPy reference
#
# `reference.attention(q, k, v, cu_seqlens, return_lse=True)` loops over items; within an item it
# processes query rows in chunks so that no `L×L` array exists even in NumPy:

# %%
print(inspect.getsource(reference.attention))

# %% [markdown]
# ## The kernels: `moonvit_kernels/numba_backend/attention.py`
#
# Both read q, k, v straight from the packed `qkv [L, 3·Q]` buffer the `wqkv` GEMM and the RoPE kernel
# produced (no transposes), and write `o [L, Q]` in the layout the `wo` GEMM reads. The module header
# says what each version changes:

# %%
print(attention_module.__doc__)

# %% [markdown]
# ### v1: one block per (query row, head)
#
# The block's threads compute the row's scores into a shared-memory row, reduce it to its max and its sum
# of exponentials (shared-memory trees), then each thread produces output dims `t, t + threads, …`.
# Every query row reads its item's whole K and V from global memory — the traffic the table above counts.


# %%
def show_source(module, *names):
    """Print the source of the first of `names` the module defines (kernel factories)."""
    for name in names:
        if hasattr(module, name):
            print(inspect.getsource(getattr(module, name)))
            return
    print(f"(the module defines none of {names})")


show_source(attention_module, "make_attention_v1", "_make_attention_v1")

# %% [markdown]
# ### v2: tiles and the online softmax
#
# One block per (query tile, head): the tile's queries stay in shared memory, K and V stream through it
# `block_k` keys at a time, and each row carries `(m, l, acc)` with the rescale written out above (you
# write that update yourself in exercise B).

# %%
show_source(attention_module, "make_attention_v2", "_make_attention_v2")

# %% [markdown]
# ## Tensor cores: `mma.sync`, first on a GEMM tile
#
# The bf16 flash kernel below computes both of its products on the **tensor cores**, so they come first,
# on the simplest thing they do: the top rung of notebook 01's GEMM ladder, `cuda_backend/gemm_bf16.cu`.
# A tensor-core instruction is a *warp* instruction: its operands are spread over the 32 lanes, as the
# values of a warp shuffle (notebook 02) are.

# %% [markdown]
# **bf16 tensor cores (`gemm_bf16.cu`)**, the GEMM that can approach the bf16 peak:
#
# - **`mma.sync.m16n8k16`**: one warp multiplies a 16×16 bf16 tile of A by a 16×8 tile of B into a 16×8
#   fp32 accumulator in one instruction. The operands live in *fragments* spread over the 32 lanes — lane
#   `l` holds rows `l/4` and `l/4 + 8`, columns `2·(l%4)` and `+1` of the accumulator (the store loop at
#   the end reads exactly that). A warp owns 64×32 outputs = 4×4 such tiles; 8 warps make the 128×128
#   block tile.
# - **`ldmatrix.x4`** loads four 8×8 bf16 matrices from shared memory straight into those fragments: each
#   lane supplies the address of one 16-byte row.
# - **`cp.async`** copies 16-byte chunks global → shared without passing through registers, and
#   **double buffering** (`As[2]`, `Bs[2]`) lets tile `k+1` be in flight while tile `k` is multiplied:
#   `cp_async_wait<1>` waits for all but the newest group.
# - **padding**: shared rows of 40 bf16 (80 bytes) instead of 32, so the 8 row addresses one `ldmatrix`
#   phase reads fall in 8 different 16-byte bank groups — no bank conflicts. The `cp.async` copies are
#   ordered to match: the 8 lanes of a quarter-warp copy 8 consecutive rows of one 16-byte chunk column
#   (not 2 rows × 4 chunks, which would put two chunks on the same banks), so the stores into shared
#   memory are conflict-free as well.
#
# The PTX wrappers (`ptx.cuh`) and the kernel:

# %%
from moonvit_kernels.cuda_backend.sources import KERNEL_DIR
from moonvit_kernels.source_regions import region

print((KERNEL_DIR / "ptx.cuh").read_text(encoding="utf-8"))
print(region(KERNEL_DIR / "gemm_bf16.cu", "kernel"))

# %% [markdown]
# The bf16 GEMM on the CPU emulator at a tiny awkward size (`37 × 21`, `K = 40`: one block, partial tiles
# everywhere), compared with a float64 product of the **bf16-rounded** inputs, so the bound only covers fp32
# accumulation; next to it, how far bf16 rounding of the inputs alone moves the result from the fp32
# product — the price of the tensor cores.

# %%
from IPython.display import Markdown, display

from moonvit_kernels.cuda_backend import launchers
from moonvit_kernels.plots import markdown_table
from moonvit_kernels.tools import emulation
from moonvit_kernels.weights import bf16_bits_to_float32, float32_to_bf16_bits

gemm_rng = np.random.default_rng(11)
m_e, n_e, k_e = 37, 21, 40
a_e = gemm_rng.standard_normal((m_e, k_e)).astype(np.float32)
b_e = gemm_rng.standard_normal((n_e, k_e)).astype(np.float32)
exact = a_e.astype(np.float64) @ b_e.astype(np.float64).T
bound_e = 8 * FP32_EPS * np.sqrt(k_e) * (np.abs(a_e.astype(np.float64)) @ np.abs(b_e.astype(np.float64)).T)
if emulation.compiler() is None:
    print("no C++ compiler (g++ >= 11) here: the CUDA C emulator cannot run")
else:
    a_bits, b_bits = float32_to_bf16_bits(a_e), float32_to_bf16_bits(b_e)
    a_r, b_r = (bf16_bits_to_float32(x).astype(np.float64) for x in (a_bits, b_bits))
    got_bf16 = emulation.run(launchers.gemm, a_bits, b_bits)  # bf16 in, fp32 out
    exact_bf16 = a_r @ b_r.T
    bound_bf16 = 8 * FP32_EPS * np.sqrt(k_e) * (np.abs(a_r) @ np.abs(b_r).T)
    assert np.all(np.abs(got_bf16 - exact_bf16) <= bound_bf16), "gemm_bf16.cu beyond the bound"
    rows = [
        ["gemm_bf16.cu vs bf16 inputs", np.abs(got_bf16 - exact_bf16).max(),
         (np.abs(got_bf16 - exact_bf16) / bound_bf16).max()],
        ["bf16 rounding of the inputs alone", np.abs(exact_bf16 - exact).max(), (np.abs(exact_bf16 - exact) / bound_e).max()],
    ]  # fmt: skip
    print(f"CPU emulator of gemm_bf16.cu: [{m_e}, {k_e}] · [{n_e}, {k_e}]ᵀ")
    display(Markdown(markdown_table(["kernel", "max abs error", "error / fp32 bound"], rows)))

# %% [markdown]
# ### The CUDA C flash kernels (`cuda_backend/attention.cu`)
#
# Two kernels, the same algorithm. `flash_attn_fp32` is v2 on SIMT cores with a padded K tile
# (`HD + 1`: lane `j` reads key `j`'s row without bank conflicts). `flash_attn_bf16` uses the tensor
# cores for both products and adds two tricks:
#
# - **exp2 domain**: scores are scaled by `scale·log2(e)` once, so every `exp` becomes the cheaper
#   `exp2f` and the rescale is `2^(m_old − m_new)`; `lse` is converted back with `ln 2` at the end;
# - **P-fragment reuse**: the fp32 accumulators of `S = Q·Kᵀ` for two 16×8 key tiles sit in exactly the
#   lanes and registers of the A fragment of a 16×16 tile of `P` — so after `exp2` they are packed to
#   bf16 in registers (`pack_bf16x2`) and fed straight into `O += P·V`'s `mma.sync`, never touching
#   shared memory. V is read with `ldmatrix .trans` (it is `[key][d]`, and the B operand wants k fastest).
#
# Three pieces of the file (its regions; the whole of it is `moonvit_kernels/cuda_backend/attention.cu`):
# the layouts and the algorithm, then the bf16 kernel's online softmax on the `mma.sync` accumulators, and
# `O += P·V` from those accumulators repacked as the A fragment. Then both kernels run on the CPU emulator
# against the float64 reference (the fp32 one on this notebook's packed input; `hd = 24` is one of the
# emulator's instantiations):

# %%
from moonvit_kernels.cuda_backend.sources import KERNEL_DIR
from moonvit_kernels.source_regions import region
from moonvit_kernels.tools import emulation

for name in ("attn_layout", "attn_bf16_online_softmax", "attn_bf16_pv"):
    print(f"// ---- attention.cu, region {name}")
    print(region(KERNEL_DIR / "attention.cu", name))

# %% [markdown]
# ## Check against NumPy — output and log-sum-exp
#
# q, k, v random and non-uniform (rows of different magnitudes, so some softmaxes are peaked). The
# tolerance follows the fp32 rounding of a score, `4·eps·Σ|q_d·k_d|/√hd`, which `exp` turns into a
# relative error of each probability; NaN fails.

# %%
row_scale = np.exp(rng.uniform(0, math.log(4), (L, 1, 1)))
q = (rng.standard_normal((L, heads, hd)) * row_scale).astype(np.float32)
k = (rng.standard_normal((L, heads, hd)) * rng.uniform(0.5, 2.0, (1, heads, hd))).astype(np.float32)
v = (rng.standard_normal((L, heads, hd)) * 1.5 + rng.uniform(-1, 1, (1, heads, hd))).astype(np.float32)
qkv = pack_qkv(q, k, v)
ref_o, ref_lse = reference.attention(*(a.astype(np.float64) for a in (q, k, v)), cu_seqlens, return_lse=True)
ref_o = ref_o.reshape(L, Q)

bounds = list(zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True))
abs_terms = max(float((np.abs(q[a:b, h]) @ np.abs(k[a:b, h]).T).max()) for a, b in bounds for h in range(heads))
score_err = 4 * FP32_EPS * abs_terms / math.sqrt(hd)
rtol = 8 * FP32_EPS * math.sqrt(lengths.max())
qkv_d = cuda.to_device(qkv)
outputs, first_run_seconds, rows = {}, {}, []
for name, launch in launches.items():
    start = time.perf_counter()
    o_d, lse_d = attention(qkv_d, cu_seqlens, heads, **launch)
    cuda.synchronize()
    first_run_seconds[name] = time.perf_counter() - start
    o, lse = o_d.copy_to_host(), lse_d.copy_to_host()
    assert np.all(np.isfinite(o)) and np.all(np.isfinite(lse)), name
    np.testing.assert_allclose(o, ref_o, rtol=rtol, atol=(score_err + rtol) * np.abs(v).max(), err_msg=name)
    np.testing.assert_allclose(lse, ref_lse, rtol=rtol, atol=score_err, err_msg=name + " lse")
    outputs[name] = o
    rows.append([name, str(launch), np.abs(o - ref_o).max(), np.abs(lse - ref_lse).max()])
display(Markdown(markdown_table(["kernel", "launch", "o: max abs error", "lse: max abs error"], rows)))

# %% [markdown]
# The CUDA C kernels on the CPU emulator, same input and bounds as above (bf16: compared with a float64
# attention of the bf16-rounded q, k, v, with a bound for P rounded to bf16 before `P·V`). On a GPU this
# notebook's input is K3-sized, far too big for the emulator, so there it gets the simulator's tiny one:

# %%
if on_gpu:  # the emulator runs each CUDA thread as a fiber on one OS thread: give it the simulator's tiny input
    heads_e, hd_e = 2, 24
    cu_e = reference.cu_seqlens(np.array([[1, 2, 5], [2, 1, 3], [1, 1, 2]])).astype(np.int32)
    L_e = int(cu_e[-1])
    q_e, k_e, v_e = (rng.standard_normal((L_e, heads_e, hd_e)).astype(np.float32) for _ in range(3))
    qkv_e = pack_qkv(q_e, k_e, v_e)
    ref_o_e, ref_lse_e = reference.attention(*(a_.astype(np.float64) for a_ in (q_e, k_e, v_e)), cu_e, return_lse=True)
    ref_o_e = ref_o_e.reshape(L_e, -1)
    rtol_e = 8 * FP32_EPS * math.sqrt(np.diff(cu_e).max())
    score_err_e = 4 * FP32_EPS * float(np.abs(q_e).max() * np.abs(k_e).max()) * math.sqrt(hd_e)
else:
    heads_e, hd_e, cu_e, L_e, qkv_e, v_e = heads, hd, cu_seqlens, L, qkv, v
    ref_o_e, ref_lse_e, rtol_e, score_err_e = ref_o, ref_lse, rtol, score_err
Q_e = heads_e * hd_e
if emulation.compiler() is None or hd_e not in emulation.HEAD_DIMS:
    print(f"the CUDA C emulator cannot run here (no g++ >= 11, or hd = {hd_e} not among {emulation.HEAD_DIMS})")
else:
    from moonvit_kernels.weights import bf16_bits_to_float32, float32_to_bf16_bits

    o_c, lse_c = emulation.run(launchers.attention, qkv_e, cu_e, heads_e, hd_e)
    atol_e = (score_err_e + rtol_e) * np.abs(v_e).max()
    np.testing.assert_allclose(o_c, ref_o_e, rtol=rtol_e, atol=atol_e, err_msg="fp32")
    np.testing.assert_allclose(lse_c, ref_lse_e, rtol=rtol_e, atol=score_err_e, err_msg="fp32 lse")
    bits = float32_to_bf16_bits(qkv_e)
    o_b, lse_b = emulation.run(launchers.attention, bits, cu_e, heads_e, hd_e)
    o_b = bf16_bits_to_float32(o_b)
    q_r, k_r, v_r = (
        bf16_bits_to_float32(bits[:, s_ * Q_e : (s_ + 1) * Q_e]).reshape(L_e, heads_e, hd_e) for s_ in range(3)
    )
    ref_b, ref_lse_b = reference.attention(*(a_.astype(np.float64) for a_ in (q_r, k_r, v_r)), cu_e, return_lse=True)
    err_b = np.abs(o_b - ref_b.reshape(L_e, Q_e)).max()
    assert err_b <= 2**-7 * np.abs(v_r).max() * 2, err_b  # P and the output rounded to bf16
    rows_c = [
        ["flash_attn_fp32 (SIMT)", np.abs(o_c - ref_o_e).max(), np.abs(lse_c - ref_lse_e).max()],
        ["flash_attn_bf16 (tensor cores)", err_b, np.abs(lse_b - ref_lse_b).max()],
    ]
    print(f"CPU emulator of attention.cu: items {np.diff(cu_e).tolist()}, {heads_e} heads × hd {hd_e}")
    display(Markdown(markdown_table(["kernel", "o: max abs error", "lse: max abs error"], rows_c)))

# %% [markdown]
# ## Pictures: where the error lands
#
# The error of v2 for every (token, head·dim): rounding noise everywhere. A tile-edge or item-boundary
# bug would show up as a band of rows (one query tile, one item) or of columns (one head).

# %%
error_heatmap(outputs["v2"], ref_o, bound=rtol * np.abs(ref_o) + (score_err + rtol) * np.abs(v).max(),
              title="attention v2 vs float64, o [L, Q]: error / bound")  # fmt: skip

# %% [markdown]
# ## No leaks between items
#
# Change every key and value of the *last* item and run again: the outputs of all other items must not
# change in a single bit. Then the pitfall: one softmax over the whole packed sequence (`cu_seqlens =
# [0, L]`), as a port without the mask computes it.

# %%
a, b = bounds[-1]
changed = qkv.copy()
changed[a:b, Q:] = rng.standard_normal((b - a, 2 * Q)).astype(np.float32)
for name, launch in launches.items():
    o2 = attention(changed, cu_seqlens, heads, **launch)[0].copy_to_host()
    assert np.array_equal(o2[:a], outputs[name][:a]), f"{name}: item {len(bounds) - 1} leaked into the others"
    assert not np.array_equal(o2[a:], outputs[name][a:])
print("changing the last item's k, v left every other item's output bit-for-bit unchanged")

leaky = reference.attention(q, k, v, np.array([0, L]))
print(f"one softmax over all L tokens: max |o − o_packed| = {np.abs(leaky.reshape(L, Q) - ref_o).max():.2f}")

# %% [markdown]
# ## Speed
#
# Attention does `4·n²·Q` FLOPs per item (two matrix products per head). On a GPU, compare v1 and v2:
# v2 reads K and V once per tile of `block_q` rows instead of once per row. On the simulator a time
# measures Python threads — not performance — so only one labelled line is printed and no chart drawn.

# %%
flops = 4 * int(np.sum(lengths.astype(np.int64) ** 2)) * Q
seconds = {}
for name, launch in launches.items():
    if on_gpu:
        t = median_seconds(lambda launch=launch: attention(qkv_d, cu_seqlens, heads, **launch), 10, 2, cuda.synchronize)
        seconds[f"attention {name}"] = t["median"]
    else:
        seconds[f"attention {name}"] = first_run_seconds[name]
if on_gpu:
    for name, sec in seconds.items():
        print(
            f"{where()}: {name}  {sec * 1e3:10.2f} ms  {flops / sec / 1e12:10.3g} TFLOP/s  (4·Σn²·Q = {flops:,} FLOP)"
        )
    display(plot_timings(seconds, where(), title=f"attention, items {lengths.tolist()}"))
else:
    print(
        f"{where()} (Python threads, not GPU performance): " + ", ".join(f"{n} {t:.2f} s" for n, t in seconds.items())
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

header, rows, note = prediction_rows("04")
display(Markdown(markdown_table(header, rows)))
print(note)

# %% [markdown]
# ## Exercises
#
# ### Your turn: write the kernel
#
# Two single-head attention kernels, one thread per query (`L = 23`, then 37 queries and keys over two
# blocks, `head_dim = 16`), then attention v2's tiled loop, each with a gap between `▼` and `▲`. The test
# data are chosen so scores reach ±200: `exp` of that overflows fp32 (above ≈ 88.7). `check(name, kernel)`
# runs your kernel (simulator or GPU) against NumPy and says which queries and dims are wrong, NaN, never
# written, a race, or the known bug it reproduces. As committed the checks report failures. A failing
# check shows a first hint; `hint("attention_softmax")` shows them all, `solution(...)` prints a solution.
#
# **A.** The softmax in two passes over the keys, safe from overflow; the cell already divides `acc / l`.

# %%
# YOUR TURN: attention_softmax — launched by check() as attention_softmax[1, 32](q, k, v, out, L, scale)
import math

from numba import float32

from moonvit_kernels.exercises import check, hint, solution

HD = 16  # head dim, a compile-time constant (the size of the local accumulator)


@cuda.jit
def attention_softmax(q, k, v, out, L, scale):
    i = cuda.grid(1)  # the query row of this thread
    if i >= L:
        return
    m = float32(-math.inf)
    for j in range(L):  # pass 1
        s = float32(0.0)
        for d in range(HD):
            s += q[i, d] * k[j, d]
        s *= scale
        # ▼ your code (1)
        pass
        # ▲
    acc = cuda.local.array(HD, float32)
    for d in range(HD):
        acc[d] = float32(0.0)
    l = float32(0.0)
    for j in range(L):  # pass 2
        s = float32(0.0)
        for d in range(HD):
            s += q[i, d] * k[j, d]
        s *= scale
        # ▼ your code (2)
        pass
        # ▲
    for d in range(HD):
        out[i, d] = acc[d] / l


result = check("attention_softmax", attention_softmax)

# %% [markdown]
# **B.** The online softmax: one pass over the keys (a key tile of one; attention v2 does the same per
# 16-key tile). The placeholder tracks the running maximum and sums the exp-weights relative to it — but
# the maximum moves while the sums grow.


# %%
# YOUR TURN: online_softmax_rescale — launched by check() as online_softmax_rescale[1, 32](q, k, v, out, L, scale)
@cuda.jit
def online_softmax_rescale(q, k, v, out, L, scale):
    i = cuda.grid(1)
    if i >= L:
        return
    acc = cuda.local.array(HD, float32)
    for d in range(HD):
        acc[d] = float32(0.0)
    m = float32(-math.inf)
    l = float32(0.0)
    for j in range(L):
        s = float32(0.0)
        for d in range(HD):
            s += q[i, d] * k[j, d]
        s *= scale
        m_new = max(m, s)
        # ▼ your code: this placeholder update is wrong as soon as the maximum grows
        p = math.exp(s - m_new)
        l = l + p
        for d in range(HD):
            acc[d] = acc[d] + p * v[j, d]
        # ▲
        m = m_new
    for d in range(HD):
        out[i, d] = acc[d] / l


result = check("online_softmax_rescale", online_softmax_rescale)

# %% [markdown]
# **C. The flash loop.** Attention v2, printed above, is yours to write: one block per tile of `BQ = 4`
# query rows of one packed item (`tiles[b] = (item, first query row)`), the query tile staged in shared
# memory once, the item's keys and values streamed through shared memory `BK = 8` at a time, a running
# maximum and sum per row rescaled as in B — but a whole tile of keys per step — and the barriers that
# keep 32 threads from reading a tile another thread is still writing. Thread `(ty, tx)` is query row `ty`
# of the tile and key `tx` of the key tile; with `BK = head_dim = 8` it also owns output dim `tx`. The
# cases pack items of 6 and 13 tokens, then 3, 17 and 9: partial query tiles, partial key tiles, and items
# that must not see each other.

# %%
# YOUR TURN: flash_attention_tiles — launched by check() as flash_attention_tiles[n_tiles, (8, 4)](q, k, v, cu_seqlens, tiles, out, scale)
HEAD_DIM, BQ, BK = 8, 4, 8


@cuda.jit
def flash_attention_tiles(q, k, v, cu_seqlens, tiles, out, scale):
    q_s = cuda.shared.array((BQ, HEAD_DIM), float32)
    k_s = cuda.shared.array((BK, HEAD_DIM), float32)
    v_s = cuda.shared.array((BK, HEAD_DIM), float32)
    s_s = cuda.shared.array((BQ, BK), float32)
    p_s = cuda.shared.array((BQ, BK), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    item = tiles[cuda.blockIdx.x, 0]
    row = tiles[cuda.blockIdx.x, 1] + ty
    kv_start = cu_seqlens[item]
    kv_end = cu_seqlens[item + 1]
    m_i = float32(-math.inf)
    l_i = float32(0.0)
    acc = float32(0.0)
    # ▼ your code
    pass
    # ▲
    if row < kv_end:
        out[row, tx] = acc / l_i


result = check("flash_attention_tiles", flash_attention_tiles)

# %% [markdown]
# **D. CUDA C: the tensor-core fragments.** `mma.sync.m16n8k16` multiplies a 16×16 bf16 tile of A by a
# 16×8 tile of B into a 16×8 fp32 tile in one warp-wide instruction — but each operand arrives spread over
# the 32 lanes by a fixed table (the header of `ptx.cuh`, printed above with the bf16 GEMM). Write the
# kernel that gives each lane its pieces of A and B and stores its pieces of the result: one warp per
# 16×8 tile of C. The source is compiled by the CPU emulator (g++, every CUDA thread a fiber, `ptx.cuh`'s
# `mma_bf16_16816` computed from the PTX ISA's tables); `check` takes the **source text**. A and B are
# passed as bf16 bit patterns (`unsigned short`), K is a multiple of 16, M and N are not multiples of the
# tile.

# %%
# YOUR TURN: mma_fragments — launched by check() as mma_fragments<<<(⌈N/8⌉, ⌈M/16⌉), 32>>>(A, B, C, M, N, K)
mma_fragments = r"""
#include "ptx.cuh"

extern "C" __global__ void mma_fragments(const unsigned short* A, const unsigned short* B, float* C,
                                         int M, int N, int K) {
  const int lane = threadIdx.x;
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  // ▼ your code
  // ▲
}
"""

result = check("mma_fragments", mma_fragments)

# %% [markdown]
# ### Worked exercises
#
# Each cell below holds a worked answer; replace it with your own and rerun — the `assert` checks it.
#
# **1.** Two halves of a row's keys were processed separately, giving `(m₁, l₁, o₁)` and `(m₂, l₂, o₂)`
# (max, sum of `exp(s − m)`, normalised output). Combine them into the full row's output — the rule
# split-K flash attention uses.

# %%
s = rng.standard_normal(20) * 3
vals = rng.standard_normal((20, 5))


def half_softmax(scores, values):
    """(max, Σ exp(s − max), normalised output) of one part of a row."""
    m_part = scores.max()
    p_part = np.exp(scores - m_part)
    return m_part, p_part.sum(), p_part @ values / p_part.sum()


(m1, l1, o1), (m2, l2, o2) = half_softmax(s[:9], vals[:9]), half_softmax(s[9:], vals[9:])

m = max(m1, m2)  # worked answer
w1, w2 = l1 * np.exp(m1 - m), l2 * np.exp(m2 - m)
combined_answer = (w1 * o1 + w2 * o2) / (w1 + w2)

p = np.exp(s - s.max())
np.testing.assert_allclose(combined_answer, p @ vals / p.sum(), rtol=1e-12)
print(combined_answer)

# %% [markdown]
# **2.** From the kernel's `lse`, recover the attention probabilities of query row 0, head 0 (without
# recomputing a max or a sum) — then they must sum to 1.

# %%
_, lse_d = attention(qkv, cu_seqlens, heads, **launches["v2"])
lse = lse_d.copy_to_host()
a, b = bounds[0]
scores = (q[0, 0].astype(np.float64) @ k[a:b, 0].astype(np.float64).T) / math.sqrt(hd)
probs_answer = np.exp(scores - lse[0, 0])  # worked answer

assert abs(probs_answer.sum() - 1) < 1e-5
print(np.round(probs_answer, 4))

# %% [markdown]
# **3.** How many MiB would the naive fp32 `L×L` score matrix take, all 12 heads, for one 1792×1792 image?

# %%
L_big = (1792 // 14) ** 2
mib_answer = 12 * L_big**2 * 4 / 2**20  # worked answer

naive = attention_memory_table([L_big], 12, 128, bq, bk)[0]
assert mib_answer == naive.nbytes / 2**20
print(
    f"{mib_answer:,.0f} MiB (versus {attention_memory_table([L_big], 12, 128, bq, bk)[2].nbytes:,} bytes per v2 tile)"
)
