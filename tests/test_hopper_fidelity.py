"""The emulator rejects real Hopper kernels that break a hardware rule of the PTX ISA.

A copy of the sm90 kernels is built with three defects planted by text substitution, each switched
on at run time (`moonvit_plant`, one bit per defect, so a single extra build serves every case):
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

import mmap
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

PLANT_SWITCH = 'inline int moonvit_plant = 0;\nextern "C" void moonvit_set_plant(int p) { moonvit_plant = p; }\n'
# (file, text in the real kernel, its planted replacement): each text occurs exactly once
SUBSTITUTIONS = [
    ("flash_attn_sm90.cu", "fence_proxy_async();", "if (!(moonvit_plant & 1)) fence_proxy_async();"),
    ("gemm_bf16_sm90.cu", "fence_mbarrier_init();", "if (!(moonvit_plant & 2)) fence_mbarrier_init();"),
    (
        "gemm_bf16_sm90.cu",
        "SM90_DYNAMIC_SMEM(smem);",
        "SM90_DYNAMIC_SMEM(smem_planted);\n  unsigned char* smem = smem_planted + (moonvit_plant & 4 ? 512 : 0);",
    ),
    ("gemm_bf16_sm90.cu", "+ 2 * STAGES * 8;", "+ 2 * STAGES * 8 + 1024;"),  # room for the shifted ring
]


def plant(directory) -> None:
    """Write the sm90 kernel files into `directory` with SUBSTITUTIONS applied (the switch in gemm_bf16_sm90.cu,
    which the emulator's driver includes first)."""
    from moonvit_kernels.tools.emulation import hopper

    for name in hopper.KERNEL_FILES:
        shutil.copy(kcuda.KERNEL_DIR / name, directory / name)
    for name, old, new in SUBSTITUTIONS:
        text = (directory / name).read_text(encoding="utf-8")
        assert text.count(old) == 1, f"{name}: {old!r} occurs {text.count(old)} times; update the substitution"
        (directory / name).write_text(text.replace(old, new), encoding="utf-8")
    gemm = directory / "gemm_bf16_sm90.cu"
    gemm.write_text(PLANT_SWITCH + gemm.read_text(encoding="utf-8"), encoding="utf-8")


def use_kernels_from(monkeypatch, directory):
    """Make the Hopper emulator build and load the kernel files of `directory` (a fresh library cache)."""
    from moonvit_kernels.tools.emulation import hopper

    monkeypatch.setattr(kcuda, "KERNEL_DIR", directory)
    hopper.library.cache_clear()


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The emulator library of the planted copy, built (cached on disk by content) and loaded here, in the
    parent process: the forked children only call it."""
    from moonvit_kernels.tools.emulation import hopper

    directory = tmp_path_factory.mktemp("planted_sm90")
    plant(directory)
    with pytest.MonkeyPatch.context() as mp:
        use_kernels_from(mp, directory)
        lib = hopper.library()
    hopper.library.cache_clear()  # back to the real kernels
    yield lib
    hopper.library.cache_clear()


class PlantedAbort(AssertionError):
    """The emulator aborted the planted kernel; the message is its stderr."""


def shared_like(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A zeroed array in anonymous shared memory: a forked child's writes to it reach the parent."""
    nbytes = max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype, count=int(np.prod(shape))).reshape(shape)


class Planted:
    """The launchers' gemm / attention API (as cuda_kernel_checks calls it) on the planted copy with the
    defects `bits` switched on. Each launch runs in a forked child (a defect aborts it: PlantedAbort);
    the result comes back through shared memory and the reference is computed here, in the parent (a
    child forked from a process with thread pools must not run threaded NumPy)."""

    def __init__(self, lib, bits: int):
        self.lib, self.bits = lib, bits

    @staticmethod
    def array_module():
        return np

    def _launch(self, run) -> None:
        from moonvit_kernels.tools.emulation import hopper

        def child():
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(hopper, "library", lambda: self.lib)
                self.lib.moonvit_set_plant(self.bits)
                run(hopper)

        rc, err = hopper.run_forked(child)
        if rc != 0:
            raise PlantedAbort(f"exit {rc}: {err}")

    def gemm(self, a, b, *, epilogue="none", residual=None, out=None, out_dtype="float32"):
        dtype = np.uint16 if out_dtype == "bfloat16" else np.float32
        result = shared_like((a.shape[0], b.shape[0]), dtype)
        if residual is not None:
            result[...] = residual
        self._launch(
            lambda h: h.probe_gemm(
                a, b, epilogue=epilogue, residual=None if residual is None else result, out=result, out_dtype=out_dtype
            )  # fmt: skip
        )
        if out is None:
            return np.array(result)
        out[...] = result
        return out

    def attention(self, qkv, cu_seqlens, num_heads, head_dim):
        out = shared_like((qkv.shape[0], num_heads * head_dim), np.uint16)
        lse = shared_like((qkv.shape[0], num_heads), np.float32)

        def run(h):
            o, m = h.probe_attention(qkv, cu_seqlens, num_heads, head_dim)
            out[...], lse[...] = o, m

        self._launch(run)
        return np.array(out), np.array(lse)


def run_checked(planted_lib, bits: int, kernel: str) -> None:
    """One small launch of the planted copy with defects `bits`, compared with the reference."""
    k = Planted(planted_lib, bits)
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
        run_checked(planted, bits, kernel)
    assert "exit -6" in str(abort.value)  # SIGABRT: a model's check, not a crash
    for m in messages:
        assert m in str(abort.value)


@pytest.mark.parametrize("kernel", ["gemm", "attention"])
def test_planted_copy_without_defects_is_correct(planted, kernel):
    run_checked(planted, 0, kernel)


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
