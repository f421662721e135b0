"""RMSNorm kernel (one block per row, shared-memory tree reduction) vs the NumPy reference, rstd included."""

import numpy as np
import pytest
from helpers import assert_close, fp32_rtol

from moonvit_kernels import reference
from moonvit_kernels.config import FP32_EPS
from moonvit_kernels.numba_backend import launch
from moonvit_kernels.numba_backend import rmsnorm as R


def data(rows: int, cols: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    r = np.random.default_rng(seed)
    scale = r.uniform(0.05, 3.0, (rows, 1))  # rows of very different RMS, so rstd varies per row
    x = (r.standard_normal((rows, cols)) * scale + r.uniform(-0.2, 0.2, (rows, 1))).astype(np.float32)
    w = r.uniform(0.5, 1.5, cols).astype(np.float32)
    return x, w


def check(out, rstd, x, w, eps):
    ref, ref_rstd = reference.rmsnorm(x.astype(np.float64), w.astype(np.float64), eps, return_rstd=True)
    rtol = fp32_rtol(x.shape[1])
    assert_close(rstd, ref_rstd, rtol=rtol, atol=0.0, name="rstd")
    assert_close(out, ref, rtol=rtol, atol=1e-6, name="out")


# (rows, cols, threads): odd widths, a row shorter than a block, rows wider than the block (strided loop).
@pytest.mark.parametrize(
    "rows,cols,threads",
    [(1, 37, None), (7, 37, 32), (33, 19, None), (3, 300, None), (2, 1, None), (5, 129, 64)],
)
@pytest.mark.parametrize("eps", [FP32_EPS, 0.5])
def test_rmsnorm_matches_reference(rows, cols, threads, eps):
    x, w = data(rows, cols, seed=rows * 1000 + cols)
    out, rstd = R.rmsnorm(x, w, eps, return_rstd=True, threads=threads)
    assert launch.is_device_array(out) and launch.is_device_array(rstd)
    check(out.copy_to_host(), rstd.copy_to_host(), x, w, eps)


def test_eps_matters():
    """A kernel that ignored eps would pass eps=1e-7 but not eps=0.5 on small-RMS rows."""
    x, w = data(4, 33, seed=1)
    x *= 0.1
    out = R.rmsnorm(x, w, 1e-7).copy_to_host()
    with pytest.raises(AssertionError):
        assert_close(out, reference.rmsnorm(x.astype(np.float64), w.astype(np.float64), 0.5), 1e-4, 1e-6)


def test_in_place_on_device():
    x, w = data(7, 37, seed=2)
    x_d = launch.to_device(x)
    out, rstd = R.rmsnorm(x_d, launch.to_device(w), 1e-5, out=x_d, return_rstd=True)
    assert out is x_d
    check(x_d.copy_to_host(), rstd.copy_to_host(), x, w, 1e-5)


def test_numpy_in_place():
    x, w = data(7, 37, seed=3)
    x_host = x.copy()
    R.rmsnorm(x_host, w, 1e-5, out=x_host)
    assert_close(x_host, reference.rmsnorm(x.astype(np.float64), w.astype(np.float64), 1e-5), 1e-5, 1e-6)


def test_compile_tier_builds_every_block_size():
    from moonvit_kernels import registry

    built = [e.python_function() for e in registry.numba_entries() if e.stage == "rmsnorm"]
    assert [fn.__name__ for fn in built] == [f"rmsnorm_kernel_t{t}" for t in R.BLOCK_SIZES]
    assert all(fn is R.kernel_for(t).py_func for fn, t in zip(built, R.BLOCK_SIZES, strict=True))


def test_launcher_rejects_bad_arguments():
    x, w = data(7, 37, seed=4)
    cases = [
        (dict(x=x.astype(np.float64), weight=w, eps=1e-5), "x: dtype float64"),
        (dict(x=x, weight=w[:-1], eps=1e-5), r"weight: shape \(36,\) does not match \(37,\)"),
        (dict(x=x, weight=w.astype(np.float16), eps=1e-5), "weight: dtype float16"),
        (dict(x=x[:, ::2], weight=w[:19].copy(), eps=1e-5), "x: array is not C-contiguous"),
        (dict(x=launch.to_device(x)[:, :19], weight=w[:19].copy(), eps=1e-5), "x: array is not C-contiguous"),
        (dict(x=x.ravel(), weight=w, eps=1e-5), "x: shape .* has 1 dimensions"),
        (dict(x=x, weight=w, eps=1e-5, out=np.empty((7, 36), np.float32)), "out: shape"),
        (dict(x=x, weight=w, eps=0.0), "eps must be a positive"),
        (dict(x=x, weight=w, eps=float("nan")), "eps must be a positive"),
        (dict(x=x, weight=w, eps=1e-5, threads=48), "threads=48 is not one of"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            R.rmsnorm(**kwargs)
