"""Two speed-ups for numba-cuda's CUDA simulator that change nothing a correct kernel can observe, and shared
memory that shows an incorrect one's reads of what nothing wrote.

The simulator runs a block as one Python thread per CUDA thread. Profiled on a forward of the tiny config
(40 tokens, 2 layers: 23 launches, 362 blocks, 25,280 threads), its time went to two pieces of machinery,
not to the kernels:

1. **The barrier was found by polling.** numba's `BlockManager` loops in the launching thread asking every
   thread, again and again, whether it is alive and whether it sits in `syncthreads()`: 19 million
   `is_alive()` calls, competing under the GIL with the threads it waits for. Here the barrier is a
   condition variable. A thread that reaches `syncthreads()` counts itself in; the last live thread to
   arrive releases the block (a new generation); a thread that returns counts itself out and releases the
   others when they were all waiting on it. numba's rules are kept: a barrier waits for every thread of the
   block that has not returned; the first exception aborts the block (waiting threads raise "abort flag
   set", as in numba) and is raised from the launch, named by thread and block.
   One rule is added, as hardware has it: every thread of a generation must wait at the same
   `syncthreads()` call (its file:line, read from the caller's frame). A thread arriving at another site
   (a barrier inside an `if`) fails the launch with `DivergentBarrier`, naming both sites; on a GPU that is
   undefined behaviour, commonly a hang. A thread that returns still does not hold the others (numba's rule).
2. **Every device-function call swapped module globals.** numba wraps each call of a `device=True`
   function in `swapped_cuda_module`, which re-imports `numba.cuda`, takes two locks and scans the
   function's module for globals bound to `cuda`, to point them at the simulated module. A device function
   that names no such global (index arithmetic like `v3_row`) has nothing to swap: it is called directly.
   Which globals a function names is read once from its code object.

Threads still interleave under the GIL as before, so a missing barrier still races and still fails its
test (tests/test_simulator.py plants both faults). `reversed_thread_order()` starts each block's threads last
to first, so that the exercise checker can ask whether an output depends on the order of the threads.
3. **Shared memory starts as visible garbage.** numba makes a static `cuda.shared.array` with `np.empty`:
   zeros in a fresh process, leftovers of earlier work in a long-lived one, so a kernel reading a slot no
   thread wrote passed or failed by the history of its process. Here a new array holds NaN (floats) or
   0xCD bytes (integers), and is made once per call site under a lock (numba's lookup walked the whole
   stack on every call).

`install()` applies all three to numba-cuda's simulator (`numba.cuda.simulator.kernel`, numba-cuda 0.30, frozen)
for this process; `_cuda` calls it when the simulator is on.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import numpy as np

_installed = False
_REVERSED = [False]  # True within reversed_thread_order()


@contextlib.contextmanager
def reversed_thread_order() -> Iterator[None]:
    """Within the block, each block's threads start last to first (their Python threads run in start order until
    a barrier or the interpreter switches them): a kernel whose output changes depends on the order of its
    threads (a race)."""
    saved = _REVERSED[0]
    _REVERSED[0] = True
    try:
        yield
    finally:
        _REVERSED[0] = saved


class _Barrier:
    """The shared state of one block: live threads, threads waiting, the barrier's generation."""

    def __init__(self, threads: int) -> None:
        self.cond = threading.Condition()
        self.live = threads
        self.waiting = 0
        self.generation = 0
        self.site: str | None = None  # where this generation's first thread waits (file:line)
        self.failed: Any = None  # the first thread that raised

    def release(self) -> None:
        """Let every waiting thread through (call with `cond` held)."""
        self.waiting = 0
        self.site = None
        self.generation += 1
        self.cond.notify_all()


class DivergentBarrier(RuntimeError):
    """Threads of one block wait at different `syncthreads()` calls: undefined behaviour on a GPU (commonly a hang)."""


def call_site(skip: tuple[str, ...]) -> str:
    """`file:line` of the innermost frame outside the files and folders in `skip` (the kernel's call)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def names_cuda(fn: Any, cuda_module: Any, fake_module_type: type) -> bool:
    """True when `fn`'s code (nested code objects included) reads a global bound to `cuda` or to a simulated
    module: the calls numba's swap changes."""
    globs = fn.__globals__
    codes = [fn.__code__]
    while codes:
        code = codes.pop()
        for name in code.co_names:
            value = globs.get(name)
            if value is cuda_module or isinstance(value, fake_module_type):
                return True
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return False


def install() -> None:
    """Put the waiting barrier and the direct device-function calls into numba-cuda's simulator (idempotent)."""
    global _installed
    if _installed:
        return
    from numba import cuda as cuda_module
    from numba.cuda.simulator import kernel as sim
    from numba.cuda.simulator import kernelapi as api
    from numba.cuda.simulator.kernelapi import FakeCUDAModule, numpy_support
    from numba.cuda.simulator.kernelapi import types as numba_types

    skip = (os.path.dirname(sim.__file__) + os.sep, __file__, threading.__file__)

    class WaitingBlockThread(sim.BlockThread):
        def syncthreads(self) -> None:
            site = call_site(skip)
            b = self._manager.barrier
            with b.cond:
                if b.failed is not None:
                    raise RuntimeError("abort flag set on syncthreads call")
                if b.site is None:
                    b.site = site
                elif b.site != site:
                    raise DivergentBarrier(
                        f"divergent barrier: this thread waits at syncthreads() at {site}, while other threads of its "
                        f"block wait at syncthreads() at {b.site}; every thread of a block that has not returned must "
                        "reach the same barrier (on a GPU this is undefined behaviour, commonly a hang)"
                    )
                generation = b.generation
                b.waiting += 1
                if b.waiting == b.live:
                    b.release()
                while generation == b.generation and b.failed is None:
                    b.cond.wait()
                if b.failed is not None:
                    raise RuntimeError("abort flag set on syncthreads clear")

        def run(self) -> None:
            try:
                super().run()  # numba's: records an exception, named by thread and block
            finally:
                b = self._manager.barrier
                with b.cond:
                    b.live -= 1
                    if self.exception is not None and b.failed is None:
                        b.failed = self
                        b.cond.notify_all()
                    elif b.live == 0 or (b.waiting and b.waiting == b.live):
                        b.release()

    class WaitingBlockManager(sim.BlockManager):
        def run(self, grid_point: Any, *args: Any) -> None:
            def target() -> None:
                self._f(*args)

            points = np.ndindex(*self._block_dim)
            threads = [WaitingBlockThread(target, self, grid_point, p, self._debug) for p in points]
            self.barrier = b = _Barrier(len(threads))
            for t in reversed(threads) if _REVERSED[0] else threads:
                t.start()
            with b.cond:
                while b.live and b.failed is None:
                    b.cond.wait()
            if b.failed is not None:
                raise b.failed.exception[0].with_traceback(b.failed.exception[1])

    numba_call = sim.FakeCUDAKernel.__call__

    def swapped_call(fn: Any, args: tuple) -> Any:
        """`fn(*args)` with its module's `cuda` globals pointing at the simulated module: numba's
        `swapped_cuda_module` (the same per-module lock and reference count, so the two nest), without its
        per-call import and context manager."""
        globs = fn.__globals__
        gid = id(globs)
        with api._locks_register_lock:
            lock = api._globals_locks[gid]
        with lock:
            if api._swap_refcount[gid] == 0:
                orig = {k: v for k, v in globs.items() if v is cuda_module}
                api._swap_orig[gid] = orig
                fake = sim._get_kernel_context()
                for k in orig:
                    globs[k] = fake
            api._swap_refcount[gid] += 1
        try:
            return fn(*args)
        finally:
            with lock:
                api._swap_refcount[gid] -= 1
                if api._swap_refcount[gid] == 0:
                    globs.update(api._swap_orig.pop(gid))
                    del api._swap_refcount[gid]

    def call(self: Any, *args: Any) -> Any:
        if not self._device:
            return numba_call(self, *args)
        direct = self.__dict__.get("_moonvit_direct")
        if direct is None:
            direct = self._moonvit_direct = not names_cuda(self.fn, cuda_module, FakeCUDAModule)
        return self.fn(*args) if direct else swapped_call(self.fn, args)

    numba_shared_array = api.FakeCUDAShared.array
    allocating = threading.Lock()

    def shared_array(self: Any, shape: Any, dtype: Any, alignment: Any = None) -> Any:
        """numba's `cuda.shared.array` (one array per call site and block), made once under a lock and filled
        with `garbage`; dynamic shared memory (shape 0) as numba has it."""
        if alignment is not None or shape == 0:
            return numba_shared_array(self, shape, dtype, alignment)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        with allocating:
            out = self._allocations.get(key)
            if out is None:
                dtype = numpy_support.as_dtype(dtype) if isinstance(dtype, numba_types.Type) else np.dtype(dtype)
                out = self._allocations[key] = np.full(shape, garbage(dtype), dtype)
        return out

    sim.BlockThread = WaitingBlockThread
    sim.BlockManager = WaitingBlockManager
    sim.FakeCUDAKernel.__call__ = call
    api.FakeCUDAShared.array = shared_array
    _installed = True


def garbage(dtype: np.dtype) -> Any:
    """What a new static shared array of `dtype` holds under the simulator: NaN for floats, 0xCD bytes for
    integers (-842150451 as int32), so a read of an element nothing wrote shows in the output (as NaN, or an
    index far out of range) instead of being numpy's leftover memory, zeros in a fresh process."""
    dtype = np.dtype(dtype)
    if dtype.kind in "fc":
        return np.nan
    if dtype.kind in "iu":
        return np.frombuffer(b"\xcd" * dtype.itemsize, dtype)[0]
    return np.zeros((), dtype)[()]
