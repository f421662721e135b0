"""Shared launcher checks and helpers for the numba.cuda kernels.

numba validates nothing at launch: a wrong dtype compiles a new specialisation, a wrong shape
reads out of bounds, a strided view silently computes garbage. Every launcher therefore calls
`check_array` on each argument first, and `ValueError` names the argument and the problem.

Arrays accepted by launchers: numba device arrays (`numba.cuda.to_device`, `device_array`), or
host NumPy arrays for convenience, which `to_device` copies to the device (and `copy_back`
copies an in-place result back into). Launchers always return device arrays.

`check_launch` checks what the simulator cannot: every grid dimension (x < 2^31, y and z <= 65535),
threads per block, and the block's registers (per thread from the compile tier's table in
`registers.py`) against the register file's launch rule (`moonvit_kernels.launch_rules`: registers
go to warps in units of 256, and to each of an SM's 4 sub-partitions).

Also here: grid-size helpers and the int32 tables that describe packed media items.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import launch_rules, packing
from ._cuda import cuda, is_cuda_ndarray
from .nvvm import require_nvvm


# ============================================================================ array checks
def is_device_array(arr: Any) -> bool:
    """True for a numba device array (also under the CUDA simulator)."""
    return bool(is_cuda_ndarray(arr))


def check_array(
    name: str,
    arr: Any,
    dtype: Any = np.float32,
    shape: Sequence[int | None] | None = None,
    ndim: int | None = None,
    allow_empty: bool = False,
) -> tuple[int, ...]:
    """Validate one launcher argument and return its shape.

    `arr` must be a numba device array or a NumPy ndarray, of exactly `dtype`, C-contiguous,
    with `ndim` dimensions (or `len(shape)`), and matching `shape` where an entry is not None.
    Empty arrays are rejected unless `allow_empty` (a grid of zero blocks is a launch error).
    Raises ValueError naming `name`.
    """
    if not (is_device_array(arr) or isinstance(arr, np.ndarray)):
        raise ValueError(f"{name}: expected a numba device array or a NumPy array, got {type(arr).__name__}")
    dtype = np.dtype(dtype)
    if np.dtype(arr.dtype) != dtype:
        raise ValueError(f"{name}: dtype {np.dtype(arr.dtype)} is not {dtype}")
    got = tuple(int(s) for s in arr.shape)
    if shape is not None:
        ndim = len(shape)
    if ndim is not None and len(got) != ndim:
        raise ValueError(f"{name}: shape {got} has {len(got)} dimensions, expected {ndim}")
    if shape is not None:
        for axis, (g, want) in enumerate(zip(got, shape, strict=True)):
            if want is not None and g != want:
                raise ValueError(f"{name}: shape {got} does not match {_shape_str(shape)} (axis {axis})")
    if not allow_empty and 0 in got:
        raise ValueError(f"{name}: shape {got} is empty")
    if not _is_c_contiguous(arr):
        raise ValueError(f"{name}: array is not C-contiguous (strides {tuple(arr.strides)}); make a contiguous copy")
    return got


def _shape_str(shape: Sequence[int | None]) -> str:
    """`(?, 144)` for `(None, 144)`: None marks an axis of any size."""
    parts = ["?" if s is None else str(s) for s in shape]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _is_c_contiguous(arr: Any) -> bool:
    if isinstance(arr, np.ndarray):
        return bool(arr.flags.c_contiguous)
    return bool(arr.is_c_contiguous())


def check_positive(name: str, value: Any) -> int:
    """An integer size argument >= 1, returned as a Python int."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


# ============================================================================ host <-> device
def to_device(arr: Any) -> Any:
    """A device array holding `arr`: device arrays pass through unchanged, NumPy arrays are copied."""
    if is_device_array(arr):
        return arr
    return cuda.to_device(np.ascontiguousarray(arr))


def device_array(shape: int | Sequence[int], dtype: Any = np.float32) -> Any:
    """An uninitialised device array (C order)."""
    return cuda.device_array(shape, dtype=np.dtype(dtype))


def copy_back(host: Any, device: Any) -> None:
    """If `host` is a NumPy array, copy `device` into it (the in-place result of a launcher)."""
    if isinstance(host, np.ndarray) and not is_device_array(host):
        device.copy_to_host(host)


# ============================================================================ kernels
def jit_named(fn: Any, name: str) -> Any:
    """`cuda.jit(fn)` under its own name: each specialisation a factory builds (one per epilogue,
    block size, mode) then shows up distinctly in profilers and in the compile tier's report."""
    fn.__name__ = fn.__qualname__ = name
    return cuda.jit(fn)


# ============================================================================ launch limits
# Hardware limits the simulator does not enforce (sm_80, sm_89, sm_90 alike).
MAX_THREADS_PER_BLOCK = 1024
MAX_GRID = (2**31 - 1, 65535, 65535)  # blocks along x, y, z
MAX_BLOCK = (1024, 1024, 64)  # threads along x, y, z


def kernel_name(kernel: Any) -> str:
    """The specialised name of a kernel (its Python function's name, e.g. `gemm_v3_residual`)."""
    return str(kernel.py_func.__name__)


def block_registers(registers_per_thread: int, threads: int) -> int:
    """Registers a block of `threads` takes: per warp, 32·registers rounded up to 256."""
    return launch_rules.warps_of(threads) * launch_rules.registers_per_warp(registers_per_thread)


def max_threads_for(registers_per_thread: int) -> int:
    """The most threads (a multiple of 32, at most 1024) a block may have at this many registers per
    thread (`launch_rules.max_threads_for`: per warp, per SM sub-partition)."""
    return launch_rules.max_threads_for(registers_per_thread)


def kernel_registers(name: str, compiler: str | None = None) -> tuple[int, str]:
    """Registers per thread of the kernel called `name`, and where the number comes from.

    The compile tier's table of `compiler` (default: the one building the kernels, `_cuda.COMPILER`;
    `registers.KERNEL_REGISTERS`) when it lists the kernel; for another specialisation of a listed family
    (e.g. `attention_v2_hd64_...`: the table holds head_dim 128 and 24) the family's largest entry, an
    estimate; otherwise ASSUMED_REGISTERS.
    """
    from ._cuda import COMPILER
    from .registers import ASSUMED_REGISTERS, registers_for

    table = registers_for(compiler or COMPILER)
    if name in table:
        return table[name], "from the compile tier"
    family = name.split("_hd")[0] + "_hd" if "_hd" in name else None
    relatives = [r for k, r in table.items() if family and k.startswith(family)]
    if relatives:
        return max(relatives), f"estimated: the most of the {family}* kernels in the compile tier"
    return ASSUMED_REGISTERS, "assumed: not in the compile tier's table"


def check_launch(kernel: Any, blocks: Any, threads: Any, registers_of: str | None = None) -> tuple[Any, Any]:
    """Check a launch shape against the GPU's limits; returns `(blocks, threads)` unchanged.

    `blocks` and `threads` are ints or tuples (x, y, z order). Every grid dimension must be in
    1..MAX_GRID, the block 1..1024 threads, and the block's registers (per-thread count from
    `kernel_registers` under the kernel's name, or `registers_of` when a specialisation
    shares another's count) must pass `launch_rules.register_problem`. Raises ValueError naming the kernel,
    or `nvvm.NvvmUnavailable` when numba-cuda cannot compile on this machine (checked once, before the first compile).
    """
    name = kernel_name(kernel)
    grid = (blocks,) if isinstance(blocks, (int, np.integer)) else tuple(blocks)
    block = (threads,) if isinstance(threads, (int, np.integer)) else tuple(threads)
    for axis, (n, limit) in enumerate(zip(grid, MAX_GRID, strict=False)):
        if not 1 <= int(n) <= limit:
            raise ValueError(
                f"{name}: grid dimension {'xyz'[axis]} = {int(n)} blocks is outside 1..{limit} (grid {grid})"
            )
    count = int(np.prod(block))
    if min(block) < 1 or count > MAX_THREADS_PER_BLOCK or any(n > m for n, m in zip(block, MAX_BLOCK, strict=False)):
        raise ValueError(
            f"{name}: block {block} must have 1..{MAX_THREADS_PER_BLOCK} threads (at most {MAX_BLOCK} along "
            f"x, y, z), has {count}"
        )
    registers, source = kernel_registers(registers_of or name)
    problem = launch_rules.register_problem(registers, count)
    if problem:
        raise ValueError(f"{name}: {problem} ({source}): use at most {max_threads_for(registers)} threads")
    require_nvvm()  # before the first compile: one clear line when numba-cuda cannot compile here (once a process)
    return blocks, threads


# ============================================================================ grid sizes
def ceil_div(n: int, d: int) -> int:
    """`ceil(n / d)` for positive integers: the number of blocks covering n items."""
    return -(-int(n) // int(d))


def grid_2d(rows: int, cols: int, block_rows: int, block_cols: int) -> tuple[int, int]:
    """Blocks `(x, y)` covering a rows x cols output: x runs over columns, y over rows."""
    return ceil_div(cols, block_cols), ceil_div(rows, block_rows)


def threads_for(n: int, max_threads: int = 256, min_threads: int = 32) -> int:
    """A power of two in [min_threads, max_threads], the smallest >= n when possible.

    For one-block-per-row kernels: a row of n elements gets at most one element per thread
    before the kernel starts striding. Powers of two keep tree reductions simple.
    """
    t = min_threads
    while t < n and t < max_threads:
        t *= 2
    return t


# ============================================================================ packed media items
# written once in moonvit_kernels.packing; the names the numba kernels use
grid_table = packing.grid_table
cu_seqlens_table = packing.cu_seqlens
item_table = packing.item_table
ITEM_T, ITEM_H, ITEM_W = packing.ITEM_T, packing.ITEM_H, packing.ITEM_W
ITEM_TOKEN_OFFSET, ITEM_MERGED_OFFSET = packing.ITEM_TOKEN_OFFSET, packing.ITEM_MERGED_OFFSET
