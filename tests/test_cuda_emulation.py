"""CupyBackend as a whole on the CPU emulator (moonvit_kernels/tools/emulation) vs the reference.

No GPU needed: the `.cu` files are compiled unchanged by g++ against stand-ins for threads, barriers, warp
shuffles, ldmatrix, mma.sync and cp.async (see the emulation module's docstring). Each kernel's own checks at
awkward sizes live with its stage (tests/stages/test_<stage>.py, class TestCudaEmulator); here the whole
backend's forward runs on the emulated device. Skipped when no C++20 compiler is present.
"""

import numpy as np
import pytest
from cuda_kernel_checks import check_backend_forward

from moonvit_kernels.config import VisionConfig
from moonvit_kernels.tools import emulation

pytestmark = [
    pytest.mark.emulator,
    pytest.mark.skipif(emulation.compiler() is None, reason="no C++ compiler (g++ >= 11) for the CUDA C emulation"),
]


@pytest.fixture(scope="module")
def k():
    from moonvit_kernels.cuda_backend import launchers

    emulation.library()  # build once (cached per user by source hash (private_dirs))
    return emulation.OnEmulator(launchers)


def test_run_takes_numpy_and_keeps_in_place_updates(k):
    """`emulation.run`: NumPy in, NumPy out (tuples too); an array passed twice is one device array, so
    `residual=x, out=x` adds into x and returns x itself; an input the launcher only reads is left as it was
    (a read-only one too)."""
    from moonvit_kernels.cuda_backend import launchers

    rng = np.random.default_rng(3)
    a, b, x = (rng.standard_normal(s).astype(np.float32) for s in ((5, 8), (3, 8), (5, 3)))
    a.flags.writeable = False
    want = x + a.astype(np.float64) @ b.T.astype(np.float64)
    got = emulation.run(launchers.gemm, a, b, epilogue="residual", residual=x, out=x)
    assert got is x
    np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-5)
    qkv = rng.standard_normal((6, 3 * 8)).astype(np.float32)
    out, lse = k.attention(qkv, np.array([0, 2, 6]), 1, 8)
    assert type(out) is np.ndarray and type(lse) is np.ndarray and out.shape == (6, 8) and lse.shape == (6, 1)


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


def _device_backends(k, device, seed):
    """(pixels, grid, the host-path bf16 forward's outputs, a CupyBackend whose kernels see `device` as their
    array module) on the tiny config."""
    from cuda_kernel_checks import random_pixels, random_weights

    from moonvit_kernels.cuda_backend.backend import CupyBackend

    config = VisionConfig.tiny()
    grid = np.array([[1, 2, 6], [1, 4, 2]])
    weights = random_weights(config, 3)
    pixels = random_pixels(grid, config.patch_size, seed=seed)
    want = CupyBackend(config, weights, dtype="bfloat16", kernels=k).forward(pixels, grid, as_numpy=True)
    kernels = emulation.OnEmulator(k.module)
    kernels.array_module = lambda: device
    return pixels, grid, want, CupyBackend(config, weights, dtype="bfloat16", kernels=kernels)


class _UploadingDeviceModule(_DeviceModule):
    """`_DeviceModule` whose arrays are their own type, so host (NumPy) arrays are not device arrays: the
    backend must upload them. Counts the uploads of pixel-shaped (4-D) arrays."""

    class ndarray(np.ndarray):
        pass

    def __init__(self):
        super().__init__()
        self.pixel_uploads = 0

    def asarray(self, a, dtype=None):
        if not isinstance(a, self.ndarray) and np.ndim(a) == 4:
            self.pixel_uploads += 1
        return np.asarray(a, dtype).view(self.ndarray)


def test_backend_uploads_host_pixels_and_checks_them_on_the_device(k, monkeypatch):
    """Host pixel_values go to the device as given (float64 too), where they are checked and rounded: the
    host-side validate_inputs is not called, the result equals the host path's bit for bit, and bad pixels
    (NaN, integers, a ragged list) still get their messages."""
    from moonvit_kernels import reference

    device = _UploadingDeviceModule()
    pixels, grid, want, backend = _device_backends(k, device, seed=5)
    monkeypatch.setattr(reference, "validate_inputs", lambda *a, **kw: pytest.fail("host pixels validated on the host"))
    got = backend.forward(pixels.astype(np.float64), grid, as_numpy=True)
    assert (device.pixel_uploads, device.isfinite_calls) == (1, 1)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)

    bad = pixels.copy()
    bad[11, 2, 0, 1] = np.inf
    with pytest.raises(ValueError, match=r"non-finite values .*first in patch 11"):
        backend.forward(bad, grid)
    with pytest.raises(ValueError, match=r"not floating point"):
        backend.forward(pixels.astype(np.uint8), grid)
    with pytest.raises(ValueError, match=r"pixel_values is not a rectangular array"):
        backend.forward([pixels[0], pixels[1, 0]], grid)


def test_backend_validates_device_pixels_on_the_device(k, monkeypatch):
    """Device pixel_values are checked on the device (shape, dtype, NaN with its patch, fp32 overflow),
    never through the host-side `reference.validate_inputs`, and give the host path's result bit for bit."""
    from moonvit_kernels import reference

    device = _DeviceModule()
    pixels, grid, want, backend = _device_backends(k, device, seed=4)

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
    p = VisionConfig.tiny().patch_size
    with pytest.raises(ValueError, match=rf"shape \(20, 3, {p}\) is not \[L, 3, {p}, {p}\]"):
        backend.forward(pixels[..., 0], grid)
