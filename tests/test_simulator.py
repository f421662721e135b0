"""tools/simulator.py: the waiting barrier and the direct device-function calls keep numba's rules.

Each speed-up is held to what a kernel can observe: a barrier still orders shared-memory traffic (and a kernel
without it still races), threads that return early do not hold a barrier, the first exception of a block is
raised from the launch named by thread and block (and the others do not hang), and a device function that reads
`cuda` still sees the simulated thread. Runs under the CUDA simulator only (a GPU does not use it).
"""

import numpy as np
import pytest

from moonvit_kernels.device import simulator_enabled
from moonvit_kernels.numba_backend._cuda import cuda, float32, int32

SIMULATOR = simulator_enabled()

pytestmark = [
    pytest.mark.skipif(not SIMULATOR, reason="the simulator's scheduler; a GPU does not use it"),
    pytest.mark.timeout(120),  # a barrier that never opens fails here, not after the suite's 900 s
]

THREADS = 96  # three warps, so a reversal crosses warps


@cuda.jit
def reverse_through_shared(x, out):
    tile = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    tile[t] = x[t]
    cuda.syncthreads()
    out[t] = tile[THREADS - 1 - t]


@cuda.jit
def reverse_without_barrier(x, out):
    tile = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    tile[t] = x[t]
    out[t] = tile[THREADS - 1 - t]


@cuda.jit
def block_sum_with_early_exit(x, n, out):
    """Threads past `n` return before the barriers; the rest sum their block's values in shared memory."""
    partial = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * THREADS + t
    if i >= n:
        return
    partial[t] = x[i]
    cuda.syncthreads()
    if t == 0:
        s = float32(0.0)
        live = min(THREADS, n - cuda.blockIdx.x * THREADS)
        for j in range(live):
            s += partial[j]
        out[cuda.blockIdx.x] = s


@cuda.jit
def one_thread_raises(x, out):
    tile = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    tile[t] = x[t]
    cuda.syncthreads()
    out[t + (1000 if t == 37 else 0)] = tile[t]  # thread 37 indexes past the end
    cuda.syncthreads()


@cuda.jit
def barrier_inside_an_if(x, out):
    """Planted fault (issue 28, class 5): the first warp waits at one `syncthreads()`, the rest at another."""
    tile = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    tile[t] = x[t]
    if t < 32:
        cuda.syncthreads()  # BARRIER A
        out[t] = tile[THREADS - 1 - t]
    else:
        cuda.syncthreads()  # BARRIER B
        out[t] = tile[THREADS - 1 - t]


@cuda.jit
def barrier_in_a_loop_and_a_count(x, out):
    """Correct: one barrier site reached in every iteration, and `syncthreads_count` (two barriers inside)."""
    tile = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    v = x[t]
    for _ in range(3):
        tile[t] = v
        cuda.syncthreads()
        v = tile[THREADS - 1 - t]
        cuda.syncthreads()
    out[t] = v + cuda.syncthreads_count(v > 0) * 0


@cuda.jit(device=True, inline="always")
def mirror(i, n):
    return n - 1 - i  # reads no `cuda`: called directly


@cuda.jit(device=True, inline="always")
def my_lane():
    return cuda.threadIdx.x % 32  # reads `cuda`: needs the simulated module


@cuda.jit
def device_calls(out):
    t = cuda.threadIdx.x
    out[mirror(t, THREADS)] = my_lane() + 100 * cuda.blockIdx.x


def _values(n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * 3 + rng.uniform(-1, 1)).astype(np.float32)


def test_the_waiting_scheduler_is_installed():
    from numba.cuda.simulator import kernel as sim

    assert sim.BlockManager.__name__ == "WaitingBlockManager"
    assert sim.BlockThread.__name__ == "WaitingBlockThread"


def test_a_barrier_orders_shared_memory_and_a_missing_one_races():
    x = _values(THREADS)
    out = np.full(THREADS, np.nan, np.float32)
    reverse_through_shared[1, THREADS](x, out)
    np.testing.assert_array_equal(out, x[::-1])
    racy = np.full(THREADS, np.nan, np.float32)
    reverse_without_barrier[1, THREADS](x, racy)
    assert not np.array_equal(racy, x[::-1]), "a kernel without its barrier gave the right answer"


@pytest.mark.parametrize("n", [1, 95, 97, 250])
def test_threads_that_return_early_do_not_hold_the_barrier(n):
    x = _values(n, seed=n)
    blocks = -(-n // THREADS)
    out = np.full(blocks, np.nan, np.float32)
    block_sum_with_early_exit[blocks, THREADS](x, n, out)
    want = [x[b * THREADS : (b + 1) * THREADS].astype(np.float64).sum() for b in range(blocks)]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_the_first_exception_is_raised_named_and_nothing_hangs():
    x = _values(THREADS)
    out = np.zeros(THREADS, np.float32)
    with pytest.raises(IndexError, match=r"tid=\[37, 0, 0\] ctaid=\[0, 0, 0\]"):
        one_thread_raises[2, THREADS](x, out)
    # the block after it runs normally: no state is left behind
    good = np.full(THREADS, np.nan, np.float32)
    reverse_through_shared[1, THREADS](x, good)
    np.testing.assert_array_equal(good, x[::-1])


def test_device_functions_see_the_simulated_thread():
    out = np.full(THREADS, -1, np.int64)
    device_calls[1, THREADS](out)
    np.testing.assert_array_equal(out, (np.arange(THREADS) % 32)[::-1])
    assert mirror._moonvit_direct is True  # called without swapping module globals
    assert my_lane._moonvit_direct is False  # swapped, as numba does


def _line_of(marker):
    """The line of this file holding `marker` (the planted barriers' sites)."""
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if marker in line and "_line_of" not in line)


def test_a_barrier_inside_an_if_is_rejected_naming_both_sites():
    x = _values(THREADS)
    out = np.zeros(THREADS, np.float32)
    with pytest.raises(RuntimeError, match="divergent barrier") as err:
        barrier_inside_an_if[1, THREADS](x, out)
    message = str(err.value)
    for marker in ("# BARRIER A", "# BARRIER B"):
        assert f"test_simulator.py:{_line_of(marker)}" in message, message
    # nothing is left behind: the next launch runs normally
    good = np.full(THREADS, np.nan, np.float32)
    reverse_through_shared[1, THREADS](x, good)
    np.testing.assert_array_equal(good, x[::-1])


def test_one_barrier_site_in_a_loop_and_syncthreads_count_pass():
    x = _values(THREADS)
    out = np.full(THREADS, np.nan, np.float32)
    barrier_in_a_loop_and_a_count[1, THREADS](x, out)
    np.testing.assert_array_equal(out, x[::-1])


@cuda.jit
def read_unwritten_shared(out_f, out_i):
    floats = cuda.shared.array(4, float32)
    ints = cuda.shared.array(4, int32)
    t = cuda.threadIdx.x
    if t == 0:
        floats[0] = 1.5
        ints[0] = 7
    cuda.syncthreads()
    out_f[t] = floats[t]
    out_i[t] = ints[t]


def test_shared_memory_nothing_wrote_shows_as_nan_or_0xcd_and_arrays_do_not_alias():
    """Slot 0 was written, slots 1-3 not: NaN (floats) and 0xCDCDCDCD (int32), whatever the process did before;
    the two arrays of one kernel are two arrays."""
    out_f, out_i = np.zeros(4, np.float32), np.zeros(4, np.int32)
    read_unwritten_shared[1, 4](out_f, out_i)
    assert out_f[0] == 1.5 and np.isnan(out_f[1:]).all()
    assert out_i[0] == 7 and (out_i[1:] == np.frombuffer(b"\xcd" * 4, np.int32)[0]).all()
