"""Timers and statistics: CUDA events on a GPU, the host clock on the CPU (simulator, emulator).

A timer is `(label, fn -> seconds of one call)`. Device timers record an event before and after the
call and wait for the second one, so the number is device time of the work `fn` queued; host
timers wrap `fn` with `time.perf_counter` (the simulator and the emulator run synchronously).
`measure` warms up, repeats, and returns the median with the 10th..90th percentile spread.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Timer = Callable[[Callable[[], Any]], float]


@dataclass(frozen=True)
class Timing:
    """Seconds of one call: median, 10th and 90th percentile over `runs` timed calls."""

    median: float
    p10: float
    p90: float
    runs: int
    clock: str

    @property
    def median_ms(self) -> float:
        return self.median * 1e3


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated q-th percentile (0..100) of a non-empty list."""
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(seconds: list[float], clock: str) -> Timing:
    """A `Timing` from a list of per-call seconds."""
    if not seconds:
        raise ValueError("no timed runs")
    return Timing(statistics.median(seconds), percentile(seconds, 10), percentile(seconds, 90), len(seconds), clock)


def host_timer(fn: Callable[[], Any]) -> float:
    """Seconds of one synchronous call on the host clock."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def cupy_timer(fn: Callable[[], Any]) -> float:
    """Device seconds of the work `fn` queues on CuPy's current stream (CUDA events)."""
    import cupy as cp

    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) / 1e3


def numba_timer(fn: Callable[[], Any]) -> float:
    """Device seconds of the work `fn` queues on numba's default stream (CUDA events)."""
    from numba import cuda

    start, stop = cuda.event(), cuda.event()
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1e3


def torch_timer(fn: Callable[[], Any]) -> float:
    """Device seconds of the work `fn` queues on torch's current stream (CUDA events)."""
    import torch

    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1e3


def measure(
    fn: Callable[[], Any], timer: Timer, clock: str, repeats: int, warmup: int = 1, max_seconds: float | None = None
) -> Timing:
    """Warm up `warmup` calls, then time up to `repeats` calls with `timer`: the median and spread.

    With `max_seconds`, the number of timed calls is cut (never below 3, or `repeats` if smaller)
    so that slow kernels do not eat the run's budget: the first timed call sets the pace."""
    for _ in range(warmup):
        fn()
    times = [timer(fn)]
    n = max(1, repeats)
    if max_seconds is not None and times[0] > 0:
        n = min(n, max(min(3, n), int(max_seconds / times[0])))
    times += [timer(fn) for _ in range(n - 1)]
    return summarize(times, clock)
