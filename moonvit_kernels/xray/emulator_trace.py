"""Bank conflicts and coalescing of the CUDA C kernels, recorded in the CPU emulator (placeholder until
the emulator records addresses: returns no traces and says so)."""

from __future__ import annotations

from collections.abc import Sequence


def run_all(patterns: Sequence[str] = ()) -> tuple[dict, list[str]]:
    """({cubin label: TraceResult}, notes) for the CUDA C kernels."""
    return {}, ["CUDA C kernels: no address traces (emulator tracing not available)"]
