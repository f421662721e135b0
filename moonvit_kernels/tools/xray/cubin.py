"""Resources read straight from a cubin (an ELF file): registers, stack frame and static shared memory.

The CUDA ELF layout used here: every kernel `f` has a section `.text.f` whose `sh_info` holds the
index of f's symbol in its low 24 bits (and, in sm_80/sm_89 cubins, the register count in its top
byte); the `.nv.info` section is a list of attribute records
`(u8 format, u8 attribute, u16 size, payload)`, among them EIATTR_REGCOUNT (0x2f) and
EIATTR_FRAME_SIZE (0x11), each with the payload `(u32 symbol index, u32 value)`; static
`__shared__` arrays of f live in `.nv.shared.f`. In sm_90 cubins (NVRTC and nvJitLink, CUDA 13)
that section's size also counts the 1 KiB per-block system reserve; in sm_80 / sm_89 cubins it
does not (ptxas -v never does), so the reserve is taken off for sm_90 and later only. Entry
functions (kernels) are told from device functions by their parameter bank `.nv.constant0.f`.
"""

from __future__ import annotations

import struct

_EIFMT_SVAL = 0x04
_EIATTR_REGCOUNT = 0x2F
_EIATTR_FRAME_SIZE = 0x11
SHARED_RESERVE = 1024


def _sections(data: bytes) -> list[tuple[str, int, int, int]]:
    """(name, sh_info, file offset, size) of every section of a 64-bit little-endian ELF."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF (cubin) file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = []
    for i in range(shnum):
        fields = struct.unpack_from("<IIQQQQII", data, shoff + i * shentsize)
        name, offset, size, info = fields[0], fields[4], fields[5], fields[7]
        headers.append((name, info, offset, size))
    str_off = headers[shstrndx][2]

    def name_at(k: int) -> str:
        end = data.index(b"\0", str_off + k)
        return data[str_off + k : end].decode(errors="replace")

    return [(name_at(n), info, offset, size) for n, info, offset, size in headers]


def _attributes(data: bytes, offset: int, size: int) -> list[tuple[int, bytes]]:
    out, p = [], offset
    while p + 4 <= offset + size:
        fmt, attr, value = data[p], data[p + 1], struct.unpack_from("<H", data, p + 2)[0]
        if fmt == _EIFMT_SVAL:
            out.append((attr, data[p + 4 : p + 4 + value]))
            p += 4 + value
        else:
            p += 4
    return out


def kernel_resources(cubin: bytes, arch: str = "sm_90") -> dict[str, dict[str, int]]:
    """{kernel symbol: {"registers", "stack_bytes", "static_shared"}} for every kernel (entry function)
    of a cubin built for `arch`.

    `static_shared` is the kernel's own static shared memory, without the reserve."""
    reserve = SHARED_RESERVE if int(arch.removeprefix("sm_").rstrip("af")) >= 90 else 0
    secs = _sections(cubin)
    by_symbol: dict[int, dict[str, int]] = {}
    for name, _, offset, size in secs:
        if name == ".nv.info":
            for attr, payload in _attributes(cubin, offset, size):
                if attr in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE) and len(payload) >= 8:
                    sym, value = struct.unpack_from("<II", payload)
                    key = "registers" if attr == _EIATTR_REGCOUNT else "stack_bytes"
                    by_symbol.setdefault(sym, {})[key] = value
    shared = {name[len(".nv.shared.") :]: size for name, _, _, size in secs if name.startswith(".nv.shared.")}
    entries = {name[len(".nv.constant0.") :] for name, _, _, _ in secs if name.startswith(".nv.constant0.")}
    out = {}
    for name, info, _, _ in secs:
        if name.startswith(".text.") and name[len(".text.") :] in entries:
            fn = name[len(".text.") :]
            found = by_symbol.get(info & 0xFFFFFF, {})
            out[fn] = {
                "registers": found.get("registers", info >> 24 or -1),
                "stack_bytes": found.get("stack_bytes", 0),
                "static_shared": max(0, shared.get(fn, 0) - reserve) if fn in shared else 0,
            }
    return out
