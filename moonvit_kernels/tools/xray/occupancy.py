"""Theoretical occupancy of one kernel launch on one architecture (the occupancy calculator's rules).

Inputs: registers per thread (from the compiled binary), threads per block and shared memory per
block (static from the binary + dynamic from the launcher). Per SM, the resident blocks are the
minimum of four limits:
  registers  `launch_rules.blocks_by_registers`: each warp gets ceil(regs·32 / 256)·256 registers, each
             of the SM's 4 sub-partitions holds floor(16,384 / that) warps, then floor(warps / warps_per_block)
  shared     each block takes round_up(static + dynamic + 1 KiB reserve, 128 B) (the reserve is counted for
             every block, as cudaOccupancyMaxActiveBlocksPerMultiprocessor does); floor(SM shared / that)
  warps      floor(max warps per SM / warps per block)
  blocks     the hardware's max blocks per SM
A block that cannot launch at all (too many threads, registers over `launch_rules.register_problem`,
shared memory over the opt-in limit) gets 0 blocks and says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from moonvit_kernels import launch_rules
from moonvit_kernels.tools.xray.arch import ArchLimits, limits


def _ceil_to(n: int, unit: int) -> int:
    return -(-n // unit) * unit


@dataclass
class Occupancy:
    """Resident blocks and warps per SM and which resource limits them."""

    arch: str
    threads: int
    registers: int
    shared_bytes: int  # static + dynamic, without the reserve
    blocks_per_sm: int
    warps_per_sm: int
    occupancy: float  # resident warps / max warps
    limiter: str  # "registers", "shared", "warps", "blocks" (several joined by "+"), or "cannot launch"
    by_limit: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def occupancy(
    arch: str | ArchLimits, threads: int, registers: int, static_shared: int = 0, dynamic_shared: int = 0
) -> Occupancy:
    """Blocks and warps per SM of a kernel with `registers` per thread launched with `threads` threads
    and `static_shared + dynamic_shared` bytes of shared memory per block, on `arch`."""
    lim = limits(arch) if isinstance(arch, str) else arch
    if threads < 1 or registers < 0 or static_shared < 0 or dynamic_shared < 0:
        raise ValueError(
            f"occupancy: threads={threads}, registers={registers}, shared={static_shared}+{dynamic_shared} must be >= 0"
        )
    warps = -(-threads // 32)
    shared = static_shared + dynamic_shared
    problems = []
    if threads > lim.max_threads_per_block:
        problems.append(f"{threads} threads > {lim.max_threads_per_block} per block")
    if register_problem := launch_rules.register_problem(registers, threads, lim.register_file):
        problems.append(register_problem)
    if static_shared > lim.shared_static_max:
        problems.append(f"{static_shared} B static shared > {lim.shared_static_max} B")
    if shared > lim.shared_per_block_optin:
        problems.append(f"{shared} B shared > {lim.shared_per_block_optin} B per block (opt-in limit)")
    by_limit = {
        "registers": launch_rules.warps_by_registers(registers, lim.register_file) // warps,
        "shared": (lim.shared_per_sm // _ceil_to(shared + lim.shared_reserved_per_block, lim.shared_unit)),
        "warps": lim.max_warps_per_sm // warps,
        "blocks": lim.max_blocks_per_sm,
    }
    blocks = 0 if problems else min(by_limit.values())
    if problems:
        limiter = "cannot launch"
    else:
        limiter = "+".join(k for k, v in by_limit.items() if v == blocks)
    return Occupancy(
        arch=lim.arch,
        threads=threads,
        registers=registers,
        shared_bytes=shared,
        blocks_per_sm=blocks,
        warps_per_sm=blocks * warps,
        occupancy=blocks * warps / lim.max_warps_per_sm,
        limiter=limiter,
        by_limit=by_limit,
        problems=problems,
    )
