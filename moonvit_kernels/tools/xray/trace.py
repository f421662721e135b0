"""Record the addresses every warp touches, per access site, by running a kernel on the CPU.

numba kernels run under numba's CUDA simulator (one Python thread per CUDA thread). Their global
arrays are passed in as `TracedArray`s and `cuda.shared.array` is patched to return one, so every
element access records (space, array, access site, block, thread, byte offset, size, load/store).
The access site is (file, line, array, load or store). Requests are rebuilt afterwards: the lanes of
one warp (linear thread id // 32) at one site in their k-th execution of it form the k-th request of
that warp at that site (two loads of one array on one line, as in `s[i] += s[i + 1]`, alternate
instances, and every lane evaluates them in the same order, so they stay apart; lanes that skip
an iteration shift their later instances: fine for the uniform loops of these kernels, stated in
the report as a limit of the method). Each request is then costed by `counters` (wavefronts for
shared memory, 32-byte sectors for global memory). Byte offsets are relative to each array's start
(global arrays assumed 256-byte aligned, as cudaMalloc returns; shared arrays start on a 128-byte
boundary), which does not change the bank or sector pattern of a request.
"""

from __future__ import annotations

import contextlib
import linecache
import re
import sys
import threading
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from moonvit_kernels.tools.xray import counters

_SHARED_NAME = re.compile(r"(\w+)\s*=\s*cuda\.shared\.array")


class Recorder:
    """Collects access records from simulator threads."""

    def __init__(self) -> None:
        self.records: list[tuple] = []
        self._local = threading.local()

    def record(self, space: str, name: str, offset: int, size: int, store: bool, depth: int = 2) -> None:
        t = threading.current_thread()
        tid = getattr(t, "thread_id", None)
        if tid is None:  # not a simulator thread (host code touching a traced array)
            return
        frame = sys._getframe(depth)
        site = (frame.f_code.co_filename, frame.f_lineno)
        counts = getattr(self._local, "counts", None)
        if counts is None:
            counts = self._local.counts = defaultdict(int)
        key = (space, name, site, store)
        counts[key] += 1
        b = t.blockIdx
        self.records.append((space, name, site, store, (b.x, b.y, b.z), tid, offset, size, counts[key]))


class TracedArray:
    """A NumPy array seen through a kernel: element reads and writes are recorded, then performed."""

    def __init__(self, array: np.ndarray, name: str, space: str, recorder: Recorder) -> None:
        self._a = array
        self.name = name
        self.space = space
        self._rec = recorder
        self.shape = array.shape
        self.ndim = array.ndim
        self.dtype = array.dtype
        self.size = array.size
        self.strides = array.strides

    def __len__(self) -> int:
        return len(self._a)

    def _offset(self, idx: Any) -> int | None:
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) != self.ndim:
            return None
        off = 0
        for i, n, s in zip(idx, self.shape, self.strides, strict=True):
            if not isinstance(i, (int, np.integer)):
                return None
            i = int(i)
            off += (i + n if i < 0 else i) * s
        return off

    def __getitem__(self, idx: Any) -> Any:
        off = self._offset(idx)
        if off is not None:
            self._rec.record(self.space, self.name, off, self.dtype.itemsize, False)
        return self._a[idx]

    def __setitem__(self, idx: Any, value: Any) -> None:
        off = self._offset(idx)
        if off is not None:
            self._rec.record(self.space, self.name, off, self.dtype.itemsize, True)
        self._a[idx] = value

    def copy_to_host(self) -> np.ndarray:
        return self._a.copy()


@contextlib.contextmanager
def traced_shared(recorder: Recorder) -> Iterator[None]:
    """While active, `cuda.shared.array(...)` in simulated kernels returns TracedArrays named after
    the variable they are assigned to."""
    from numba.core import types
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support

    original = kernelapi.FakeCUDAShared.array

    def array(self, shape, dtype, alignment=None):
        frame = sys._getframe(1)
        if shape == 0:  # dynamic shared memory: one buffer for the block, as the simulator does
            arr = original(self, shape, dtype, alignment)
        else:  # one array per declaring line and block (the simulator keys by the caller, which is now us)
            key = (frame.f_code.co_filename, frame.f_lineno)
            arr = self._allocations.get(key)
            if arr is None:
                dt = numpy_support.as_dtype(dtype) if isinstance(dtype, types.Type) else np.dtype(dtype)
                arr = self._allocations[key] = np.empty(shape, dt)
        line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
        m = _SHARED_NAME.search(line)
        return TracedArray(arr, m.group(1) if m else f"shared@{frame.f_lineno}", "shared", recorder)

    kernelapi.FakeCUDAShared.array = array
    try:
        yield
    finally:
        kernelapi.FakeCUDAShared.array = original


# ============================================================================ analysis
@dataclass
class SiteStats:
    """Cost of one access site over all its requests."""

    space: str  # "shared" or "global"
    array: str
    file: str
    line: int
    store: bool
    code: str = ""
    requests: int = 0
    cost: int = 0  # wavefronts (shared) or sectors (global), summed
    ideal: int = 0
    worst: float = 0.0  # worst request's cost / ideal
    lanes: int = 0  # active lanes, summed

    @property
    def per_request(self) -> float:
        return self.cost / self.requests if self.requests else 0.0

    @property
    def factor(self) -> float:
        """cost / ideal over all requests: 1 = conflict-free (shared) or fully coalesced (global)."""
        return self.cost / self.ideal if self.ideal else 0.0

    @property
    def kind(self) -> str:
        return ("STS" if self.store else "LDS") if self.space == "shared" else ("STG" if self.store else "LDG")

    @property
    def where(self) -> str:
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line}"


@dataclass
class TraceResult:
    """Per-site statistics of one traced launch, and what was run."""

    kernel: str
    setup: str
    sites: list[SiteStats] = field(default_factory=list)
    error: str | None = None

    def worst(self, space: str) -> float | None:
        """The largest per-site factor in `space` (None when the space was never touched)."""
        vals = [s.factor for s in self.sites if s.space == space]
        return max(vals) if vals else None


def requests(records: Sequence[tuple]) -> dict[tuple, list[counters.Access]]:
    """Group records into warp requests: key (space, array, site, store, block, warp, instance)."""
    groups: dict[tuple, list[counters.Access]] = defaultdict(list)
    for space, name, site, store, block, tid, offset, size, k in records:
        groups[(space, name, site, store, block, tid // 32, k)].append((tid % 32, offset, size))
    return groups


def analyse(records: Sequence[tuple]) -> list[SiteStats]:
    """Cost every request and sum per site; sites sorted by file and line."""
    sites: dict[tuple, SiteStats] = {}
    for (space, name, site, store, _b, _w, _k), accesses in requests(records).items():
        key = (space, name, site[0], site[1], store)
        st = sites.get(key)
        if st is None:
            code = linecache.getline(site[0], site[1]).strip()
            st = sites[key] = SiteStats(space, name, site[0], site[1], store, code)
        cost, ideal = counters.wavefronts(accesses) if space == "shared" else counters.sectors(accesses)
        st.requests += 1
        st.cost += cost
        st.ideal += ideal
        st.lanes += len(accesses)
        st.worst = max(st.worst, cost / ideal if ideal else 0.0)
    return sorted(sites.values(), key=lambda s: (s.file, s.line, s.array, s.store))


def merge_sites(sites: Sequence[SiteStats]) -> list[SiteStats]:
    """Merge sites that share (space, array, file, line, direction): one row per source line."""
    out: dict[tuple, SiteStats] = {}
    for s in sites:
        key = (s.space, s.array, s.file, s.line, s.store)
        m = out.get(key)
        if m is None:
            out[key] = SiteStats(s.space, s.array, s.file, s.line, s.store, s.code, s.requests, s.cost, s.ideal,
                                 s.worst, s.lanes)  # fmt: skip
        else:
            m.requests += s.requests
            m.cost += s.cost
            m.ideal += s.ideal
            m.lanes += s.lanes
            m.worst = max(m.worst, s.worst)
    return list(out.values())


def run_traced(kernel: Any, grid: Any, block: Any, args: Sequence[Any], names: Sequence[str]) -> list[tuple]:
    """Launch a simulator kernel with every NumPy array argument traced (named by `names`); records."""
    from numba import config

    if not config.ENABLE_CUDASIM:
        raise RuntimeError("tracing needs numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1 before numba is imported)")
    rec = Recorder()
    wrapped = [
        TracedArray(a, n, "global", rec) if isinstance(a, np.ndarray) else a for a, n in zip(args, names, strict=True)
    ]
    with traced_shared(rec):
        kernel[grid, block](*wrapped)
    return rec.records
