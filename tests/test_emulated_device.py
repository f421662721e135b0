"""The CPU emulator as a device: the real launchers (`launchers.py`, `hopper_launchers.py`) run on it.

Everything a GPU launch goes through runs here — the launchers' checks, their scalar casts and launch
geometry, CuPy-style argument marshalling (sizes and alignments against the kernel's parameters), the
tensor-map encoding up to the driver's entry point — and only the kernel body runs on the CPU.
tests/test_planted_faults.py breaks these launchers on purpose and sees the tests here fail.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from moonvit_kernels import registry
from moonvit_kernels.cuda_backend import hopper_launchers, launchers, tensor_maps
from moonvit_kernels.tools.emulation import compiler, device
from moonvit_kernels.weights import bf16_bits_to_float32, float32_to_bf16_bits

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C++ compiler (g++ >= 11) for the CUDA C emulation")


@pytest.fixture
def dev():
    device.configure(compute_capability="90", count=2)
    with device.activated() as d:
        yield d
    device.configure()


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# ============================================================================ the real launchers, run
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_real_gemm_launcher_on_the_emulated_device(dev, dtype):
    """M != N != K, none a tile multiple: a launcher that swaps two of them computes something else."""
    rng = _rng(3)
    M, N, K = 37, 29, 24
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((N, K)).astype(np.float32)
    if dtype == "bfloat16":
        a, b = bf16_bits_to_float32(float32_to_bf16_bits(a)), bf16_bits_to_float32(float32_to_bf16_bits(b))
        da, db = dev.asarray(float32_to_bf16_bits(a)), dev.asarray(float32_to_bf16_bits(b))
    else:
        da, db = dev.asarray(a), dev.asarray(b)
    got = launchers.gemm(da, db)
    assert isinstance(got, dev.ndarray) and got.shape == (M, N)
    want = a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(got.get(), want, rtol=1e-5, atol=1e-4)


def test_real_rmsnorm_launcher_on_the_emulated_device(dev):
    rng = _rng(4)
    x = rng.standard_normal((5, 36)).astype(np.float32) * 3
    w = rng.standard_normal(36).astype(np.float32)
    out, rstd = launchers.rmsnorm(dev.asarray(x), dev.asarray(w), 1e-5, return_rstd=True)
    r = 1 / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1) + 1e-5)
    np.testing.assert_allclose(rstd.get(), r, rtol=1e-5)
    np.testing.assert_allclose(out.get(), x * r[:, None] * w, rtol=1e-5, atol=1e-5)


def test_misaligned_paired_store_is_refused_before_the_launch(dev):
    """The bf16 GEMM stores column pairs (N even): an `out` one element off refuses on the host, before a
    misaligned store could fault (on the emulator: abort the process; on a GPU: end the CUDA context)."""
    a = dev.asarray(float32_to_bf16_bits(_rng(5).standard_normal((9, 16))))
    b = dev.asarray(float32_to_bf16_bits(_rng(6).standard_normal((6, 16))))
    odd = dev.empty(9 * 6 + 1, np.float32)[1:].reshape(9, 6)
    with pytest.raises(ValueError, match=r"gemm: out starts at .* not 8-byte aligned"):
        launchers.gemm(a, b, out=odd)


def test_the_launchers_refuse_host_arrays_and_arrays_of_another_device(dev):
    x = np.ones((3, 8), np.float32)
    with pytest.raises(ValueError, match="must be a CuPy array on the GPU"):
        launchers.rmsnorm(x, dev.asarray(np.ones(8, np.float32)), 1e-5)
    with dev.cuda.Device(1):
        w1 = dev.asarray(np.ones(8, np.float32))
    with pytest.raises(ValueError, match="lives on device 1 but the current device is 0"):
        launchers.rmsnorm(dev.asarray(x), w1, 1e-5)


def test_hopper_gemm_launcher_on_the_emulated_device(dev):
    """hopper_launchers.gemm end to end: tensor maps encoded by the driver-shaped model, passed by value
    as 64-byte aligned 128-byte structs, the sm_90a kernel run by the Hopper models."""
    rng = _rng(7)
    M, N, K = 5, 3, 24
    a = bf16_bits_to_float32(float32_to_bf16_bits(rng.standard_normal((M, K))))
    b = bf16_bits_to_float32(float32_to_bf16_bits(rng.standard_normal((N, K))))
    got = hopper_launchers.gemm(dev.asarray(float32_to_bf16_bits(a)), dev.asarray(float32_to_bf16_bits(b)))
    np.testing.assert_allclose(got.get(), a.astype(np.float64) @ b.astype(np.float64).T, rtol=1e-5, atol=1e-5)


def test_hopper_launches_encode_each_tensor_map_once(dev, monkeypatch):
    """A repeated launch on the same buffers reuses their encoded maps (host time: the H200 run measured the
    Hopper launches' host cost per call at 2-3x the mma.sync ones'); a new buffer, or a new shape at the same
    address, is encoded afresh, and every result is still right."""
    encoded = []
    real = tensor_maps.encode
    monkeypatch.setattr(tensor_maps, "encode", lambda m, address, encoder=None: encoded.append((m, address))
                        or real(m, address, encoder))  # fmt: skip
    hopper_launchers._encoded_map.cache_clear()
    rng = _rng(8)
    a, b = (bf16_bits_to_float32(float32_to_bf16_bits(rng.standard_normal(s))) for s in ((6, 16), (5, 16)))
    a_dev, b_dev = dev.asarray(float32_to_bf16_bits(a)), dev.asarray(float32_to_bf16_bits(b))
    want = a.astype(np.float64) @ b.astype(np.float64).T
    for _ in range(3):
        np.testing.assert_allclose(hopper_launchers.gemm(a_dev, b_dev).get(), want, rtol=1e-5, atol=1e-5)
    assert len(encoded) == 2, encoded  # A's map and B's, once
    b2 = dev.asarray(float32_to_bf16_bits(b[:, :8]).copy())
    np.testing.assert_allclose(
        hopper_launchers.gemm(a_dev[:, :8].copy(), b2).get(),
        a[:, :8].astype(np.float64) @ b[:, :8].astype(np.float64).T,
        rtol=1e-5,
        atol=1e-5,
    )
    assert len(encoded) == 4 and {m.dims for m, _ in encoded[2:]} == {(8, 6), (8, 5)}


def test_sm90a_modules_need_a_compute_capability_9_device():
    device.configure(compute_capability="80", optin_smem=163 * 1024)
    try:
        with device.activated():
            with pytest.raises(device.LaunchError, match="compute capability 9.0"):
                device.RawModule(code="", options=("-arch=sm_90a",), name_expressions=("k",))
    finally:
        device.configure()


# ============================================================================ the launch itself
_KERNEL = r"""
extern "C" __global__ void scale(float* x, int n, float s) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= s;
}
"""


def test_a_raw_module_launches_like_cupy(dev):
    k = dev.RawModule(code=_KERNEL).get_function("scale")
    x = dev.asarray(np.arange(70, dtype=np.float32))
    k((3,), (32,), (x, np.int32(70), np.float32(0.5)))
    np.testing.assert_array_equal(x.get(), np.arange(70, dtype=np.float32) * 0.5)


@pytest.mark.parametrize(
    "args, match",
    [
        (lambda x: (x, 70, np.float32(0.5)), r"argument 1 of scale is 8 bytes, its parameter 4"),  # int -> int64
        (lambda x: (x, np.int32(70), 0.5), r"argument 2 of scale is 8 bytes, its parameter 4"),  # float -> double
        (lambda x: (np.int32(70), x, np.float32(0.5)), r"argument 0 of scale is 4 bytes, its parameter 8"),
        (lambda x: (x, np.int32(70)), r"scale takes 3 arguments, got 2"),
        (lambda x: (x.get(), np.int32(70), np.float32(0.5)), r"host \(NumPy\) array"),
    ],
)
def test_arguments_are_marshalled_and_checked_as_a_gpu_reads_them(dev, args, match):
    k = dev.RawModule(code=_KERNEL).get_function("scale")
    x = dev.asarray(np.zeros(70, np.float32))
    with pytest.raises(device.LaunchError, match=match):
        k((3,), (32,), args(x))


def test_struct_arguments_need_their_parameters_alignment(dev):
    code = r"""
struct __align__(64) Map { unsigned long long w[16]; };
extern "C" __global__ void first_word(const __grid_constant__ Map m, unsigned long long* out) {
  if (threadIdx.x == 0) out[0] = m.w[0] + m.w[15];
}
"""
    k = dev.RawModule(code=code).get_function("first_word")
    out = dev.empty(1, np.uint64)
    words = np.arange(16, dtype=np.uint64) + 40
    aligned = np.frombuffer(words.tobytes(), dev.make_aligned_dtype([("w", np.uint64, (16,))], alignment=64))[0]
    k((1,), (32,), (aligned, out))
    assert int(out.get()[0]) == 40 + 55
    plain = np.frombuffer(words.tobytes(), np.dtype([("w", np.uint64, (16,))]))[0]  # packed: 1-byte alignment
    with pytest.raises(device.LaunchError, match=r"packed with 1-byte alignment, its parameter needs 64"):
        k((1,), (32,), (plain, out))


def test_launch_geometry_and_shared_memory_limits(dev):
    k = dev.RawModule(code=_KERNEL).get_function("scale")
    x = dev.asarray(np.zeros(8, np.float32))
    args = (x, np.int32(8), np.float32(1))
    with pytest.raises(device.LaunchError, match="block .* exceeds"):
        k((1,), (1056,), args)
    with pytest.raises(device.LaunchError, match="grid .* exceeds"):
        k((1, 65536), (32,), args)
    with pytest.raises(device.LaunchError, match="without raising max_dynamic_shared_size_bytes"):
        k((1,), (32,), args, shared_mem=48 * 1024 + 16)
    k.max_dynamic_shared_size_bytes = 300 * 1024
    with pytest.raises(device.LaunchError, match="opt-in limit"):
        k((1,), (32,), args, shared_mem=64 * 1024)


def test_a_block_the_register_file_cannot_hold_is_refused(dev):
    """The hardware's rule, not registers x threads <= 65536: 80 registers per thread fit 768 threads, not 800."""
    k = dev.RawModule(code=_KERNEL).get_function("scale")
    x = dev.asarray(np.zeros(8, np.float32))
    k.num_regs = 80
    k((1,), (768,), (x, np.int32(8), np.float32(1)))
    with pytest.raises(device.LaunchError, match="too many resources requested for launch"):
        k((1,), (800,), (x, np.int32(8), np.float32(1)))


def test_catalogue_kernels_carry_their_register_bound(dev):
    from moonvit_kernels.cuda_backend import sources as kcuda

    spec = next(s for s in registry.kernel_specs() if s.source == "rmsnorm.cu")
    module = dev.RawModule(code=kcuda.load_source("rmsnorm.cu"), name_expressions=(spec.name,))
    assert module.get_function(spec.name).num_regs == spec.max_registers > 0


def test_new_device_memory_is_poisoned():
    assert np.isnan(device.empty(3, np.float32).get()).all()
    assert (device.empty(3, np.uint16).get() == 0x7FC0).all()  # a bf16 NaN


# ============================================================================ tensor maps up to the driver
def test_tensor_maps_are_encoded_with_typed_arguments_into_an_aligned_buffer():
    seen = {}

    def encoder(*args):
        seen["args"] = args
        return 0

    m = tensor_maps.gemm_operand_map(300, 72)
    words = tensor_maps.encode(m, 0x10000, encoder)
    out, dtype, rank, address, dims, strides, box, estrides, *_ = seen["args"]
    assert out.value % 64 == 0 and words.ctypes.data == out.value and words.dtype == np.uint64 and words.size == 16
    assert (dtype, rank.value, address.value) == (tensor_maps.DATA_TYPE_BFLOAT16, 2, 0x10000)
    assert isinstance(dims[0], int) and type(dims)._type_ is ctypes.c_uint64 and list(dims) == [72, 300]
    assert type(strides)._type_ is ctypes.c_uint64 and list(strides)[:1] == [144]
    assert type(box)._type_ is ctypes.c_uint32 and list(box) == [64, 128]
    assert type(estrides)._type_ is ctypes.c_uint32 and list(estrides) == [1, 1]
    assert tensor_maps.ENCODE_ARGTYPES[4]._type_ is ctypes.c_uint64


def test_the_emulators_encoder_checks_the_drivers_requirements():
    from moonvit_kernels.tools.emulation import hopper

    enc = hopper.encode_tiled_driver()
    g = device.empty(4096, np.uint16)
    good = tensor_maps.gemm_operand_map(16, 64)
    assert tensor_maps.encode(good, g.data.ptr, enc)[0] != 0
    with pytest.raises(ValueError, match="globalAddress not 16-byte aligned"):
        tensor_maps.encode(good, g.data.ptr + 8, enc)
    overlapping = tensor_maps.TiledMap((64, 16), (64,), (64, 16), 128)  # row pitch 64 B < 64 bf16 = 128 B
    with pytest.raises(ValueError, match="smaller than the extent"):
        tensor_maps.encode(overlapping, g.data.ptr, enc)
    raw = np.zeros(256, np.uint8)
    off = raw[((-raw.ctypes.data) % 64) + 8 :]  # 8 bytes past a 64-byte boundary
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    dims, strides, box, ones = (u64 * 2)(64, 16), (u64 * 1)(128), (u32 * 2)(64, 16), (u32 * 2)(1, 1)
    rc = enc(ctypes.c_void_p(off.ctypes.data), 9, 2, ctypes.c_void_p(g.data.ptr), dims, strides, box, ones, 0, 3, 2, 0)
    assert rc == 1 and "64-byte aligned" in enc.last_error()


# ============================================================================ the whole backend on the device
@pytest.mark.parametrize("dtype, tol", [("float32", 2e-5), ("bfloat16", 2e-2)])
def test_the_whole_cupy_backend_runs_on_the_emulated_device(dev, dtype, tol):
    """`CupyBackend` with its default kernels (the real launchers) on the emulated device: weights uploaded
    once, device pixel_values validated on the device, every stage launched through the launchers."""
    from cuda_kernel_checks import random_pixels, random_weights

    from moonvit_kernels import reference
    from moonvit_kernels.config import VisionConfig
    from moonvit_kernels.cuda_backend.backend import CupyBackend

    config = VisionConfig.tiny()
    grid = np.array([[1, 4, 6], [2, 2, 4]])
    weights = random_weights(config, 5)
    pixels = random_pixels(grid, config.patch_size, seed=6)
    backend = CupyBackend(config, weights, dtype=dtype, hopper=False)
    assert backend.xp is dev and isinstance(backend.patch_w, dev.ndarray)
    got = backend.forward(dev.asarray(pixels), grid, as_numpy=True)
    want = reference.vision_forward(pixels.astype(np.float64), grid, weights, config, dtype=np.float64)
    for g, w in zip(got, want, strict=True):
        scale = float(np.max(np.abs(w)))
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * scale)
    assert sum(backend.kernel_calls.values()) > 0
