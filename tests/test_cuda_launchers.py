"""The CuPy launchers' host-side checks, on the CPU against a fake CuPy (no GPU, no CuPy needed).

What is checked here would otherwise fail only on hardware: a misaligned paired store (a sticky
error that ends the process's CUDA context), a module or raised shared-memory attribute reused on
another GPU of a multi-GPU machine, a head dim whose shared memory exceeds the device's opt-in
limit, CUDA headers of another major than CuPy's NVRTC. The fake models what the real driver does
in those cases: a kernel launched on a device other than the one its module was loaded on, or with
more dynamic shared memory than its attribute allows, raises.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from moonvit_kernels.cuda_backend import launchers
from moonvit_kernels.cuda_backend import sources as kcuda

# device id -> (compute capability, opt-in shared memory per block): an H200, an L4, a T4
DEVICES = {0: ("90", 232_448), 1: ("89", 101_376), 2: ("75", 65_536)}


class FakeCupy:
    """The slice of CuPy the launchers use; records modules and launches."""

    def __init__(self, nvrtc_version=(13, 5)):
        fake = self
        self.current = 0
        self.next_ptr = {d: 0x7F0000000000 + (d << 36) for d in DEVICES}
        self.modules: list[FakeModule] = []
        self.launches: list[tuple] = []
        self.float32, self.uint16, self.int32 = np.float32, np.uint16, np.int32

        class Device:
            def __init__(self, device_id=None):
                self.id = fake.current if device_id is None else int(device_id)

            @property
            def compute_capability(self):
                return DEVICES[self.id][0]

            def __enter__(self):
                self._prev, fake.current = fake.current, self.id
                return self

            def __exit__(self, *exc):
                fake.current = self._prev

        class Runtime:
            cudaDevAttrMaxSharedMemoryPerBlockOptin = 97

            @staticmethod
            def getDevice():
                return fake.current

            @staticmethod
            def deviceGetAttribute(attr, device_id):
                assert attr == 97
                return DEVICES[device_id][1]

        self.cuda = types.SimpleNamespace(
            Device=Device, runtime=Runtime, nvrtc=types.SimpleNamespace(getVersion=lambda: nvrtc_version)
        )

        class ndarray:  # noqa: N801  (CuPy's name)
            def __init__(self, shape, dtype, ptr=None):
                self.shape, self.dtype, self.ndim = tuple(shape), np.dtype(dtype), len(shape)
                self.size = int(np.prod(shape))
                self.strides = tuple(int(s) * self.dtype.itemsize for s in np.cumprod((1, *shape[:0:-1]))[::-1])
                self.flags = types.SimpleNamespace(c_contiguous=True)
                self.device = Device()
                if ptr is None:
                    ptr = fake.next_ptr[self.device.id]
                    fake.next_ptr[self.device.id] += -(-max(self.size * self.dtype.itemsize, 1) // 512) * 512
                self.data = types.SimpleNamespace(ptr=ptr)

            def at_offset(self, nbytes):
                """A C-contiguous view of the same shape starting `nbytes` further (an offset slice)."""
                v = ndarray(self.shape, self.dtype, self.data.ptr + nbytes)
                v.device = self.device
                return v

        self.ndarray = ndarray

        class FakeKernel:
            def __init__(self, module, name):
                self.module, self.name, self.device, self.smem_attr = module, name, module.device, 48 * 1024

            @property
            def max_dynamic_shared_size_bytes(self):
                return self.smem_attr

            @max_dynamic_shared_size_bytes.setter
            def max_dynamic_shared_size_bytes(self, value):
                assert fake.current == self.device, "attribute set on another device's function"
                self.smem_attr = value

            def __call__(self, grid, block, args, shared_mem=0):
                if fake.current != self.device:
                    raise RuntimeError(f"invalid resource handle: module of device {self.device} on {fake.current}")
                if shared_mem > self.smem_attr:
                    raise RuntimeError(f"{shared_mem} B dynamic shared memory > attribute {self.smem_attr} B")
                fake.launches.append((self.device, self.name, grid, block, shared_mem, args))

        class FakeModule:
            def __init__(self, code, options, name_expressions):
                self.device, self.options, self.names, self.kernels = fake.current, options, name_expressions, {}
                fake.modules.append(self)

            def get_function(self, name):
                assert name in self.names
                return self.kernels.setdefault(name, FakeKernel(self, name))

        self.RawModule = FakeModule

    def empty(self, shape, dtype):
        return self.ndarray(shape, dtype)

    def asarray(self, a, dtype=None):
        a = np.asarray(a, dtype=dtype)
        return self.ndarray(a.shape, a.dtype)


@pytest.fixture
def cp(monkeypatch):
    fake = FakeCupy()
    monkeypatch.setattr(launchers, "_cupy", lambda: fake)
    monkeypatch.setattr(kcuda, "compile_options", lambda major=None: ("--std=c++17", "-ftz=true", f"-I/cuda{major}"))
    names = ("_cached_capability", "_cached_optin_smem", "_cached_nvrtc_major", "_module", "_kernel")
    caches = [getattr(launchers, n) for n in names if hasattr(launchers, n)]
    for c in caches:
        c.cache_clear()
    yield fake
    for c in caches:
        c.cache_clear()


# ============================================================================ alignment (host-side)
def test_check_aligned_is_pure_host_arithmetic():
    launchers.check_aligned("x", 0x1000, 16, "float4 loads")
    with pytest.raises(ValueError, match=r"x starts at device address 0x1004, which is not 8-byte aligned .*pairs"):
        launchers.check_aligned("x", 0x1004, 8, "pairs")


def test_device_pointer_reads_the_cuda_array_interface():
    class Foreign:
        __cuda_array_interface__ = {"data": (0xABC0, False), "shape": (3,), "typestr": "<f4", "version": 3}

    assert launchers.device_pointer(Foreign()) == 0xABC0


@pytest.mark.parametrize("out_dtype, pair", [("float32", 8), ("bfloat16", 4)])
@pytest.mark.parametrize("which", ["out", "residual"])
def test_gemm_refuses_a_misaligned_paired_store_before_launching(cp, out_dtype, pair, which):
    M, N, K = 37, 150, 72  # N even: the bf16 kernel stores column pairs
    a, b = cp.empty((M, K), np.uint16), cp.empty((N, K), np.uint16)
    store = np.float32 if out_dtype == "float32" else np.uint16
    odd = cp.empty((M, N), store).at_offset(pair // 2)  # element-aligned, not pair-aligned
    kwargs = {"out": odd} if which == "out" else {"residual": odd, "epilogue": "residual"}
    with pytest.raises(ValueError, match=rf"gemm: {which} starts at .* not {pair}-byte aligned .*paired stores"):
        launchers.gemm(a, b, out_dtype=out_dtype, **kwargs)
    assert cp.launches == []
    fine = cp.empty((M, N), store)
    kwargs = {"out": fine} if which == "out" else {"residual": fine, "epilogue": "residual"}
    launchers.gemm(a, b, out_dtype=out_dtype, **kwargs)
    assert len(cp.launches) == 1


def test_gemm_odd_n_stores_single_elements_so_any_element_offset_is_fine(cp):
    a, b = cp.empty((5, 16), np.uint16), cp.empty((7, 16), np.uint16)
    out = cp.empty((5, 7), np.float32).at_offset(4)
    launchers.gemm(a, b, out=out)
    (dev, name, grid, block, smem, args) = cp.launches[0]
    assert name == kcuda.gemm_bf16_name("float32", "none") and args[2] is out and block == (256,)
    fp32 = cp.empty((5, 16), np.float32)  # the fp32 kernel stores element by element
    launchers.gemm(fp32, cp.empty((6, 16), np.float32), out=cp.empty((5, 6), np.float32).at_offset(4))
    assert len(cp.launches) == 2


def test_arrays_must_be_element_aligned(cp):
    a = cp.empty((5, 16), np.float32).at_offset(2)
    with pytest.raises(ValueError, match="gemm: a starts at .* not 4-byte aligned as element accesses"):
        launchers.gemm(a, cp.empty((6, 16), np.float32))
    with pytest.raises(ValueError, match="merge: x .* not 2-byte aligned"):
        launchers.tpool_merge(cp.empty((8, 4), np.uint16).at_offset(1), cp.empty((2, 4), np.int32), (2, 2))
    assert cp.launches == []


def test_rmsnorm_alignment_is_the_vector_width_of_each_array(cp):
    w = cp.empty((64,), np.float32)
    launchers.rmsnorm(cp.empty((3, 64), np.uint16).at_offset(8), w, 1e-6)  # bf16 x: 8-byte uint2 loads
    for args, what, need in [
        ((cp.empty((3, 64), np.float32).at_offset(8), w), "x", 16),
        ((cp.empty((3, 64), np.uint16).at_offset(4), w), "x", 8),
        ((cp.empty((3, 64), np.float32), cp.empty((64,), np.float32).at_offset(4)), "weight", 16),
    ]:
        with pytest.raises(ValueError, match=f"rmsnorm: {what} starts at .* not {need}-byte aligned"):
            launchers.rmsnorm(*args, 1e-6)
    out = cp.empty((3, 64), np.uint16).at_offset(2)
    with pytest.raises(ValueError, match="rmsnorm: out .* not 8-byte aligned"):
        launchers.rmsnorm(cp.empty((3, 64), np.float32), w, 1e-6, out=out)
    launchers.rmsnorm(cp.empty((3, 63), np.float32).at_offset(4), cp.empty((63,), np.float32).at_offset(4), 1e-6)
    assert len(cp.launches) == 2


def test_attention_and_rope_alignment(cp):
    qkv = cp.empty((10, 3 * 2 * 24), np.uint16)
    with pytest.raises(ValueError, match="attention: qkv .* not 16-byte aligned .*cp.async"):
        launchers.attention(qkv.at_offset(8), np.array([0, 10]), 2, 24)
    with pytest.raises(ValueError, match="rope: qkv .* not 8-byte aligned"):
        launchers.rope_inplace(
            qkv.at_offset(4), cp.empty((10, 4), np.int32), cp.empty((6,), np.float32), num_heads=2, head_dim=24
        )
    launchers.attention(qkv, np.array([0, 3, 10]), 2, 24)
    assert len(cp.launches) == 1


# ============================================================================ per-device caches and limits
def test_each_gpu_gets_its_own_module_and_kernels(cp):
    """A module loaded on GPU 0 cannot launch on GPU 1: the caches are keyed by the current device."""
    for dev in (0, 1, 0, 1):
        with cp.cuda.Device(dev):
            a, b = cp.empty((9, 32), np.uint16), cp.empty((12, 32), np.uint16)
            launchers.gemm(a, b)
            qkv = cp.empty((70, 3 * 128), np.uint16)
            launchers.attention(qkv, np.array([0, 70]), 1, 128)
    assert sorted(m.device for m in cp.modules) == [0, 0, 1, 1]  # gemm_bf16.cu and attention.cu per device
    assert [launch[0] for launch in cp.launches] == [0, 0, 1, 1, 0, 0, 1, 1]
    smem = kcuda.attention_smem_bytes(128, "bfloat16")
    attn = [launch for launch in cp.launches if launch[1] == kcuda.attention_name(128, "bfloat16")]
    assert {launch[4] for launch in attn} == {smem}  # each device's kernel had its attribute raised


def test_compute_capability_is_checked_per_device(cp):
    launchers.require_sm80()
    with cp.cuda.Device(2), pytest.raises(RuntimeError, match="device 2 is sm_75"):
        launchers.require_sm80()
    with cp.cuda.Device(2), pytest.raises(RuntimeError, match="sm_75"):
        launchers.gemm(cp.empty((4, 8), np.float32), cp.empty((4, 8), np.float32))


def test_arrays_must_live_on_the_current_device(cp):
    a = cp.empty((4, 8), np.float32)
    with cp.cuda.Device(1):
        b = cp.empty((4, 8), np.float32)
        with pytest.raises(ValueError, match="gemm: a lives on device 0 but the current device is 1"):
            launchers.gemm(a, b)


def test_head_dims_that_exceed_the_devices_shared_memory_are_refused(cp):
    """hd 152 in bf16 needs 107,520 B: fine on an H200 (232,448 B), too much for an L4 (101,376 B)."""
    qkv = cp.empty((20, 3 * 152), np.uint16)
    launchers.attention(qkv, np.array([0, 20]), 1, 152)
    launchers.check_attention_supported(240, "bfloat16")
    with cp.cuda.Device(1):
        qkv1 = cp.empty((20, 3 * 152), np.uint16)
        with pytest.raises(ValueError, match=r"needs 107,520 B .* 101,376 B device 1 \(sm_89\) allows.* is 144"):
            launchers.attention(qkv1, np.array([0, 20]), 1, 152)
        launchers.attention(cp.empty((20, 3 * 152), np.float32), np.array([0, 20]), 1, 152)  # fp32: 48,768 B
        launchers.check_attention_supported(144, "bfloat16")
    assert [launch[0] for launch in cp.launches] == [0, 1]


def test_modules_compile_with_the_headers_of_cupys_nvrtc(cp, monkeypatch):
    fake12 = FakeCupy(nvrtc_version=(12, 8))
    monkeypatch.setattr(launchers, "_cupy", lambda: fake12)
    launchers.gemm(fake12.empty((3, 8), np.float32), fake12.empty((5, 8), np.float32))
    (module,) = fake12.modules
    assert module.options == ("--std=c++17", "-ftz=true", "-I/cuda12")
