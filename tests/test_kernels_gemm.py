"""GEMM kernels (v1 naive, v2 shared tiles, v3 register blocking) and their epilogues vs the NumPy reference."""

import numpy as np
import pytest
from helpers import assert_close, fp32_rtol

from moonvit_kernels import reference
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.numba_backend import gemm as G
from moonvit_kernels.numba_backend import launch
from moonvit_kernels.weights import random_weights

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


def test_compile_signatures_cover_every_kernel():
    assert len(G.COMPILE_SIGNATURES) == len(VERSIONS) * len(G.EPILOGUES)
    names = {fn.__name__ for fn, _ in G.COMPILE_SIGNATURES}
    assert names == {f"gemm_v{v}_{ep}" for v in VERSIONS for ep in G.EPILOGUES}


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
