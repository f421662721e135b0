"""GEMM (patch embedding, qkv, wo, MLP, projector; epilogues none / gelu_tanh / gelu_erf / residual), every tier."""

import numpy as np
import pytest
from compile_tier import assert_cuda_stage_builds, assert_numba_stage_compiles, cuda_archs
from cuda_kernel_checks import (
    check_gemm,
)
from formulations import (
    TIGHT,
    conv2d_loop,
    cut_patches,
    gelu_erf_formula,
    gelu_tanh_formula,
    rmsnorm_formula,
    rnd,
)
from helpers import assert_close, fp32_rtol
from tiers import EMULATOR, GPU_L, K3, gpu_rand

from moonvit_kernels import reference as ref
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.cuda_backend.sources import EPILOGUES
from moonvit_kernels.numba_backend import gemm as G
from moonvit_kernels.numba_backend import launch
from moonvit_kernels.tools.xray import counters
from moonvit_kernels.tools.xray.sass import nvdisasm_path
from moonvit_kernels.weights import random_weights

# ============================================================================
# reference: against the second formulations in tests/formulations.py
TINY = VisionConfig.tiny()


class TestReference:
    pytestmark = [pytest.mark.reference]

    def test_patch_embed_equals_literal_conv_loop(self):
        p, D, h, w = 3, 5, 2, 3
        image = rnd((3, h * p, w * p), 1)
        weight = rnd((D, 3, p, p), 2)
        got = ref.patch_embed(cut_patches(image, p), weight)
        assert_close(got, conv2d_loop(image, weight, p).reshape(h * w, D), **TIGHT, name="patch_embed")

    def test_patch_embed_flattening_order_matters(self):
        # A weight read in (kx, ky) order instead of (ky, kx) would give a different answer: the test can tell.
        p, D = 3, 4
        image = rnd((3, 2 * p, p), 3)
        weight = rnd((D, 3, p, p), 4)
        conv = conv2d_loop(image, weight, p).reshape(2, D)
        wrong = ref.patch_embed(cut_patches(image, p), weight.transpose(0, 1, 3, 2).copy())
        assert np.abs(wrong - conv).max() > 1e-3

    def test_gelus_match_formulas_and_differ(self):
        x = np.concatenate([np.linspace(-6, 6, 61), rnd(40, 62, scale=2.0)])
        assert_close(ref.gelu_tanh(x.copy()), gelu_tanh_formula(x), **TIGHT, name="gelu_tanh")
        assert_close(ref.gelu_erf(x), gelu_erf_formula(x), **TIGHT, name="gelu_erf")
        assert_close(ref.gelu_tanh(x.astype(np.float32)), gelu_tanh_formula(x), 1e-6, 1e-6, "gelu_tanh fp32")
        assert_close(ref.gelu_erf(x.astype(np.float32)), gelu_erf_formula(x), 1e-6, 1e-6, "gelu_erf fp32")
        assert np.abs(ref.gelu_tanh(x.copy()) - ref.gelu_erf(x)).max() > 1e-4

    def test_projector_equals_formula(self):
        cfg = TINY
        weights = random_weights(cfg, seed=3)
        merged = rnd((5, cfg.merged_hidden_size), 90)
        got = ref.projector(merged, weights, cfg)
        W0 = weights["mm_projector.proj.0.weight"].astype(np.float64)
        W2 = weights["mm_projector.proj.2.weight"].astype(np.float64)
        g = weights["mm_projector.post_norm.weight"].astype(np.float64)
        want = rmsnorm_formula(gelu_erf_formula(merged @ W0.T) @ W2.T, g, cfg.projector_ln_eps)
        assert got.shape == (5, cfg.text_hidden_size)
        assert_close(got, want, 1e-11, 1e-11, "projector")
        # tanh GELU in the projector would be a different model: the test can tell.
        wrong = rmsnorm_formula(gelu_tanh_formula(merged @ W0.T) @ W2.T, g, cfg.projector_ln_eps)
        assert np.abs(wrong - got).max() > 1e-6


# ============================================================================
# numba kernel (the CUDA simulator without a GPU)
VERSIONS = G.VERSIONS


def operands(M: int, N: int, K: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r = np.random.default_rng(seed)
    a = (r.standard_normal((M, K)) + r.uniform(-0.5, 0.5, (1, K))).astype(np.float32)
    b = (r.standard_normal((N, K)) * 0.5).astype(np.float32)
    res = r.standard_normal((M, N)).astype(np.float32)
    return a, b, res


def expected(a: np.ndarray, b: np.ndarray, epilogue: str, res: np.ndarray) -> np.ndarray:
    c = a.astype(np.float64) @ b.astype(np.float64).T
    if epilogue == "gelu_tanh":
        return ref.gelu_tanh(c)
    if epilogue == "gelu_erf":
        return ref.gelu_erf(c)
    if epilogue == "residual":
        return c + res
    return c


def check(got, a, b, epilogue="none", res=None, name="C"):
    K = a.shape[1]
    rtol = fp32_rtol(K)
    assert_close(got, expected(a, b, epilogue, res), rtol=rtol, atol=rtol * np.sqrt(K), name=name)


def _conflict(words_by_lane: dict[int, int]) -> int:
    """Wavefronts / ideal of one warp's 4-byte shared access (lane -> word index)."""
    wavefronts, ideal = counters.wavefronts([(lane, 4 * word, 4) for lane, word in words_by_lane.items()])
    return wavefronts // ideal


def _v3_worst_conflicts() -> dict[str, int]:
    """Worst conflict factor over every warp and every instance of each v3 shared access, from the
    kernel's own layout (G.V3_A_SHAPE, G.V3_B_SHAPE) and index functions (stage coords, row, col)."""
    stage, row, col = G.v3_stage_coords.py_func, G.v3_row.py_func, G.v3_col.py_func
    a_stride, b_stride = G.V3_A_SHAPE[1], G.V3_B_SHAPE[1]
    worst: dict[str, int] = {}

    def note(site: str, words: dict[int, int]) -> None:
        worst[site] = max(worst.get(site, 0), _conflict(words))

    for warp in range(G.V3_THREADS // 32):
        tids = {lane: warp * 32 + lane for lane in range(32)}
        tx = {lane: t % G.V3_THREADS_X for lane, t in tids.items()}
        ty = {lane: t // G.V3_THREADS_X for lane, t in tids.items()}
        for s in range(G.V3_LOADS_A):
            note("a_tile store", {lane: stage(t, s)[1] * a_stride + stage(t, s)[0] for lane, t in tids.items()})
        for s in range(G.V3_LOADS_B):
            note("b_tile store", {lane: stage(t, s)[1] * b_stride + stage(t, s)[0] for lane, t in tids.items()})
        for kk in range(G.BK):
            for i in range(G.TM):
                note("a_tile load", {lane: kk * a_stride + row(ty[lane], i) for lane in tids})
            for j in range(G.TN):
                note("b_tile load", {lane: kk * b_stride + col(tx[lane], j) for lane in tids})
    return worst


class TestNumba:
    pytestmark = [pytest.mark.numba]

    # Sizes that are not multiples of any tile (16, 64) and K spanning two K-slabs; N = 70 gives v3 two blocks
    # along n, M = 67 two along m (with K = 35: three slabs).
    @pytest.mark.parametrize("version", VERSIONS)
    @pytest.mark.parametrize("M,N,K", [(1, 37, 19), (7, 70, 19), (33, 37, 19), (5, 3, 1), (67, 5, 35)])
    def test_gemm_matches_reference(self, version, M, N, K):
        a, b, _ = operands(M, N, K, seed=M * 100 + N)
        got = G.gemm(a, b, version=version)
        assert launch.is_device_array(got)
        check(got.copy_to_host(), a, b, name=f"v{version} {M}x{N}x{K}")

    @pytest.mark.parametrize("version", VERSIONS)
    @pytest.mark.parametrize("epilogue", ["gelu_tanh", "gelu_erf", "residual"])
    def test_gemm_epilogues(self, version, epilogue):
        a, b, res = operands(7, 37, 19, seed=3)
        a *= 0.3  # pre-activations around [-3, 3], where the two GELUs differ most
        got = G.gemm(a, b, epilogue=epilogue, residual=res if epilogue == "residual" else None, version=version)
        check(got.copy_to_host(), a, b, epilogue, res, name=f"v{version} {epilogue}")

    def test_gelu_epilogues_differ(self):
        """tanh and erf GELU differ by more than the tolerance on this data, so a swapped epilogue fails."""
        a, b, _ = operands(7, 37, 19, seed=3)
        a *= 0.3
        tanh_out = G.gemm(a, b, epilogue="gelu_tanh", version=1).copy_to_host()
        with pytest.raises(AssertionError):
            check(tanh_out, a, b, "gelu_erf")

    def test_residual_in_place_on_device(self):
        """x = x + o·Woᵀ with out aliasing the residual, all data staying on the device."""
        a, b, res = operands(33, 37, 19, seed=5)
        x = launch.to_device(res)
        got = G.gemm(launch.to_device(a), launch.to_device(b), epilogue="residual", residual=x, out=x, version=3)
        assert got is x
        check(x.copy_to_host(), a, b, "residual", res)

    def test_numpy_out_receives_result(self):
        a, b, res = operands(7, 37, 19, seed=6)
        out = res.copy()
        G.gemm(a, b, epilogue="residual", residual=out, out=out, version=2)
        check(out, a, b, "residual", res)

    def test_patch_embedding_is_one_gemm(self):
        cfg = VisionConfig.tiny()
        w = random_weights(cfg, seed=1)["vision_tower.patch_embed.proj.weight"]
        r = np.random.default_rng(2)
        pixels = r.standard_normal((13, 3, cfg.patch_size, cfg.patch_size)).astype(np.float32)
        got = G.gemm(pixels.reshape(13, -1), w.reshape(w.shape[0], -1), version=3).copy_to_host()
        K = cfg.patch_dim
        want = ref.patch_embed(pixels.astype(np.float64), w.astype(np.float64))
        assert_close(got, want, rtol=fp32_rtol(K), atol=fp32_rtol(K) * np.sqrt(K), name="patch_embed")

    def test_compile_tier_builds_every_kernel(self):
        from moonvit_kernels import registry

        built = {e.label: e.python_function() for e in registry.numba_entries() if e.stage == "gemm"}
        assert len(built) == len(VERSIONS) * len(G.EPILOGUES)
        assert built == {f"gemm_v{v}_{ep}": G.KERNELS[(v, ep)].py_func for v in VERSIONS for ep in G.EPILOGUES}

    # ---------------------------------------------------------------------------- launcher errors
    def test_launcher_rejects_bad_arguments(self):
        a, b, res = operands(7, 37, 19, seed=7)
        cases = [
            (dict(a=a.astype(np.float64), b=b), "a: dtype float64"),
            (dict(a=a, b=b.astype(np.float16)), "b: dtype float16"),
            (dict(a=a, b=b[:, :-1].copy()), r"b: shape \(37, 18\) does not match"),
            (dict(a=a[0], b=b), "a: shape .* has 1 dimensions"),
            (dict(a=np.asfortranarray(a), b=b), "a: array is not C-contiguous"),
            (dict(a=a, b=launch.to_device(np.ascontiguousarray(np.repeat(b, 2, axis=1)))[:, ::2]), "b: .*C-contiguous"),
            (dict(a=a.tolist(), b=b), "a: expected a numba device array or a NumPy array"),
            (dict(a=a[:0], b=b), "a: shape .* is empty"),
            (dict(a=a, b=b, epilogue="relu"), "epilogue 'relu'"),
            (dict(a=a, b=b, version=max(G.VERSIONS) + 1), f"version {max(G.VERSIONS) + 1}"),
            (dict(a=a, b=b, epilogue="residual"), "needs a residual"),
            (dict(a=a, b=b, residual=res), "residual given but epilogue is 'none'"),
            (dict(a=a, b=b, epilogue="residual", residual=res.T.copy()), r"residual: shape \(37, 7\)"),
            (dict(a=a, b=b, epilogue="residual", residual=res.astype(np.float64)), "residual: dtype"),
            (dict(a=a, b=b, out=np.empty((7, 36), np.float32)), "out: shape"),
        ]
        for kwargs, message in cases:
            with pytest.raises(ValueError, match=message):
                G.gemm(**kwargs)

    def test_v3_shared_accesses_are_at_most_2_way_bank_conflicted(self):
        worst = _v3_worst_conflicts()
        assert set(worst) == {"a_tile store", "b_tile store", "a_tile load", "b_tile load"}
        assert max(worst.values()) <= 2, worst

    def test_v3_tile_covers_every_output_and_slab_element_once(self):
        """The index functions the bank test reads are the kernel's real mapping: each thread's outputs and
        staged elements tile the block exactly (no gaps, no overlap), so the layout cannot cheat."""
        outputs = sorted(
            (G.v3_row.py_func(ty, i), G.v3_col.py_func(tx, j))
            for ty in range(G.BM // G.TM)
            for tx in range(G.V3_THREADS_X)
            for i in range(G.TM)
            for j in range(G.TN)
        )
        assert outputs == [(r, c) for r in range(G.BM) for c in range(G.BN)]
        staged = sorted(G.v3_stage_coords.py_func(t, s) for t in range(G.V3_THREADS) for s in range(G.V3_LOADS_A))
        assert staged == [(r, kk) for r in range(G.BM) for kk in range(G.BK)]
        assert G.V3_A_SHAPE[1] >= G.BM and G.V3_B_SHAPE[1] >= G.BN

    def test_bank_count_sees_the_unpadded_layout_conflict(self):
        """The counter is not blind: the old v3 staging (row stride 64 = 0 mod 32) is a 16-way conflict."""
        stage = G.v3_stage_coords.py_func
        assert _conflict({lane: stage(lane, 0)[1] * 64 + stage(lane, 0)[0] for lane in range(32)}) == 16


# ============================================================================
# CUDA C kernel on the CPU emulator, through the real launchers
# (M, N, K): odd sizes; K = 45 and 588 (patch embedding) take the scalar-load path (K % 8 != 0);
# 130 rows span two 128-row tiles, 150 columns two 128-column tiles.
GEMM_SHAPES = [(37, 150, 72), (20, 131, 45), (1, 7, 16), (130, 9, 588)]


def _float32_at(shape: tuple[int, int], misalign: int, fill: np.ndarray | None = None) -> np.ndarray:
    """A C-contiguous float32 array whose data starts `misalign` bytes past a 16-byte boundary (NaN or `fill`)."""
    buf = np.empty(shape[0] * shape[1] + 4, np.float32)
    skip = ((misalign - buf.ctypes.data) % 16) // 4
    out = buf[skip : skip + shape[0] * shape[1]].reshape(shape)
    out[...] = np.nan if fill is None else fill
    assert out.ctypes.data % 16 == misalign and out.flags.c_contiguous
    return out


class TestCudaEmulator:
    pytestmark = EMULATOR

    @pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
    @pytest.mark.parametrize("shape", GEMM_SHAPES, ids=lambda s: "x".join(map(str, s)))
    def test_gemm_bf16_tensor_cores(self, k, shape, out_dtype):
        for i, epilogue in enumerate(EPILOGUES):
            check_gemm(k, *shape, "bfloat16", out_dtype, epilogue, seed=i)

    @pytest.mark.parametrize("shape", GEMM_SHAPES[:3] + [(70, 65, 33)], ids=lambda s: "x".join(map(str, s)))
    def test_gemm_fp32_simt(self, k, shape):
        for i, epilogue in enumerate(EPILOGUES):
            check_gemm(k, *shape, "float32", "float32", epilogue, seed=i)

    # gemm_fp32.cu stores C (and reads the residual) as float4 runs when N % 4 == 0 and both are 16-byte
    # aligned: N = 68 is a partial 64-column tile, 37 rows a partial 64-row tile, K = 20 and 9 odd slabs.
    @pytest.mark.parametrize("shape", [(37, 68, 20), (3, 4, 9), (65, 132, 36)], ids=lambda s: "x".join(map(str, s)))
    def test_gemm_fp32_simt_float4_stores(self, k, shape):
        for i, epilogue in enumerate(EPILOGUES):
            check_gemm(k, *shape, "float32", "float32", epilogue, seed=10 + i)

    @pytest.mark.parametrize("out_misalign, res_misalign", [(4, 0), (0, 8), (12, 12)])
    @pytest.mark.parametrize("epilogue", ["none", "residual"])
    def test_gemm_fp32_simt_unaligned_output_falls_back(self, k, epilogue, out_misalign, res_misalign):
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


# ============================================================================
# compile tier (no GPU): the stage's numba kernels for sm_90, its CUDA C kernels with NVRTC per architecture
class TestCompile:
    pytestmark = [pytest.mark.compile]

    @pytest.fixture(scope="class")
    def numba_reports(self):
        return assert_numba_stage_compiles("gemm")

    def test_numba_kernels_compile_within_limits(self, numba_reports):
        assert numba_reports

    @pytest.mark.parametrize("arch", cuda_archs("gemm"))
    def test_cuda_c_kernels_build_within_limits(self, arch):
        assert_cuda_stage_builds("gemm", arch)

    def test_gemm_v3_k_loop_is_unrolled_within_its_sass_budget(self, numba_reports):
        """The budgets of `--sass` hold GEMM v3's k-slab loop, and that loop exists (128 FFMAs unrolled)."""
        if nvdisasm_path() is None:
            pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm, part of the dev extra)")
        for r in numba_reports:
            if r.kernel == "gemm_v3_none":
                loops = [lp for lp in r.loops if lp["fma"]]
                assert loops and loops[0]["fma"] >= 64, (r.compiler, loops)


# ============================================================================
# GPU (CuPy launchers and numba kernels at real sizes; skipped without a GPU)


AWKWARD_GEMMS = [(37, 150, 72), (20, 131, 45), (1, 7, 16), (130, 9, 588), (257, 300, 1000)]


# The K3 GEMMs at L = 1024 tokens (M = 256 merged tokens for the projector), each with its epilogue.
D, Q, I, P, T = K3.vt_hidden_size, K3.qkv_hidden_size, K3.vt_intermediate_size, K3.patch_dim, K3.text_hidden_size


REAL_GEMMS = [
    ("patch", 1024, D, P, "float32", "none"),
    ("qkv", 1024, 3 * Q, D, "bfloat16", "none"),
    ("wo", 1024, D, Q, "float32", "residual"),
    ("fc0", 1024, I, D, "bfloat16", "gelu_tanh"),
    ("fc1", 1024, D, I, "float32", "residual"),
    ("proj0", 256, 4 * D, 4 * D, "bfloat16", "gelu_erf"),
    ("proj2", 256, T, 4 * D, "float32", "none"),
]


class TestGpu:
    pytestmark = [pytest.mark.gpu]

    @pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
    @pytest.mark.parametrize("shape", AWKWARD_GEMMS, ids=lambda s: "x".join(map(str, s)))
    def test_gemm_bf16_awkward(self, k, shape, out_dtype):
        for i, epilogue in enumerate(EPILOGUES):
            check_gemm(k, *shape, "bfloat16", out_dtype, epilogue, seed=i)

    @pytest.mark.parametrize("name, M, N, K_, out_dtype, epilogue", REAL_GEMMS, ids=[g[0] for g in REAL_GEMMS])
    def test_gemm_bf16_real_sizes(self, k, name, M, N, K_, out_dtype, epilogue):
        check_gemm(k, M, N, K_, "bfloat16", out_dtype, epilogue)

    @pytest.mark.parametrize("shape", AWKWARD_GEMMS + [(512, 1024, 1024)], ids=lambda s: "x".join(map(str, s)))
    def test_gemm_fp32(self, k, shape):
        for i, epilogue in enumerate(EPILOGUES):
            check_gemm(k, *shape, "float32", "float32", epilogue, seed=i)

    @pytest.mark.parametrize("version", G.VERSIONS)
    @pytest.mark.parametrize("epilogue", G.EPILOGUES)
    @pytest.mark.parametrize("M, N, K", [(GPU_L, 3 * K3.qkv_hidden_size, 1024), (1031, 1024, 4096), (257, 7168, 4096)])
    def test_gemm_real_sizes(self, version, epilogue, M, N, K):
        a, b = gpu_rand(M, K), gpu_rand(N, K, scale=K**-0.5)
        r = gpu_rand(M, N) if epilogue == "residual" else None
        got = G.gemm(a, b, epilogue=epilogue, residual=r, version=version).copy_to_host()
        y = a.astype(np.float64) @ b.astype(np.float64).T
        want = {
            "none": y,
            "gelu_tanh": ref.gelu_tanh(y),
            "gelu_erf": ref.gelu_erf(y),
            "residual": y + (r if r is not None else 0),
        }
        scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64).T
        assert_close(got, want[epilogue], rtol=1e-5, atol=float(fp32_rtol(K) * scale.max()), name=f"gemm v{version}")
