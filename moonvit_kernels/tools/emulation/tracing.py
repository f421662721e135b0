"""Address traces of the CUDA C kernels on the CPU emulator (for `moonvit_kernels.tools.xray`).

A second build of the emulator library: the kernels (`driver.cpp` and what it includes, exactly as
`library()` builds them) are compiled with GCC's `-fsanitize=thread`, which calls `__tsan_readN` /
`__tsan_writeN` before every memory access, and linked with `trace_hooks.cpp`, which implements
those calls by recording the accesses of emulated CUDA threads to registered memory (no
ThreadSanitizer runtime is involved). The ldmatrix / cp.async stand-ins of the copied `ptx.cuh`
are patched to report one 16-byte row (ldmatrix) or one 16-byte copy (cp.async) per lane at their
caller's line, and not to record the element gathers they do internally.

`traced_library()` builds and loads it; `run(launch, regions)` returns the records as tuples
`(space, array, site, store, block, thread, offset, size, instance)` that
`moonvit_kernels.tools.xray.trace.analyse` costs per warp request. Sites of instrumented accesses are
(file, line, instruction address), resolved with addr2line from the debug info. The host compiler
may split a vector access (a `float4` load) into narrower ones: consecutive accesses of one thread
on one source line that names a vector type, contiguous and aligned, are merged back (up to 16 B),
so that the request is costed as the GPU issues it.
"""

from __future__ import annotations

import ctypes
import functools
import re
import subprocess
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from moonvit_kernels.cuda_backend import sources as kcuda
from moonvit_kernels.tools.emulation import HERE, build

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


# the instrumented build: debug info for the sites, every warning off (the tracer reads, it does not judge)
TRACE_FLAGS = ("-std=c++20", "-O1", "-g", "-fPIC", "-fno-gnu-unique", "-pthread", "-w")


@functools.cache
def traced_library() -> tuple[ctypes.CDLL, Path]:
    """Build (cached; `build.build_library`) and load (`build.load`) the instrumented emulator; (library, its path)."""
    files = {
        name: build.for_emulator((kcuda.KERNEL_DIR / name).read_text(encoding="utf-8"))
        for name in (*kcuda.PORTABLE_SOURCES, "common.cuh")
    }
    for name in ("driver.cpp", "trace_hooks.cpp"):
        files[name] = (HERE / name).read_text(encoding="utf-8")
    patched = {"ptx.cuh": patch_ptx((HERE / "ptx.cuh").read_text(encoding="utf-8"))}
    lib_path = build.build_library(
        files,
        "driver.cpp",
        standins=("prelude.h", "ptx.cuh", "cuda_bf16.h"),
        replace_standins=patched,
        tag="trace",
        units=[("driver.cpp", ("-fsanitize=thread",)), ("trace_hooks.cpp", ())],
        flags=TRACE_FLAGS,
    )
    lib = build.load(lib_path)
    lib.emu_trace_region.restype = ctypes.c_int
    lib.emu_trace_region.argtypes = [ctypes.c_void_p, ctypes.c_longlong]
    lib.emu_trace_count.restype = ctypes.c_longlong
    lib.emu_trace_anchor.restype = ctypes.c_void_p
    if lib.emu_trace_record_size() != RECORD.itemsize:
        raise RuntimeError("tracing: record layout mismatch between trace_hooks.cpp and tracing.py")
    return lib, lib_path


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


def static_shared(function_prefix: str) -> list[tuple[str, int, int]]:
    """(array name, runtime address, bytes) of static `__shared__` arrays of functions whose demangled
    name starts with `function_prefix` (e.g. "gemm_fp32_simt<3>")."""
    lib, path = traced_library()
    syms = _symbols(path)
    (anchor,) = [a for a, _, n in syms if n == "emu_trace_anchor"]
    base = lib.emu_trace_anchor() - anchor
    return [(n.rsplit("::", 1)[1], base + a, s) for a, s, n in syms if n.startswith(function_prefix) and s]


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


def run(
    launch: Callable[[ctypes.CDLL], None],
    regions: Sequence[tuple[str, str, np.ndarray | tuple[int, int]]],
    dynamic: Sequence[tuple[str, int, int]] = (),
) -> list[tuple]:
    """Trace one launch. `regions`: (space, name, array or (address, bytes)) of memory to record;
    `dynamic`: (name, offset, bytes) slices of the block's dynamic shared memory. Returns records
    for `moonvit_kernels.tools.xray.trace.analyse`."""
    lib, path = traced_library()
    lib.emu_trace_reset()
    spans = []
    for space, name, mem in regions:
        if isinstance(mem, np.ndarray):
            addr, nbytes = mem.ctypes.data, mem.nbytes
        else:
            addr, nbytes = mem
        spans.append((space, name, addr))
        lib.emu_trace_region(ctypes.c_void_p(addr), ctypes.c_longlong(nbytes))
    lib.emu_trace_enable(1)
    try:
        launch(lib)
    finally:
        lib.emu_trace_enable(0)
    n = lib.emu_trace_count()
    recs = np.zeros(n, RECORD)
    if n:
        lib.emu_trace_copy(recs.ctypes.data_as(ctypes.c_void_p))
    base = lib.emu_trace_anchor() - next(a for a, _, nm in _symbols(path) if nm == "emu_trace_anchor")
    pcs = sorted({int(p) - base - 1 for p in np.unique(recs["pc"]) if p})
    lines = _addr2line(path, pcs)
    files: dict[int, str] = {}
    rows = []
    for r in recs.tolist():
        pc, fptr, line, region, offset, size, store, block, thread = r
        if pc:
            file, line = lines.get(pc - base - 1, ("?", 0))
            site = (file, line, pc)
        else:
            if fptr not in files:
                files[fptr] = ctypes.string_at(fptr).decode(errors="replace")
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
            space, name, _ = spans[region]
        key = (block, thread, site, store, name)
        counts[key] += 1
        out.append((space, name, site, bool(store), block, thread, offset, size, counts[key]))
    return out
