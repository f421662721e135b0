"""How the register file decides whether a block launches and how many fit on an SM (pure functions).

The rule, as the CUDA occupancy calculator states it (`cuda_occupancy.h` of the CUDA 13.0 runtime
headers, `cudaOccMaxBlocksPerSMRegsLimit`, `cudaOccRegAllocationGranularity`,
`cudaOccSubPartitionsPerMultiprocessor`):

  per warp     registers go to whole warps, R·32 rounded up to the allocation unit of 256
               (compute capability 3.x to 12.x): `registers_per_warp(R) = ceil(R·32 / 256)·256`;
  per SM       the 65,536-register file is split into 4 sub-partitions (cc 7.x to 12.x) of 16,384,
               each holding floor(16,384 / registers_per_warp) warps: an SM holds
               `warps_by_registers(R) = 4·floor(16,384 / registers_per_warp(R))` warps;
  launch       the hardware checks a block's registers as if its warps were spread over all four
               sub-partitions: registers_per_warp · round_up(warps, 4) <= 65,536 registers per block,
               which is the same as `warps <= warps_by_registers(R)`;
  residency    blocks per SM by registers = floor(warps_by_registers(R) / warps per block).

A block of T threads and R registers per thread therefore launches only if
ceil(T / 32) <= 4·floor(16,384 / (ceil(R·32 / 256)·256)) (and T <= 1024, R <= 255). Examples:
80 registers -> 2,560 per warp -> 6 warps per sub-partition -> at most 24 warps = 768 threads
(the simplified registers x threads <= 65,536 would allow 800); 129 registers -> 4,352 per warp ->
3 per sub-partition -> 384 threads (not 480).

The numbers (65,536 registers per SM and per block, at most 255 per thread, 1024 threads per block)
are those of the CUDA C++ Programming Guide's table of technical specifications per compute
capability for 8.0, 8.6, 8.9 and 9.0, the architectures this project builds for: one register file
serves them all (`REGISTER_FILE`). Nothing here imports CUDA: the launchers, the compile tiers and
the kernel X-ray all ask this module.
"""

from __future__ import annotations

from dataclasses import dataclass

WARP_SIZE = 32
MAX_THREADS_PER_BLOCK = 1024


@dataclass(frozen=True)
class RegisterFile:
    """An SM's register file and the rules it allocates by (32-bit registers)."""

    per_sm: int = 65536
    per_block: int = 65536
    per_thread_max: int = 255
    unit: int = 256  # registers go to a warp in multiples of this
    sub_partitions: int = 4  # each holds per_sm / sub_partitions registers and its own warps


# sm_80, sm_86, sm_89 and sm_90 alike
REGISTER_FILE = RegisterFile()


def _ceil_div(n: int, d: int) -> int:
    return -(-int(n) // int(d))


def warps_of(threads: int) -> int:
    """Warps a block of `threads` threads occupies (a partial warp is a whole one)."""
    return _ceil_div(threads, WARP_SIZE)


def registers_per_warp(registers: int, rf: RegisterFile = REGISTER_FILE) -> int:
    """Registers one warp is given: `registers`·32 rounded up to the allocation unit (0 for 0)."""
    return _ceil_div(registers * WARP_SIZE, rf.unit) * rf.unit


def warps_by_registers(registers: int, rf: RegisterFile = REGISTER_FILE) -> int:
    """Most warps of `registers` registers per thread an SM holds: per sub-partition, then times 4."""
    per_warp = registers_per_warp(max(registers, 1), rf)
    return rf.sub_partitions * ((rf.per_sm // rf.sub_partitions) // per_warp)


def register_problem(registers: int, threads: int, rf: RegisterFile = REGISTER_FILE) -> str | None:
    """Why a block of `threads` threads with `registers` registers each cannot launch, or None if it can.

    Checks the per-thread cap and the hardware's per-block check (registers per warp x warps rounded
    up to the sub-partitions <= per-block registers)."""
    if registers < 0 or threads < 1:
        raise ValueError(f"registers={registers} must be >= 0 and threads={threads} >= 1")
    if registers > rf.per_thread_max:
        return f"{registers} registers per thread > {rf.per_thread_max}"
    warps = warps_of(threads)
    per_warp = registers_per_warp(registers, rf)
    assumed = per_warp * _ceil_div(warps, rf.sub_partitions) * rf.sub_partitions
    if assumed > rf.per_block:
        return (
            f"{threads} threads x {registers} registers do not fit the register file: {per_warp} registers per "
            f"warp, {(rf.per_sm // rf.sub_partitions) // per_warp} warps per SM sub-partition x "
            f"{rf.sub_partitions} = at most {warps_by_registers(registers, rf)} warps, the block has {warps}"
        )
    return None


def max_threads_for(registers: int, rf: RegisterFile = REGISTER_FILE) -> int:
    """The most threads (a multiple of 32, at most 1024) a block of `registers` registers per thread
    may have and still launch; 0 when no block can (over the per-thread cap)."""
    if registers > rf.per_thread_max:
        return 0
    return min(MAX_THREADS_PER_BLOCK, warps_by_registers(registers, rf) * WARP_SIZE)


def max_registers_for(threads: int, rf: RegisterFile = REGISTER_FILE) -> int:
    """The most registers per thread (at most 255) with which a block of `threads` threads launches;
    a bound to hand the compiler (ptxas allocates in multiples of 8 below the cap)."""
    if not 1 <= threads <= MAX_THREADS_PER_BLOCK:
        raise ValueError(f"threads={threads} is not in 1..{MAX_THREADS_PER_BLOCK}")
    slots = _ceil_div(warps_of(threads), rf.sub_partitions)  # warps each sub-partition must hold
    per_warp = (rf.per_sm // rf.sub_partitions) // slots // rf.unit * rf.unit
    return min(rf.per_thread_max, per_warp // WARP_SIZE)


def blocks_by_registers(registers: int, threads: int, rf: RegisterFile = REGISTER_FILE) -> int:
    """Blocks of `threads` threads that the register file lets reside on one SM (0 if none launches)."""
    if register_problem(registers, threads, rf):
        return 0
    return warps_by_registers(registers, rf) // warps_of(threads)
