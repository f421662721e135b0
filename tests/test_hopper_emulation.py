"""The Hopper kernels (gemm_bf16_sm90.cu, flash_attn_sm90.cu): on the CPU emulator vs the reference, and
built for sm_90a by NVRTC.

The emulator runs the unchanged `.cu` file against the models of tests/test_hopper_layouts.py
(wgmma from swizzled shared memory, tensor copies completing on mbarriers, setmaxnreg), so the
producer/consumer ring, the phase parities, the descriptor arithmetic, the zero-filled tails and
the fragment-layout epilogue are all exercised at awkward sizes; the attention kernel adds 3-D
tensor maps over the packed qkv, wgmma with A (P) in registers, the producer's V transpose and the
online softmax on the wgmma fragment, over items that end inside tiles. The compile check builds
every instantiation for sm_90a (warnings are errors), asserts ptxas's registers and spills, and
reads the SASS for the Hopper instructions (HGMMA, UTMALDG, SYNCS; USETMAXREG in the GEMM) and the
absence of HMMA.
"""

import numpy as np
import pytest
from cuda_kernel_checks import check_attention, check_gemm

from moonvit_kernels.cuda_backend.sources import EPILOGUES
from moonvit_kernels.tools.emulation import compiler

GEMM_NAMES = [
    f"gemm_bf16_sm90<{out}, {epi}, {bn}>" for bn in (128, 256) for out in ("float", "__nv_bfloat16") for epi in range(4)
]
ATTN_NAMES = [f"flash_attn_sm90<{hd}>" for hd in (128, 64, 72, 24)]
# Built here for the SASS and exact-register checks; every instantiation the backend launches is built and
# judged by the compile tier (registry.hopper_specs in tests/test_nvrtc_compile.py), so a few suffice.
BUILDS = {
    "gemm_bf16_sm90.cu": [GEMM_NAMES[3], GEMM_NAMES[-3]],  # <float, residual, 128>, <bf16, gelu_tanh, 256>
    "flash_attn_sm90.cu": [ATTN_NAMES[0], ATTN_NAMES[2]],  # hd 128 and 72 (zero-filled to 128)
}
REGS_AT_ENTRY = 168  # the GEMM's __launch_bounds__(384, 1): 65536 / 384 rounded down to a multiple of 8

needs_cxx = pytest.mark.skipif(compiler() is None, reason="no C++ compiler (g++ >= 11) for the CUDA C emulation")
pytestmark = pytest.mark.compile


@pytest.fixture(scope="module")
def hop():
    from moonvit_kernels.tools.emulation import hopper

    hopper.library()
    return hopper


# (M, N, K): one block with K shorter than a K tile; 2 x 2 blocks with 6 K tiles (the 4-stage ring
# wraps, so every barrier changes phase) and tails in M, N and K; a single row; K = 8.
GEMM_SHAPES = [(70, 72, 40), (130, 136, 328), (1, 7, 16), (129, 9, 8)]


@needs_cxx
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", GEMM_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm_sm90_on_the_emulator(hop, shape, out_dtype):
    for i, epilogue in enumerate(EPILOGUES):
        check_gemm(hop, *shape, "bfloat16", out_dtype, epilogue, seed=10 + i)


@needs_cxx
@pytest.mark.parametrize("shape", [(70, 300, 136), (129, 257, 8)], ids=lambda s: "x".join(map(str, s)))
def test_gemm_sm90_bn256_on_the_emulator(hop, shape):
    """The BN = 256 tiles (wgmma m64n256k16, B boxes of 256 rows): N spans two tiles, tails everywhere."""

    class Wide:
        array_module = staticmethod(hop.array_module)

        @staticmethod
        def gemm(*args, **kwargs):
            return hop.gemm(*args, block_n=256, **kwargs)

    for i, (epilogue, out_dtype) in enumerate([("none", "float32"), ("residual", "bfloat16"), ("gelu_erf", "float32")]):
        check_gemm(Wide, *shape, "bfloat16", out_dtype, epilogue, seed=20 + i)


@needs_cxx
def test_planted_fault_is_visible(hop):
    """The self-check's planted mismatch (B's tensor map 8 elements late) really changes the result."""

    class Faulty:
        array_module = staticmethod(hop.array_module)

        @staticmethod
        def gemm(a, b, **kwargs):
            return hop.gemm(a, hop.read_late(b), **kwargs)

    with pytest.raises(AssertionError, match="gemm bfloat16->float32 none"):
        check_gemm(Faulty, 70, 72, 40, "bfloat16", "float32", "none")


@needs_cxx
def test_gemm_sm90_rejects_what_it_cannot_do(hop):
    a = np.zeros((4, 12), np.uint16)
    with pytest.raises(ValueError, match="K % 8 == 0"):  # from tensor_maps.gemm_operand_map
        hop.gemm(a, np.zeros((3, 12), np.uint16))
    with pytest.raises(ValueError, match="bf16 arrays"):  # hopper_launchers.check_gemm_args
        hop.gemm(np.zeros((4, 16), np.float32), np.zeros((3, 16), np.float32))
    with pytest.raises(ValueError, match="inner dimensions differ"):
        hop.gemm(np.zeros((4, 16), np.uint16), np.zeros((3, 24), np.uint16))
    with pytest.raises(ValueError, match="unknown epilogue"):
        hop.gemm(np.zeros((4, 16), np.uint16), np.zeros((3, 16), np.uint16), epilogue="relu")


# (head_dim, heads, item lengths): items ending inside key and query tiles, a 1-token item, head dims
# below one 64-dim block (24), exactly one (64), one and a bit (72, zero-filled to 128) and two (128).
ATTN_CASES = [(128, 1, [65, 3]), (64, 1, [70]), (24, 2, [1, 70, 130]), (72, 1, [130])]


@needs_cxx
@pytest.mark.parametrize("head_dim, heads, lens", ATTN_CASES)
def test_flash_attn_sm90_on_the_emulator(hop, head_dim, heads, lens):
    check_attention(hop, "bfloat16", head_dim, heads, lens, seed=head_dim)


@needs_cxx
def test_flash_attn_sm90_rejects_what_it_cannot_do(hop):
    cu = np.array([0, 4], np.int32)
    with pytest.raises(ValueError, match="head dims"):
        hop.attention(np.zeros((4, 3 * 36), np.uint16), cu, 1, 36)
    with pytest.raises(ValueError, match="bf16 arrays"):
        hop.attention(np.zeros((4, 3 * 64), np.float32), cu, 1, 64)
    with pytest.raises(ValueError, match="columns"):
        hop.attention(np.zeros((4, 3 * 64), np.uint16), cu, 2, 64)


# ============================================================================ tensor-map parameters
def test_tensor_map_parameters():
    from moonvit_kernels.cuda_backend import tensor_maps

    m = tensor_maps.gemm_operand_map(70, 40)
    assert (m.dims, m.strides, m.box, m.swizzle, m.box_bytes) == ((40, 70), (80,), (64, 128), 128, 16384)
    assert tensor_maps.gemm_operand_map(300, 136, 256).box == (64, 256)
    with pytest.raises(ValueError, match="128 or 256 rows"):
        tensor_maps.gemm_operand_map(70, 40, 64)
    sw, raw = tensor_maps.attention_qkv_maps(L=100, H=16, head_dim=72)
    assert (sw.dims, sw.strides, sw.box, sw.swizzle) == ((72, 48, 100), (144, 2 * 3 * 16 * 72), (64, 1, 64), 128)
    assert raw.swizzle == 0 and raw.dims == sw.dims
    with pytest.raises(ValueError, match="K % 8 == 0"):
        tensor_maps.gemm_operand_map(70, 588)
    with pytest.raises(ValueError, match="head_dim a multiple of 8"):
        tensor_maps.attention_qkv_maps(10, 2, 136)


def kernel_constant(source: str, expression: str):
    """`int read(int p)` returning the C++ `expression` (of `p`), compiled after `source` (a Hopper kernel file)
    into an emulator module with no kernels: the kernel's own compile-time constants, read from C."""
    from moonvit_kernels.cuda_backend import sources as kcuda
    from moonvit_kernels.tools.emulation import build

    reader = f'\nextern "C" int moonvit_read(int p) {{ return {expression}; }}\n'
    return build.build_module(kcuda.load_source(source) + reader, (), hopper=True).moonvit_read


@needs_cxx
def test_gpu_launchers_use_the_kernels_shared_memory_sizes():
    from moonvit_kernels.cuda_backend import hopper_launchers as hl

    gemm = kernel_constant(
        "gemm_bf16_sm90.cu", "p == 256 ? GemmSm90Cfg<256>::SMEM_BYTES : GemmSm90Cfg<128>::SMEM_BYTES"
    )
    for bn in (128, 256):
        assert hl.gemm_smem_bytes(bn) == gemm(bn)
    head_dims = (24, 64, 72, 128)
    attention = kernel_constant(
        "flash_attn_sm90.cu", " : ".join(f"p == {hd} ? AttnSm90Cfg<{hd}>::SMEM_BYTES" for hd in head_dims) + " : -1"
    )
    for hd in head_dims:
        assert hl.attention_smem_bytes(hd) == attention(hd)
    assert len(set(hl.gemm_names())) == 16 and hl.gemm_name("bfloat16", "residual", 256) == GEMM_NAMES[-1]


# ============================================================================ NVRTC for sm_90a
@pytest.fixture(scope="module", params=sorted(BUILDS))
def sm90a_build(request):
    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings (numba-cuda[cu13]) not installed")
    from moonvit_kernels.cuda_backend import sources as kcuda
    from moonvit_kernels.tools import nvrtc_check

    source = request.param
    text = kcuda.load_source(source)
    cubin, log, lowered = nvrtc_check.compile_text(text, source, BUILDS[source], "sm_90a")
    return source, nvrtc_check, text, cubin, log, lowered


def test_builds_for_sm90a_without_spills(sm90a_build):
    source, nvrtc_check, _, _, log, lowered = sm90a_build
    infos = nvrtc_check.parse_ptxas_log(log)
    assert not nvrtc_check.warnings_in(log)  # C7508 would say setmaxnreg was ignored
    for name in BUILDS[source]:
        info = infos[lowered[name]]
        assert info.spill_stores == info.spill_loads == info.stack_bytes == 0, (name, info)
        if source == "gemm_bf16_sm90.cu":  # setmaxnreg redistributes exactly the registers held at entry
            assert info.registers == REGS_AT_ENTRY, (name, info)
        else:
            assert 0 < info.registers <= 255, (name, info)


def test_sass_uses_the_hopper_instructions(sm90a_build):
    from moonvit_kernels.tools.xray import sass

    if sass.nvdisasm_path() is None:
        pytest.skip("nvdisasm (nvidia-cuda-nvdisasm) not installed")
    source, _, _, cubin, _, _ = sm90a_build
    text = sass.disassemble_text(cubin)
    wanted = ("HGMMA", "UTMALDG", "SYNCS") + (("USETMAXREG",) if source == "gemm_bf16_sm90.cu" else ())
    for opcode in wanted:
        assert opcode in text, opcode
    assert "HMMA" not in text.replace("HGMMA", "")


def test_plain_sm90_cannot_build_it(sm90a_build):
    source, nvrtc_check, text, _, _, _ = sm90a_build
    with pytest.raises(nvrtc_check.CompileError, match="wgmma|setmaxnreg"):
        nvrtc_check.compile_text(text, source, BUILDS[source][:1], "sm_90")


# ============================================================================ first-use self-check
def numpy_gemm(a, b, *, epilogue="none", residual=None, out=None, out_dtype="float32"):
    """The launchers' gemm API on the NumPy reference (the trusted side in these tests)."""
    from moonvit_kernels import reference as ref
    from moonvit_kernels.weights import bf16_bits_to_float32, float32_to_bf16_bits

    x = bf16_bits_to_float32(a).astype(np.float64) @ bf16_bits_to_float32(b).astype(np.float64).T
    x = ref.gelu_tanh(x) if epilogue == "gelu_tanh" else x
    return x.astype(np.float32) if out_dtype == "float32" else float32_to_bf16_bits(x.astype(np.float32))


def numpy_attention(qkv, cu, heads, head_dim):
    from moonvit_kernels import reference as ref
    from moonvit_kernels.weights import bf16_bits_to_float32, float32_to_bf16_bits

    x = bf16_bits_to_float32(qkv).astype(np.float64)
    L, Q = x.shape[0], heads * head_dim
    q, k, v = (x[:, s * Q : (s + 1) * Q].reshape(L, heads, head_dim) for s in range(3))
    out, lse = ref.attention(q, k, v, np.asarray(cu), return_lse=True)
    return float32_to_bf16_bits(out.reshape(L, Q).astype(np.float32)), lse.astype(np.float32)


@needs_cxx
def test_self_check_keeps_a_good_kernel(hop, recwarn):
    from moonvit_kernels.cuda_backend import selfcheck

    gemm = selfcheck.FirstUseCheck("gemm_bf16_sm90", hop.gemm, numpy_gemm, selfcheck.gemm_probe(np), rtol=1e-2)
    attn = selfcheck.FirstUseCheck(
        "flash_attn_sm90", hop.attention, numpy_attention, selfcheck.attention_probe(np, 64), rtol=1e-2
    )
    assert gemm.check() and attn.check() and not recwarn.list
    assert gemm.error < 1e-2 and attn.error < 1e-2


@needs_cxx
def test_self_check_falls_back_on_a_planted_mismatch(hop):
    from moonvit_kernels.cuda_backend import selfcheck

    def faulty(a, b, **kwargs):
        return hop.gemm(a, hop.read_late(b), **kwargs)

    gemm = selfcheck.FirstUseCheck("gemm_bf16_sm90", faulty, numpy_gemm, selfcheck.gemm_probe(np), rtol=1e-2)
    a, b = np.zeros((3, 16), np.uint16), np.zeros((5, 16), np.uint16)
    with pytest.warns(selfcheck.SelfCheckWarning, match="gemm_bf16_sm90: first-use self-check failed"):
        got = gemm(a, b)
    assert gemm.verified is False and gemm.error > 1e-2
    np.testing.assert_array_equal(got, numpy_gemm(a, b))  # the trusted kernel answered


def test_self_check_falls_back_when_the_kernel_raises():
    from moonvit_kernels.cuda_backend import selfcheck

    def broken(*args, **kwargs):
        raise RuntimeError("no sm_90a image")

    gemm = selfcheck.FirstUseCheck("gemm_bf16_sm90", broken, numpy_gemm, selfcheck.gemm_probe(np), rtol=1e-2)
    with pytest.warns(selfcheck.SelfCheckWarning, match="RuntimeError: no sm_90a image"):
        assert not gemm.check()
    assert gemm.check() is False  # checked once only


# ============================================================================ on an sm_90 GPU (marker `gpu`)
@pytest.fixture(scope="module")
def hl():
    cp = pytest.importorskip("cupy", reason="CuPy not installed (pip install -e '.[cuda13]')")
    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("the Hopper kernels need a compute capability 9.0 device")
    from moonvit_kernels.cuda_backend import hopper_launchers

    return hopper_launchers


@pytest.mark.gpu
@pytest.mark.parametrize("block_n", [128, 256])
@pytest.mark.parametrize("shape", [*GEMM_SHAPES, (1030, 4096, 1152)], ids=lambda s: "x".join(map(str, s)))
def test_gemm_sm90_on_the_gpu(hl, shape, block_n):
    class K:
        array_module = staticmethod(hl.array_module)

        @staticmethod
        def gemm(*args, **kwargs):
            return hl.gemm(*args, block_n=block_n, **kwargs)

    for out_dtype in ("float32", "bfloat16"):
        for i, epilogue in enumerate(EPILOGUES):
            check_gemm(K, *shape, "bfloat16", out_dtype, epilogue, seed=30 + i)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim, heads, lens", [*ATTN_CASES, (128, 16, [1024, 300])])
def test_flash_attn_sm90_on_the_gpu(hl, head_dim, heads, lens):
    check_attention(hl, "bfloat16", head_dim, heads, lens, seed=head_dim)


@pytest.mark.gpu
def test_first_use_check_accepts_the_hopper_kernels_on_the_gpu(hl):
    from moonvit_kernels.cuda_backend import launchers, selfcheck

    cp = hl.array_module()
    gemm = selfcheck.FirstUseCheck("gemm_bf16_sm90", hl.gemm, launchers.gemm, selfcheck.gemm_probe(cp), rtol=1e-2)
    attn = selfcheck.FirstUseCheck(
        "flash_attn_sm90", hl.attention, launchers.attention, selfcheck.attention_probe(cp, 128), rtol=1e-2
    )
    assert gemm.check(), gemm.error
    assert attn.check(), attn.error
