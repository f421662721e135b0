"""Bad input to the reference tower: each case is a ValueError/KeyError whose message names the problem.

Checked through `vision_forward` (the path a user takes) with `VisionConfig.tiny()`
(patch 4, merge kernel 2x2, init_pos_emb_time 4, 2 layers).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import random_pixels

from moonvit_kernels import reference as ref
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.weights import random_weights

CFG = VisionConfig.tiny()
P = CFG.patch_size
GRID = np.array([[1, 2, 4], [2, 2, 2]])  # 8 + 8 = 16 patches


@pytest.fixture(scope="module")
def weights():
    return random_weights(CFG, seed=1)


@pytest.fixture(scope="module")
def pixels():
    return random_pixels(GRID, P, seed=2)


def run(pixels, grid, weights, **kw):
    return ref.vision_forward(pixels, grid, weights, CFG, **kw)


# ============================================================================ pixel_values
@pytest.mark.parametrize(
    ("shape", "match"),
    [
        ((15, 3, P, P), r"holds 15 patches but grid_thws .* needs sum\(t\*h\*w\) = 16"),
        ((17, 3, P, P), r"holds 17 patches .* = 16"),
        ((16, 1, P, P), r"pixel_values shape \(16, 1, 4, 4\) is not \[L, 3, 4, 4\]"),
        ((16, 4, P, P), r"pixel_values shape \(16, 4, 4, 4\) is not \[L, 3, 4, 4\]"),
        ((16, 3, 5, 5), r"pixel_values shape \(16, 3, 5, 5\) is not \[L, 3, 4, 4\] \(patch_size=4\)"),
        ((16, 3, P, P + 1), r"pixel_values shape \(16, 3, 4, 5\)"),
        ((16, 3, P * P), r"pixel_values shape \(16, 3, 16\) is not \[L, 3, 4, 4\]"),
        ((16, 3 * P * P), r"pixel_values shape \(16, 48\)"),
        ((1, 16, 3, P, P), r"pixel_values shape \(1, 16, 3, 4, 4\)"),
    ],
)
def test_pixel_values_shape(weights, shape, match):
    pv = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    with pytest.raises(ValueError, match=match):
        run(pv, GRID, weights)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_pixels(weights, pixels, bad):
    pv = pixels.copy()
    pv[11, 2, 1, 3] = bad
    with pytest.raises(ValueError, match=r"pixel_values holds non-finite values .*first in patch 11"):
        run(pv, GRID, weights)


def test_float64_pixels_too_large_for_float32(weights, pixels):
    pv = pixels.astype(np.float64)
    pv[5, 0, 0, 0] = 1e300
    with pytest.raises(ValueError, match=r"too large for float32 \(first in patch 5\)"):
        run(pv, GRID, weights)
    run(pv, GRID, weights, dtype=np.float64)  # fine in float64 mode


@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.int64, np.bool_, np.complex64])
def test_non_floating_pixels_rejected(weights, pixels, dtype):
    pv = (pixels * 50).astype(dtype) if dtype is not np.bool_ else pixels > 0
    with pytest.raises(ValueError, match=rf"pixel_values dtype {np.dtype(dtype)} is not floating point"):
        run(pv, GRID, weights)


def test_ragged_pixels_rejected(weights):
    with pytest.raises(ValueError, match="pixel_values is not a rectangular array"):
        run([[0.1, 0.2], [0.3]], GRID, weights)


def test_float16_pixels_are_converted(weights, pixels):
    pv16 = pixels.astype(np.float16)
    got = run(pv16, GRID, weights)
    want = run(pv16.astype(np.float32), GRID, weights)
    assert all(g.dtype == np.float32 for g in got)
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w)
    # and float16 rounding really happened (the test is not comparing a run with itself by accident)
    assert not np.array_equal(pv16.astype(np.float32), pixels)


def test_float64_pixels_in_float32_mode(weights, pixels):
    pv64 = pixels.astype(np.float64) + 1e-9  # not representable in float32: it must be rounded, not rejected
    got = run(pv64, GRID, weights)
    want = run(pv64.astype(np.float32), GRID, weights)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.float32
        assert np.array_equal(g, w)


def test_list_pixels_accepted(weights, pixels):
    got = run(pixels.tolist(), GRID, weights)
    for g, w in zip(got, run(pixels, GRID, weights), strict=True):
        assert np.array_equal(g, w)


def test_unsupported_compute_dtype(weights, pixels):
    with pytest.raises(ValueError, match="dtype must be float32 or float64, got float16"):
        run(pixels, GRID, weights, dtype=np.float16)


# ============================================================================ grid_thws
@pytest.mark.parametrize(
    ("grid", "match"),
    [
        ([[1, 3, 4]], r"grid_thws\[0\] = \(1, 3, 4\): h must be divisible by 2 and w by 2 \(merge_kernel_size\)"),
        ([[1, 2, 4], [1, 2, 5]], r"grid_thws\[1\] = \(1, 2, 5\): h must be divisible by 2 and w by 2"),
        ([[5, 2, 2]], r"grid_thws\[0\] = \(5, 2, 2\): t=5 frames exceeds init_pos_emb_time=4"),
        ([[1, 514, 2]], r"grid_thws\[0\] = \(1, 514, 2\): h and w must be <= 512"),
        ([[1, 2, 1024]], r"h and w must be <= 512"),
        ([[0, 2, 2]], r"grid_thws\[0\] = \(0, 2, 2\): t, h, w must all be >= 1"),
        ([[1, 0, 2]], r"\(1, 0, 2\): t, h, w must all be >= 1"),
        ([[1, 2, 0]], r"\(1, 2, 0\): t, h, w must all be >= 1"),
        ([[-1, 2, 2]], r"\(-1, 2, 2\): t, h, w must all be >= 1"),
        ([[1, -2, 2]], r"\(1, -2, 2\): t, h, w must all be >= 1"),
        ([[1, 2, -4]], r"\(1, 2, -4\): t, h, w must all be >= 1"),
        ([[1, 2]], r"grid_thws shape \(1, 2\) is not \[N, 3\]"),
        ([[1, 2, 4, 1]], r"grid_thws shape \(1, 4\) is not \[N, 3\]"),
        ([1, 2, 4, 1], r"grid_thws shape \(4,\) is not \[N, 3\]"),
        ([[[1, 2, 4]]], r"grid_thws shape \(1, 1, 3\) is not \[N, 3\]"),
        (np.zeros((0, 3), np.int64), r"grid_thws shape \(0, 3\) is not \[N, 3\] with N >= 1"),
        ([[1, 2, 4], [1, 2]], r"grid_thws is not a rectangular array"),
        ([[1, 2, 4.5]], r"grid_thws must hold integers, got dtype float64"),
        ([[1, 2, np.nan]], r"grid_thws must hold integers"),
        ([["1", "2", "4"]], r"grid_thws must hold integers, got dtype <U1"),
        (np.array([[True, True, True]]), r"grid_thws must hold integers, got dtype bool"),
        (None, r"grid_thws shape \(\) is not \[N, 3\]"),
    ],
)
def test_bad_grid(weights, grid, match):
    pv = random_pixels([[1, 2, 2]], P, seed=4)  # the grid is checked first: pixel count is irrelevant here
    with pytest.raises(ValueError, match=match):
        run(pv, grid, weights)


def test_grid_accepts_one_row_and_integral_floats(weights):
    pv = random_pixels([[1, 2, 4]], P, seed=5)
    base = run(pv, np.array([[1, 2, 4]]), weights)[0]
    for grid in ([1, 2, 4], np.array([[1.0, 2.0, 4.0]]), np.array([[1, 2, 4]], np.uint8)):
        assert np.array_equal(run(pv, grid, weights)[0], base)
    _, g = ref.validate_inputs(pv, np.array([[1.0, 2.0, 4.0]]), CFG)
    assert g.dtype == np.int64


def test_position_embedding_rejects_too_many_frames(weights):
    with pytest.raises(ValueError, match="t=5 frames exceeds init_pos_emb_time=4"):
        ref.position_embedding(np.array([[5, 2, 2]]), weights["vision_tower.patch_embed.pos_emb.weight"], CFG)


# ============================================================================ weights
def test_missing_tensor(weights, pixels):
    name = "vision_tower.encoder.blocks.1.mlp.fc0.weight"
    w = {k: v for k, v in weights.items() if k != name}
    with pytest.raises(KeyError, match=re.escape(f"missing tensor {name!r}")):
        run(pixels, GRID, w)


def test_misshaped_tensor(weights, pixels):
    name = "vision_tower.encoder.blocks.0.wo.weight"
    D, Q = CFG.vt_hidden_size, CFG.qkv_hidden_size
    w = {**weights, name: weights[name].T.copy()}  # [Q, D] instead of [D, Q]: the classic square-wo mistake
    with pytest.raises(ValueError, match=re.escape(f"tensor {name!r} has shape ({Q}, {D}), expected ({D}, {Q})")):
        run(pixels, GRID, w)


def test_extra_layer_rejected(weights, pixels):
    n = CFG.vt_num_hidden_layers
    name = f"vision_tower.encoder.blocks.{n}.norm0.weight"
    w = {**weights, name: np.ones(CFG.vt_hidden_size, np.float32)}
    with pytest.raises(
        ValueError, match=re.escape(f"unexpected vision tensor {name!r}") + f".*vt_num_hidden_layers={n}"
    ):
        run(pixels, GRID, w)


def test_non_vision_tensors_ignored(weights, pixels):
    w = {**weights, "language_model.model.embed_tokens.weight": np.zeros((3, 5), np.float32)}
    for g, want in zip(run(pixels, GRID, w), run(pixels, GRID, weights), strict=True):
        assert np.array_equal(g, want)


@pytest.mark.parametrize("dtype", [np.int32, np.uint16, np.bool_])
def test_integer_weight_rejected(weights, pixels, dtype):
    name = "vision_tower.encoder.final_layernorm.weight"
    w = {**weights, name: weights[name].astype(dtype)}
    with pytest.raises(ValueError, match=re.escape(f"tensor {name!r} has dtype {np.dtype(dtype)}") + ".*floating"):
        run(pixels, GRID, w)


def test_weights_not_a_mapping(weights, pixels):
    with pytest.raises(ValueError, match="weights must be a mapping"):
        run(pixels, GRID, list(weights.items()))


def test_nan_weights_through_the_model_are_refused(weights, pixels):
    from moonvit_kernels.model import MoonViT

    bad = {
        **weights,
        "vision_tower.encoder.blocks.1.norm1.weight": weights["vision_tower.encoder.blocks.1.norm1.weight"].copy(),
    }
    bad["vision_tower.encoder.blocks.1.norm1.weight"][3] = np.inf
    with pytest.raises(ValueError, match=r"blocks\.1\.norm1\.weight.*NaN or Inf"):
        MoonViT(CFG, bad, backend="numpy")
    with pytest.raises(ValueError, match=r"blocks\.1\.norm1\.weight.*NaN or Inf"):
        run(pixels, GRID, bad)
