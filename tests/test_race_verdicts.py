"""Race verdicts: a kernel whose output depends on the order of its threads is told so.

When a case fails (and on the first case always), the checker runs the kernel again with its threads in the
opposite order (`exercises.thread_order.reversed_thread_order`: warps, lanes and blocks reversed on the CPU
emulator, threads started last to first under the simulator) and says "race: ..." when the output changes
beyond the case's error bound. Every barrier of every solution is dropped in turn (the list is read from
the solutions, so a new solution's barriers are covered without editing this file): each such kernel must
be rejected with that verdict, deterministically. The correct solutions pass (tests/test_exercises.py).
"""

from __future__ import annotations

import re

import pytest

from moonvit_kernels.exercises import EXERCISES, check, solution_path
from moonvit_kernels.tools.emulation import build

BARRIER = {"numba": "cuda.syncthreads()", "cuda_c": "__syncthreads()"}


def _barrier_drops() -> list[tuple[str, int]]:
    """(exercise, line number) of every barrier call in the solutions."""
    drops = []
    for name, ex in EXERCISES.items():
        lines = solution_path(name).read_text(encoding="utf-8").splitlines()
        drops += [(name, i + 1) for i, line in enumerate(lines) if BARRIER[ex.language] in line.split("#")[0]]
    return drops


DROPS = _barrier_drops()


def _without_line(name: str, line: int) -> object:
    """Exercise `name`'s solution with the barrier at `line` replaced by a no-op: a kernel (numba) or source."""
    path = solution_path(name)
    lines = path.read_text(encoding="utf-8").splitlines()
    text = lines[line - 1]
    indent = text[: len(text) - len(text.lstrip())]
    numba = EXERCISES[name].language == "numba"
    lines[line - 1] = indent + ("pass" if numba else ";")
    source = "\n".join(lines) + "\n"
    if not numba:
        return source
    namespace: dict = {"__name__": f"dropped_{name}_{line}"}
    exec(compile(source, f"{path.name} without line {line}", "exec"), namespace)
    return namespace[name]


def test_the_solutions_have_barriers_to_drop():
    """The harness below is not empty: the shared-memory exercises' solutions hold their barriers."""
    names = {name for name, _ in DROPS}
    assert {"warm_block_sum", "warm_scan", "warm_transpose", "gemm_tile_loads", "flash_attention_tiles"} <= names
    assert len(DROPS) >= 15


@pytest.mark.parametrize(("name", "line"), DROPS, ids=[f"{n}:{line}" for n, line in DROPS])
def test_a_dropped_barrier_gets_a_race_verdict(name, line):
    result = check(name, _without_line(name, line), verbose=False)
    assert not result.passed, f"{name} without the barrier at line {line} passed"
    assert "race: the output depends on the order of the threads" in result.message, result.message


RACY_WARP_SUM = r"""
extern "C" __global__ void rmsnorm_warp_sum(const float* x, const float* weight, float* out, int cols, float eps) {
  __shared__ float part[32];
  const int row = blockIdx.x, lane = threadIdx.x;
  const float* xr = x + (long long)row * cols;
  float s = 0.0f;
  for (int j = lane; j < cols; j += 32) s += xr[j] * xr[j];
  part[lane] = s;  // no __syncwarp() before the other lanes' values are read
  float total = 0.0f;
  for (int k = 0; k < 32; ++k) total += part[k];
  const float r = rsqrtf(total / cols + eps);
  for (int j = lane; j < cols; j += 32) out[(long long)row * cols + j] = xr[j] * r * weight[j];
}
"""


@pytest.mark.skipif(build.compiler() is None, reason="no C++ compiler (g++ >= 11) for the CUDA C emulator")
def test_a_racy_cuda_c_kernel_gets_a_race_verdict_on_the_emulator():
    """A warp sum through shared memory with no barrier between the writes and the reads: every lane reads
    its neighbours' slots before (forward order) or after (reversed) they are written."""
    result = check("rmsnorm_warp_sum", RACY_WARP_SUM, verbose=False)
    assert not result.passed
    assert re.search(r"race: the output depends on the order of the threads \(all rows", result.message), result.message
