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
base addresses; `encode` needs a CUDA driver (cuda-bindings) and has not been run on a GPU yet.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def encode(m: TiledMap, address: int) -> np.ndarray:
    """The 128-byte CUtensorMap (as uint64[16]) for a bf16 tensor at device `address`, by the CUDA driver.

    For a kernel argument passed by value the bytes go as a 64-byte aligned struct (e.g. a NumPy
    structured scalar of 16 uint64 with CuPy's `make_aligned_dtype(..., alignment=64)`)."""
    from cuda.bindings import driver

    swz = {
        0: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
        32: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B,
        64: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
        128: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
    }[m.swizzle]
    err, tmap = driver.cuTensorMapEncodeTiled(
        driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        len(m.dims),
        address,
        list(m.dims),
        list(m.strides),
        list(m.box),
        [1] * len(m.dims),
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        swz,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled({m}) failed: {err}")
    return np.asarray(tmap.opaque, dtype=np.uint64)
