"""RMSNorm (rows, with rstd), every tier."""

import math
import platform

import numpy as np
import pytest
from compile_tier import assert_cuda_stage_builds, assert_numba_stage_compiles, cuda_archs
from cuda_kernel_checks import (
    check_rmsnorm,
    check_rmsnorm_flushes_denormals,
)
from formulations import (
    TIGHT,
    rmsnorm_formula,
    rnd,
)
from helpers import assert_close, fp32_rtol
from tiers import EMULATOR, GPU_L, K3, gpu_rand

from moonvit_kernels import reference as ref
from moonvit_kernels.config import FP32_EPS
from moonvit_kernels.numba_backend import launch
from moonvit_kernels.numba_backend import rmsnorm as R


# ============================================================================
# reference: against the second formulations in tests/formulations.py
class TestReference:
    pytestmark = [pytest.mark.reference]

    @pytest.mark.parametrize("rows", [1, 7])
    def test_rmsnorm_and_rstd(self, rows):
        x = rnd((rows, 33), 60, scale=3.0)
        g = 1 + 0.25 * rnd(33, 61)
        eps = 1e-5
        out, rstd = ref.rmsnorm(x, g, eps, return_rstd=True)
        assert_close(out, rmsnorm_formula(x, g, eps), **TIGHT, name="rmsnorm")
        assert_close(rstd, [1 / math.sqrt(sum(v * v for v in row) / 33 + eps) for row in x], **TIGHT, name="rstd")
        out32, rstd32 = ref.rmsnorm(x.astype(np.float32), g.astype(np.float32), eps, return_rstd=True)
        assert out32.dtype == np.float32 and rstd32.dtype == np.float32
        assert_close(out32, rmsnorm_formula(x.astype(np.float32), g.astype(np.float32), eps), fp32_rtol(33), 1e-6)
        # float16 input is normed in float32 (never below float32)
        assert ref.rmsnorm(x.astype(np.float16), g, eps).dtype == np.float32


# ============================================================================
# numba kernel (the CUDA simulator without a GPU)
def data(rows: int, cols: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    r = np.random.default_rng(seed)
    scale = r.uniform(0.05, 3.0, (rows, 1))  # rows of very different RMS, so rstd varies per row
    x = (r.standard_normal((rows, cols)) * scale + r.uniform(-0.2, 0.2, (rows, 1))).astype(np.float32)
    w = r.uniform(0.5, 1.5, cols).astype(np.float32)
    return x, w


def check(out, rstd, x, w, eps):
    want, want_rstd = ref.rmsnorm(x.astype(np.float64), w.astype(np.float64), eps, return_rstd=True)
    rtol = fp32_rtol(x.shape[1])
    assert_close(rstd, want_rstd, rtol=rtol, atol=0.0, name="rstd")
    assert_close(out, want, rtol=rtol, atol=1e-6, name="out")


class TestNumba:
    pytestmark = [pytest.mark.numba]

    # (rows, cols, threads): odd widths, a row shorter than a block, rows wider than the block (strided loop).
    @pytest.mark.parametrize(
        "rows,cols,threads",
        [(1, 37, None), (7, 37, 32), (33, 19, None), (3, 300, None), (2, 1, None), (5, 129, 64)],
    )
    @pytest.mark.parametrize("eps", [FP32_EPS, 0.5])
    def test_rmsnorm_matches_reference(self, rows, cols, threads, eps):
        x, w = data(rows, cols, seed=rows * 1000 + cols)
        out, rstd = R.rmsnorm(x, w, eps, return_rstd=True, threads=threads)
        assert launch.is_device_array(out) and launch.is_device_array(rstd)
        check(out.copy_to_host(), rstd.copy_to_host(), x, w, eps)

    def test_eps_matters(self):
        """A kernel that ignored eps would pass eps=1e-7 but not eps=0.5 on small-RMS rows."""
        x, w = data(4, 33, seed=1)
        x *= 0.1
        out = R.rmsnorm(x, w, 1e-7).copy_to_host()
        with pytest.raises(AssertionError):
            assert_close(out, ref.rmsnorm(x.astype(np.float64), w.astype(np.float64), 0.5), 1e-4, 1e-6)

    def test_in_place_on_device(self):
        x, w = data(7, 37, seed=2)
        x_d = launch.to_device(x)
        out, rstd = R.rmsnorm(x_d, launch.to_device(w), 1e-5, out=x_d, return_rstd=True)
        assert out is x_d
        check(x_d.copy_to_host(), rstd.copy_to_host(), x, w, 1e-5)

    def test_numpy_in_place(self):
        x, w = data(7, 37, seed=3)
        x_host = x.copy()
        R.rmsnorm(x_host, w, 1e-5, out=x_host)
        assert_close(x_host, ref.rmsnorm(x.astype(np.float64), w.astype(np.float64), 1e-5), 1e-5, 1e-6)

    def test_compile_tier_builds_every_block_size(self):
        from moonvit_kernels import registry

        built = [e.python_function() for e in registry.numba_entries() if e.stage == "rmsnorm"]
        assert [fn.__name__ for fn in built] == [f"rmsnorm_kernel_t{t}" for t in R.BLOCK_SIZES]
        assert all(fn is R.kernel_for(t).py_func for fn, t in zip(built, R.BLOCK_SIZES, strict=True))

    def test_launcher_rejects_bad_arguments(self):
        x, w = data(7, 37, seed=4)
        cases = [
            (dict(x=x.astype(np.float64), weight=w, eps=1e-5), "x: dtype float64"),
            (dict(x=x, weight=w[:-1], eps=1e-5), r"weight: shape \(36,\) does not match \(37,\)"),
            (dict(x=x, weight=w.astype(np.float16), eps=1e-5), "weight: dtype float16"),
            (dict(x=x[:, ::2], weight=w[:19].copy(), eps=1e-5), "x: array is not C-contiguous"),
            (dict(x=launch.to_device(x)[:, :19], weight=w[:19].copy(), eps=1e-5), "x: array is not C-contiguous"),
            (dict(x=x.ravel(), weight=w, eps=1e-5), "x: shape .* has 1 dimensions"),
            (dict(x=x, weight=w, eps=1e-5, out=np.empty((7, 36), np.float32)), "out: shape"),
            (dict(x=x, weight=w, eps=0.0), "eps must be a positive"),
            (dict(x=x, weight=w, eps=float("nan")), "eps must be a positive"),
            (dict(x=x, weight=w, eps=1e-5, threads=48), "threads=48 is not one of"),
        ]
        for kwargs, message in cases:
            with pytest.raises(ValueError, match=message):
                R.rmsnorm(**kwargs)


# ============================================================================
# CUDA C kernel on the CPU emulator, through the real launchers
class TestCudaEmulator:
    pytestmark = EMULATOR

    @pytest.mark.parametrize("rows, D", [(5, 1024), (3, 50), (2, 7168), (1, 36)])
    def test_rmsnorm(self, k, rows, D):
        for in_dtype in ("float32", "bfloat16"):
            for out_dtype in ("float32", "bfloat16"):
                check_rmsnorm(k, rows, D, in_dtype, out_dtype)

    @pytest.mark.skipif(
        platform.machine().lower() not in ("x86_64", "amd64", "i686", "aarch64", "arm64"),
        reason="the emulator sets flush-to-zero on x86 and AArch64 only",
    )
    @pytest.mark.parametrize("in_dtype", ["float32", "bfloat16"])
    def test_rmsnorm_flushes_denormals_like_ftz(self, k, in_dtype):
        """The kernels are built with -ftz=true (as CuPy builds them); the emulator flushes the same way."""
        check_rmsnorm_flushes_denormals(k, in_dtype)

    def test_emulator_leaves_the_callers_denormals_alone(self, k):
        check_rmsnorm_flushes_denormals(k, "float32")
        tiny = np.float32(np.finfo(np.float32).tiny)
        assert np.float32(tiny) * np.float32(0.5) != 0  # the launch restored the caller's FP mode


# ============================================================================
# compile tier (no GPU): the stage's numba kernels for sm_90, its CUDA C kernels with NVRTC per architecture
class TestCompile:
    pytestmark = [pytest.mark.compile]

    def test_numba_kernels_compile_within_limits(self):
        assert_numba_stage_compiles("rmsnorm")

    @pytest.mark.parametrize("arch", cuda_archs("rmsnorm"))
    def test_cuda_c_kernels_build_within_limits(self, arch):
        assert_cuda_stage_builds("rmsnorm", arch)


# ============================================================================
# GPU (CuPy launchers and numba kernels at real sizes; skipped without a GPU)
class TestGpu:
    pytestmark = [pytest.mark.gpu]

    @pytest.mark.parametrize("rows, D_", [(5, 1024), (3, 50), (1, 36), (4096, 1024), (300, 7168)])
    def test_rmsnorm(self, k, rows, D_):
        for in_dtype in ("float32", "bfloat16"):
            for out_dtype in ("float32", "bfloat16"):
                check_rmsnorm(k, rows, D_, in_dtype, out_dtype)

    @pytest.mark.parametrize("in_dtype", ["float32", "bfloat16"])
    def test_rmsnorm_flushes_denormals(self, k, in_dtype):
        """CuPy compiles with -ftz=true: the hardware flushes as the emulator does (TestCudaEmulator)."""
        check_rmsnorm_flushes_denormals(k, in_dtype)

    def test_rmsnorm_real_size(self):
        x, g = gpu_rand(GPU_L, 1024), gpu_rand(1024)
        out, rstd = R.rmsnorm(x, g, K3.vit_norm_eps, return_rstd=True)
        want, want_rstd = ref.rmsnorm(x.astype(np.float64), g.astype(np.float64), K3.vit_norm_eps, return_rstd=True)
        assert_close(out.copy_to_host(), want, rtol=fp32_rtol(1024), atol=1e-6, name="rmsnorm")
        assert_close(rstd.copy_to_host(), want_rstd, rtol=fp32_rtol(1024), atol=0, name="rstd")
