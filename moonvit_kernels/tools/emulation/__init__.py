"""Run the CUDA C kernels on the CPU: a test tier for machines without a GPU.

The `.cu` files are compiled unchanged by the host C++ compiler (g++ >= 11, C++20) against
stand-ins for the CUDA pieces they use: `prelude.h` (threads, blocks, barriers, warp shuffles),
`ptx.cuh` (cp.async, ldmatrix, mma.sync, written from the PTX ISA's fragment tables),
`ptx_sm90.cuh` + `hopper.cuh` (wgmma, tensor copies, mbarrier, setmaxnreg) and `cuda_bf16.h`. Each
CUDA thread becomes a fiber, so only small sizes are practical (a few blocks), but every index,
bound, fragment layout, pipeline wait and softmax step of the real kernels runs and is compared with
the NumPy reference. What it cannot show: speed, registers, races the barriers do not order, and the
device's exact transcendental functions.
The stand-ins never read the real headers' inline PTX: `ptx_models.py` names the exact PTX each one
models, and tests/test_ptx_conformance.py holds the real asm statements to it (`ptx_conformance`).

The emulator is a *device* (`emulation.device`): an object with CuPy's interface that the real
launchers (`cuda_backend.launchers`, `hopper_launchers`) run on, argument marshalling, checks and
launch geometry included. `build.py` is its one build recipe. The functions below are conveniences
for tests and notebooks: the launchers' API on NumPy arrays (bf16 as uint16 bits) — each uploads its
inputs to the emulated device, calls the real launcher and downloads the result.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from moonvit_kernels import registry
from moonvit_kernels.cuda_backend import sources as kcuda
from moonvit_kernels.cuda_backend.launchers import cu_seqlens_int32, merge_sources, token_positions  # noqa: F401  (same tables)
from moonvit_kernels.tools.emulation import build, device
from moonvit_kernels.tools.emulation.build import compiler
from moonvit_kernels.weights import bf16_bits_to_float32, float32_to_bf16_bits

HERE = Path(__file__).resolve().parent
HEAD_DIMS = tuple(range(8, kcuda.MAX_HEAD_DIM + 1, 8))  # attention head dims the kernels (and so the emulator) take
_DYNAMIC_SMEM = build.DYNAMIC_SMEM
_EPI = kcuda.EPILOGUES


@functools.cache
def library() -> None:
    """Build (cached by source digest; `build.build_library`) and load every portable kernel module of the
    catalogue for the emulated device, as a GPU would compile them on first use."""
    if compiler() is None:
        raise RuntimeError("the CUDA C emulation needs a C++20 compiler (g++ >= 11); set CXX")
    for source, specs in kcuda.specs_by_source(registry.kernel_specs()).items():
        if source in kcuda.PORTABLE_SOURCES:
            build.build_module(kcuda.load_source(source), tuple(s.name for s in specs), False)


# ============================================================================ the launchers API on NumPy
def array_module() -> Any:
    return np


def to_bf16(x: np.ndarray) -> np.ndarray:
    return float32_to_bf16_bits(np.asarray(x, dtype=np.float32))


def from_bf16(bits: np.ndarray) -> np.ndarray:
    return bf16_bits_to_float32(np.asarray(bits))


def _up(a: Any) -> Any:
    return None if a is None else device.asarray(np.ascontiguousarray(a))


def _down(a: Any) -> np.ndarray:
    return a.get()


def _launchers() -> Any:
    from moonvit_kernels.cuda_backend import launchers

    return launchers


def gemm(a, b, *, epilogue="none", residual=None, out=None, out_dtype="float32"):
    """launchers.gemm on the emulated device (NumPy in and out; `out`, when given, is written in place)."""
    with device.activated():
        got = _launchers().gemm(
            _up(a), _up(b), epilogue=epilogue, residual=_up(residual), out=_up(out), out_dtype=out_dtype
        )
        host = _down(got)
    if out is not None:
        out[...] = host
        return out
    return host


def rmsnorm(x, weight, eps, *, out=None, out_dtype="float32", return_rstd=False):
    """launchers.rmsnorm on the emulated device."""
    with device.activated():
        got = _launchers().rmsnorm(
            _up(x), _up(np.asarray(weight, np.float32)), eps, out=_up(out), out_dtype=out_dtype, return_rstd=True
        )
        y, rstd = _down(got[0]), _down(got[1])
    if out is not None:
        out[...] = y
        y = out
    return (y, rstd) if return_rstd else y


def rope_inplace(qkv, token_pos, freqs, num_heads, head_dim):
    """launchers.rope_inplace on the emulated device (qkv updated in place)."""
    with device.activated():
        d = _up(qkv)
        _launchers().rope_inplace(d, _up(np.asarray(token_pos, np.int32)), _up(np.asarray(freqs, np.float32)),
                                  num_heads, head_dim)  # fmt: skip
        qkv[...] = _down(d)
    return qkv


def attention(qkv, cu_seqlens, num_heads, head_dim, cu_seqlens_device=None):
    """launchers.attention on the emulated device: (out [L, H·hd], lse [L, H])."""
    with device.activated():
        cu_dev = None if cu_seqlens_device is None else _up(np.asarray(cu_seqlens_device, np.int32))
        o, lse = _launchers().attention(_up(qkv), np.asarray(cu_seqlens), num_heads, head_dim, cu_dev)
        return _down(o), _down(lse)


def add_position_embedding_inplace(x, token_pos, grid_thws, pos_weight, time_table, mode):
    """launchers.add_position_embedding_inplace on the emulated device (x updated in place)."""
    with device.activated():
        d = _up(x)
        _launchers().add_position_embedding_inplace(
            d,
            _up(np.asarray(token_pos, np.int32)),
            _up(np.asarray(grid_thws, np.int32)),
            _up(np.asarray(pos_weight, np.float32)),
            _up(np.asarray(time_table, np.float32)),
            mode,
        )
        x[...] = _down(d)
    return x


def tpool_merge(x, merge_src, merge_kernel_size, out_dtype="float32"):
    """launchers.tpool_merge on the emulated device."""
    with device.activated():
        src = _up(np.asarray(merge_src, np.int32))
        return _down(_launchers().tpool_merge(_up(x), src, merge_kernel_size, out_dtype))
