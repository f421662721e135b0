"""CupyBackend and the CuPy launchers as a whole, on a real GPU (marker `gpu`), plus the host-side index
tables and the backend's argument checks (no GPU needed).

Each kernel's own checks at awkward and real K3 sizes live with its stage (tests/stages/test_<stage>.py,
class TestGpu). Here: the whole CupyBackend forward against reference.vision_forward on VisionConfig.tiny()
and on a 2-layer random checkpoint with the real dimensions, the launchers' input checks, the shared-memory
table and every GPU of the machine. conftest skips `gpu` tests when cuInit finds no GPU; each one also needs CuPy.
"""

import numpy as np
import pytest
from cuda_kernel_checks import (
    check_attention,
    check_backend_forward,
    check_gemm,
)

from moonvit_kernels import reference as ref
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.cuda_backend import sources as kcuda
from moonvit_kernels.cuda_backend.backend import CupyBackend
from moonvit_kernels.cuda_backend.launchers import cu_seqlens_int32, merge_sources, token_positions
from moonvit_kernels.weights import random_weights

gpu = pytest.mark.gpu
K3 = VisionConfig.k3()


@pytest.fixture(scope="module")
def k():
    pytest.importorskip("cupy", reason="CuPy not installed (pip install -e '.[cuda13]')")
    from moonvit_kernels.cuda_backend import launchers as cupy_kernels

    return cupy_kernels


# ============================================================================ host tables (CPU)
GRIDS = np.array([[1, 4, 6], [3, 2, 6], [1, 6, 2], [4, 4, 4]])


def test_token_positions_match_the_reference_rope_grid():
    pos = token_positions(GRIDS)
    L = int(np.sum(np.prod(GRIDS, axis=1)))
    assert pos.shape == (L, 4) and pos.dtype == np.int32 and pos.flags.c_contiguous
    # reference: complex slot 0 turns by col·f_0 = col (f_0 = 1), slot 1 by row·f_0
    angles = ref.rope_angles_packed(GRIDS, 4, np.float64)
    np.testing.assert_array_equal(pos[:, 3], angles[:, 0])
    np.testing.assert_array_equal(pos[:, 2], angles[:, 1])
    bounds = ref.cu_seqlens(GRIDS)
    for item, (t, h, w) in enumerate(GRIDS.tolist()):
        part = pos[bounds[item] : bounds[item + 1]]
        assert np.all(part[:, 0] == item)
        np.testing.assert_array_equal(part[:, 1], np.repeat(np.arange(t), h * w))


def test_merge_sources_gather_what_the_reference_merger_gathers():
    rng = np.random.default_rng(0)
    L = int(np.sum(np.prod(GRIDS, axis=1)))
    x = rng.standard_normal((L, 3))
    for kh, kw in [(2, 2), (2, 1), (1, 2)]:
        table = merge_sources(GRIDS, (kh, kw))
        want = np.concatenate([m.reshape(m.shape[0], -1) for m in ref.tpool_patch_merger(x, GRIDS, (kh, kw))])
        assert table.shape == (want.shape[0], 4) and table.dtype == np.int32
        # what merge.cu reads: slot (a, b), frame f -> token base + f·frame_stride + a·w + b
        got = np.zeros_like(want)
        for m, (base, t, stride, w) in enumerate(table.tolist()):
            for a in range(kh):
                for b in range(kw):
                    rows = [base + f * stride + a * w + b for f in range(t)]
                    got[m, (a * kw + b) * 3 : (a * kw + b + 1) * 3] = x[rows].mean(axis=0)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


def test_cu_seqlens_int32():
    got = cu_seqlens_int32(GRIDS)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, ref.cu_seqlens(GRIDS))


def test_backend_rejects_bad_arguments_before_touching_a_gpu():
    cfg = VisionConfig.tiny()
    w = random_weights(cfg, 0)
    with pytest.raises(ValueError, match="dtype"):
        CupyBackend(cfg, w, dtype="float16")
    bad = dict(w)
    bad["vision_tower.encoder.blocks.0.wo.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError, match="wo.weight"):
        CupyBackend(cfg, bad, dtype="bfloat16")
    with pytest.raises(ValueError, match="head_dim"):
        c = cfg.replace(qkv_hidden_size=24, vt_num_attention_heads=2)  # head_dim 12: not a multiple of 8
        CupyBackend(c, random_weights(c, 0))


# ============================================================================ kernels on the GPU


# ============================================================================ launcher checks
@gpu
def test_launchers_reject_bad_inputs(k):
    import cupy as cp

    a = cp.zeros((8, 16), cp.uint16)
    with pytest.raises(ValueError, match="disagree on K"):
        k.gemm(a, cp.zeros((4, 8), cp.uint16))
    with pytest.raises(ValueError, match="dtype float64"):
        k.gemm(a, cp.zeros((4, 16), cp.float64))
    with pytest.raises(ValueError, match="both must be float32 or both bfloat16"):
        k.gemm(a, cp.zeros((4, 16), cp.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        k.gemm(cp.zeros((16, 8), cp.uint16).T, cp.zeros((4, 16), cp.uint16))
    with pytest.raises(ValueError, match="needs residual"):
        k.gemm(a, cp.zeros((4, 16), cp.uint16), epilogue="residual")
    with pytest.raises(ValueError, match="CuPy array"):
        k.gemm(np.zeros((8, 16), np.uint16), cp.zeros((4, 16), cp.uint16))
    qkv = cp.zeros((10, 3 * 2 * 24), cp.uint16)
    with pytest.raises(ValueError, match="cu_seqlens"):
        k.attention(qkv, np.array([0, 4, 3, 10]), 2, 24)
    with pytest.raises(ValueError, match="cu_seqlens"):
        k.attention(qkv, np.array([0, 9]), 2, 24)
    with pytest.raises(ValueError, match="columns"):
        k.attention(qkv, np.array([0, 10]), 3, 24)
    with pytest.raises(ValueError, match="head_dim"):
        k.attention(cp.zeros((10, 3 * 2 * 12), cp.uint16), np.array([0, 10]), 2, 12)
    with pytest.raises(ValueError, match="token_pos"):
        k.rope_inplace(qkv, cp.zeros((9, 4), cp.int32), cp.zeros(6, cp.float32), 2, 24)
    with pytest.raises(ValueError, match="weight"):
        k.rmsnorm(cp.zeros((3, 8), cp.float32), cp.zeros(7, cp.float32), 1e-6)
    # an offset view: refused on the host (on the GPU the paired store would end the CUDA context)
    b = cp.zeros((6, 16), cp.uint16)
    buf = cp.zeros(8 * 6 + 1, cp.float32)
    with pytest.raises(ValueError, match="gemm: out .* not 8-byte aligned"):
        k.gemm(a, b, out=buf[1:].reshape(8, 6))
    k.gemm(a, b, out=buf[:48].reshape(8, 6))
    cp.cuda.runtime.deviceSynchronize()  # the context is still alive


@gpu
def test_shared_memory_table_matches_this_gpu(k):
    import cupy as cp

    dev = cp.cuda.runtime.getDevice()
    arch = f"sm_{k._compute_capability(dev)}"
    if arch not in kcuda.OPTIN_SMEM_PER_BLOCK:
        pytest.skip(f"{arch} is not in sources.OPTIN_SMEM_PER_BLOCK")
    assert k._optin_smem(dev) == kcuda.OPTIN_SMEM_PER_BLOCK[arch]
    bf16_max, fp32_max = kcuda.SUPPORTED_HEAD_DIMS[arch]
    k.check_attention_supported(bf16_max, "bfloat16")
    k.check_attention_supported(fp32_max, "float32")


@gpu
def test_every_gpu_of_the_machine(k):
    """Modules, kernels and attributes are per device: the same launches work on each GPU in turn."""
    import cupy as cp

    count = cp.cuda.runtime.getDeviceCount()
    if count < 2:
        pytest.skip("one GPU: the per-device caches need two to be exercised")
    for dev in [0, 1, 0]:
        with cp.cuda.Device(dev):
            check_gemm(k, 37, 150, 72, "bfloat16", "float32", "residual")
            check_attention(k, "bfloat16", 128, 1, [65, 3])


# ============================================================================ the whole backend
@gpu
@pytest.mark.parametrize("dtype, tol", [("float32", 2e-5), ("bfloat16", 2e-2)])
def test_backend_forward_tiny(k, dtype, tol):
    grid = np.array([[1, 4, 6], [2, 2, 4], [1, 6, 6], [3, 8, 2]])
    check_backend_forward(k, VisionConfig.tiny(), grid, dtype, tol)


@gpu
@pytest.mark.parametrize("dtype, tol", [("float32", 1e-4), ("bfloat16", 3e-2)])
def test_backend_forward_real_dimensions(k, dtype, tol):
    """Two encoder layers at the real K3 widths (D 1024, hd 128, I 4096, T 7168), 1792 packed tokens."""
    grid = np.array([[1, 32, 32], [2, 16, 24]])
    check_backend_forward(k, K3.replace(vt_num_hidden_layers=2), grid, dtype, tol)


@gpu
def test_backend_accepts_cupy_inputs_and_returns_cupy(k):
    import cupy as cp
    from helpers import random_pixels

    cfg = VisionConfig.tiny()
    grid = np.array([[1, 4, 4]])
    backend = CupyBackend(cfg, random_weights(cfg, 0), dtype="bfloat16")
    pixels = random_pixels(grid, cfg.patch_size)
    outs = backend.forward(cp.asarray(pixels), grid)
    assert isinstance(outs[0], cp.ndarray) and outs[0].shape == (4, cfg.text_hidden_size)
    again = backend.forward(pixels, grid, as_numpy=True)
    np.testing.assert_array_equal(outs[0].get(), again[0])  # deterministic
    with pytest.raises(ValueError, match="pixel_values"):
        backend.forward(pixels[:-1], grid)
