"""Address traces of the CUDA C kernels on the emulated device (for `moonvit_kernels.tools.xray`).

The traced variant of a module (`build.build_module(..., traced=True)`, which the emulated device's
`RawModule` loads within `device.tracing(recording)`): the module's unit is compiled with GCC's
`-fsanitize=thread`, which calls `__tsan_readN` / `__tsan_writeN` before every memory access, and linked
with `trace_hooks.cpp`, which implements those calls by recording the accesses of emulated CUDA threads
to registered memory (no ThreadSanitizer runtime is involved). The ldmatrix / cp.async stand-ins of
the patched `ptx.cuh` (`patch_ptx`) report one 16-byte row (ldmatrix) or one 16-byte copy (cp.async)
per lane at their caller's line, and not the element gathers they do internally.

A `Recording` is what the device calls a launch through: it registers the launch's device arrays
(named by the recording, in argument order), the static `__shared__` arrays of the functions it
names (`static_shared`, read with `nm` from the module's traced library) and slices of the block's
dynamic shared memory, runs the launch in this process, and keeps the records as tuples
`(space, array, site, store, block, thread, offset, size, instance)` that
`moonvit_kernels.tools.xray.trace.analyse` costs per warp request. Sites of instrumented accesses are
(file, line, instruction address), resolved with addr2line from the debug info; a kernel source the
module's `#line` directives name is read from `cuda_backend/`. The host compiler may split a vector
access (a `float4` load) into narrower ones: consecutive accesses of one thread on one source line
that names a vector type, contiguous and aligned, are merged back (up to 16 B), so that the request
is costed as the GPU issues it.
"""

from __future__ import annotations

import ctypes
import functools
import re
import subprocess
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moonvit_kernels.cuda_backend import sources as kcuda

RECORD = np.dtype(
    [("pc", "<u8"), ("file", "<u8"), ("line", "<i4"), ("region", "<i4"), ("offset", "<i8"), ("size", "<i4"),
     ("store", "<i4"), ("block", "<i4"), ("thread", "<i4")]
)  # fmt: skip
_HOOK_DECL = 'extern "C" void emu_trace_explicit(const void*, int, int, const char*, int);\n'
_SITE_ARGS = "const char* emu_file_ = __builtin_FILE(), int emu_line_ = __builtin_LINE()"


def patch_ptx(text: str) -> str:
    """The ptx.cuh stand-in with ldmatrix / cp.async reporting their accesses (see the module doc)."""
    out = _HOOK_DECL + text
    out, n_cp = re.subn(
        r"(__device__ __forceinline__ void cp_async_16\(void\* dst, const void\* src, bool valid)\) \{",
        r"__attribute__((no_sanitize_thread)) \1, " + _SITE_ARGS + ") {\n"
        "  emu_trace_explicit(dst, 16, 1, emu_file_, emu_line_);\n"
        "  if (valid) emu_trace_explicit(src, 16, 0, emu_file_, emu_line_);",
        out,
    )
    out, n_ld = re.subn(
        r"(__device__ __forceinline__ void ldmatrix_x4(?:_trans)?\(unsigned \(&r\)\[4\], const void\* p)\) \{",
        r"\1, " + _SITE_ARGS + ") { emu_trace_explicit(p, 16, 0, emu_file_, emu_line_);",
        out,
    )
    out = out.replace(
        "inline unsigned short emu_b16(", "__attribute__((no_sanitize_thread)) inline unsigned short emu_b16("
    )
    out = out.replace("inline void emu_ldmatrix(", "__attribute__((no_sanitize_thread)) inline void emu_ldmatrix(")
    if n_cp != 1 or n_ld != 2:
        raise RuntimeError("tracing: the ptx.cuh stand-in changed shape; update emulation/tracing.patch_ptx")
    return out


# the instrumented build: the plain build's -Og, line tables for the sites (-g1: all addr2line reads), every
# warning off (the tracer reads, it does not judge)
TRACE_FLAGS = ("-std=c++20", "-Og", "-g1", "-fPIC", "-fno-gnu-unique", "-pthread", "-w")


@functools.cache
def _symbols(lib_path: Path) -> list[tuple[int, int, str]]:
    """(address, size, demangled name) of the library's function-local statics (static __shared__ arrays)."""
    r = subprocess.run(["nm", "-S", "-C", "--defined-only", str(lib_path)], capture_output=True, text=True, check=True)
    out = []
    for line in r.stdout.splitlines():
        parts = line.split(maxsplit=3)
        if len(parts) == 4 and parts[2] in "bBdDuV" and "::" in parts[3] and "guard variable" not in parts[3]:
            out.append((int(parts[0], 16), int(parts[1], 16), parts[3]))
        elif len(parts) >= 3 and parts[-1] == "emu_trace_anchor":
            out.append((int(parts[0], 16), 0, "emu_trace_anchor"))
    return out


def static_shared(lib: ctypes.CDLL, function_prefix: str) -> list[tuple[str, int, int]]:
    """(array name, runtime address, bytes) of the static `__shared__` arrays in traced library `lib` of
    functions whose demangled name starts with `function_prefix` (e.g. "gemm_fp32_simt<3>")."""
    syms = _symbols(Path(lib._name))
    base = _load_base(lib)
    return [(n.rsplit("::", 1)[1], base + a, s) for a, s, n in syms if n.startswith(function_prefix) and s]


def _load_base(lib: ctypes.CDLL) -> int:
    """Where traced library `lib` is loaded: runtime address minus the address `nm` gives."""
    lib.emu_trace_anchor.restype = ctypes.c_void_p
    (anchor,) = [a for a, _, n in _symbols(Path(lib._name)) if n == "emu_trace_anchor"]
    return lib.emu_trace_anchor() - anchor


def _addr2line(lib_path: Path, offsets: Sequence[int]) -> dict[int, tuple[str, int]]:
    if not offsets:
        return {}
    r = subprocess.run(
        ["addr2line", "-e", str(lib_path), *[hex(o) for o in offsets]], capture_output=True, text=True, check=True
    )
    out = {}
    for off, line in zip(offsets, r.stdout.splitlines(), strict=False):
        file, _, num = line.rpartition(":")
        num = num.split()[0] if num else "0"
        out[off] = (file, int(num) if num.isdigit() else 0)
    return out


_VECTOR = re.compile(r"\b(float[24]|u?int[24]|uint[24]|__nv_bfloat162|load_float[24]|store_float[24])\b")


@functools.cache
def _vector_line(file: str, line: int) -> bool:
    """True when a source line reads or writes through a vector type (float4, uint2, ...)."""
    import linecache

    return bool(_VECTOR.search(linecache.getline(file, line)))


@functools.cache
def _source_file(name: str) -> str:
    """The file a site's file name stands for: a kernel source or header the module's `#line` directives name
    (not a file where the compiler ran) is the one in `cuda_backend/`."""
    path = Path(name)
    if path.is_file() or not (kcuda.KERNEL_DIR / path.name).is_file():
        return name
    return str(kcuda.KERNEL_DIR / path.name)


@dataclass
class Recording:
    """What to record of a launch on the emulated device (`device.tracing(recording)`), and the records.

    `arrays`: names of the launch's device-array arguments in order (an argument at the address of an
    earlier one is that one); `shared`: prefixes of the functions whose static `__shared__` arrays are
    recorded; `dynamic`: (name, offset, bytes) slices of the block's dynamic shared memory; `blocks`:
    record the blocks of linear index below it only (None: all)."""

    arrays: Sequence[str]
    shared: Sequence[str] = ()
    dynamic: Sequence[tuple[str, int, int]] = ()
    blocks: int | None = None
    records: list[tuple] = field(default_factory=list)

    def launch(self, lib: ctypes.CDLL, args: Sequence[Any], run: Callable[[], Any]) -> Any:
        """`run()`, the device's launch of a kernel of traced library `lib` with `args`, recorded; its result."""
        regions = self._regions(lib, args)
        lib.emu_trace_reset()
        for _, _, addr, nbytes in regions:
            lib.emu_trace_region(ctypes.c_void_p(addr), ctypes.c_longlong(nbytes))
        lib.emu_trace_blocks(ctypes.c_longlong(-1 if self.blocks is None else self.blocks))
        lib.emu_trace_enable(1)
        try:
            got = run()
        finally:
            lib.emu_trace_enable(0)
        self.records += _decode(lib, [(space, name) for space, name, _, _ in regions], self.dynamic)
        return got

    def _regions(self, lib: ctypes.CDLL, args: Sequence[Any]) -> list[tuple[str, str, int, int]]:
        """(space, name, address, bytes) of the memory to record: the device arrays, then the static shared arrays."""
        arrays = [a for a in args if isinstance(a, np.ndarray)]
        if len(arrays) != len(self.arrays):
            raise ValueError(f"the launch passes {len(arrays)} device arrays; the recording names {list(self.arrays)}")
        out: list[tuple[str, str, int, int]] = []
        for name, a in zip(self.arrays, arrays, strict=True):
            if all(addr != a.ctypes.data for _, _, addr, _ in out):
                out.append(("global", name, a.ctypes.data, a.nbytes))
        for prefix in self.shared:
            out += [("shared", name, addr, nbytes) for name, addr, nbytes in static_shared(lib, prefix)]
        return out


def _decode(lib: ctypes.CDLL, spans: Sequence[tuple[str, str]], dynamic: Sequence[tuple[str, int, int]]) -> list[tuple]:
    """The records `lib` holds as tuples for `moonvit_kernels.tools.xray.trace.analyse`; `spans`: (space, name)
    of each registered region, `dynamic`: (name, offset, bytes) slices of dynamic shared memory."""
    lib.emu_trace_count.restype = ctypes.c_longlong
    if lib.emu_trace_record_size() != RECORD.itemsize:
        raise RuntimeError("tracing: record layout mismatch between trace_hooks.cpp and tracing.py")
    path = Path(lib._name)
    n = lib.emu_trace_count()
    recs = np.zeros(n, RECORD)
    if n:
        lib.emu_trace_copy(recs.ctypes.data_as(ctypes.c_void_p))
    base = _load_base(lib)
    pcs = sorted({int(p) - base - 1 for p in np.unique(recs["pc"]) if p})
    lines = _addr2line(path, pcs)
    files: dict[int, str] = {}
    rows = []
    for r in recs.tolist():
        pc, fptr, line, region, offset, size, store, block, thread = r
        if pc:
            file, line = lines.get(pc - base - 1, ("?", 0))
            site = (_source_file(file), line, pc)
        else:
            if fptr not in files:
                files[fptr] = _source_file(ctypes.string_at(fptr).decode(errors="replace"))
            site = (files[fptr], line, 0)
        prev = rows[-1] if rows else None
        if (
            prev is not None
            and pc
            and (prev[0], prev[1], prev[3], prev[6], prev[7]) == (site[0], site[1], region, store, block)
            and prev[8] == thread
            and prev[4] + prev[5] == offset
            and prev[5] + size <= 16
            and prev[4] % (1 << (prev[5] + size - 1).bit_length()) == 0
            and _vector_line(site[0], site[1])
        ):
            rows[-1] = (*prev[:5], prev[5] + size, *prev[6:])
            continue
        rows.append((site[0], site[1], site[2], region, offset, size, store, block, thread))
    counts: dict[tuple, int] = defaultdict(int)
    out = []
    for file, line, pc, region, offset, size, store, block, thread in rows:
        site = (file, line, pc)
        if region == -1:
            space, name = "shared", "dynamic"
            for dname, doff, dbytes in dynamic:
                if doff <= offset < doff + dbytes:
                    name, offset = dname, offset - doff
                    break
        else:
            space, name = spans[region]
        key = (block, thread, site, store, name)
        counts[key] += 1
        out.append((space, name, site, bool(store), block, thread, offset, size, counts[key]))
    return out
