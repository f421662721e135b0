"""Divergent barriers (issue 28, class 5): a `cuda.syncthreads()` under a thread-dependent condition is refused by
the checker even when every case passes — the simulator cannot see it (threads that skip a barrier and exit look
like threads that returned early), a GPU may hang on it."""

from __future__ import annotations

import pytest

from moonvit_kernels.exercises import EXERCISES, check, solution_path
from moonvit_kernels.exercises.barriers import divergent_barriers
from moonvit_kernels.numba_backend._cuda import cuda, float32

THREADS = 32


@cuda.jit
def warm_block_sum(a, out, n):
    """The audit's plant: the solution with its barrier moved inside `if t < stride` (it passes every case)."""
    partial = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    base = cuda.blockIdx.x * 2 * THREADS
    x0 = a[base + t] if base + t < n else float32(0.0)
    x1 = a[base + THREADS + t] if base + THREADS + t < n else float32(0.0)
    partial[t] = x0 + x1
    stride = THREADS // 2
    while stride > 0:
        if t < stride:
            cuda.syncthreads()
            partial[t] += partial[t + stride]
        stride //= 2
    if t == 0:
        out[cuda.blockIdx.x] = partial[0]


def test_a_barrier_inside_a_thread_dependent_if_is_refused_though_every_case_passes():
    result = check("warm_block_sum", warm_block_sum, verbose=False)
    assert not result.passed
    assert "correct on all 2 cases here, but not a kernel a GPU can run safely" in result.message
    assert "cuda.syncthreads() at line 28 is inside `if t < stride` (line 27)" in result.message


@pytest.mark.parametrize("name", [n for n, e in EXERCISES.items() if e.language == "numba"])
def test_no_solution_has_a_divergent_barrier(name):
    assert divergent_barriers(solution_path(name).read_text(encoding="utf-8")) == []


CASES = {
    "uniform loop and early return": (
        """
def k(x, n):
    t = cuda.threadIdx.x
    if t >= n:
        return
    stride = 16
    while stride > 0:
        cuda.syncthreads()
        stride //= 2
""",
        [],
    ),
    "through a chain of names": (
        """
def k(x):
    i = cuda.grid(1)
    j = i + 1
    if j < 5:
        cuda.syncthreads()
""",
        ["line 6 is inside `if j < 5` (line 5)"],
    ),
    "a thread-strided loop": (
        """
def k(x, n):
    for c in range(cuda.threadIdx.x, n, 32):
        cuda.syncthreads()
""",
        ["line 4 is inside `for c in range(cuda.threadIdx.x, n, 32)` (line 3)"],
    ),
    "a value read at the thread's index": (
        """
def k(x, flags):
    f = flags[cuda.threadIdx.x]
    while f > 0:
        cuda.syncthreads()
        f -= 1
""",
        ["line 5 is inside `while f > 0` (line 4)"],
    ),
    "a store at the thread's index leaves the array uniform": (
        """
def k(buf, n):
    buf[cuda.threadIdx.x] = 1
    if buf.shape[0] > n:
        cuda.syncthreads()
""",
        [],
    ),
}


@pytest.mark.parametrize("source, says", CASES.values(), ids=CASES.keys())
def test_which_conditions_depend_on_the_thread(source, says):
    found = divergent_barriers(source)
    assert len(found) == len(says) and all(s in f for s, f in zip(says, found, strict=True)), found
