"""torch in, torch out: MoonViT takes torch / DLPack inputs and returns torch tensors sharing memory.

The host path runs wherever torch is installed (a CPU build is enough); the CUDA path (torch CUDA
tensors on the numba and cupy backends, streams) needs a GPU and torch built with CUDA.
"""

import sys

import numpy as np
import pytest
from helpers import random_pixels

from moonvit_kernels import interop
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.model import MoonViT, cupy_importable
from moonvit_kernels.weights import random_weights

CFG = VisionConfig.tiny()
GRID = np.array([[1, 2, 4], [2, 4, 2]])  # an image and a 2-frame video, packed

try:
    import torch
except ImportError:  # torch is an optional extra; CI does not install it
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (optional extra: pip install torch)")


@pytest.fixture(scope="module")
def model():
    return MoonViT(CFG, random_weights(CFG, 11), backend="numpy")


@pytest.fixture(scope="module")
def pixels():
    return random_pixels(GRID, CFG.patch_size, seed=12)


class HostDLPack:
    """A foreign producer that only speaks DLPack (not an ndarray, not torch)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


class OtherDevice:
    """A DLPack object on a device that is neither CPU nor CUDA (ROCm = 10)."""

    def __dlpack_device__(self):
        return (10, 0)


class FakeCudaArray:
    """Announces CUDA memory through `__cuda_array_interface__` (nothing real behind it)."""

    __cuda_array_interface__ = {"shape": (2,), "typestr": "<f4", "data": (0, False), "version": 3}


def test_location_of_arrays():
    assert interop.location(np.zeros(2)) == "host"
    assert interop.location([[1, 2, 4]]) == "host"
    assert interop.location(HostDLPack(np.zeros(2))) == "host"
    assert interop.location(OtherDevice()) == "other"
    assert interop.location(FakeCudaArray()) == "cuda"


def test_dlpack_producer_gives_the_same_outputs(model, pixels):
    expected = model(pixels, GRID)
    got = model(HostDLPack(pixels), HostDLPack(GRID))
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)


def test_unsupported_device_and_unreadable_cuda_input_are_named(model, pixels):
    with pytest.raises(ValueError, match=r"pixel_values lives on DLPack device \(10, 0\)"):
        model(OtherDevice(), GRID)
    if not cupy_importable():
        with pytest.raises(ValueError, match="pixel_values is in CUDA memory .FakeCudaArray."):
            model(FakeCudaArray(), GRID)


def test_as_numpy_and_as_torch_exclude_each_other(model, pixels):
    with pytest.raises(ValueError, match="as_numpy and as_torch"):
        model(pixels, GRID, as_numpy=True, as_torch=True)


def test_as_torch_without_torch_says_how_to_install(model, pixels, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    with pytest.raises(ImportError, match=r"as_torch=True needs PyTorch: pip install torch"):
        model(pixels, GRID, as_torch=True)


class CudaDLPack:
    """A DLPack producer in CUDA memory (device type 2) without `__cuda_array_interface__`."""

    def __dlpack__(self, **kwargs):
        raise AssertionError("only the device importer may read it")

    def __dlpack_device__(self):
        return (2, 0)


def test_cuda_inputs_reach_the_device_backends_without_a_host_copy(monkeypatch):
    """Routing only (no GPU here): CUDA memory goes to CuPy's / numba's importers, never to the host."""
    import types

    from numba import cuda

    synced = []
    stream = types.SimpleNamespace(synchronize=lambda: synced.append(1))
    fake_cupy = types.SimpleNamespace(
        from_dlpack=lambda x: ("cupy.from_dlpack", x),
        asarray=lambda x: ("cupy.asarray", x),
        cuda=types.SimpleNamespace(get_current_stream=lambda: stream),
    )
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    cai, dl = FakeCudaArray(), CudaDLPack()
    assert interop.to_backend_pixels(cai, "cupy", host_backend=False) == ("cupy.asarray", cai)
    assert interop.to_backend_pixels(dl, "cupy", host_backend=False) == ("cupy.from_dlpack", dl)
    monkeypatch.setattr(cuda, "is_cuda_array", lambda x: hasattr(x, "__cuda_array_interface__"), raising=False)
    monkeypatch.setattr(cuda, "as_cuda_array", lambda x: ("numba.as_cuda_array", x), raising=False)
    assert interop.to_backend_pixels(cai, "numba", host_backend=False) == ("numba.as_cuda_array", cai)
    # DLPack-only CUDA producers reach numba through CuPy.
    assert interop.to_backend_pixels(dl, "numba", host_backend=False) == (
        "numba.as_cuda_array",
        ("cupy.from_dlpack", dl),
    )
    host = np.zeros((2, 3), np.float32)
    assert interop.to_backend_pixels(host, "cupy", host_backend=False) is host  # the backend uploads host arrays
    interop.synchronize_backend("cupy", host_backend=False)
    interop.synchronize_backend("numpy", host_backend=True)
    assert synced == [1]


@needs_torch
def test_torch_cpu_inputs_equal_numpy_inputs(model, pixels):
    expected = model(pixels, GRID)
    pv = torch.from_numpy(pixels.copy()).requires_grad_(True)  # grad-tracking tensors are detached
    got = model(pv, torch.from_numpy(GRID))
    for a, b in zip(got, expected, strict=True):
        assert isinstance(a, np.ndarray)
        np.testing.assert_array_equal(a, b)


@needs_torch
def test_torch_non_contiguous_and_float64_inputs(model, pixels):
    expected = model(pixels, GRID)
    wide = torch.from_numpy(np.concatenate([pixels, pixels], axis=1))[:, :3]  # a strided view
    assert not wide.is_contiguous()
    for a, b in zip(model(wide, GRID), expected, strict=True):
        np.testing.assert_array_equal(a, b)
    as64 = model(torch.from_numpy(pixels.astype(np.float64)), GRID)  # float64 is converted like NumPy's
    for a, b in zip(as64, expected, strict=True):
        np.testing.assert_array_equal(a, b)


@needs_torch
def test_torch_bfloat16_pixels_become_float32(model, pixels):
    bf16 = torch.from_numpy(pixels).to(torch.bfloat16)
    expected = model(bf16.float().numpy(), GRID)
    for a, b in zip(model(bf16, GRID), expected, strict=True):
        np.testing.assert_array_equal(a, b)


@needs_torch
def test_torch_nan_is_rejected(model, pixels):
    bad = torch.from_numpy(pixels.copy())
    bad[5, 1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        model(bad, GRID)


@needs_torch
def test_as_torch_shares_memory_with_the_outputs(model, pixels):
    expected = model(pixels, GRID)
    outputs, stages = model(torch.from_numpy(pixels), GRID, as_torch=True, return_intermediates=True)
    assert all(isinstance(o, torch.Tensor) and o.dtype == torch.float32 for o in outputs)
    assert [tuple(o.shape) for o in outputs] == [e.shape for e in expected]
    for a, b in zip(outputs, expected, strict=True):
        np.testing.assert_array_equal(a.numpy(), b)
    assert set(stages) >= {"patch_embed", "projected"} and isinstance(stages["projected"], torch.Tensor)
    # The outputs are views of the projected stage: one memory, no copies.
    projected = stages["projected"]
    assert outputs[0].data_ptr() == projected.data_ptr()
    assert outputs[1].data_ptr() == projected[outputs[0].shape[0] :].data_ptr()
    host = np.arange(6, dtype=np.float32)
    t = interop.to_torch(host)
    t[0] = 42.0
    assert host[0] == 42.0


@needs_torch
def test_as_torch_asks_a_simulated_device_backend_for_host_outputs(model, pixels, monkeypatch):
    """numba on the CUDA simulator holds NumPy-backed fake device arrays: as_torch asks for host outputs."""
    from moonvit_kernels import model as model_module

    class Recorder:
        def forward(self, pixel_values, grid_thws, **kwargs):
            self.kwargs = kwargs
            return [np.full((2, 3), 7.0, np.float32)]

    stub = MoonViT(CFG, random_weights(CFG, 11), backend="numpy")
    stub.backend_name, stub.backend = "numba", Recorder()
    monkeypatch.setattr(model_module, "simulator_enabled", lambda: True)
    (out,) = stub(torch.from_numpy(pixels), GRID, as_torch=True)
    assert stub.backend.kwargs["as_numpy"] is True
    assert isinstance(out, torch.Tensor) and float(out[1, 2]) == 7.0
    monkeypatch.setattr(model_module, "simulator_enabled", lambda: False)
    assert not stub.computes_on_host


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["numba", "cupy"])
def test_torch_cuda_in_and_out(backend, pixels):
    if torch is None or not torch.cuda.is_available():
        pytest.skip("needs torch built with CUDA and a GPU")
    if backend == "cupy" and not cupy_importable():
        pytest.skip("CuPy is not installed")
    w = random_weights(CFG, 11)
    expected = MoonViT(CFG, w, backend="numpy")(pixels, GRID)
    options = {"dtype": "float32"} if backend == "cupy" else {}
    model = MoonViT(CFG, w, backend=backend, **options)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # inputs written on a non-default torch stream: forward must wait for it
        pv = torch.from_numpy(pixels).cuda(non_blocking=True) * 1.0
        outputs = model(pv, torch.from_numpy(GRID).cuda(), as_torch=True)
    for a, b in zip(outputs, expected, strict=True):
        assert a.is_cuda and a.dtype == torch.float32
        np.testing.assert_allclose(a.cpu().numpy(), b, rtol=1e-4, atol=1e-4)


# ============================================================================ weights from torch / DLPack
def test_dlpack_weights_are_taken_as_numpy(model, pixels):
    """A state dict of foreign (DLPack-only) arrays gives the same outputs as the NumPy weights."""
    weights = random_weights(CFG, 11)
    foreign = MoonViT(CFG, {k: HostDLPack(v) for k, v in weights.items()}, backend="numpy")
    for a, b in zip(foreign(pixels, GRID), model(pixels, GRID), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"weight 'vision_tower\.patch_embed\.proj\.weight' lives on DLPack device"):
        MoonViT(CFG, {**weights, "vision_tower.patch_embed.proj.weight": OtherDevice()}, backend="numpy")


@needs_torch
def test_a_torch_state_dict_is_accepted(model, pixels):
    weights = random_weights(CFG, 11)
    state_dict = {k: torch.from_numpy(v.copy()).requires_grad_(True) for k, v in weights.items()}
    for a, b in zip(MoonViT(CFG, state_dict, backend="numpy")(pixels, GRID), model(pixels, GRID), strict=True):
        np.testing.assert_array_equal(a, b)
    bf16 = {k: v.detach().to(torch.bfloat16) for k, v in state_dict.items()}  # as checkpoints store them
    rounded = {k: v.float().numpy() for k, v in bf16.items()}
    got = MoonViT(CFG, bf16, backend="numpy")(pixels, GRID)
    for a, b in zip(got, MoonViT(CFG, rounded, backend="numpy")(pixels, GRID), strict=True):
        np.testing.assert_array_equal(a, b)
    nan = {**state_dict, "mm_projector.post_norm.weight": torch.full((CFG.text_hidden_size,), float("nan"))}
    with pytest.raises(ValueError, match=r"mm_projector\.post_norm\.weight.*NaN or Inf"):
        MoonViT(CFG, nan, backend="numpy")
