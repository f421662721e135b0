"""Bank conflicts and coalescing of one warp-wide memory request, from the addresses its lanes touch.

A request is what one warp does at one access site in one dynamic instance: a list of
(lane, byte address, access size in bytes) for its active lanes.

Shared memory (`wavefronts`): 32 banks of 4 bytes; bank = (address // 4) % 32. A request is
served in phases: all 32 lanes at once for accesses of up to 4 bytes, half-warps (16 lanes) for
8-byte accesses, quarter-warps (8 lanes) for 16-byte accesses. In each phase every bank delivers
one 4-byte word per wavefront, and lanes reading the same word share it (broadcast), so a phase
takes max over banks of the number of *distinct* words wanted from that bank. The request takes
the sum over its phases. The ideal is one wavefront per phase that has an active lane; the
conflict factor is wavefronts / ideal (1 = conflict-free, 32 = fully serialised).

Global memory (`sectors`): memory moves in 32-byte sectors; a request costs the number of
distinct sectors its lanes' bytes fall in. The ideal is the fewest sectors that could hold the
distinct bytes requested, ceil(bytes / 32); the coalescing factor is sectors / ideal (1 = fully
coalesced; stride-K float reads by 32 lanes: 32 sectors for 128 useful bytes = 8).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

BANKS = 32
BANK_BYTES = 4
SECTOR_BYTES = 32
_PHASE_LANES = {1: 32, 2: 32, 4: 32, 8: 16, 16: 8}

Access = tuple[int, int, int]  # (lane, byte address, size in bytes)


def _check(accesses: Sequence[Access]) -> None:
    for lane, addr, size in accesses:
        if not 0 <= lane < 32:
            raise ValueError(f"lane {lane} is not in 0..31")
        if size not in _PHASE_LANES:
            raise ValueError(f"access size {size} B is not one of {sorted(_PHASE_LANES)}")
        if addr < 0:
            raise ValueError(f"negative address {addr}")


def wavefronts(accesses: Sequence[Access]) -> tuple[int, int]:
    """(wavefronts, ideal wavefronts) of one shared-memory request; sizes may not be mixed."""
    if not accesses:
        return 0, 0
    _check(accesses)
    sizes = {size for _, _, size in accesses}
    if len(sizes) != 1:
        raise ValueError(f"one request mixes access sizes {sorted(sizes)}")
    size = sizes.pop()
    per_phase = _PHASE_LANES[size]
    phases: dict[int, list[tuple[int, int]]] = {}
    for lane, addr, _ in accesses:
        phases.setdefault(lane // per_phase, []).append((addr, size))
    total = 0
    for reqs in phases.values():
        words_by_bank: dict[int, set[int]] = {}
        for addr, sz in reqs:
            for word in range(addr // BANK_BYTES, (addr + sz - 1) // BANK_BYTES + 1):
                words_by_bank.setdefault(word % BANKS, set()).add(word)
        total += max(len(w) for w in words_by_bank.values())
    return total, len(phases)


def sectors(accesses: Sequence[Access]) -> tuple[int, int]:
    """(32-byte sectors touched, ideal sectors for the distinct bytes) of one global-memory request."""
    if not accesses:
        return 0, 0
    _check(accesses)
    touched: set[int] = set()
    distinct_bytes: set[int] = set()
    for _, addr, size in accesses:
        touched.update(range(addr // SECTOR_BYTES, (addr + size - 1) // SECTOR_BYTES + 1))
        distinct_bytes.update(range(addr, addr + size))
    return len(touched), max(1, -(-len(distinct_bytes) // SECTOR_BYTES))


def strided(stride_bytes: int, size: int = 4, lanes: Iterable[int] = range(32), base: int = 0) -> list[Access]:
    """A request where lane i touches `size` bytes at `base + i·stride_bytes` (for tests and examples)."""
    return [(lane, base + lane * stride_bytes, size) for lane in lanes]
