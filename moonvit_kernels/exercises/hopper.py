"""Notebook 08's exercises: the 128-byte swizzle and wgmma's matrix descriptor (written from the PTX ISA)."""

from __future__ import annotations

import numpy as np

from .core import OUT, Case, Exercise

NB = "08_hopper"


def swizzle_case(rows: int, base: int) -> Case:
    """Byte address of element (r, k) of a K-major bf16 tile under the 128-byte swizzle (PTX ISA figure):
    16-byte chunk j of row r is stored at chunk position j XOR (r mod 8)."""
    r = np.arange(rows)[:, None]
    byte = 2 * np.arange(64)[None, :]
    want = base + 128 * r + 16 * ((byte // 16) ^ (r % 8)) + byte % 16
    return Case(
        args=[np.int32(base), OUT],
        out_shape=(rows, 64),
        grid=1,
        block=32,
        expected=want,
        bound=0.0,
        arg_names="base, out",
        axes=("tile rows r", "columns k"),
        out_dtype=np.int32,
        label=f"a tile of {rows} rows × 64 bf16 at base {base:#x}",
    )


def swizzle_cases(rng: np.random.Generator) -> list[Case]:
    return [swizzle_case(21, 0x800), swizzle_case(11, 0x1C00)]


def descriptor_params(high_bits: bool = False) -> np.ndarray:
    """(shared address, LBO bytes, SBO bytes, swizzle code) of descriptors the sm90 kernels build, and a few
    more; with `high_bits`, addresses as a generic-space pointer carries them (bits above 18 set)."""
    base = 0x800  # the 1024-aligned start of the GEMM's ring in the emulator's shared memory
    if high_bits:
        rows = [(0x7000000 + base + s * 16384 + kk * 32, 16, 1024, 1) for s in (0, 1, 2) for kk in range(4)]
        rows += [(0x1050040, 128, 256, 0), (0x2043020, 16, 512, 2), (0x3FFFFF0, 16, 256, 3)]
        return np.array(rows, dtype=np.int32)
    rows = [(base + s * 16384 + m * 128 + kk * 32, 16, 1024, 1) for s in (0, 3) for m in (0, 64) for kk in range(4)]
    rows += [(base + 65536 + s * 16384 + kk * 32, 16, 1024, 1) for s in (0, 3) for kk in range(4)]  # B
    rows += [(base + 8192 + kk * 32, 16, 1024, 1) for kk in range(4)]  # attention's 2nd 64-dim block of Q
    rows += [(0x1230, 128, 256, 0), (0x2040, 16, 512, 2), (0x3020, 16, 256, 3)]  # no swizzle, 64B, 32B
    return np.array(rows, dtype=np.int32)


def descriptor_case(high_bits: bool) -> Case:
    """wgmma's 64-bit matrix descriptor as four 16-bit words (PTX ISA, "Matrix Descriptor Format")."""
    params = descriptor_params(high_bits)
    p = params.astype(np.int64)
    want = np.stack([(p[:, 0] & 0x3FFFF) >> 4, (p[:, 1] >> 4) & 0x3FFF, (p[:, 2] >> 4) & 0x3FFF, p[:, 3] << 14], 1)
    return Case(
        args=[params, OUT],
        out_shape=want.shape,
        grid=1,
        block=32,
        expected=want,
        bound=0.0,
        arg_names="params, out",
        axes=("descriptors", "16-bit words (0 start, 1 LBO, 2 SBO, 3 mode)"),
        out_dtype=np.int32,
        label=f"{len(params)} descriptors"
        + (
            ": addresses with bits above 18 set, as a generic pointer carries them"
            if high_bits
            else " the kernels build"
        ),
    )


def descriptor_cases(rng: np.random.Generator) -> list[Case]:
    return [descriptor_case(False), descriptor_case(True)]


EXERCISES = (
    Exercise(
        "swizzle_128b",
        NB,
        "the shared-memory address of element (r, k) of a tile stored with the 128-byte swizzle",
        swizzle_cases,
        (
            "Row r is 128 bytes: base + 128·r. Inside a row, the swizzle permutes the eight 16-byte chunks, "
            "differently for each of 8 consecutive rows; bytes inside a chunk stay in place.",
            "Byte b = 2·k of the row lies in chunk j = b // 16 at offset b mod 16; the swizzle stores chunk j at "
            "chunk position j XOR (r mod 8). Rows 0, 8, 16 are not permuted, which is why only they are right "
            "without the XOR.",
        ),
    ),
    Exercise(
        "wgmma_desc",
        NB,
        "wgmma's shared-memory matrix descriptor, field by field",
        descriptor_cases,
        (
            "Addresses and byte offsets are stored in 16-byte units, each field 14 bits wide; the start address "
            "field holds only the low 18 bits of the shared-memory address.",
            "word 0 = (address & 0x3FFFF) >> 4 (bits 0–13), word 1 = LBO >> 4 (bits 16–29), word 2 = SBO >> 4 "
            "(bits 32–45), word 3 = swizzle code << 14 (bits 62–63 of the descriptor are bits 14–15 of its last "
            "16-bit word).",
        ),
    ),
)
