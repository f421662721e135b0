"""What the X-ray knows about each kernel beyond its binary: family, version, launch shape at K3
sizes, and the FLOP / byte model of one launch, read from the kernel's entry in `moonvit_kernels.registry`
(whose models `moonvit_kernels.launch_model` computes: K3 shapes, one 896x896 image of L = 4096 tokens).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from moonvit_kernels import registry
from moonvit_kernels.launch_model import GEMM_SHAPES, HD, HEADS, MERGED, MERGED_W, MLP, PATCH_K, TEXT, D, L, Q

__all__ = ["D", "GEMM_SHAPES", "HD", "HEADS", "L", "MERGED", "MERGED_W", "MLP", "PATCH_K", "Q", "TEXT"]
__all__ += ["KernelInfo", "describe"]


@dataclass
class KernelInfo:
    """Catalogue entry of one kernel instantiation."""

    backend: str
    label: str
    family: str  # gemm, attention, rmsnorm, rope, merge, pos_emb, input_check ("other": not in the registry)
    version: str  # "v1", "v3", "bf16 tc", ...
    specialisation: str
    threads: int  # launch block size at K3
    dynamic_shared: int = 0
    k3: bool = True  # False for instantiations that K3 does not launch (e.g. hd 24 of the tiny config)
    flops: float | None = None
    dram_bytes: float | None = None
    request_bytes: float | None = None
    formula: str = ""
    peak: str = "fp32"  # the compute roof: "fp32" (FFMA), "mma_sync" (bf16 HMMA) or "wgmma" (bf16 HGMMA)
    fma_shares: tuple[float, ...] = ()  # FLOPs share of each phase's loop (launch_counts.fma_loops)
    fma_exact: bool = False  # FLOPs = 2 x the kernel's multiply-adds (GEMM, attention): the SASS can be scaled by them


def describe(backend: str, label: str, threads: int | None = None, dynamic_shared: int | None = None) -> KernelInfo:
    """The catalogue entry of a kernel label (as the compile tiers name their cubins): the registry entry's
    stage, version, launch shape and model; `threads` / `dynamic_shared` replace the launch shape when given.
    A label the registry lacks gets family "other" and no model."""
    entry = registry.find(backend, label)
    if entry is None:
        return KernelInfo(backend, label, "other", "", "", threads or 256, dynamic_shared or 0)
    model = dataclasses.asdict(entry.model)
    return KernelInfo(
        backend,
        label,
        entry.stage,
        entry.version,
        entry.specialisation,
        threads or entry.threads,
        entry.dynamic_smem if dynamic_shared is None else dynamic_shared,
        **model,
    )
