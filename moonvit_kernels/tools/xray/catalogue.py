"""What the X-ray knows about each kernel beyond its binary: family, version, launch shape at K3
sizes, and the FLOP / byte model of one launch, read from the kernel's entry in `moonvit_kernels.registry`
(whose models `moonvit_kernels.launch_model` computes: K3 shapes, one 896x896 image of L = 4096 tokens).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from moonvit_kernels import registry
from moonvit_kernels.launch_model import GEMM_SHAPES, HD, HEADS, MERGED, MERGED_W, MLP, PATCH_K, TEXT, D, L, Model, Q

__all__ = ["D", "GEMM_SHAPES", "HD", "HEADS", "L", "MERGED", "MERGED_W", "MLP", "PATCH_K", "Q", "TEXT"]
__all__ += ["KernelInfo", "describe"]


@dataclass(frozen=True, kw_only=True)
class KernelInfo(Model):
    """Catalogue entry of one kernel instantiation: the registry's words for it and its launch model (`Model`)."""

    backend: str
    label: str
    family: str  # gemm, attention, rmsnorm, rope, merge, pos_emb, input_check ("other": not in the registry)
    version: str  # "v1", "v3", "bf16 tc", ...
    specialisation: str
    threads: int  # launch block size at K3
    dynamic_shared: int = 0


def describe(backend: str, label: str, threads: int | None = None, dynamic_shared: int | None = None) -> KernelInfo:
    """The catalogue entry of a kernel label (as the compile tiers name their cubins): the registry entry's
    stage, version, launch shape and model; `threads` / `dynamic_shared` replace the launch shape when given.
    A label the registry lacks gets family "other" and no model."""
    entry = registry.find(backend, label)
    if entry is None:
        return KernelInfo(backend=backend, label=label, family="other", version="", specialisation="",
                          threads=threads or 256, dynamic_shared=dynamic_shared or 0)  # fmt: skip
    return KernelInfo(
        backend=backend,
        label=label,
        family=entry.stage,
        version=entry.version,
        specialisation=entry.specialisation,
        threads=threads or entry.threads,
        dynamic_shared=entry.dynamic_smem if dynamic_shared is None else dynamic_shared,
        **dataclasses.asdict(entry.model),
    )
