"""Clocks and the kernel timing method: device events on a GPU, the host clock on the CPU.

A `Clock` marks points in one backend's stream (CuPy, numba, torch events; `time.perf_counter` on the
host, where the simulator and the emulator run synchronously), says whether the device has reached a
mark yet, and can queue an L2 flush (a 256 MiB memset, as `triton.testing.do_bench` does: over four
times the 50-60 MB L2 of an H100/H200).

`measure_kernel(fn, clock, ...)` (the method every kernel and baseline is timed with):
  host     host seconds per call: `inner` calls queued back to back, divided by `inner` (the Python
           launch overhead, reported on its own);
  warm     device seconds per call with `inner` calls between one pair of marks, after enough flushes
           were queued ahead of them that the host finishes queueing all calls before the device
           reaches the first mark (checked each time: `gap_free`), so launch overhead stays out of the
           window; one untimed call just before the window leaves its data L2-resident when it fits;
  cold     device seconds of one call right after L2 flushes (DRAM-resident inputs); the flushes also
           keep the device busy while the host queues the call (checked the same way).
Median and 10th..90th percentile of each (`Timing`).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

FLUSH_BYTES = 256 * 2**20


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


# ============================================================================ clocks
class HostClock:
    """The host clock, for work that runs synchronously (the simulator, the emulator, NumPy)."""

    device = False

    def __init__(self, label: str = "host clock"):
        self.label = label

    def mark(self) -> float:
        return time.perf_counter()

    def seconds(self, a: float, b: float) -> float:
        return b - a

    def pending(self, mark: float) -> bool:
        return False

    def flush(self) -> None:
        pass

    def sync(self) -> None:
        pass


class _DeviceClock:
    device = True
    label = "CUDA events"
    _flush_seconds: float | None = None

    def flush_seconds(self) -> float:
        """Device seconds of one flush (measured once)."""
        if self._flush_seconds is None:
            self.flush()
            a = self.mark()
            self.flush()
            b = self.mark()
            self._flush_seconds = max(1e-6, self.seconds(a, b))
        return self._flush_seconds


class CupyClock(_DeviceClock):
    """CUDA events on CuPy's current stream."""

    def __init__(self) -> None:
        import cupy as cp

        self.cp = cp
        self.buffer = None

    def mark(self) -> Any:
        e = self.cp.cuda.Event()
        e.record()
        return e

    def seconds(self, a: Any, b: Any) -> float:
        b.synchronize()
        return self.cp.cuda.get_elapsed_time(a, b) / 1e3

    def pending(self, mark: Any) -> bool:
        return not mark.done

    def flush(self) -> None:
        if self.buffer is None:
            self.buffer = self.cp.empty(FLUSH_BYTES, dtype=self.cp.uint8)
        self.buffer.fill(0)

    def sync(self) -> None:
        self.cp.cuda.get_current_stream().synchronize()


class _EventClock(_DeviceClock):
    """CUDA events that record themselves, are waited on with `synchronize()` and answer `query()` and
    `elapsed_time(other)` in ms (numba's and torch's)."""

    def event(self) -> Any:
        raise NotImplementedError

    def mark(self) -> Any:
        e = self.event()
        e.record()
        return e

    def seconds(self, a: Any, b: Any) -> float:
        b.synchronize()
        return a.elapsed_time(b) / 1e3

    def pending(self, mark: Any) -> bool:
        return not mark.query()


class NumbaClock(_EventClock):
    """CUDA events on numba's default stream."""

    def __init__(self) -> None:
        from numba import cuda

        self.cuda = cuda
        self.buffer = None

    def event(self) -> Any:
        return self.cuda.event()

    def flush(self) -> None:
        from numba.cuda.cudadrv import driver

        if self.buffer is None:
            self.buffer = self.cuda.device_array(FLUSH_BYTES, dtype=np.uint8)
        driver.device_memset(self.buffer, 0, FLUSH_BYTES)

    def sync(self) -> None:
        self.cuda.synchronize()


class TorchClock(_EventClock):
    """CUDA events on torch's current stream."""

    def __init__(self, torch: Any = None) -> None:
        if torch is None:
            import torch
        self.torch = torch
        self.buffer = None

    def event(self) -> Any:
        return self.torch.cuda.Event(enable_timing=True)

    def flush(self) -> None:
        if self.buffer is None:
            self.buffer = self.torch.empty(FLUSH_BYTES, dtype=self.torch.uint8, device="cuda")
        self.buffer.zero_()

    def sync(self) -> None:
        self.torch.cuda.synchronize()


# ============================================================================ the method
@dataclass(frozen=True)
class KernelTiming:
    """What `measure_kernel` found: seconds per call warm and cold, host seconds per call, and whether the
    warm windows were free of launch gaps."""

    warm: Timing
    cold: Timing | None
    host: float
    gap_free: str
    inner: int


def measure_kernel(
    fn: Callable[[], Any],
    clock: Any,
    repeats: int,
    warmup: int = 1,
    inner: int = 1,
    cold_repeats: int = 0,
    max_seconds: float | None = None,
) -> KernelTiming:
    """Time `fn` (which queues one call of the work) with `clock` by the method of the module docstring.

    `repeats` warm windows of `inner` calls each and `cold_repeats` single cold calls; with `max_seconds`,
    the calls per window and both counts are cut (the counts never below 3, or the count asked for if
    smaller) so that slow work does not eat the run's budget: one timed call sets the pace."""
    inner, repeats = max(1, inner), max(1, repeats)
    for _ in range(warmup):
        fn()
    if not clock.device:  # synchronous work: each window's host time is its time; no L2 to flush
        return _measure_on_host(fn, clock, repeats, inner, cold_repeats)
    clock.sync()
    a = clock.mark()
    fn()
    pace = clock.seconds(a, clock.mark())  # one call sets the pace (launch overhead included: an upper bound)
    if max_seconds is not None and pace > 0:
        inner = min(inner, max(1, int(max_seconds / (4 * pace))))
        fits = int(max_seconds / (pace * (inner + 2)))
        repeats = min(repeats, max(min(3, repeats), fits))
        cold_repeats = min(cold_repeats, max(min(3, cold_repeats), fits))
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    host = (time.perf_counter() - t0) / inner
    clock.sync()
    # enough device work queued ahead of each window to cover queueing its calls, 1.5x over
    flushes = max(1, math.ceil(1.5 * host * (inner + 1) / clock.flush_seconds()))
    warm, late = [], 0
    for _ in range(repeats):
        for _ in range(flushes):
            clock.flush()
        fn()  # untimed: leaves this call's data in L2 where it fits
        a = clock.mark()
        for _ in range(inner):
            fn()
        b = clock.mark()
        early = not clock.pending(a)
        warm.append(clock.seconds(a, b) / inner)
        if early:
            late += 1
            flushes *= 2  # the host fell behind: queue more device work ahead next time
    cold, cold_late = [], 0
    flushes = max(1, math.ceil(1.5 * host / clock.flush_seconds()))
    for _ in range(cold_repeats):
        for _ in range(flushes):
            clock.flush()
        a = clock.mark()
        fn()
        b = clock.mark()
        early = not clock.pending(a)
        cold.append(clock.seconds(a, b))
        if early:
            cold_late += 1
            flushes *= 2
    if late + cold_late == 0:
        gap_free = "yes"
    else:
        gap_free = f"no ({late} of {repeats} warm, {cold_late} of {cold_repeats} cold windows opened early)"
    return KernelTiming(
        summarize(warm, clock.label), summarize(cold, clock.label) if cold else None, host, gap_free, inner
    )


def _measure_on_host(fn: Callable[[], Any], clock: Any, repeats: int, inner: int, cold_repeats: int) -> KernelTiming:
    warm = []
    for _ in range(repeats):
        a = clock.mark()
        for _ in range(inner):
            fn()
        warm.append(clock.seconds(a, clock.mark()) / inner)
    cold = []
    for _ in range(cold_repeats):
        a = clock.mark()
        fn()
        cold.append(clock.seconds(a, clock.mark()))
    timing = summarize(warm, clock.label)
    return KernelTiming(
        timing, summarize(cold, clock.label) if cold else None, timing.median, "n/a (host clock)", inner
    )
