"""Tensor maps (CUtensorMap) of the Hopper kernels: what each kernel's tensor copies assume, and their encoding.

The sm90 kernels receive their global operands as tensor maps (`const __grid_constant__ TmaMap`,
128 opaque bytes). This module is the one place that says how each map is laid out; the CPU
emulator (`emulation/hopper.py`, through its model of the driver's encoder) and a GPU launcher
(through `encode`, the driver's cuTensorMapEncodeTiled) both build them from here, so the
emulator tests check the parameters a GPU run will use.

- `gemm_operand_map(rows, K, box_rows)`: an operand [rows, K] of gemm_bf16_sm90 (A: rows = M,
  box_rows = 128; B: rows = N, box_rows = the kernel's BN, 128 or 256): dims {K, rows}, row pitch
  2K bytes, box {64, box_rows} (a box_rows x 64 K tile), 128-byte swizzle.
- `attention_qkv_maps(L, H, head_dim)`: qkv [L, 3·H·hd] of flash_attn_sm90 as a 3-D tensor
  {hd, 3H, L} (strides 2·hd and 2·3·H·hd bytes), box {64, 1, 64}: one with the 128-byte swizzle
  (Q, K) and one without (V, transposed in the kernel).

The maps need 16-byte row pitches (K % 8 == 0 for the GEMM; head_dim % 8 == 0) and 16-byte aligned
base addresses. `encode` calls the driver's entry point through ctypes (typed arguments, a 64-byte
aligned output) on a GPU (first run on an H200, 2026-12-04) and the emulator's model of it on the CPU.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class TiledMap:
    """cuTensorMapEncodeTiled's arguments for a bf16 tensor (element strides 1, no interleave, zero fill)."""

    dims: tuple[int, ...]  # elements per dimension, innermost first
    strides: tuple[int, ...]  # bytes between consecutive indices of dimensions 1.. (rank - 1 entries)
    box: tuple[int, ...]  # elements per dimension of one copy
    swizzle: int  # bytes: 0 (none), 32, 64 or 128

    @property
    def box_bytes(self) -> int:
        return 2 * int(np.prod(self.box))


GEMM_BK = 64  # GemmSm90Cfg: the K tile (64 bf16 = one 128-byte swizzled row)
ATTENTION_BOX = (64, 1, 64)  # AttnSm90Cfg: 64 head dims x one (slot, head) x BKV = BQ tokens


def gemm_operand_map(rows: int, K: int, box_rows: int = 128) -> TiledMap:
    """The map of a K-contiguous bf16 operand [rows, K] of gemm_bf16_sm90 (box_rows: 128 for A, BN for B)."""
    if K % 8:
        raise ValueError(f"gemm_bf16_sm90 needs K % 8 == 0 (16-byte tensor-map row pitch), got K={K}")
    if rows < 1 or K < 1:
        raise ValueError(f"empty operand [{rows}, {K}]")
    if box_rows not in (128, 256):
        raise ValueError(f"gemm_bf16_sm90 tiles are 128 or 256 rows, not {box_rows}")
    return TiledMap((K, rows), (2 * K,), (GEMM_BK, box_rows), 128)


def attention_qkv_maps(L: int, H: int, head_dim: int) -> tuple[TiledMap, TiledMap]:
    """(swizzled map for Q and K, plain map for V) over the packed qkv [L, 3·H·head_dim] of flash_attn_sm90."""
    if head_dim % 8 or not 8 <= head_dim <= 128:
        raise ValueError(f"flash_attn_sm90 needs head_dim a multiple of 8 in 8..128, got {head_dim}")
    dims = (head_dim, 3 * H, L)
    strides = (2 * head_dim, 2 * 3 * H * head_dim)
    return TiledMap(dims, strides, ATTENTION_BOX, 128), TiledMap(dims, strides, ATTENTION_BOX, 0)


# cuda.h's enum values for the arguments the kernels use
DATA_TYPE_BFLOAT16 = 9  # CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
INTERLEAVE_NONE = 0
SWIZZLE = {0: 0, 32: 1, 64: 2, 128: 3}  # span in bytes -> CU_TENSOR_MAP_SWIZZLE_{NONE,32B,64B,128B}
L2_PROMOTION_128B = 2
OOB_FILL_NONE = 0  # out-of-bounds elements read as zeros
CUDA_SUCCESS = 0
MAP_BYTES, MAP_ALIGNMENT = 128, 64  # sizeof / alignof(CUtensorMap)

_u32, _u64 = ctypes.c_uint32, ctypes.c_uint64
# CUresult cuTensorMapEncodeTiled(CUtensorMap*, CUtensorMapDataType, cuuint32_t rank, void* globalAddress,
#     const cuuint64_t* globalDim, const cuuint64_t* globalStrides, const cuuint32_t* boxDim,
#     const cuuint32_t* elementStrides, interleave, swizzle, l2Promotion, oobFill)
ENCODE_ARGTYPES = [
    ctypes.c_void_p, ctypes.c_int, _u32, ctypes.c_void_p, ctypes.POINTER(_u64), ctypes.POINTER(_u64),
    ctypes.POINTER(_u32), ctypes.POINTER(_u32), ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
]  # fmt: skip


@functools.cache
def driver_encoder() -> Any:
    """The CUDA driver's `cuTensorMapEncodeTiled` (libcuda), typed for ctypes."""
    try:
        lib = ctypes.CDLL("libcuda.so.1" if sys.platform != "win32" else "nvcuda.dll")
    except OSError as e:
        raise RuntimeError(f"tensor maps need the CUDA driver (libcuda.so.1), which is not installed here: {e}") from e
    fn = lib.cuTensorMapEncodeTiled
    fn.argtypes, fn.restype = ENCODE_ARGTYPES, ctypes.c_int
    return fn


def aligned_map_buffer() -> np.ndarray:
    """128 zero bytes at a 64-byte aligned address (as uint8, a view of a larger buffer): a CUtensorMap."""
    raw = np.zeros(MAP_BYTES + MAP_ALIGNMENT, np.uint8)
    view = raw[(-raw.ctypes.data) % MAP_ALIGNMENT :][:MAP_BYTES]
    assert view.ctypes.data % MAP_ALIGNMENT == 0
    return view


def encode(m: TiledMap, address: int, encoder: Any = None) -> np.ndarray:
    """The 128-byte CUtensorMap (as uint64[16]) of a bf16 tensor at device `address`.

    `encoder` is a function with `cuTensorMapEncodeTiled`'s C signature (`ENCODE_ARGTYPES`): the
    driver's by default, the CPU emulator's model on the emulated device. The arguments are typed
    C arrays (cuuint64_t dims and strides, cuuint32_t box and element strides) and the map is written
    into a 64-byte aligned buffer, as the driver requires; a refusal raises naming the map and why."""
    fn = driver_encoder() if encoder is None else encoder
    out = aligned_map_buffer()
    rank = len(m.dims)
    rc = fn(
        ctypes.c_void_p(out.ctypes.data),
        DATA_TYPE_BFLOAT16,
        _u32(rank),
        ctypes.c_void_p(address),
        (_u64 * rank)(*m.dims),
        (_u64 * max(rank - 1, 1))(*m.strides),
        (_u32 * rank)(*m.box),
        (_u32 * rank)(*([1] * rank)),
        INTERLEAVE_NONE,
        SWIZZLE[m.swizzle],
        L2_PROMOTION_128B,
        OOB_FILL_NONE,
    )
    if rc != CUDA_SUCCESS:
        why = getattr(fn, "last_error", lambda: "")()
        why = f": {why}" if why else ""
        raise ValueError(f"cuTensorMapEncodeTiled({m}, address {address:#x}) failed with CUresult {rc}{why}")
    return out.view(np.uint64)
