"""gpu tier: the numba kernels and the numba forward at real K3 sizes (skipped without a GPU).

Same checks as the simulator tests, at the sizes the model really runs: D = 1024, Q = 1536
(12 heads of 128), I = 4096, awkward token counts, an image and a video packed together.
"""

import numpy as np
import pytest
from helpers import assert_close, fp32_rtol, random_pixels

from moonvit_kernels import reference as ref
from moonvit_kernels.compare import compare_stages
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.model import MoonViT
from moonvit_kernels.numba_backend import attention as attention_k
from moonvit_kernels.numba_backend import gemm as gemm_k
from moonvit_kernels.numba_backend import merge as merge_k
from moonvit_kernels.numba_backend import pos_emb as pos_emb_k
from moonvit_kernels.numba_backend import rmsnorm as rmsnorm_k
from moonvit_kernels.numba_backend import rope as rope_k
from moonvit_kernels.numba_backend.launch import cu_seqlens_table, grid_table, item_table
from moonvit_kernels.weights import random_weights

pytestmark = pytest.mark.gpu

K3 = VisionConfig.k3()
# a 30x46-patch image (interpolated from the 64x64 grid) and a 3-frame 16x12 video: L = 1956
GRID = np.array([[1, 30, 46], [3, 16, 12]])
L = int(np.sum(np.prod(GRID, axis=1)))
R = np.random.default_rng(2026)


def _rand(*shape, scale=1.0):
    return (R.standard_normal(shape) * scale + 0.1).astype(np.float32)


@pytest.mark.parametrize("version", gemm_k.VERSIONS)
@pytest.mark.parametrize("epilogue", gemm_k.EPILOGUES)
@pytest.mark.parametrize("M, N, K", [(L, 3 * K3.qkv_hidden_size, 1024), (1031, 1024, 4096), (257, 7168, 4096)])
def test_gemm_real_sizes(version, epilogue, M, N, K):
    a, b = _rand(M, K), _rand(N, K, scale=K**-0.5)
    r = _rand(M, N) if epilogue == "residual" else None
    got = gemm_k.gemm(a, b, epilogue=epilogue, residual=r, version=version).copy_to_host()
    y = a.astype(np.float64) @ b.astype(np.float64).T
    want = {
        "none": y,
        "gelu_tanh": ref.gelu_tanh(y),
        "gelu_erf": ref.gelu_erf(y),
        "residual": y + (r if r is not None else 0),
    }
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64).T
    assert_close(got, want[epilogue], rtol=1e-5, atol=float(fp32_rtol(K) * scale.max()), name=f"gemm v{version}")


def test_rmsnorm_real_size():
    x, g = _rand(L, 1024), _rand(1024)
    out, rstd = rmsnorm_k.rmsnorm(x, g, K3.vit_norm_eps, return_rstd=True)
    want, want_rstd = ref.rmsnorm(x.astype(np.float64), g.astype(np.float64), K3.vit_norm_eps, return_rstd=True)
    assert_close(out.copy_to_host(), want, rtol=fp32_rtol(1024), atol=1e-6, name="rmsnorm")
    assert_close(rstd.copy_to_host(), want_rstd, rtol=fp32_rtol(1024), atol=0, name="rstd")


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_pos_emb_real_size(mode):
    cfg = K3.replace(pos_emb_interpolation_mode=mode)
    pos, x = _rand(64, 64, 1024, scale=0.5), _rand(L, 1024)
    time = pos_emb_k.time_table(1024, cfg.init_pos_emb_time)
    got = pos_emb_k.add_position_embedding(x.copy(), pos, time, item_table(GRID), mode=mode).copy_to_host()
    want = ref.add_position_embedding(x.astype(np.float64), GRID, pos.astype(np.float64), cfg)
    assert_close(got, want, rtol=1e-5, atol=1e-5, name=f"pos_emb {mode}")


def test_rope_real_size():
    H, hd = K3.vt_num_attention_heads, K3.head_dim
    qkv = _rand(L, 3 * H * hd)
    got = rope_k.rope2d(qkv.copy(), grid_table(GRID), cu_seqlens_table(GRID), H, hd).copy_to_host()
    ang = ref.rope_angles_packed(GRID, hd, np.float64)
    Q = H * hd
    for s in range(2):
        want = ref.apply_rope(qkv[:, s * Q : (s + 1) * Q].reshape(L, H, hd).astype(np.float64), ang).reshape(L, Q)
        # angles reach 45 rad: fp32 angle rounding bounds the error at ~45·eps
        assert_close(got[:, s * Q : (s + 1) * Q], want, rtol=1e-5, atol=2e-5 * np.abs(qkv).max(), name="rope")
    np.testing.assert_array_equal(got[:, 2 * Q :], qkv[:, 2 * Q :])


@pytest.mark.parametrize("version", attention_k.VERSIONS)
def test_attention_real_size(version):
    H, hd = K3.vt_num_attention_heads, K3.head_dim
    qkv = _rand(L, 3 * H * hd)
    cu = cu_seqlens_table(GRID)
    o, lse = attention_k.attention(qkv, cu, H, version=version)
    q, k, v = (qkv[:, s * H * hd : (s + 1) * H * hd].reshape(L, H, hd).astype(np.float64) for s in range(3))
    want, want_lse = ref.attention(q, k, v, cu, return_lse=True)
    assert_close(o.copy_to_host(), want.reshape(L, H * hd), rtol=1e-4, atol=1e-4, name=f"attention v{version}")
    assert_close(lse.copy_to_host(), want_lse, rtol=1e-5, atol=1e-4, name=f"lse v{version}")


def test_merge_real_size():
    x = _rand(L, 1024)
    m_total = sum((h // 2) * (w // 2) for _, h, w in GRID.tolist())
    got = merge_k.merge_gather(x, item_table(GRID, (2, 2)), (2, 2), m_total).copy_to_host()
    want = np.concatenate([m.reshape(m.shape[0], -1) for m in ref.tpool_patch_merger(x, GRID, (2, 2))])
    assert_close(got, want, rtol=1e-6, atol=1e-6, name="merge")


def test_numba_forward_real_dimensions():
    cfg = K3.replace(vt_num_hidden_layers=2)
    w = random_weights(cfg, seed=5)
    pv = random_pixels(GRID, cfg.patch_size, seed=6)
    out, stages = MoonViT(cfg, w, backend="numba").forward(pv, GRID, return_intermediates=True, as_numpy=True)
    ref_out, ref_stages = ref.vision_forward(pv, GRID, w, cfg, dtype=np.float64, return_intermediates=True)
    report = compare_stages(stages, ref_stages, names=("numba (GPU)", "numpy float64"))
    assert report.ok, report.table()
    for o, r in zip(out, ref_out, strict=True):
        assert_close(o, r, rtol=2e-3, atol=2e-3, name="projected")


def test_register_table_holds_for_this_gpus_compiler():
    """The launch checks trust the compiler's table in `registers.KERNEL_REGISTERS` (from nvJitLink in the
    compile tier); the driver compiles the same PTX itself here, and its counts must not exceed the table either."""
    from moonvit_kernels import registry
    from moonvit_kernels.numba_backend._cuda import COMPILER, cuda
    from moonvit_kernels.numba_backend.registers import registers_for

    KERNEL_REGISTERS = registers_for(COMPILER)

    over = {}
    for entry in registry.numba_entries():
        fn = entry.python_function()
        regs = cuda.jit(entry.numba_signature())(fn).get_regs_per_thread()
        regs = max(regs.values()) if isinstance(regs, dict) else regs
        if regs > KERNEL_REGISTERS.get(fn.__name__, 0):
            over[fn.__name__] = (regs, KERNEL_REGISTERS.get(fn.__name__))
    assert not over, f"(this GPU's registers, table) for kernels above the table: {over}"
