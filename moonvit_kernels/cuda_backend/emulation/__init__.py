"""Run the CUDA C kernels on the CPU: a test tier for machines without a GPU.

The `.cu` files are compiled unchanged by the host C++ compiler (g++ >= 11, C++20) against
stand-ins for the CUDA pieces they use: `prelude.h` (threads, blocks, barriers, warp shuffles),
`ptx.cuh` (cp.async, ldmatrix, mma.sync, written from the PTX ISA's fragment tables) and
`cuda_bf16.h`. Each CUDA thread becomes a std::thread, so only small sizes are practical (a few
blocks), but every index, bound, fragment layout, pipeline wait and softmax step of the real
kernels runs and is compared with the NumPy reference. What it cannot show: speed, registers,
races the barriers do not order, and the device's exact transcendental functions.

This module mirrors `moonvit_kernels.cuda_backend.launchers` (same function names and arguments, NumPy
arrays instead of CuPy, bf16 as uint16 bits), so `CupyBackend(..., kernels=emulation)` runs the
whole backend on the CPU. Launch geometry lives in `driver.cpp` and matches the CuPy launchers.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from moonvit_kernels.cuda_backend import sources as kcuda
from moonvit_kernels.cuda_backend.launchers import cu_seqlens_int32, merge_sources, token_positions  # noqa: F401  (same tables)
from moonvit_kernels.weights import bf16_bits_to_float32, float32_to_bf16_bits

HERE = Path(__file__).resolve().parent
HEAD_DIMS = (8, 16, 24, 40, 64, 128)  # attention instantiations built into the emulator (driver.cpp)
_STANDINS = ("prelude.h", "ptx.cuh", "cuda_bf16.h", "driver.cpp")
_DYNAMIC_SMEM = "extern __shared__ __align__(16) unsigned char smem_raw[];"
_EPI = kcuda.EPILOGUES


def compiler() -> str | None:
    """The host C++ compiler used ($CXX, else g++), or None when there is none."""
    cxx = os.environ.get("CXX", "g++")
    return shutil.which(cxx)


# Function-local statics of inline functions and templates (a kernel's static __shared__ arrays,
# emu:: thread state) are STB_GNU_UNIQUE symbols by default, which the dynamic linker makes one
# instance per process even across libraries loaded RTLD_LOCAL: with two emulator builds loaded
# (plain and traced), the second would silently use the first one's shared memory. Every
# emulator build passes -fno-gnu-unique so that each library keeps its own.
GNU_UNIQUE_NOTE = "-fno-gnu-unique: each emulator library keeps its own function-local statics"


def _sources_digest() -> str:
    h = hashlib.sha256()
    for name in (*kcuda.PORTABLE_SOURCES, "common.cuh"):
        h.update((kcuda.KERNEL_DIR / name).read_bytes())
    for name in _STANDINS:
        h.update((HERE / name).read_bytes())
    h.update(Path(__file__).read_bytes())  # the build recipe below
    return h.hexdigest()[:16]


@functools.cache
def library() -> ctypes.CDLL:
    """Build (once per source version, cached in the temp dir) and load the emulator library."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("the CUDA C emulation needs a C++20 compiler (g++ >= 11); set CXX")
    build = Path(tempfile.gettempdir()) / f"moonvit_cuda_emulation_{_sources_digest()}"
    lib_path = build / "libmoonvit_emu.so"
    if not lib_path.exists():
        src = build / "src"
        inc = build / "include"
        src.mkdir(parents=True, exist_ok=True)
        inc.mkdir(parents=True, exist_ok=True)
        for name in (*kcuda.PORTABLE_SOURCES, "common.cuh"):
            text = (kcuda.KERNEL_DIR / name).read_text(encoding="utf-8")
            # dynamic shared memory comes from the emulated block
            text = text.replace(_DYNAMIC_SMEM, "unsigned char* smem_raw = emu::dynamic_smem();")
            (src / name).write_text(text, encoding="utf-8")
        for name in _STANDINS:  # ptx.cuh and cuda_bf16.h stand-ins are found through -I include
            shutil.copy(HERE / name, inc / name)
        tmp = build / f"lib.{os.getpid()}.so"
        cmd = [
            cxx,
            "-std=c++20",
            "-O1",
            "-fPIC",
            "-fno-gnu-unique",  # see GNU_UNIQUE_NOTE
            "-shared",
            "-pthread",
            "-Wall",
            "-Wno-unknown-pragmas",
            "-Wno-unused-function",
            "-fsanitize=alignment",  # a misaligned vector access (a fault on the GPU) aborts
            "-fno-sanitize-recover=all",
            f"-I{inc}",
            f"-I{src}",
            "-include",
            str(inc / "prelude.h"),
            str(inc / "driver.cpp"),
            "-o",
            str(tmp),
        ]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"building the CUDA C emulation failed:\n{' '.join(cmd)}\n{r.stderr[-4000:]}")
        os.replace(tmp, lib_path)  # atomic: concurrent builders do not see a half-written library
    return ctypes.CDLL(str(lib_path))


# ============================================================================ the launchers API on NumPy
def array_module() -> Any:
    return np


def to_bf16(x: np.ndarray) -> np.ndarray:
    return float32_to_bf16_bits(np.asarray(x, dtype=np.float32))


def from_bf16(bits: np.ndarray) -> np.ndarray:
    return bf16_bits_to_float32(np.asarray(bits))


def _name(a: np.ndarray) -> str:
    if a.dtype == np.float32:
        return "float32"
    if a.dtype == np.uint16:
        return "bfloat16"
    raise ValueError(f"dtype {a.dtype} is neither float32 nor bfloat16 (uint16 bits)")


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    if not a.flags.c_contiguous:
        raise ValueError("emulation: arrays must be C-contiguous")
    return ctypes.c_void_p(a.ctypes.data)


def _empty(shape: tuple[int, ...], dtype_name: str) -> np.ndarray:
    """Output buffers start as NaN so that an element the kernel never writes fails the tests."""
    if dtype_name == "float32":
        return np.full(shape, np.nan, dtype=np.float32)
    return np.full(shape, 0x7FC0, dtype=np.uint16)


_i = ctypes.c_int


def gemm(a, b, *, epilogue="none", residual=None, out=None, out_dtype="float32"):
    """launchers.gemm on the emulator."""
    a_dt, b_dt = _name(a), _name(b)
    assert a_dt == b_dt and a.shape[1] == b.shape[1]
    M, K = a.shape
    N = b.shape[0]
    if out is None:
        out = _empty((M, N), out_dtype)
    out_dt = _name(out)
    r = out if residual is None else residual
    if a_dt == "bfloat16":
        vec = K % 8 == 0
        library().emu_gemm_bf16(
            _i(out_dt == "bfloat16"),
            _i(_EPI[epilogue]),
            _ptr(a),
            _ptr(b),
            _ptr(out),
            _ptr(r),
            _i(M),
            _i(N),
            _i(K),
            _i(vec),
        )
    else:
        vec = K % 4 == 0
        library().emu_gemm_fp32(_i(_EPI[epilogue]), _ptr(a), _ptr(b), _ptr(out), _ptr(r), _i(M), _i(N), _i(K), _i(vec))
    return out


def rmsnorm(x, weight, eps, *, out=None, out_dtype="float32", return_rstd=False):
    """launchers.rmsnorm on the emulator."""
    rows, D = x.shape
    if out is None:
        out = _empty((rows, D), out_dtype)
    rstd = np.full(rows, np.nan, dtype=np.float32)
    w = np.ascontiguousarray(weight, dtype=np.float32)
    library().emu_rmsnorm(
        _i(_name(x) == "bfloat16"),
        _i(_name(out) == "bfloat16"),
        _ptr(x),
        _ptr(w),
        _ptr(out),
        _ptr(rstd),
        _i(rows),
        _i(D),
        ctypes.c_float(eps),
    )
    return (out, rstd) if return_rstd else out


def rope_inplace(qkv, token_pos, freqs, num_heads, head_dim):
    """launchers.rope_inplace on the emulator."""
    tp = np.ascontiguousarray(token_pos, dtype=np.int32)
    f = np.ascontiguousarray(freqs, dtype=np.float32)
    library().emu_rope(
        _i(_name(qkv) == "bfloat16"), _ptr(qkv), _ptr(tp), _ptr(f), _i(qkv.shape[0]), _i(num_heads), _i(head_dim)
    )
    return qkv


def attention(qkv, cu_seqlens, num_heads, head_dim, cu_seqlens_device=None):
    """launchers.attention on the emulator (head_dim in HEAD_DIMS); reads cu_seqlens_device when given."""
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"the emulator is built for head dims {HEAD_DIMS}, not {head_dim}")
    dt = _name(qkv)
    L = qkv.shape[0]
    cu = np.ascontiguousarray(cu_seqlens if cu_seqlens_device is None else cu_seqlens_device, dtype=np.int32)
    out = _empty((L, num_heads * head_dim), dt)
    lse = np.full((L, num_heads), np.nan, dtype=np.float32)
    rc = library().emu_attention(
        _i(head_dim),
        _i(dt == "bfloat16"),
        _ptr(qkv),
        _ptr(out),
        _ptr(lse),
        _ptr(cu),
        _i(cu.size - 1),
        _i(int(np.max(np.diff(cu)))),
        _i(num_heads),
    )
    assert rc == 0
    return out, lse


def add_position_embedding_inplace(x, token_pos, grid_thws, pos_weight, time_table, mode):
    """launchers.add_position_embedding_inplace on the emulator."""
    tp = np.ascontiguousarray(token_pos, dtype=np.int32)
    g = np.ascontiguousarray(grid_thws, dtype=np.int32)
    pw = np.ascontiguousarray(pos_weight, dtype=np.float32)
    tt = np.ascontiguousarray(time_table, dtype=np.float32)
    library().emu_pos_emb(
        _i(mode == "bicubic"),
        _ptr(x),
        _ptr(tp),
        _ptr(g),
        _ptr(pw),
        _ptr(tt),
        _i(x.shape[0]),
        _i(x.shape[1]),
        _i(pw.shape[0]),
        _i(pw.shape[1]),
    )
    return x


def tpool_merge(x, merge_src, merge_kernel_size, out_dtype="float32"):
    """launchers.tpool_merge on the emulator."""
    kh, kw = merge_kernel_size
    ms = np.ascontiguousarray(merge_src, dtype=np.int32)
    M, D = ms.shape[0], x.shape[1]
    out = _empty((M, kh * kw * D), out_dtype)
    library().emu_merge(
        _i(_name(x) == "bfloat16"),
        _i(out_dtype == "bfloat16"),
        _ptr(x),
        _ptr(out),
        _ptr(ms),
        _i(M),
        _i(D),
        _i(kh),
        _i(kw),
    )
    return out
