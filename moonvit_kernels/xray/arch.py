"""Per-architecture limits and datasheet peaks: the one table every X-ray view reads.

Occupancy limits (per SM unless said otherwise) are from the CUDA C++ Programming Guide,
"Compute Capabilities" → "Technical Specifications per Compute Capability" (and, for the
register allocation unit and shared-memory granularity, the CUDA Occupancy Calculator that
ships with Nsight Compute). Shared memory per SM is the largest carve-out of the unified
L1/shared array; per block is the opt-in maximum (`cudaFuncAttributeMaxDynamicSharedMemorySize`);
without opting in a block gets at most 48 KiB, and static `__shared__` arrays are capped at 48 KiB.
Every block that uses shared memory also costs a 1 KiB system reserve on sm_80 and later.

Peaks are datasheet numbers (dense, no sparsity), never measurements:
  A100 SXM 80GB: NVIDIA A100 Tensor Core GPU datasheet (19.5 TFLOP/s fp32, 312 bf16, 2.04 TB/s HBM2e).
  L40S (sm_89):  NVIDIA L40S datasheet (91.6 TFLOP/s fp32, 362 bf16 dense (733 with sparsity), 864 GB/s GDDR6).
  H100 SXM:      NVIDIA H100 Tensor Core GPU datasheet (67 TFLOP/s fp32, 989 bf16 dense, 3.35 TB/s HBM3).
  H200 SXM:      NVIDIA H200 Tensor Core GPU datasheet (67 TFLOP/s fp32, 989 bf16 dense, 4.8 TB/s HBM3e).
"""

from __future__ import annotations

from dataclasses import dataclass

SOURCE_LIMITS = (
    "CUDA C++ Programming Guide, Compute Capabilities, Table 'Technical Specifications per Compute Capability'; "
    "register allocation unit and shared-memory granularity: CUDA Occupancy Calculator (Nsight Compute)"
)
SOURCE_PEAKS = "NVIDIA datasheets (A100, L40S, H100 SXM, H200 SXM), dense, no sparsity"


@dataclass(frozen=True)
class ArchLimits:
    """What one SM of a compute capability offers, and the rules it allocates by."""

    arch: str  # "sm_90"
    registers_per_sm: int = 65536
    registers_per_block: int = 65536
    max_registers_per_thread: int = 255
    register_unit: int = 256  # registers are given to a warp in units of this many
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    max_threads_per_block: int = 1024
    shared_per_sm: int = 228 * 1024  # largest carve-out
    shared_per_block_optin: int = 227 * 1024
    shared_static_max: int = 48 * 1024
    shared_reserved_per_block: int = 1024
    shared_unit: int = 128  # allocation granularity per block


LIMITS: dict[str, ArchLimits] = {
    "sm_80": ArchLimits("sm_80", shared_per_sm=164 * 1024, shared_per_block_optin=163 * 1024),
    "sm_89": ArchLimits(
        "sm_89", max_warps_per_sm=48, max_blocks_per_sm=24, shared_per_sm=100 * 1024, shared_per_block_optin=99 * 1024
    ),
    "sm_90": ArchLimits("sm_90"),
}


@dataclass(frozen=True)
class GpuPeaks:
    """Datasheet peaks of one GPU (dense): fp32 SIMT and bf16 tensor-core FLOP/s, DRAM bytes/s."""

    name: str
    arch: str
    sms: int
    fp32_flops: float
    bf16_tensor_flops: float
    dram_bytes_per_s: float


GPUS: dict[str, GpuPeaks] = {
    "A100": GpuPeaks("A100 SXM 80GB", "sm_80", 108, 19.5e12, 312e12, 2.039e12),
    "L40S": GpuPeaks("L40S", "sm_89", 142, 91.6e12, 362e12, 0.864e12),
    "H100": GpuPeaks("H100 SXM", "sm_90", 132, 67e12, 989e12, 3.35e12),
    "H200": GpuPeaks("H200 SXM", "sm_90", 132, 67e12, 989e12, 4.8e12),
}

ARCHS = tuple(LIMITS)


def limits(arch: str) -> ArchLimits:
    """The limits of `arch` ("sm_80", "sm_89", "sm_90"); ValueError naming the known ones otherwise."""
    if arch not in LIMITS:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(LIMITS)}")
    return LIMITS[arch]


def gpus_for(arch: str) -> list[GpuPeaks]:
    """The GPUs of the peaks table built on `arch`."""
    limits(arch)
    return [g for g in GPUS.values() if g.arch == arch]


def parse_archs(text: str) -> list[str]:
    """`"sm_80,sm_90"` (or `"80,90"`) -> ["sm_80", "sm_90"], each checked against the table."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        arch = part if part.startswith("sm_") else f"sm_{part}"
        limits(arch)
        out.append(arch)
    if not out:
        raise ValueError(f"no architecture in {text!r}")
    return out
