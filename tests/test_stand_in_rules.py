"""The CUDA C emulator enforces what hardware requires of barriers and warp masks (issue 28, classes 3 and 5).

Planted faults: a warp sum whose shuffles name half a warp (`0xffff`) while all 32 lanes run them; a
shuffle naming lanes that have exited; a `__syncthreads` inside an `if` (threads of one block at two sites).
Each fails the launch naming the intrinsic and its line. Correct kernels pass: a full-warp sum, a half-warp
shuffle whose mask names exactly the lanes that run it, votes, and one barrier reached in a loop. The numba
simulator's rule (one `syncthreads()` site per barrier) is tested in tests/test_simulator.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from moonvit_kernels.tools.emulation import compiler, device

pytestmark = [
    pytest.mark.skipif(compiler() is None, reason="no C++ compiler (g++ >= 11) for the CUDA C emulation"),
    pytest.mark.timeout(300),
]

_CODE = r"""
extern "C" __global__ void warp_sum(const float* x, float* out, unsigned mask) {
  float v = x[threadIdx.x];
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(mask, v, off);  // WARP SUM
  out[threadIdx.x] = v;
}
extern "C" __global__ void half_warp_sum(const float* x, float* out) {
  float v = x[threadIdx.x];
  if (threadIdx.x % 32 < 16)
    for (int off = 8; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffu, v, off);
  __syncthreads();
  out[threadIdx.x] = v;
}
extern "C" __global__ void shuffle_after_exit(const float* x, float* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, x[threadIdx.x], 1);  // AFTER EXIT
}
extern "C" __global__ void down_sum_and_broadcast(const float* x, float* out) {
  float v = x[threadIdx.x];
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  const float up = __shfl_up_sync(0xffffffffu, x[threadIdx.x], 1);
  out[threadIdx.x] = __shfl_sync(0xffffffffu, v, 0) + 0.0f * up;
}
extern "C" __global__ void votes(const float* x, float* out) {
  const unsigned b = __ballot_sync(0xffffffffu, x[threadIdx.x] > 0.0f);
  const bool any = __any_sync(0xffffffffu, x[threadIdx.x] > 100.0f);
  const bool all = __all_sync(0xffffffffu, x[threadIdx.x] > -100.0f);
  __syncwarp();
  out[threadIdx.x] = float(__popc(b)) + (any ? 1000.0f : 0.0f) + (all ? 10000.0f : 0.0f);
}
extern "C" __global__ void barrier_in_a_loop(const float* x, float* out) {
  __shared__ float tile[64];
  float v = x[threadIdx.x];
  for (int i = 0; i < 3; ++i) {
    tile[threadIdx.x] = v;
    __syncthreads();
    v = tile[63 - threadIdx.x];
    __syncthreads();
  }
  out[threadIdx.x] = v;
}
extern "C" __global__ void barrier_inside_an_if(const float* x, float* out) {
  __shared__ float tile[64];
  tile[threadIdx.x] = x[threadIdx.x];
  if (threadIdx.x < 32) {
    __syncthreads();  // BARRIER A
    out[threadIdx.x] = tile[63 - threadIdx.x];
  } else {
    __syncthreads();  // BARRIER B
    out[threadIdx.x] = tile[63 - threadIdx.x];
  }
}
"""


def _line(marker: str) -> int:
    return next(i for i, line in enumerate(_CODE.splitlines(), 1) if marker in line)


@pytest.fixture(scope="module")
def mod():
    device.configure(compute_capability="90", count=1)
    with device.activated() as d:
        yield d.RawModule(code=_CODE)
    device.configure()


def _run(mod, name, n, *extra):
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    xd, out = device.asarray(x), device.asarray(np.zeros(n, np.float32))
    mod.get_function(name)((1,), (n,), (xd, out, *extra))
    return x, out.get()


def test_a_full_warp_sum_and_a_half_warp_shuffle_named_by_its_mask_pass(mod):
    x, out = _run(mod, "warp_sum", 32, np.uint32(0xFFFFFFFF))
    np.testing.assert_allclose(out, np.full(32, x.astype(np.float64).sum()), rtol=1e-5, atol=1e-5)
    x, out = _run(mod, "half_warp_sum", 64)
    want = x.copy()
    for w in range(2):
        want[32 * w : 32 * w + 16] = x[32 * w : 32 * w + 16].sum()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_shfl_down_and_up_pass(mod):
    x, out = _run(mod, "down_sum_and_broadcast", 32)
    np.testing.assert_allclose(out, np.full(32, x.astype(np.float64).sum()), rtol=1e-5, atol=1e-5)


def test_votes_and_a_barrier_in_a_loop_pass(mod):
    x, out = _run(mod, "votes", 32)
    np.testing.assert_array_equal(out, np.full(32, (x > 0).sum() + 10000.0, np.float32))
    x, out = _run(mod, "barrier_in_a_loop", 64)
    np.testing.assert_array_equal(out, x[::-1])


def test_a_half_warp_mask_over_a_whole_warp_is_rejected(mod):
    """Planted fault (class 3): the learner's `rmsnorm_warp_sum` with `0xffff`."""
    with pytest.raises(device.LaunchStopped, match=r"bad warp mask: __shfl_xor_sync\(0x0000ffff, \.\.\.\)") as e:
        _run(mod, "warp_sum", 32, np.uint32(0xFFFF))
    assert f":{_line('// WARP SUM')}," in str(e.value), str(e.value)
    assert "the mask leaves out lane" in str(e.value)


def test_a_mask_naming_exited_lanes_is_rejected(mod):
    with pytest.raises(
        device.LaunchStopped, match=r"__shfl_xor_sync\(0xffffffff, \.\.\.\).*names lane 16, which has exited"
    ) as e:
        _run(mod, "shuffle_after_exit", 32)
    assert f":{_line('// AFTER EXIT')}," in str(e.value), str(e.value)


def test_a_barrier_inside_an_if_is_rejected_naming_both_sites(mod):
    """Planted fault (class 5): two warps of a block wait at different `__syncthreads`."""
    with pytest.raises(device.LaunchStopped, match="divergent barrier") as e:
        _run(mod, "barrier_inside_an_if", 64)
    for marker in ("// BARRIER A", "// BARRIER B"):
        assert re.search(rf":{_line(marker)}\b", str(e.value)), str(e.value)
