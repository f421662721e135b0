"""Device functions shared by several kernels: the block tree reduction and the token -> item lookup.

Every function here is `@cuda.jit(device=True, inline="always")`: numba inlines it into the
calling kernel before type inference, so `cuda.compile_ptx` builds the kernel without a GPU
(a plain `device=True` callee needs the current device's compute capability), the simulator
runs it as an ordinary Python call, and arguments that are compile-time constants in the caller
(`op` below) fold away as if the body had been written in place.
"""

from __future__ import annotations

from ._cuda import cuda, int32, uint32

# `op` of `block_reduce`.
REDUCE_SUM = 0
REDUCE_MAX = 1


@cuda.jit(device=True, inline="always")
def block_reduce(buf, value, op):
    """Sum (`op == REDUCE_SUM`) or max (`REDUCE_MAX`) of `value` over the block's threads, returned to all.

    `buf` is a shared float32 array with exactly blockDim.x (a power of two) elements, indexed by
    threadIdx.x; the threads halve at each step of the tree. Every thread of the block must call it
    (it synchronises); `buf` may be reused right after, since the last sync follows the read of buf[0].
    """
    tid = cuda.threadIdx.x
    buf[tid] = value
    cuda.syncthreads()
    stride = buf.shape[0] // 2
    while stride > 0:
        if tid < stride:
            if op == REDUCE_MAX:
                buf[tid] = max(buf[tid], buf[tid + stride])
            else:
                buf[tid] += buf[tid + stride]
        cuda.syncthreads()
        stride //= 2
    result = buf[0]
    cuda.syncthreads()
    return result


@cuda.jit(device=True, inline="always")
def find_item(offsets, n_items, index):
    """The packed media item holding token `index`: the last n < n_items with `offsets[n] <= index`.

    `offsets` is 1-D int32, item n's first token (or first merged token) at n: `cu_seqlens`, or a
    column of `launch.item_table` (`items[:, ITEM_TOKEN_OFFSET]`). It starts at 0 and never
    decreases; an empty item shares its offset with the next one and is never returned, since the
    last match wins. Binary search: log2(N) reads whatever the number of items. Returns -1 when
    `index` precedes item 0; an index past the last item returns the last item, so callers
    bound-check `index` against the total first.
    """
    if n_items < 1 or index < offsets[0]:
        return -1
    # uint32 indices (no negative-index wraparound to compute) and an update by two selects, not an
    # if/else: numba-cuda-mlir 0.6 keeps lo and hi in a local-memory frame when each is assigned in one
    # branch (STL/LDL on every step); this way both compilers keep them in registers (notebook 09).
    lo = uint32(0)
    hi = uint32(n_items)
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        below = offsets[mid] <= index
        lo = mid if below else lo
        hi = hi if below else mid
    return int32(lo)  # not uint32: a uint32 and the -1 above would unify to float64
