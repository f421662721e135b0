"""Guarded device memory of the emulated device: a kernel that runs past an array's end is caught.

Each allocation is shared memory (`mmap` MAP_SHARED, so a launch's forked child writes it) laid out as

    [ GUARD_BYTES PROT_NONE | front canary | the array | back canary | GUARD_BYTES PROT_NONE ]

The array starts `START_ALIGN`-aligned (as CuPy's allocator gives) and ends as close to the back guard as
that allows: the back canary is the array's size rounded up to `START_ALIGN` (fewer than 256 bytes), the front
canary what rounds the data up to whole pages. A read or write that reaches a guard region faults; the
launch's fault handler reports the address, and `overrun` names the array it ran past. Writes into the canaries
(the bytes between the array and its guards) are found after the launch by `dirty_canary`. A read of the
canaries is not caught: it reads the canary pattern, 0x7FC0 in every 16-bit word (a bf16, half and float32 NaN).
"""

from __future__ import annotations

import ctypes
import mmap
import weakref
from typing import Any

GUARD_BYTES = 64 * 1024  # PROT_NONE on each side: an overrun up to this far is named, further ones fault plainly
START_ALIGN = 256
_CANARY = b"\xc0\x7f"  # 0x7FC0 little-endian; period 2 from every allocation's even data offset
_PROT_NONE = 0


class GuardedMap(mmap.mmap):
    """The shared memory of one device allocation (see the module doc); `describe` says what it holds."""

    base: int  # address of the map's first byte (the front guard)
    start: int  # offset of the array's first byte in the map
    nbytes: int
    data_end: int  # offset of the back guard
    describe: str

    @property
    def array_address(self) -> int:
        return self.base + self.start


_LIVE: weakref.WeakValueDictionary[int, GuardedMap] = weakref.WeakValueDictionary()


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return libc


_LIBC = _libc()


def _protect(address: int, length: int) -> None:
    if _LIBC.mprotect(address, length, _PROT_NONE) != 0:
        raise OSError(ctypes.get_errno(), "mprotect of a guard region failed")


def _pattern(offset: int, length: int) -> bytes:
    """The canary bytes at data offsets [offset, offset + length) (the pattern's phase is the offset's parity)."""
    return (_CANARY * (length // 2 + 2))[offset % 2 : offset % 2 + length]


def allocate(nbytes: int, describe: str) -> GuardedMap:
    """A guarded map for an array of `nbytes` bytes (its first byte at `map.start`); `describe` names the array
    in bounds errors (shape, dtype, size)."""
    nbytes = int(nbytes)
    span = -(-nbytes // START_ALIGN) * START_ALIGN
    data = -(-span // mmap.PAGESIZE) * mmap.PAGESIZE
    m = GuardedMap(-1, GUARD_BYTES + data + GUARD_BYTES)
    m.base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    m.start, m.nbytes, m.data_end, m.describe = GUARD_BYTES + data - span, nbytes, GUARD_BYTES + data, describe
    _protect(m.base, GUARD_BYTES)
    _protect(m.base + m.data_end, GUARD_BYTES)
    for lo, hi in _canaries(m):
        m[lo:hi] = _pattern(lo - GUARD_BYTES, hi - lo)
    _LIVE[m.base] = m
    return m


def _canaries(m: GuardedMap) -> tuple[tuple[int, int], tuple[int, int]]:
    """The map offsets of the front and back canary."""
    return (GUARD_BYTES, m.start), (m.start + m.nbytes, m.data_end)


def map_of(a: Any) -> GuardedMap | None:
    """The guarded map under NumPy array `a` (a view of it included), or None."""
    base = a
    while hasattr(base, "base") and not isinstance(base, mmap.mmap):
        base = base.base
    return base if isinstance(base, GuardedMap) else None


def dirty_canary(m: GuardedMap) -> str | None:
    """Where a kernel wrote into `m`'s canaries (restoring them), in words; None when they are intact."""
    found = []
    for lo, hi in _canaries(m):
        want = _pattern(lo - GUARD_BYTES, hi - lo)
        got = m[lo:hi]
        if got == want:
            continue
        changed = [lo + i for i in range(hi - lo) if got[i] != want[i]]
        found.append(_span_words(m, changed[0], changed[-1]))
        m[lo:hi] = want
    return "; ".join(found) or None


def _where(m: GuardedMap, offset: int) -> tuple[int, str]:
    """(k, side): the map offset is byte k (from 1) before the array's start or past its end."""
    if offset < m.start:
        return m.start - offset, "before the start"
    return offset - m.start - m.nbytes + 1, "past the end"


def _span_words(m: GuardedMap, first: int, last: int) -> str:
    """Map offsets first..last (one side of the array) in words."""
    (a, side), (b, _) = _where(m, first), _where(m, last)
    return f"byte {a} {side}" if a == b else f"bytes {min(a, b)} to {max(a, b)} {side}"


def overrun(address: int) -> tuple[GuardedMap, str] | None:
    """(the map, where `address` lies relative to its array in words) when `address` is in a guard region."""
    for m in list(_LIVE.values()):
        offset = address - m.base
        if 0 <= offset < GUARD_BYTES or m.data_end <= offset < m.data_end + GUARD_BYTES:
            return m, _span_words(m, offset, offset)
    return None
