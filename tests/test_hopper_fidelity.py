"""The emulator rejects real Hopper kernels that break a hardware rule of the PTX ISA.

A copy of the sm90 kernels is built with three defects planted by text substitution, each switched
on at run time (`moonvit_plant()`, one bit per defect of $MOONVIT_PLANT, so a single extra build of
each kernel file serves every case), and launched by the real `hopper_launchers` on the emulated device:
  1  flash_attn_sm90.cu without the producer's `fence.proxy.async` after its ordinary stores of the
     transposed V tile, which wgmma then reads ("Async Proxy": a cross-proxy fence is required);
  2  gemm_bf16_sm90.cu without `fence.mbarrier_init` after the barriers' init, before the tensor
     copies complete on them (membar/fence: the op-restricted release fence for mbarrier.init);
  4  gemm_bf16_sm90.cu with its swizzled ring 512 bytes past the 1024-byte boundary while the wgmma
     descriptors keep base offset 0 ("Matrix Descriptor Format").
Each must abort the emulator with a message naming the rule and the kernel's call site; with no
bit set the copy must compute the right answer (so the substitutions alone break nothing). The
models behind the rules are tested one by one in tests/test_hopper_layouts.py.
"""

import contextlib
import shutil

import numpy as np
import pytest
from cuda_kernel_checks import check_attention, check_gemm

from moonvit_kernels.cuda_backend import sources as kcuda
from moonvit_kernels.tools.emulation import compiler

pytestmark = [
    pytest.mark.compile,
    pytest.mark.skipif(compiler() is None, reason="no C++ compiler (g++ >= 11) for the CUDA C emulation"),
]

PLANT_ENV = "MOONVIT_PLANT"
LAUNCH_SECONDS = 300  # a contained launch's limit: far above a small launch's few seconds
PLANT_SWITCH = (
    "#include <cstdlib>\n"
    f'inline int moonvit_plant() {{ const char* p = std::getenv("{PLANT_ENV}"); return p ? std::atoi(p) : 0; }}\n'
)
# (file, text in the real kernel, its planted replacement): each text occurs exactly once
SUBSTITUTIONS = [
    ("flash_attn_sm90.cu", "fence_proxy_async();", "if (!(moonvit_plant() & 1)) fence_proxy_async();"),
    ("gemm_bf16_sm90.cu", "fence_mbarrier_init();", "if (!(moonvit_plant() & 2)) fence_mbarrier_init();"),
    (
        "gemm_bf16_sm90.cu",
        "SM90_DYNAMIC_SMEM(smem);",
        "SM90_DYNAMIC_SMEM(smem_planted);\n  unsigned char* smem = smem_planted + (moonvit_plant() & 4 ? 512 : 0);",
    ),
    ("gemm_bf16_sm90.cu", "+ 2 * STAGES * 8;", "+ 2 * STAGES * 8 + 1024;"),  # room for the shifted ring
]
PLANTED_GEMM_SMEM_EXTRA = 1024  # the last substitution's growth of GemmSm90Cfg::SMEM_BYTES
PLANTED_SOURCES = ("gemm_bf16_sm90.cu", "flash_attn_sm90.cu")


def plant(directory) -> None:
    """Write the kernel files (and their headers) into `directory` with SUBSTITUTIONS applied and the switch
    at the top of each planted kernel file."""
    for path in kcuda.KERNEL_DIR.glob("*.cu*"):
        shutil.copy(path, directory / path.name)
    for name, old, new in SUBSTITUTIONS:
        text = (directory / name).read_text(encoding="utf-8")
        assert text.count(old) == 1, f"{name}: {old!r} occurs {text.count(old)} times; update the substitution"
        (directory / name).write_text(text.replace(old, new), encoding="utf-8")
    for name in PLANTED_SOURCES:
        (directory / name).write_text(PLANT_SWITCH + (directory / name).read_text(encoding="utf-8"), encoding="utf-8")


def _forget_modules() -> None:
    """Drop the launchers' modules of this process, so the next launch builds (or finds) them anew."""
    from moonvit_kernels.cuda_backend import hopper_launchers

    hopper_launchers._module.cache_clear()
    hopper_launchers._device_kernel.cache_clear()


@contextlib.contextmanager
def kernels_from(directory):
    """The Hopper launchers build and load the kernel files of `directory` within, the real ones after."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kcuda, "KERNEL_DIR", directory)
        _forget_modules()
        try:
            yield
        finally:
            _forget_modules()


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """Within: the launchers use the planted copy (built on first launch, cached on disk by content)."""
    directory = tmp_path_factory.mktemp("planted_sm90")
    plant(directory)
    real_smem = kcuda.gemm_sm90_smem_bytes
    with pytest.MonkeyPatch.context() as mp, kernels_from(directory):
        mp.setattr(kcuda, "gemm_sm90_smem_bytes", lambda block_n: real_smem(block_n) + PLANTED_GEMM_SMEM_EXTRA)
        yield


class PlantedAbort(AssertionError):
    """The emulator aborted the planted kernel; the message is the launch's error (the model's stderr in it)."""


class Planted:
    """The launchers' gemm / attention API (as cuda_kernel_checks calls it): `hopper_launchers` on the emulated
    device (`emulation.run`) with the defects `bits` switched on. Each launch runs contained (in the device's
    forked child, `device.contained_launches`), so a defect's abort comes back as PlantedAbort."""

    def __init__(self, bits: int):
        self.bits = bits

    @staticmethod
    def array_module():
        return np

    def _run(self, name: str, *args, **kwargs):
        from moonvit_kernels.cuda_backend import hopper_launchers
        from moonvit_kernels.tools import emulation
        from moonvit_kernels.tools.emulation import device

        with pytest.MonkeyPatch.context() as mp, device.contained_launches(LAUNCH_SECONDS):
            mp.setenv(PLANT_ENV, str(self.bits))
            try:
                return emulation.run(getattr(hopper_launchers, name), *args, **kwargs)
            except device.LaunchStopped as e:
                raise PlantedAbort(str(e)) from None

    def gemm(self, a, b, **kwargs):
        return self._run("gemm", a, b, **kwargs)

    def attention(self, qkv, cu_seqlens, num_heads, head_dim):
        return self._run("attention", qkv, cu_seqlens, num_heads, head_dim)


def run_checked(bits: int, kernel: str) -> None:
    """One small launch of the planted copy with defects `bits`, compared with the reference."""
    k = Planted(bits)
    if kernel == "gemm":  # one K tile: the shifted ring's later stages are never filled
        check_gemm(k, 70, 72, 40, "bfloat16", "float32", "none", seed=3)
    else:
        check_attention(k, "bfloat16", 72, 1, [70], seed=4)


@pytest.mark.parametrize(
    "bits, kernel, messages",
    [
        (1, "attention", ["no fence.proxy.async in that thread", "operand B", "flash_attn_sm90.cu:"]),
        (2, "gemm", ["ran no fence.mbarrier_init", "cp.async.bulk.tensor at gemm_bf16_sm90.cu:"]),
        (4, "gemm", ["operand A is 128B-swizzled with base offset 0", "1024-byte boundary", "gemm_bf16_sm90.cu:"]),
    ],
    ids=["missing-proxy-fence", "missing-mbarrier-init-fence", "swizzled-tile-off-1024"],
)
def test_emulator_rejects_a_planted_defect(planted, bits, kernel, messages):
    with pytest.raises(PlantedAbort) as abort:
        run_checked(bits, kernel)
    assert "SIGABRT" in str(abort.value)  # a model's check, not a crash
    for m in messages:
        assert m in str(abort.value)


@pytest.mark.parametrize("kernel", ["gemm", "attention"])
def test_planted_copy_without_defects_is_correct(planted, kernel):
    run_checked(0, kernel)


def test_dynamic_shared_memory_starts_1024_aligned():
    """The model's window (hopper.cuh) and the Python constant agree, on a 1024-byte boundary."""
    from moonvit_kernels.tools.emulation import hopper

    text = (hopper.HERE / "hopper.cuh").read_text(encoding="utf-8")
    assert f"constexpr uint32_t SMEM_BASE = {hopper.SMEM_BASE:#x};" in text
    assert hopper.SMEM_BASE % 1024 == 0 and hopper.SMEM_BASE > 0


def test_flash_attn_sm90_fits_two_blocks_per_sm90_sm():
    """hd 128: 2 x (dynamic shared memory + the 1 KiB reserved per block) <= 228 KiB per SM (model, no GPU)."""
    need = kcuda.attention_sm90_smem_bytes(128)
    assert need == 114_760
    assert 2 * (need + 1024) <= 228 * 1024 < 3 * (need + 1024)
