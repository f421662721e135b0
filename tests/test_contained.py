"""Contained kernels (issue 31, finding 8): a learner's kernel that crashes or never ends is reported, and
the Python process (a notebook's kernel, this test run) lives on.

Each test below ended or hung this process before containment: a CUDA C launch that aborts, traps,
dereferences null, writes far out of bounds or deadlocks at a divergent barrier killed it (rc 134 / 139),
and an endless loop, CUDA C or numba under the simulator, never returned.
"""

from __future__ import annotations

import mmap
import os
import signal
import threading
import time

import numpy as np
import pytest
from numba import cuda

from moonvit_kernels import contained
from moonvit_kernels.exercises import check, load_solution
from moonvit_kernels.tools.emulation import build, device

needs_cxx = pytest.mark.skipif(build.compiler() is None, reason="needs a C++20 compiler for the CUDA C emulator")

FAULTS = r"""
extern "C" __global__ void add_one(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}
extern "C" __global__ void spins(float* x) { while (1) {} }
extern "C" __global__ void null_store(float* x) {
  if (blockIdx.x == 1 && threadIdx.x == 3) *(volatile float*)nullptr = 1.0f;
}
// 4 TiB below x: inside the address space, where nothing is mapped (1 GiB past x can land in a used worker's heap)
extern "C" __global__ void far_store(float* x) { if (threadIdx.x == 7) x[-(1ll << 40)] = 1.0f; }
extern "C" __global__ void aborts(float* x) { abort(); }
extern "C" __global__ void traps(float* x) { if (blockIdx.x == 1) __trap(); }
extern "C" __global__ void diverges(float* x) {
  if (threadIdx.x < 16) __syncthreads();
  else x[0] = __shfl_sync(0xffffffffu, x[1], 0);
}
"""


# ============================================================================ contained.run
def test_run_returns_the_result_and_reraises_the_exception():
    assert contained.run(lambda: (1, np.arange(3)), time_limit=10)[1].tolist() == [0, 1, 2]
    with pytest.raises(KeyError, match="missing"):
        contained.run(lambda: {}["missing"], time_limit=10)


def test_run_survives_a_crash_and_stops_an_endless_call():
    with pytest.raises(contained.Crashed, match="killed by SIGABRT") as e:
        contained.run(os.abort, time_limit=10, what="abort")
    assert e.value.signal_name == "SIGABRT"
    start = time.monotonic()
    with pytest.raises(contained.TimedOut, match="did not finish in 0.5 s"):
        contained.run(lambda: time.sleep(60), time_limit=0.5)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf")])
def test_a_time_limit_must_be_a_positive_number(bad):
    with pytest.raises(ValueError, match="positive number of seconds"):
        contained.run(lambda: None, time_limit=bad)


def test_ctrl_c_in_the_parent_kills_the_child():
    pid_box = mmap.mmap(-1, 8)

    def child():
        pid_box[:8] = os.getpid().to_bytes(8, "little")
        time.sleep(60)

    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        contained.run(child, time_limit=30)
    child_pid = int.from_bytes(pid_box[:8], "little")
    assert child_pid
    with pytest.raises(ProcessLookupError):
        os.kill(child_pid, 0)  # gone, and reaped


# ============================================================================ the emulated device
@pytest.fixture(scope="module")
def faults():
    if build.compiler() is None:
        pytest.skip("needs a C++20 compiler for the CUDA C emulator")
    return device.RawModule(code=FAULTS)


def _launch(module, name, x):
    with device.time_limit(2):
        module.get_function(name)((2,), (32,), (x,))


@needs_cxx
@pytest.mark.parametrize(
    "name, says",
    [
        ("spins", r"spins: your kernel did not finish in 2 s"),
        ("null_store", r"null_store: .*SIGSEGV.* block \(1, 0, 0\), thread \(3, 0, 0\), a write to address 0x0 \(a n"),
        ("far_store", r"far_store: .*SIGSEGV.* block \(0, 0, 0\), thread \(7, 0, 0\), a write to address 0x"),
        ("aborts", r"aborts: the kernel crashed: SIGABRT .* block \(0, 0, 0\), thread \(0, 0, 0\)"),
        ("traps", r"(?s)traps: .*SIGABRT .* block \(1, 0, 0\), thread \(0, 0, 0\).*__trap\(\) called"),
        (
            "diverges",  # lanes 16..31 shuffle with a full mask while lanes 0..15 wait at __syncthreads
            r"(?s)diverges: the kernel crashed: SIGABRT .*block \(0, 0, 0\).*bad warp mask: __shfl_sync\(0xffffffff, "
            r"\.\.\.\) at module.cpp:\d+.*names lane 0, which waits at __syncthreads at module.cpp:\d+ instead",
        ),
    ],
)
def test_a_faulting_launch_raises_launch_error_and_the_process_lives_on(faults, name, says):
    x = device.asarray(np.zeros(64, np.float32))
    with pytest.raises(device.LaunchStopped, match=says):
        _launch(faults, name, x)
    faults.get_function("add_one")((2,), (32,), (x, np.int32(64)))  # the device still works
    assert x.get().tolist() == [1.0] * 64


@needs_cxx
def test_device_memory_is_shared_and_private_arrays_are_copied_back(faults):
    x = device.asarray(np.zeros(64, np.float32))
    assert device.is_shared(x) and device.is_shared(device.empty((3, 4), np.float32)) and device.is_shared(x[8:])
    y = x + 1  # NumPy arithmetic: a device array in private memory
    assert not device.is_shared(y)
    add_one = faults.get_function("add_one")
    add_one((1,), (32,), (y[32:], np.int32(32)))  # a view into it, at an offset
    assert y.tolist() == [1.0] * 32 + [2.0] * 32
    add_one((2,), (32,), (x, np.int32(64)))
    assert x.get().tolist() == [1.0] * 64


# ============================================================================ the exercise checker
SPIN_SOURCE = (
    'extern "C" __global__ void rmsnorm_warp_sum(const float* x, const float* w, float* o, int c, float e) '
    "{ while (1) {} }"
)
NULL_SOURCE = (
    'extern "C" __global__ void rmsnorm_warp_sum(const float* x, const float* w, float* o, int c, float e) '
    "{ o[0] = *(const float*)0; }"
)


@needs_cxx
def test_a_cuda_c_exercise_reports_an_endless_loop():
    start = time.monotonic()
    result = check("rmsnorm_warp_sum", SPIN_SOURCE, verbose=False, time_limit=1)
    assert time.monotonic() - start < 15
    assert not result.passed and "rmsnorm_warp_sum: your kernel did not finish in 1 s" in result.message


@needs_cxx
def test_a_cuda_c_exercise_reports_a_crash_with_the_block_and_thread():
    result = check("rmsnorm_warp_sum", NULL_SOURCE, verbose=False)
    assert not result.passed
    assert "rmsnorm_warp_sum: the kernel crashed: SIGSEGV" in result.message
    assert "block (0, 0, 0), thread (0, 0, 0), a read of address 0x0 (a null pointer?)" in result.message


@needs_cxx
def test_a_cuda_c_exercise_is_contained_even_when_launches_are_not(monkeypatch):
    monkeypatch.setenv("MOONVIT_EMU_CONTAIN", "0")
    assert not device.contain()
    result = check("rmsnorm_warp_sum", NULL_SOURCE, verbose=False)
    assert "SIGSEGV" in result.message


@cuda.jit
def _spinning_position(grid_thws, cu_seqlens, n_items, pos, L):
    while True:
        pass


def test_a_numba_exercise_reports_an_endless_loop():
    start = time.monotonic()
    result = check("rope_token_position", _spinning_position, verbose=False, time_limit=2)
    assert time.monotonic() - start < 20
    assert not result.passed and "_spinning_position: your kernel did not finish in 2 s" in result.message
    assert check("rope_token_position", load_solution("rope_token_position"), verbose=False).passed


def test_check_refuses_a_bad_time_limit():
    with pytest.raises(ValueError, match="positive number of seconds"):
        check("rope_token_position", _spinning_position, verbose=False, time_limit=float("nan"))
