"""The whole `numba` forward (CUDA simulator without a GPU) against the NumPy reference.

The simulator runs one Python thread per CUDA thread, so one forward of the tiny config is
kept to ~40 tokens and run once per module; every check reads that one run.
"""

import dataclasses

import numpy as np
import pytest
from helpers import assert_close, random_pixels

from moonvit_kernels import reference as ref
from moonvit_kernels.compare import compare_stages
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.model import MoonViT
from moonvit_kernels.weights import random_weights

CFG = VisionConfig.tiny()
# an image resized from the 6x6 grid in both directions (4 rows, 8 columns) and a 2-frame video
GRID = np.array([[1, 4, 8], [2, 2, 2]])


@pytest.fixture(scope="module")
def run():
    w = random_weights(CFG, seed=11)
    pv = random_pixels(GRID, CFG.patch_size, seed=12)
    ref_out, ref_stages = ref.vision_forward(pv, GRID, w, CFG, dtype=np.float64, return_intermediates=True)
    model = MoonViT(CFG, w, backend="numba")
    out, stages = model.forward(pv, GRID, return_intermediates=True, as_numpy=True)
    return model, pv, out, stages, ref_out, ref_stages


def test_numba_forward_matches_reference(run):
    _, _, out, _, ref_out, _ = run
    assert [o.shape for o in out] == [r.shape for r in ref_out] == [(8, 40), (1, 40)]
    for i, (o, r) in enumerate(zip(out, ref_out, strict=True)):
        assert_close(o, r, rtol=2e-4, atol=2e-4, name=f"item {i}")


def test_numba_intermediates_match_reference(run):
    _, _, _, stages, _, ref_stages = run
    assert list(stages) == list(ref_stages)
    for name in stages:
        scale = np.abs(ref_stages[name]).max()
        assert_close(stages[name], ref_stages[name], rtol=1e-4, atol=1e-4 * scale, name=name)
    report = compare_stages(stages, ref_stages, names=("numba", "numpy float64"))
    assert report.ok, report.table()


def test_numba_backend_rejects_bad_input(run):
    model, pv, _, _, _, _ = run
    with pytest.raises(ValueError, match="holds 39 patches"):
        model.forward(pv[:-1], GRID)
    with pytest.raises(ValueError, match=r"shape \(40, 3, 4, 3\)"):
        model.forward(pv[..., :3], GRID)
    with pytest.raises(ValueError, match="divisible"):
        model.forward(pv, np.array([[1, 5, 8], [2, 2, 2]]))
    with pytest.raises(ValueError, match="non-finite"):
        bad = pv.copy()
        bad[3, 1, 2, 0] = np.inf
        model.forward(bad, GRID)
    w = random_weights(CFG, 0)
    with pytest.raises(ValueError, match="float32"):
        MoonViT(CFG, w, backend="numba", dtype="bfloat16")
    with pytest.raises(ValueError, match="gemm_version"):
        MoonViT(CFG, w, backend="numba", gemm_version=0)
    with pytest.raises(ValueError, match="unknown backend"):
        MoonViT(CFG, w, backend="tpu")


def test_forward_under_another_current_device_names_both_devices(monkeypatch):
    """The weights live on the device current at construction (0 here); with another device current,
    forward stops before any kernel with one error naming both (the simulator has one device, so the
    current device id is faked)."""
    from moonvit_kernels.numba_backend import _cuda

    model = MoonViT(CFG, random_weights(CFG, 0), backend="numba")
    assert model.backend.device_id == 0
    monkeypatch.setattr(_cuda, "current_device_id", lambda: 1)
    pv = random_pixels(GRID, CFG.patch_size, seed=3)
    with pytest.raises(RuntimeError, match=r"uploaded to CUDA device 0.*current device is device 1.*cuda\.gpus\[0\]"):
        model.forward(pv, GRID)


def test_backend_names_its_compiler_and_refuses_another():
    from moonvit_kernels.device import simulator_enabled
    from moonvit_kernels.numba_backend import _cuda, compilers

    w = random_weights(CFG, 0)
    info = MoonViT(CFG, w, backend="numba", compiler=_cuda.COMPILER).backend.describe()  # the compiler in use
    assert info["compiler"] == _cuda.compiler_label() and info["compiler"].startswith(f"{_cuda.COMPILER} 0.")
    assert info["compiler"].endswith("(CUDA simulator)") == simulator_enabled()
    assert info["device"].startswith("device 0")
    (other,) = set(compilers.COMPILERS) - {_cuda.COMPILER}
    with pytest.raises(ValueError, match=f"built with {_cuda.COMPILER} 0.*MOONVIT_NUMBA_COMPILER={other}"):
        MoonViT(CFG, w, backend="numba", compiler=other)
    with pytest.raises(ValueError, match="unknown numba compiler 'llvm'"):
        MoonViT(CFG, w, backend="numba", compiler="llvm")


def _count_device_traffic(monkeypatch, n_layers: int) -> dict[str, int]:
    """Device allocations and host->device uploads made by one forward with `n_layers` encoder layers."""
    from moonvit_kernels.numba_backend._cuda import cuda

    cfg = dataclasses.replace(CFG, vt_num_hidden_layers=n_layers)
    grid = np.array([[1, 2, 2]])  # 4 tokens, one merged token: the smallest forward
    # GEMM v1: the traffic does not depend on the GEMM version, and v1 is 4x cheaper on the simulator than v3
    model = MoonViT(cfg, random_weights(cfg, seed=5), backend="numba", gemm_version=1)
    pv = random_pixels(grid, cfg.patch_size, seed=6)
    counts = {"to_device": 0, "device_array": 0, "device_array_like": 0}
    for name in counts:
        original = getattr(cuda, name)

        def spy(*args, _name=name, _original=original, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(cuda, name, spy)
    out = model.forward(pv, grid, as_numpy=True)
    monkeypatch.undo()
    ref_out = ref.vision_forward(pv, grid, random_weights(cfg, seed=5), cfg, dtype=np.float64)
    assert_close(out[0], ref_out[0], rtol=2e-4, atol=2e-4, name=f"{n_layers} layers")
    return counts


def test_device_allocations_and_uploads_do_not_grow_with_layers(monkeypatch):
    """Tables are uploaded once per forward and the layers share one workspace: one layer or two, the
    forward makes the same allocations and uploads (it made ~9 more per layer before)."""
    one = _count_device_traffic(monkeypatch, 1)
    two = _count_device_traffic(monkeypatch, 2)
    print(f"\ndevice traffic per forward (1 layer): {one}")
    assert two == one, f"1 layer: {one}, 2 layers: {two}"
    assert one["to_device"] >= 1 and one["device_array"] >= 6, one  # the spy sees the traffic


def test_device_pixels_with_nan_are_rejected_on_the_device(run):
    """Device pixel_values are checked where they are: a NaN names its patch, before any kernel runs."""
    from moonvit_kernels.numba_backend._cuda import cuda

    model, pv, *_ = run
    bad = pv.copy()
    bad[23, 2, 1, 0] = np.nan
    bad[30, 0, 0, 3] = np.inf
    with pytest.raises(ValueError, match=r"non-finite values \(NaN/Inf; first in patch 23\)"):
        model.backend.forward(cuda.to_device(bad), GRID)


@pytest.mark.parametrize("shape", [(1, 1), (5, 37)])
def test_first_nonfinite_row_kernel(shape):
    """The device check finds the first bad row (NaN, +Inf or -Inf) at sizes that are not block multiples."""
    from moonvit_kernels.numba_backend._cuda import cuda
    from moonvit_kernels.numba_backend.input_check import first_nonfinite_row

    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    assert first_nonfinite_row(cuda.to_device(x)) == -1
    for value in (np.nan, np.inf, -np.inf):
        y = x.copy()
        rows = sorted(set(rng.integers(0, shape[0], 2).tolist()))
        for r in rows:
            y[r, rng.integers(0, shape[1])] = value
        assert first_nonfinite_row(cuda.to_device(y)) == rows[0]


def test_bring_your_own_kernel_swaps_one_launcher_and_compare_finds_its_stage():
    """`own_kernel(stage, launcher)` runs the tower with the learner's launcher (one that scales its output by 1.01
    is named at the first stage it reaches; notebook 06 runs a faithful one through the whole comparison), puts the
    original back, and refuses a launcher with other parameters by name."""
    from moonvit_kernels.compare import compare_backends
    from moonvit_kernels.numba_backend import rmsnorm as rmsnorm_k
    from moonvit_kernels.numba_backend.own_kernels import own_kernel

    grid = np.array([[1, 2, 4]])
    w = random_weights(CFG, seed=3)
    pv = random_pixels(grid, CFG.patch_size, seed=4)
    original = rmsnorm_k.rmsnorm
    calls = []

    def mine(x, weight, eps, out=None, rstd=None):
        calls.append(x.shape)
        return original(x, weight, eps, out=out, rstd=rstd)

    def wrong(x, weight, eps, out=None, rstd=None):
        y = original(x, weight, eps, out=out, rstd=rstd)
        host = y.copy_to_host() * np.float32(1.01)
        y.copy_to_device(host)
        return y

    numpy_model = MoonViT(CFG, w, backend="numpy")
    with own_kernel("rmsnorm", mine):
        assert rmsnorm_k.rmsnorm is mine
        mine(*(np.ones((2, CFG.vt_hidden_size), np.float32), np.ones(CFG.vt_hidden_size, np.float32)), 1e-6)
    assert calls == [(2, CFG.vt_hidden_size)] and rmsnorm_k.rmsnorm is original
    with own_kernel("rmsnorm", wrong):
        report = compare_backends(MoonViT(CFG, w, backend="numba"), numpy_model, pv, grid)
    assert report.first_divergence == "layer_0", report
    with pytest.raises(ValueError, match=r"lacks the parameter\(s\) out, rstd of .*rmsnorm"):
        with own_kernel("rmsnorm", lambda x, weight, eps: x):
            pass
    with pytest.raises(ValueError, match="unknown stage 'softmax'"):
        with own_kernel("softmax", mine):
            pass
