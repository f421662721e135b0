"""Baselines measured in the same run as the kernels, with the same timer kind.

    GEMM fp32        cuBLAS SGEMM through `cupy.matmul` (torch.matmul with TF32 off without CuPy)
    GEMM bf16        cuBLAS bf16 through `torch.matmul` (CuPy float16 without torch: same tensor-core rate)
    attention        torch `scaled_dot_product_attention` in the kernel's dtype: each SDPA backend that
                     takes the inputs (cuDNN, flash, memory-efficient, math) is timed, the fastest is the baseline
    memory-bound     a device-to-device copy moving the same bytes (read + write)

Each is timed by the kernels' own method (`timing.measure_kernel`; the warm time is compared).
Under `--simulate` there is no GPU: the baselines are NumPy on the CPU (matmul, the reference
attention, `np.copyto`) timed with the host clock, so "% of baseline" compares the simulator or
emulator with NumPy and says nothing about a GPU. Every baseline is cached per shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from moonvit_kernels.tools.gpu_check.timing import (
    CupyClock,
    HostClock,
    KernelTiming,
    NumbaClock,
    TorchClock,
    measure_kernel,
)


def _try_import(name: str) -> Any:
    try:
        return __import__(name)
    except Exception:
        return None


class Baselines:
    """`get(kind, *shape)` -> `(label, KernelTiming)` or `(reason, None)` when no baseline exists here.

    `method` holds the timing counts (a `plan.Plan`: repeats, warmup, inner, cold_repeats, seconds_per_item)."""

    def __init__(self, simulate: bool, method: Any):
        self.simulate = simulate
        self.method = method
        self.cache: dict[tuple, tuple[str, KernelTiming | None]] = {}
        self.cupy = None if simulate else _try_import("cupy")
        self.device = "cuda"  # where torch baselines allocate (tests point it at the CPU)
        self.torch = None
        self.host_clock = HostClock("host clock")
        self.torch_clock: Any = None
        self._clocks: dict[type, Any] = {}
        if not simulate:
            torch = _try_import("torch")
            try:
                if torch is not None and torch.cuda.is_available():
                    self.torch = torch
                    self.torch_clock = TorchClock(torch)
            except Exception:
                pass

    def clock(self, kind: type) -> Any:
        """One clock of `kind` (CupyClock, NumbaClock) per Baselines: its L2-flush buffer is allocated once."""
        if kind not in self._clocks:
            self._clocks[kind] = kind()
        return self._clocks[kind]

    def measure(self, fn: Callable[[], object], clock: Any) -> KernelTiming:
        m = self.method
        return measure_kernel(fn, clock, m.repeats, m.warmup, m.inner, m.cold_repeats, m.seconds_per_item)

    def get(self, kind: str, *shape: Any) -> tuple[str, KernelTiming | None]:
        key = (kind, *shape)
        if key not in self.cache and kind == "attention" and not self.simulate and self.torch is not None:
            self.cache[key] = self._sdpa_fastest(*shape)
        if key not in self.cache:
            make = getattr(self, f"_{kind}")
            label, fn, clock = make(*shape)
            self.cache[key] = (label, None if fn is None else self.measure(fn, clock))
        return self.cache[key]

    # ------------------------------------------------------------------ GEMMs
    def _host_gemm(self, M: int, N: int, K: int) -> tuple[str, Callable, Any]:
        """The --simulate baseline of either GEMM: NumPy's fp32 A[M, K]·B[N, K]ᵀ on the host clock."""
        rng = np.random.default_rng(10)
        a = rng.standard_normal((M, K)).astype(np.float32)
        b = (rng.standard_normal((N, K)) / math.sqrt(K)).astype(np.float32)
        return "NumPy matmul fp32 (CPU)", lambda: a @ b.T, self.host_clock

    def _gemm_fp32(self, M: int, N: int, K: int) -> tuple[str, Callable | None, Any]:
        if self.simulate:
            return self._host_gemm(M, N, K)
        if self.cupy is not None:
            cp = self.cupy
            rng = cp.random.default_rng(11)
            a = rng.standard_normal((M, K), dtype=cp.float32)
            b = rng.standard_normal((N, K), dtype=cp.float32)
            return "cuBLAS fp32 (cupy.matmul)", lambda: cp.matmul(a, b.T), self.clock(CupyClock)
        if self.torch is not None:
            torch = self.torch
            torch.backends.cuda.matmul.allow_tf32 = False
            a = torch.randn(M, K, device="cuda")
            b = torch.randn(N, K, device="cuda")
            return "cuBLAS fp32 (torch.matmul, TF32 off)", lambda: a @ b.T, self.torch_clock
        return "no cuBLAS baseline (neither CuPy nor torch with CUDA)", None, None

    def _gemm_bf16(self, M: int, N: int, K: int) -> tuple[str, Callable | None, Any]:
        if self.simulate:
            return self._host_gemm(M, N, K)
        if self.torch is not None:
            torch = self.torch
            a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
            return "cuBLAS bf16 (torch.matmul)", lambda: a @ b.T, self.torch_clock
        if self.cupy is not None:
            cp = self.cupy
            rng = cp.random.default_rng(12)
            a = rng.standard_normal((M, K), dtype=cp.float32).astype(cp.float16)
            b = rng.standard_normal((N, K), dtype=cp.float32).astype(cp.float16)
            return "cuBLAS fp16 (cupy.matmul; no torch for bf16)", lambda: cp.matmul(a, b.T), self.clock(CupyClock)
        return "no cuBLAS baseline (neither torch nor CuPy)", None, None

    # ------------------------------------------------------------------ attention
    def _attention(self, L: int, heads: int, hd: int, dtype: str) -> tuple[str, Callable | None, Any]:
        if self.simulate:
            from moonvit_kernels import reference as ref

            rng = np.random.default_rng(13)
            q, k, v = (rng.standard_normal((L, heads, hd)).astype(np.float32) for _ in range(3))
            cu = np.array([0, L], dtype=np.int32)
            return "NumPy reference attention (CPU)", lambda: ref.attention(q, k, v, cu), self.host_clock
        if self.torch is None:
            return "no SDPA baseline (torch with CUDA not installed)", None, None
        torch = self.torch
        dt = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        q, k, v = (torch.randn(1, heads, L, hd, device="cuda", dtype=dt) for _ in range(3))
        fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)  # noqa: E731
        return f"torch SDPA {dtype} (backend as torch picks)", fn, self.torch_clock

    def _sdpa_fastest(self, L: int, heads: int, hd: int, dtype: str) -> tuple[str, KernelTiming | None]:
        """torch SDPA under each backend that accepts the inputs (cuDNN, flash, memory-efficient, math),
        each timed inside its own `sdpa_kernel` context; the fastest is the baseline, named in the label."""
        torch = self.torch
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
        except ImportError:  # torch < 2.3: whatever SDPA picks
            label, fn, clock = self._attention(L, heads, hd, dtype)
            return label, self.measure(fn, clock)
        dt = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        q, k, v = (torch.randn(1, heads, L, hd, device=self.device, dtype=dt) for _ in range(3))
        best: tuple[str, KernelTiming] | None = None
        tried = []
        for name in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"):
            backend = getattr(SDPBackend, name, None)
            if backend is None:
                continue
            try:
                with sdpa_kernel([backend]):
                    fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)  # noqa: E731
                    t = self.measure(fn, self.torch_clock)
            except Exception:  # this backend does not take these inputs (dtype, head dim, GPU)
                continue
            tried.append(name.split("_")[0].lower())
            if best is None or t.warm.median < best[1].warm.median:
                best = (name.split("_")[0].lower(), t)
        if best is None:
            return f"no SDPA backend ran for {dtype}", None
        return f"torch SDPA {dtype}, {best[0]} (fastest of {'/'.join(tried)})", best[1]

    # ------------------------------------------------------------------ memory-bound
    def _copy(self, nbytes: int) -> tuple[str, Callable | None, Any]:
        half = max(1, nbytes // 2)  # read half + write half = nbytes moved
        if self.simulate:
            src = np.random.default_rng(14).integers(0, 255, half, dtype=np.uint8)
            dst = np.empty_like(src)
            return "NumPy copy (CPU)", lambda: np.copyto(dst, src), self.host_clock
        if self.cupy is not None:
            cp = self.cupy
            src = cp.ones(half, dtype=cp.uint8)
            dst = cp.empty_like(src)
            return "device-to-device copy (CuPy)", lambda: cp.copyto(dst, src), self.clock(CupyClock)
        numba = _try_import("numba")
        if numba is not None:
            from numba import cuda

            src = cuda.to_device(np.ones(half, dtype=np.uint8))
            dst = cuda.device_array_like(src)
            return "device-to-device copy (numba)", lambda: dst.copy_to_device(src), self.clock(NumbaClock)
        return "no copy baseline", None, None
