"""Trust nothing unverified: a kernel is checked against a trusted one the first time it is used.

`FirstUseCheck(name, candidate, trusted, probe, rtol)` is a callable with the candidate's signature.
On its first call it runs `probe` (a small problem with awkward sizes) through both kernels and
compares the results; if they agree it uses the candidate from then on, otherwise (or when the
candidate raises) it warns once, naming the kernel and the error, and uses the trusted kernel for
the rest of the process. Meant for the Hopper kernels (gemm_bf16_sm90, flash_attn_sm90) on sm_90
devices, with the mma.sync kernels as the trusted side; `gemm_probe` and `attention_probe` are the
small problems, for any array module `xp` (CuPy on a GPU, NumPy on the emulator).

This is the numeric guard at the first real call. Whether the Hopper kernels may run at all (no fault,
no hang) is decided before, by `preflight` (their probes in a subprocess with a timeout).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from moonvit_kernels.weights import bf16_bits_to_float32, float32_to_bf16_bits


class SelfCheckWarning(RuntimeWarning):
    """A kernel failed its first-use check; the trusted kernel is used instead."""


def _host(a: Any) -> np.ndarray:
    a = a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)
    return bf16_bits_to_float32(a) if a.dtype == np.uint16 else a.astype(np.float32)


def max_rel_error(got: Sequence[Any], want: Sequence[Any]) -> float:
    """max |got − want| / (max |want| + tiny) over paired arrays; inf when shapes differ or got is not finite."""
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        g, w = _host(g), _host(w)
        if g.shape != w.shape or not np.all(np.isfinite(g)):
            return float("inf")
        worst = max(worst, float(np.max(np.abs(g - w), initial=0.0)) / (float(np.max(np.abs(w), initial=0.0)) + 1e-30))
    return worst


class FirstUseCheck:
    """`candidate`, verified against `trusted` on `probe` at the first call; `trusted` if that fails."""

    def __init__(
        self,
        name: str,
        candidate: Callable,
        trusted: Callable,
        probe: Callable[[Callable], Sequence[Any]],
        rtol: float,
    ) -> None:
        self.name, self.candidate, self.trusted, self.probe, self.rtol = name, candidate, trusted, probe, rtol
        self.verified: bool | None = None  # None: not checked yet
        self.error = 0.0

    def check(self) -> bool:
        """Run the probe through both kernels once; True when the candidate agrees within rtol."""
        if self.verified is None:
            try:
                self.error = max_rel_error(self.probe(self.candidate), self.probe(self.trusted))
                self.verified = self.error <= self.rtol
                why = f"max relative error {self.error:.3g} > {self.rtol:.3g}"
            except Exception as e:  # a kernel that cannot even run is not trusted either
                self.verified, why = False, f"{type(e).__name__}: {e}"
            if not self.verified:
                warnings.warn(
                    f"{self.name}: first-use self-check failed ({why}); using the trusted kernel instead",
                    SelfCheckWarning,
                    stacklevel=3,
                )
        return self.verified

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return (self.candidate if self.check() else self.trusted)(*args, **kwargs)


def _bf16(xp: Any, rng: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0) -> Any:
    x = (rng.standard_normal(shape) * scale + rng.uniform(-0.3, 0.3)).astype(np.float32)
    return xp.asarray(float32_to_bf16_bits(x))


def gemm_probe(xp: Any, M: int = 70, N: int = 136, K: int = 72) -> Callable[[Callable], Sequence[Any]]:
    """A bf16 GEMM with tails in M, N, K (and two N tiles), fp32 output and the gelu_tanh epilogue."""
    rng = np.random.default_rng(1234)
    a, b = _bf16(xp, rng, (M, K)), _bf16(xp, rng, (N, K), K**-0.5)
    return lambda gemm: [gemm(a, b, out_dtype="float32"), gemm(a, b, epilogue="gelu_tanh", out_dtype="bfloat16")]


def attention_probe(xp: Any, head_dim: int, heads: int = 2, lens: Sequence[int] = (70, 1, 60)):
    """Packed bf16 attention over items that end inside tiles (including a 1-token item): out and lse."""
    rng = np.random.default_rng(4321)
    L = int(sum(lens))
    qkv = _bf16(xp, rng, (L, 3 * heads * head_dim), 1.5)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    return lambda attention: list(attention(qkv, cu, heads, head_dim))


def hopper_checks(xp: Any, hopper: Any, trusted: Any, head_dim: int = 128) -> dict[str, FirstUseCheck]:
    """The first-use checks of the Hopper kernels (`hopper`: hopper_launchers or the emulator) against the
    `trusted` launchers: gemm_bf16_sm90 at both tile widths and flash_attn_sm90 at `head_dim`, by name."""

    def wide(*args: Any, **kwargs: Any) -> Any:
        return hopper.gemm(*args, block_n=256, **kwargs)

    return {
        "gemm_bf16_sm90 bn128": FirstUseCheck("gemm_bf16_sm90", hopper.gemm, trusted.gemm, gemm_probe(xp), 1e-2),
        "gemm_bf16_sm90 bn256": FirstUseCheck("gemm_bf16_sm90 (BN 256)", wide, trusted.gemm, gemm_probe(xp), 1e-2),
        "flash_attn_sm90": FirstUseCheck(
            "flash_attn_sm90", hopper.attention, trusted.attention, attention_probe(xp, head_dim), 1e-2
        ),
    }
