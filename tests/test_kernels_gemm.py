"""GEMM kernels (v1 naive, v2 shared tiles, v3 register blocking) and their epilogues vs the NumPy reference."""

import numpy as np
import pytest
from helpers import assert_close, fp32_rtol

from moonvit_kernels import reference
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.numba_backend import gemm as G
from moonvit_kernels.numba_backend import launch
from moonvit_kernels.weights import random_weights
from moonvit_kernels.xray import counters

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
        return reference.gelu_tanh(c)
    if epilogue == "gelu_erf":
        return reference.gelu_erf(c)
    if epilogue == "residual":
        return c + res
    return c


def check(got, a, b, epilogue="none", res=None, name="C"):
    K = a.shape[1]
    rtol = fp32_rtol(K)
    assert_close(got, expected(a, b, epilogue, res), rtol=rtol, atol=rtol * np.sqrt(K), name=name)


# Sizes that are not multiples of any tile (16, 64) and K spanning two K-slabs; N = 70 gives v3 two blocks
# along n, M = 67 two along m (with K = 35: three slabs).
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("M,N,K", [(1, 37, 19), (7, 70, 19), (33, 37, 19), (5, 3, 1), (67, 5, 35)])
def test_gemm_matches_reference(version, M, N, K):
    a, b, _ = operands(M, N, K, seed=M * 100 + N)
    got = G.gemm(a, b, version=version)
    assert launch.is_device_array(got)
    check(got.copy_to_host(), a, b, name=f"v{version} {M}x{N}x{K}")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("epilogue", ["gelu_tanh", "gelu_erf", "residual"])
def test_gemm_epilogues(version, epilogue):
    a, b, res = operands(7, 37, 19, seed=3)
    a *= 0.3  # pre-activations around [-3, 3], where the two GELUs differ most
    got = G.gemm(a, b, epilogue=epilogue, residual=res if epilogue == "residual" else None, version=version)
    check(got.copy_to_host(), a, b, epilogue, res, name=f"v{version} {epilogue}")


def test_gelu_epilogues_differ():
    """tanh and erf GELU differ by more than the tolerance on this data, so a swapped epilogue fails."""
    a, b, _ = operands(7, 37, 19, seed=3)
    a *= 0.3
    tanh_out = G.gemm(a, b, epilogue="gelu_tanh", version=1).copy_to_host()
    with pytest.raises(AssertionError):
        check(tanh_out, a, b, "gelu_erf")


def test_residual_in_place_on_device():
    """x = x + o·Woᵀ with out aliasing the residual, all data staying on the device."""
    a, b, res = operands(33, 37, 19, seed=5)
    x = launch.to_device(res)
    got = G.gemm(launch.to_device(a), launch.to_device(b), epilogue="residual", residual=x, out=x, version=3)
    assert got is x
    check(x.copy_to_host(), a, b, "residual", res)


def test_numpy_out_receives_result():
    a, b, res = operands(7, 37, 19, seed=6)
    out = res.copy()
    G.gemm(a, b, epilogue="residual", residual=out, out=out, version=2)
    check(out, a, b, "residual", res)


def test_patch_embedding_is_one_gemm():
    cfg = VisionConfig.tiny()
    w = random_weights(cfg, seed=1)["vision_tower.patch_embed.proj.weight"]
    r = np.random.default_rng(2)
    pixels = r.standard_normal((13, 3, cfg.patch_size, cfg.patch_size)).astype(np.float32)
    got = G.gemm(pixels.reshape(13, -1), w.reshape(w.shape[0], -1), version=3).copy_to_host()
    K = cfg.patch_dim
    ref = reference.patch_embed(pixels.astype(np.float64), w.astype(np.float64))
    assert_close(got, ref, rtol=fp32_rtol(K), atol=fp32_rtol(K) * np.sqrt(K), name="patch_embed")


def test_compile_tier_builds_every_kernel():
    from moonvit_kernels import registry

    built = {e.label: e.python_function() for e in registry.numba_entries() if e.stage == "gemm"}
    assert len(built) == len(VERSIONS) * len(G.EPILOGUES)
    assert built == {f"gemm_v{v}_{ep}": G.KERNELS[(v, ep)].py_func for v in VERSIONS for ep in G.EPILOGUES}


# ---------------------------------------------------------------------------- launcher errors
def test_launcher_rejects_bad_arguments():
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
        (dict(a=a, b=b, version=4), "version 4"),
        (dict(a=a, b=b, epilogue="residual"), "needs a residual"),
        (dict(a=a, b=b, residual=res), "residual given but epilogue is 'none'"),
        (dict(a=a, b=b, epilogue="residual", residual=res.T.copy()), r"residual: shape \(37, 7\)"),
        (dict(a=a, b=b, epilogue="residual", residual=res.astype(np.float64)), "residual: dtype"),
        (dict(a=a, b=b, out=np.empty((7, 36), np.float32)), "out: shape"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            G.gemm(**kwargs)


# ============================================================================ shared-memory banks (host-side)
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


def test_v3_shared_accesses_are_at_most_2_way_bank_conflicted():
    worst = _v3_worst_conflicts()
    assert set(worst) == {"a_tile store", "b_tile store", "a_tile load", "b_tile load"}
    assert max(worst.values()) <= 2, worst


def test_v3_tile_covers_every_output_and_slab_element_once():
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


def test_bank_count_sees_the_unpadded_layout_conflict():
    """The counter is not blind: the old v3 staging (row stride 64 = 0 mod 32) is a 16-way conflict."""
    stage = G.v3_stage_coords.py_func
    assert _conflict({lane: stage(lane, 0)[1] * 64 + stage(lane, 0)[0] for lane in range(32)}) == 16
