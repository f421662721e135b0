"""Per-architecture limits and per-GPU peaks: the one table every X-ray view reads.

Occupancy limits (per SM unless said otherwise) are from the CUDA C++ Programming Guide,
"Compute Capabilities" → "Technical Specifications per Compute Capability"; the register file's
allocation rules (units of 256 registers per warp, 4 sub-partitions) are `moonvit_kernels.launch_rules`,
checked against the CUDA occupancy calculator (`cuda_occupancy.h`); the shared-memory granularity is
the Occupancy Calculator's. Shared memory per SM is the largest carve-out of the unified L1/shared
array; per block is the opt-in maximum (`cudaFuncAttributeMaxDynamicSharedMemorySize`); without
opting in a block gets at most 48 KiB, and static `__shared__` arrays are capped at 48 KiB. Every
block that uses shared memory also costs a 1 KiB system reserve on sm_80 and later.

Roofs (every number a model, no GPU; `SOURCE_ROOFS`):
  FFMA         datasheet fp32 (non-tensor) peak.
  mma.sync     bf16 HMMA, dense: the datasheet bf16 tensor peak on sm_80 and sm_89, where mma.sync is
               the tensor cores' only instruction. On sm_90 no datasheet gives it: the 989 TFLOP/s
               figure is wgmma's (2,048 dense bf16 FMA per clock per SM). Model: mma.sync keeps the
               Ampere SM's rate, 1,024 dense bf16 FMA per clock per SM (A100 datasheet: 312 TFLOP/s =
               2 x 1,024 x 108 SMs x 1.41 GHz), i.e. half the wgmma peak: 494.5 TFLOP/s on H100/H200.
               An assumption, labelled as one, until gpu_check measures an mma.sync kernel.
  wgmma        datasheet bf16 dense tensor peak (sm_90 only).
  DRAM         datasheet memory bandwidth.
  shared       one wavefront (32 banks x 4 B = 128 B) per clock per SM (Programming Guide, shared
               memory of compute capability 5.x and later: each bank delivers 32 bits per clock).
  issue        4 warp-instructions per clock per SM: 4 sub-partitions, each with one warp scheduler
               issuing one instruction per clock (Nsight Compute Kernel Profiling Guide, hardware model;
               the Ampere GA100 and Hopper H100 whitepapers: 4 processing blocks per SM).
The clock of the shared and issue roofs is the one the datasheet fp32 peak implies,
fp32 / (2 x FP32 lanes per SM x SMs) (Programming Guide throughput table: 64 fp32 FMA results per
clock per SM on 8.0, 128 on 8.6, 8.9 and 9.0): 1.41 GHz (A100), 2.52 GHz (L40S), 1.98 GHz (H100, H200).

Datasheets (dense, no sparsity), never measurements:
  A100 SXM 80GB: NVIDIA A100 Tensor Core GPU datasheet (19.5 TFLOP/s fp32, 312 bf16, 2.04 TB/s HBM2e).
  L40S (sm_89):  NVIDIA L40S datasheet (91.6 TFLOP/s fp32, 362 bf16 dense (733 with sparsity), 864 GB/s GDDR6).
  H100 SXM:      NVIDIA H100 Tensor Core GPU datasheet (67 TFLOP/s fp32, 989 bf16 dense, 3.35 TB/s HBM3).
  H200 SXM:      NVIDIA H200 Tensor Core GPU datasheet (67 TFLOP/s fp32, 989 bf16 dense, 4.8 TB/s HBM3e).
"""

from __future__ import annotations

from dataclasses import dataclass

from moonvit_kernels.launch_rules import REGISTER_FILE, RegisterFile

SOURCE_LIMITS = (
    "CUDA C++ Programming Guide, Compute Capabilities, Table 'Technical Specifications per Compute Capability'; "
    "registers per warp in units of 256 and per SM sub-partition: cuda_occupancy.h (moonvit_kernels.launch_rules); "
    "shared-memory granularity: CUDA Occupancy Calculator (Nsight Compute)"
)
SOURCE_PEAKS = "NVIDIA datasheets (A100, L40S, H100 SXM, H200 SXM), dense, no sparsity"
SOURCE_ROOFS = (
    "FFMA, wgmma, DRAM: datasheets; mma.sync on sm_90: half the wgmma peak (the Ampere SM's 1,024 bf16 FMA per "
    "clock, an assumption, no datasheet gives it); shared: 128 B (one wavefront) per clock per SM; issue: 4 "
    "warp-instructions per clock per SM; clock: the one the datasheet fp32 peak implies"
)
MMA_SYNC_SM90_NOTE = "model: half the wgmma dense peak (Ampere's 1,024 bf16 FMA/clk/SM), not a datasheet figure"


@dataclass(frozen=True)
class ArchLimits:
    """What one SM of a compute capability offers, and the rules it allocates and issues by."""

    arch: str  # "sm_90"
    register_file: RegisterFile = REGISTER_FILE
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    max_threads_per_block: int = 1024
    shared_per_sm: int = 228 * 1024  # largest carve-out
    shared_per_block_optin: int = 227 * 1024
    shared_static_max: int = 48 * 1024
    shared_reserved_per_block: int = 1024
    shared_unit: int = 128  # allocation granularity per block
    fp32_lanes: int = 128  # fp32 FMA results per clock per SM
    issue_per_clock: int = 4  # warp-instructions per clock per SM (4 schedulers x 1)
    shared_wavefronts_per_clock: int = 1  # 32 banks x 4 B


LIMITS: dict[str, ArchLimits] = {
    "sm_80": ArchLimits("sm_80", shared_per_sm=164 * 1024, shared_per_block_optin=163 * 1024, fp32_lanes=64),
    "sm_89": ArchLimits(
        "sm_89", max_warps_per_sm=48, max_blocks_per_sm=24, shared_per_sm=100 * 1024, shared_per_block_optin=99 * 1024
    ),
    "sm_90": ArchLimits("sm_90"),
}


@dataclass(frozen=True)
class GpuPeaks:
    """Peaks of one GPU: FLOP/s per instruction class (dense bf16 for the tensor cores), DRAM bytes/s."""

    name: str
    arch: str
    sms: int
    fp32_flops: float  # FFMA
    mma_sync_flops: float  # bf16 mma.sync (HMMA)
    wgmma_flops: float | None  # bf16 wgmma (HGMMA); None before sm_90
    dram_bytes_per_s: float
    mma_sync_source: str = "datasheet"

    @property
    def clock_hz(self) -> float:
        """The SM clock the datasheet fp32 peak implies: fp32 / (2 x FP32 lanes per SM x SMs)."""
        return self.fp32_flops / (2 * limits(self.arch).fp32_lanes * self.sms)

    @property
    def shared_wavefronts_per_s(self) -> float:
        """Shared-memory wavefronts (128 B each) the whole GPU serves per second."""
        return limits(self.arch).shared_wavefronts_per_clock * self.sms * self.clock_hz

    @property
    def issue_per_s(self) -> float:
        """Warp-instructions the whole GPU issues per second."""
        return limits(self.arch).issue_per_clock * self.sms * self.clock_hz


GPUS: dict[str, GpuPeaks] = {
    "A100": GpuPeaks("A100 SXM 80GB", "sm_80", 108, 19.5e12, 312e12, None, 2.039e12),
    "L40S": GpuPeaks("L40S", "sm_89", 142, 91.6e12, 362e12, None, 0.864e12),
    "H100": GpuPeaks("H100 SXM", "sm_90", 132, 67e12, 989e12 / 2, 989e12, 3.35e12, MMA_SYNC_SM90_NOTE),
    "H200": GpuPeaks("H200 SXM", "sm_90", 132, 67e12, 989e12 / 2, 989e12, 4.8e12, MMA_SYNC_SM90_NOTE),
}

ARCHS = tuple(LIMITS)


def limits(arch: str) -> ArchLimits:
    """The limits of `arch` ("sm_80", "sm_89", "sm_90"); ValueError naming the known ones otherwise."""
    if arch not in LIMITS:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(LIMITS)}")
    return LIMITS[arch]


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
