"""The CUDA C kernels run on the CPU emulator (moonvit_kernels/cuda_backend/emulation) vs the reference.

No GPU needed: the `.cu` files are compiled unchanged by g++ against stand-ins for threads,
barriers, warp shuffles, ldmatrix, mma.sync and cp.async (see the emulation module's docstring),
so every index, bound, fragment layout, pipeline wait and softmax step is exercised at awkward
sizes (not tile multiples, K % 8 != 0, head_dim 24, items crossing tile edges). Each CUDA thread
is a fiber, so sizes stay at a few blocks. Marked `compile` (it builds the kernels for another
target); skipped when no C++20 compiler is present.
"""

import platform

import numpy as np
import pytest
from cuda_kernel_checks import (
    check_attention,
    check_backend_forward,
    check_gemm,
    check_merge,
    check_pos_emb,
    check_rmsnorm,
    check_rmsnorm_flushes_denormals,
    check_rope,
)

from moonvit_kernels.config import VisionConfig
from moonvit_kernels.cuda_backend import emulation
from moonvit_kernels.cuda_backend.sources import EPILOGUES

pytestmark = [
    pytest.mark.compile,
    pytest.mark.skipif(emulation.compiler() is None, reason="no C++ compiler (g++ >= 11) for the CUDA C emulation"),
]


@pytest.fixture(scope="module")
def k():
    emulation.library()  # build once (cached in the temp dir by source hash)
    return emulation


# (M, N, K): odd sizes; K = 45 and 588 (patch embedding) take the scalar-load path (K % 8 != 0);
# 130 rows span two 128-row tiles, 150 columns two 128-column tiles.
GEMM_SHAPES = [(37, 150, 72), (20, 131, 45), (1, 7, 16), (130, 9, 588)]


@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", GEMM_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm_bf16_tensor_cores(k, shape, out_dtype):
    for i, epilogue in enumerate(EPILOGUES):
        check_gemm(k, *shape, "bfloat16", out_dtype, epilogue, seed=i)


@pytest.mark.parametrize("shape", GEMM_SHAPES[:3] + [(70, 65, 33)], ids=lambda s: "x".join(map(str, s)))
def test_gemm_fp32_simt(k, shape):
    for i, epilogue in enumerate(EPILOGUES):
        check_gemm(k, *shape, "float32", "float32", epilogue, seed=i)


# gemm_fp32.cu stores C (and reads the residual) as float4 runs when N % 4 == 0 and both are 16-byte
# aligned: N = 68 is a partial 64-column tile, 37 rows a partial 64-row tile, K = 20 and 9 odd slabs.
@pytest.mark.parametrize("shape", [(37, 68, 20), (3, 4, 9), (65, 132, 36)], ids=lambda s: "x".join(map(str, s)))
def test_gemm_fp32_simt_float4_stores(k, shape):
    for i, epilogue in enumerate(EPILOGUES):
        check_gemm(k, *shape, "float32", "float32", epilogue, seed=10 + i)


def _float32_at(shape: tuple[int, int], misalign: int, fill: np.ndarray | None = None) -> np.ndarray:
    """A C-contiguous float32 array whose data starts `misalign` bytes past a 16-byte boundary (NaN or `fill`)."""
    buf = np.empty(shape[0] * shape[1] + 4, np.float32)
    skip = ((misalign - buf.ctypes.data) % 16) // 4
    out = buf[skip : skip + shape[0] * shape[1]].reshape(shape)
    out[...] = np.nan if fill is None else fill
    assert out.ctypes.data % 16 == misalign and out.flags.c_contiguous
    return out


@pytest.mark.parametrize("out_misalign, res_misalign", [(4, 0), (0, 8), (12, 12)])
@pytest.mark.parametrize("epilogue", ["none", "residual"])
def test_gemm_fp32_simt_unaligned_output_falls_back(k, epilogue, out_misalign, res_misalign):
    """N % 4 == 0 but C or R not 16-byte aligned (a view into a larger buffer): the float4 epilogue must
    not be taken; the scalar stores give the same result, every element written."""
    M, N, K = 37, 68, 20
    rng = np.random.default_rng(3)
    a = rng.standard_normal((M, K)).astype(np.float32) + 0.1
    b = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    want = a.astype(np.float64) @ b.T.astype(np.float64)
    out = _float32_at((M, N), out_misalign)
    residual = None
    if epilogue == "residual":
        r = rng.standard_normal((M, N)).astype(np.float32) * 2
        residual = _float32_at((M, N), res_misalign, r)
        want = want + r
    got = k.gemm(a, b, epilogue=epilogue, residual=residual, out=out)
    assert got is out
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize(
    "head_dim, heads, lens",
    [(24, 2, [1, 70, 130]), (128, 1, [65, 3]), (8, 3, [64, 17]), (40, 2, [5])],
    ids=["hd24-items-1-70-130", "hd128-items-65-3", "hd8-items-64-17", "hd40-one-item"],
)
def test_attention(k, dtype, head_dim, heads, lens):
    check_attention(k, dtype, head_dim, heads, lens)


@pytest.mark.parametrize("rows, D", [(5, 1024), (3, 50), (2, 7168), (1, 36)])
def test_rmsnorm(k, rows, D):
    for in_dtype in ("float32", "bfloat16"):
        for out_dtype in ("float32", "bfloat16"):
            check_rmsnorm(k, rows, D, in_dtype, out_dtype)


@pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64", "i686", "aarch64", "arm64"),
    reason="the emulator sets flush-to-zero on x86 and AArch64 only",
)
@pytest.mark.parametrize("in_dtype", ["float32", "bfloat16"])
def test_rmsnorm_flushes_denormals_like_ftz(k, in_dtype):
    """The kernels are built with -ftz=true (as CuPy builds them); the emulator flushes the same way."""
    check_rmsnorm_flushes_denormals(k, in_dtype)


def test_emulator_leaves_the_callers_denormals_alone(k):
    check_rmsnorm_flushes_denormals(k, "float32")
    tiny = np.float32(np.finfo(np.float32).tiny)
    assert np.float32(tiny) * np.float32(0.5) != 0  # the launch restored the caller's FP mode


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("heads, head_dim", [(2, 24), (1, 128), (3, 4)])
def test_rope(k, dtype, heads, head_dim):
    check_rope(k, dtype, np.array([[1, 3, 5], [2, 4, 2], [1, 9, 7]]), heads, head_dim)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_pos_emb(k, mode):
    config = VisionConfig.tiny().replace(pos_emb_interpolation_mode=mode)
    # 6x6 is the grid's own size (identity), the others interpolate; t = 3 and 2 are videos
    check_pos_emb(k, config, np.array([[1, 6, 6], [3, 4, 8], [1, 10, 4], [2, 2, 12]]))


@pytest.mark.parametrize("merge_kernel_size", [(2, 2), (2, 1), (1, 3)])
def test_merge(k, merge_kernel_size):
    grid = np.array([[1, 4, 6], [3, 2, 6], [4, 6, 6]])
    for in_dtype in ("float32", "bfloat16"):
        for out_dtype in ("float32", "bfloat16"):
            check_merge(k, grid, merge_kernel_size, 40, in_dtype, out_dtype)


@pytest.mark.parametrize("dtype, tol", [("float32", 2e-5), ("bfloat16", 2e-2)])
def test_backend_forward_tiny(k, dtype, tol):
    """The whole CupyBackend (kernels swapped for the emulation) vs reference.vision_forward:
    an interpolated image, a video, and an image at the grid's own size, packed together."""
    grid = np.array([[1, 4, 6], [2, 2, 4], [1, 6, 6]])
    check_backend_forward(k, VisionConfig.tiny(), grid, dtype, tol)


class _DeviceModule:
    """An array module standing in for CuPy: NumPy underneath, but not `numpy` itself, so the backend
    treats its arrays as device arrays (validated and converted in place, never sent to the host path).
    Counts the device-side finiteness checks."""

    def __init__(self):
        self.isfinite_calls = 0

    def isfinite(self, a):
        self.isfinite_calls += 1
        return np.isfinite(a)

    def __getattr__(self, name):
        return getattr(np, name)


def test_backend_validates_device_pixels_on_the_device(k, monkeypatch):
    """Device pixel_values are checked on the device (shape, dtype, NaN with its patch, fp32 overflow),
    never through the host-side `reference.validate_inputs`, and give the host path's result bit for bit."""
    import types

    from cuda_kernel_checks import random_pixels, random_weights

    from moonvit_kernels import reference
    from moonvit_kernels.cuda_backend.backend import CupyBackend

    config = VisionConfig.tiny()
    grid = np.array([[1, 2, 6], [1, 4, 2]])
    weights = random_weights(config, 3)
    pixels = random_pixels(grid, config.patch_size, seed=4)
    want = CupyBackend(config, weights, dtype="bfloat16", kernels=k).forward(pixels, grid, as_numpy=True)

    device = _DeviceModule()
    kernels = types.SimpleNamespace(**{n: getattr(k, n) for n in dir(k) if not n.startswith("__")})
    kernels.array_module = lambda: device
    backend = CupyBackend(config, weights, dtype="bfloat16", kernels=kernels)

    def host_validation(*args, **kwargs):
        raise AssertionError("device pixel_values went through the host-side validate_inputs")

    monkeypatch.setattr(reference, "validate_inputs", host_validation)
    got = backend.forward(pixels.astype(np.float64), grid, as_numpy=True)
    assert device.isfinite_calls == 1
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)

    bad = pixels.copy()
    bad[13, 1, 2, 3] = np.nan
    with pytest.raises(ValueError, match=r"non-finite values .*first in patch 13"):
        backend.forward(bad, grid)
    huge = pixels.astype(np.float64)
    huge[7, 0, 0, 0] = 1e300
    with pytest.raises(ValueError, match=r"too large for float32 \(first in patch 7\)"):
        backend.forward(huge, grid)
    with pytest.raises(ValueError, match=r"holds 19 patches but grid_thws .* needs sum\(t\*h\*w\) = 20"):
        backend.forward(pixels[:19], grid)
    with pytest.raises(ValueError, match=r"not floating point"):
        backend.forward(pixels.astype(np.int32), grid)
    p = config.patch_size
    with pytest.raises(ValueError, match=rf"shape \(20, 3, {p}\) is not \[L, 3, {p}, {p}\]"):
        backend.forward(pixels[..., 0], grid)
