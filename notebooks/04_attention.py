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
# **What the source does.** Each encoder block runs multi-head softmax attention (SPEC.md, stage 3):
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
# Figures (matplotlib Figure objects returned by moonvit_kernels.viz*) are drawn inline.
# %matplotlib inline
from moonvit_kernels.device import gpu_available, simulator_enabled, use_simulator_without_gpu, where

use_simulator_without_gpu()

import inspect
import math
import time

import numpy as np
from IPython.display import Markdown, display
from moonvit_kernels.viz import attention_mask_picture, error_heatmap
from moonvit_kernels.viz_stages import (
    attention_memory_table,
    markdown_table,
    median_seconds,
    online_softmax_trace,
    plot_online_softmax,
    plot_timings,
)
from numba import cuda

from moonvit_kernels import reference
from moonvit_kernels.config import FP32_EPS, VisionConfig
from moonvit_kernels.numba_backend import attention as attention_module
from moonvit_kernels.numba_backend.attention import attention, pack_qkv

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
# `viz.attention_mask_picture` draws which key (column) each query (row) may see. Everything off the
# diagonal blocks is forbidden — the kernels never even compute those scores: each query row looks up
# its item in `cu_seqlens` and loops over that item's keys only.

# %%
attention_mask_picture(grid_thws if not on_gpu else np.array([[1, 6, 8], [2, 4, 4], [1, 2, 2]]))

# %% [markdown]
# ## Memory per approach
#
# Score memory for K3 (12 heads) on a few inputs — the naive `L×L` matrix, one item's `n×n` at a time, and
# the single tile a v2 thread block holds (`viz_stages.attention_memory_table`). Output and lse
# (`L·H·(hd + 1)` floats) are the same for all and not counted.

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
    rows.append([name, sum(lens)] + [f"{table[a].nbytes / 2**20:,.3f} MiB" for a in table])
display(Markdown(markdown_table(["input", "L", *table], rows)))
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
# result is the softmax exactly (up to rounding). One row of 29 random scores in tiles of 8
# (`viz_stages.online_softmax_trace`, a NumPy transcription of this recurrence):

# %%
s = rng.standard_normal(29) * 2
vals = rng.standard_normal((29, 4))
trace = online_softmax_trace(s, 8, vals)
p = np.exp(s - s.max())
print("running max per tile:", np.round(trace["running_max"], 3))
print("final lse", trace["lse"][-1], " direct", math.log(np.exp(s).sum()))
print("final output", np.round(trace["output"][-1], 6), " direct", np.round(p @ vals / p.sum(), 6))
plot_online_softmax(s, 8)

# %% [markdown]
# ## The NumPy reference
#
# `reference.attention(q, k, v, cu_seqlens, return_lse=True)` loops over items; within an item it
# processes query rows in chunks so that no `L×L` array exists even in NumPy:

# %%
print(inspect.getsource(reference.attention))

# %% [markdown]
# ## The kernels: `moonvit_kernels/kernels/attention.py`
#
# Both read q, k, v straight from the packed `qkv [L, 3·Q]` buffer the `wqkv` GEMM and the RoPE kernel
# produced (no transposes), and write `o [L, Q]` in the layout the `wo` GEMM reads. The module header
# says what each version changes:

# %%
print(attention_module.__doc__)

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
# ## Pictures: where the error lands
#
# The error of v2 for every (token, head·dim): rounding noise everywhere. A tile-edge or item-boundary
# bug would show up as a band of rows (one query tile, one item) or of columns (one head).

# %%
error_heatmap(outputs["v2"], ref_o, title="attention v2 vs float64, o [L, Q]")

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
# Attention does `4·n²·Q` FLOPs per item (two matrix products per head). On the simulator the times
# measure Python threads — no GPU number exists there. On a GPU, compare v1 and v2: v2 reads K and V once
# per tile of `block_q` rows instead of once per row.

# %%
flops = 4 * int(np.sum(lengths.astype(np.int64) ** 2)) * Q
seconds = {}
for name, launch in launches.items():
    if on_gpu:
        t = median_seconds(lambda launch=launch: attention(qkv_d, cu_seqlens, heads, **launch), 10, 2, cuda.synchronize)
        seconds[f"attention {name}"] = t["median"]
    else:
        seconds[f"attention {name}"] = first_run_seconds[name]
for name, sec in seconds.items():
    print(f"{where()}: {name}  {sec * 1e3:10.2f} ms  {flops / sec / 1e12:10.3g} TFLOP/s  (4·Σn²·Q = {flops:,} FLOP)")
plot_timings(seconds, where(), title=f"attention, items {lengths.tolist()}")

# %% [markdown]
# ## Exercises
#
# Each exercise cell holds a worked answer; replace it with your own and rerun — the `assert` checks it.
#
# **1.** Two halves of a row's keys were processed separately, giving `(m₁, l₁, o₁)` and `(m₂, l₂, o₂)`
# (max, sum of `exp(s − m)`, normalised output). Combine them into the full row's output — the rule
# split-K flash attention uses.

# %%
s = rng.standard_normal(20) * 3
vals = rng.standard_normal((20, 5))
h1, h2 = online_softmax_trace(s[:9], 9, vals[:9]), online_softmax_trace(s[9:], 11, vals[9:])
(m1, l1, o1), (m2, l2, o2) = ((h["running_max"][-1], h["running_sum"][-1], h["output"][-1]) for h in (h1, h2))

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
