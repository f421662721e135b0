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
# # 00a — Warm-ups: your first CUDA kernels, before the GEMM
#
# Seven small kernels, each a NumPy one-liner, in the spirit of Sasha Rush's *GPU Puzzles*: map → guard →
# 2-D blocks → shared memory → block reduction → scan → a transpose that must also be *fast*. Each one adds
# one idea that the stage notebooks (01–08) use all the time. You write every line between the `▼` and
# `▲` marks; the cell's code gives no algorithm away (this copy runs the empty stubs, so under each one you
# see the checker's answer to an empty kernel, with its first hint: cover it if you want none).
#
# **How a cell works.** `check(name, kernel)` launches your kernel on 2–3 cases (different sizes, several
# blocks, sizes that are not multiples of the block) and compares it with NumPy. When something is wrong
# it names the case that failed, which outputs are wrong or never written, writes past the end, races,
# and — for the bugs everybody makes — which bug it looks like. It shows a first hint; `hint(name)` shows
# them all, from a nudge to the algorithm; `solution(name)` prints a solution. The last warm-up is also
# checked for speed, by recording the addresses each warp touches (the X-ray's tracer, notebook 07).
#
# **No GPU needed.** Without one, numba runs the kernels on its CUDA *simulator* (one Python thread per CUDA
# thread): correct but slow, so the cases are small.

# %%
# Without a GPU, numba.cuda runs on its CPU simulator; the switch must be set before numba is imported.
# Figures (matplotlib Figure objects returned by moonvit_kernels.plots) are drawn inline.
# %matplotlib inline
from moonvit_kernels.device import use_simulator_without_gpu, where

use_simulator_without_gpu()

import numpy as np
from numba import cuda, float32

from moonvit_kernels.plots import plot_launch_map
from moonvit_kernels.tools.xray import counters

print(f"kernels run on: {where()}")

# %% [markdown]
# ## The model in one picture
#
# A launch `kernel[grid, block](args)` starts `grid` blocks of `block` threads. Every thread runs the same
# function; what makes it different is where it is: `cuda.threadIdx` (its place in its block),
# `cuda.blockIdx` (its block's place in the grid), `cuda.blockDim` (the block's size). Threads of one
# block can share fast on-chip memory (`cuda.shared.array`) and wait for each other
# (`cuda.syncthreads()`); threads of different blocks cannot. Consecutive `threadIdx.x` form *warps* of 32
# that issue each instruction together. Here a 2-D launch over an 11×19 output with blocks of 4×8 threads
# (y × x): 3×3 blocks, and the hatched threads fall outside the output.

# %%
plot_launch_map(11, 19, (8, 4))

# %% [markdown]
# ## Exercises
#
# ### 1. Map
#
# NumPy: `out = 2 * a + 1`. One block with exactly `n` threads, one thread per element.


# %%
# YOUR TURN: warm_map — launched by check() as warm_map[1, n](a, out, n)
from moonvit_kernels.exercises import check, hint, solution


@cuda.jit
def warm_map(a, out, n):
    # ▼ your code
    pass
    # ▲


result = check("warm_map", warm_map)

# %% [markdown]
# ### 2. Guard
#
# NumPy: `out = a + b`. Now the launch has **more threads than elements**, spread over several blocks
# (one block of 64 threads for 37 elements; three of 16 for 45; four of 32 for 100). A thread outside the array must do
# nothing — the simulator stops at an index out of bounds, a GPU silently writes over whatever lies there.


# %%
# YOUR TURN: warm_guard — launched by check() as warm_guard[blocks, threads](a, b, out, n)
@cuda.jit
def warm_guard(a, b, out, n):
    # ▼ your code
    pass
    # ▲


result = check("warm_guard", warm_guard)

# %% [markdown]
# ### 3. Blocks in 2-D
#
# NumPy: `out = a[:, None] * b[None, :]` (an outer product, `rows × cols`). The launch is the picture above:
# blocks of 4×8 threads (2×16 in the second case), `x` across the columns, `y` down the rows, enough blocks
# to cover the output — and the two cases are not square.


# %%
# YOUR TURN: warm_broadcast_2d — launched by check() as warm_broadcast_2d[(⌈cols/bx⌉, ⌈rows/by⌉), (bx, by)](a, b, out, rows, cols)
@cuda.jit
def warm_broadcast_2d(a, b, out, rows, cols):
    # ▼ your code
    pass
    # ▲


result = check("warm_broadcast_2d", warm_broadcast_2d)

# %% [markdown]
# ### 4. Shared memory
#
# NumPy: `out[i] = a[i − 1] + a[i] + a[i + 1]`, with `a` taken as 0 outside `0 … n−1`. Blocks of 16 threads.
# Reading three values of `a` per output from global memory reads each value three times; instead, stage
# the block's values once in a shared array that the whole block can read. The values a block needs reach
# one past each end of its own 16 — and threads must not read the shared array before the other threads
# have written it.

# %%
# YOUR TURN: warm_shared_window — launched by check() as warm_shared_window[⌈n/16⌉, 16](a, out, n)
THREADS = 16


@cuda.jit
def warm_shared_window(a, out, n):
    tile = cuda.shared.array(THREADS + 2, float32)
    # ▼ your code
    pass
    # ▲


result = check("warm_shared_window", warm_shared_window)

# %% [markdown]
# ### 5. Block reduction
#
# NumPy: `out[b] = a[64·b : 64·(b + 1)].sum()` — one block of 32 threads per 64 elements (the last block is
# partial). Adding 64 numbers with 32 threads in 6 steps instead of 64 is the pattern behind every norm,
# softmax and mean of the model (notebooks 02 and 04).


# %%
# YOUR TURN: warm_block_sum — launched by check() as warm_block_sum[⌈n/64⌉, 32](a, out, n)
@cuda.jit
def warm_block_sum(a, out, n):
    partial = cuda.shared.array(32, float32)
    # ▼ your code
    pass
    # ▲


result = check("warm_block_sum", warm_block_sum)

# %% [markdown]
# ### 6. Scan
#
# NumPy, per block of 32: `out[s : s + 32] = np.cumsum(a[s : s + 32])` — an inclusive prefix sum inside each
# block. A sequential loop takes 32 steps; 32 threads can do it in 5.


# %%
# YOUR TURN: warm_scan — launched by check() as warm_scan[⌈n/32⌉, 32](a, out, n)
@cuda.jit
def warm_scan(a, out, n):
    buf = cuda.shared.array(32, float32)
    # ▼ your code
    pass
    # ▲


result = check("warm_scan", warm_scan)

# %% [markdown]
# ### 7. Transpose — correct, then fast
#
# NumPy: `out = a.T` (`a` is `rows × cols`). Blocks of 32×8 threads; each block owns one 32×32 tile, so each
# thread moves four elements. This one is also checked for **speed**: memory moves in 32-byte *sectors*,
# and a warp's load or store is cheap when its 32 addresses fall in few sectors (*coalesced*). Shared
# memory has 32 *banks* of 4 bytes; lanes that want different words of the same bank wait for each other
# (*bank conflicts*). The checker traces your kernel's addresses and fails a correct but slow one. Two
# requests, costed by the tracer's counters:

# %%
for label, request in [
    ("32 lanes read 32 consecutive floats", counters.strided(4)),
    ("32 lanes read down a column of a 45-float-wide array", counters.strided(45 * 4)),
]:
    sectors, ideal = counters.sectors(request)
    print(f"{label}: {sectors} sectors where {ideal} would hold the bytes")
for label, request in [
    ("a row of a 32×32 shared tile", counters.strided(4)),
    ("a column of a 32×32 shared tile", counters.strided(32 * 4)),
]:
    waves, ideal = counters.wavefronts(request)
    print(f"{label}: {waves} wavefront(s) where {ideal} would do")


# %%
# YOUR TURN: warm_transpose — launched by check() as warm_transpose[(⌈cols/32⌉, ⌈rows/32⌉), (32, 8)](a, out, rows, cols)
TILE = 32


@cuda.jit
def warm_transpose(a, out, rows, cols):
    # ▼ your code
    pass
    # ▲


result = check("warm_transpose", warm_transpose)

# %% [markdown]
# ### Worked exercises
#
# Each cell below holds a worked answer; replace it with your own and rerun — the `assert` checks it.
#
# **1.** The launch of warm-up 3 for `rows = 11`, `cols = 19`: how many threads start, and how many of them
# have nothing to do?

# %%
blocks_x, blocks_y = -(-19 // 8), -(-11 // 4)
threads_answer = blocks_x * blocks_y * 8 * 4  # worked answer
idle_answer = threads_answer - 11 * 19

assert (threads_answer, idle_answer) == (288, 79)
print(f"{threads_answer} threads, {idle_answer} idle")

# %% [markdown]
# **2.** A warp reads one float from each of 32 rows of a row-major float32 matrix with `K = 588` columns
# (a column of the patch-embedding GEMM's A). How many 32-byte sectors does it touch, and what fraction of
# the bytes moved does it use?

# %%
sectors_answer = 32  # worked answer: rows are 588·4 bytes apart, one sector each
useful_answer = (32 * 4) / (sectors_answer * 32)

assert counters.sectors(counters.strided(588 * 4))[0] == sectors_answer
print(f"{sectors_answer} sectors, {useful_answer:.1%} of the bytes moved are used")

# %% [markdown]
# **3.** The hint of the transpose pads the shared tile to 32×33 floats. Which bank holds element `[r, 0]`
# of a 32×33 tile, and are the 32 banks of column 0 all different?

# %%
banks_answer = [(r * 33) % 32 for r in range(32)]  # worked answer: word r·33 + 0, bank = word mod 32

assert sorted(banks_answer) == list(range(32))
assert counters.wavefronts(counters.strided(33 * 4)) == (1, 1)
print("banks of column 0:", banks_answer[:8], "…  all 32 different")
