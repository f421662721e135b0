"""The shared checks (`moonvit_kernels.checks`): the error measures fail where they must, and each "want"
agrees with a second formulation written here."""

from __future__ import annotations

import math

import numpy as np
import pytest

from moonvit_kernels import checks
from moonvit_kernels import reference as ref


def test_assert_close_fails_on_nan_shape_and_distance():
    want = np.linspace(-1.0, 2.0, 12).reshape(3, 4)
    checks.assert_close(want + 1e-9, want, rtol=0.0, atol=1e-8)
    for got, what in (
        (np.where(np.arange(12).reshape(3, 4) == 5, np.nan, want), "NaN/Inf"),
        (want[:, :3], "shape"),
        (want + 1e-3, "max abs err"),
    ):
        with pytest.raises(AssertionError, match=what):
            checks.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_pos_emb_tolerance_constants_are_the_interpolation_weights_maxima():
    """Σ|w| and Σ|dw/ds| over the fraction of s, recomputed from the reference's weights: bicubic from
    `cubic_weights` (central differences), bilinear from its two weights 1 − λ and λ."""
    t = np.linspace(0.0, 1.0, 100_001)
    h = 1e-6
    slope = np.abs((ref.cubic_weights(t + h) - ref.cubic_weights(t - h)) / (2 * h)).sum(axis=1)
    assert np.abs(ref.cubic_weights(t)).sum(axis=1).max() == pytest.approx(checks._INTERP_SUM_ABS["bicubic"], rel=1e-6)
    assert slope.max() == pytest.approx(checks._INTERP_SLOPE["bicubic"], rel=1e-5)
    assert (checks._INTERP_SUM_ABS["bilinear"], checks._INTERP_SLOPE["bilinear"]) == (1.0, 2.0)


def test_pos_emb_tolerance_grows_with_the_learned_grid():
    """The coordinate term: a K3-sized grid (64 x 64) is allowed 6-8x a 6 x 5 grid's error, bicubic more than
    bilinear; both stay far below a wrong tap (an error of the data's size, ~0.5)."""
    small, large = np.full((6, 5, 4), 0.5), np.full((64, 64, 4), 0.5)
    for mode in ("bilinear", "bicubic"):
        rtol_small, atol_small = checks.pos_emb_tolerance(small, mode)
        rtol_large, atol_large = checks.pos_emb_tolerance(large, mode)
        assert rtol_small == rtol_large == 16 * checks.FP32_EPS
        assert 5 < atol_large / atol_small < 9
        assert atol_large < 1e-3 * 0.5
    assert checks.pos_emb_tolerance(large, "bicubic")[1] > checks.pos_emb_tolerance(large, "bilinear")[1]


def test_rel_err_is_nan_for_non_finite_or_misshapen_results():
    want = np.array([1.0, -4.0, 2.0])
    assert checks.rel_err(want * (1 + 1e-3), want) == pytest.approx(1e-3)
    assert math.isnan(checks.rel_err([1.0, np.inf, 2.0], want))
    assert math.isnan(checks.rel_err([1.0, -4.0], want))


def test_fp32_rtol_grows_with_the_reduction_length():
    assert checks.fp32_rtol(1) == 8 * checks.FP32_EPS
    assert checks.fp32_rtol(400) == pytest.approx(20 * 8 * checks.FP32_EPS)


def test_random_is_neither_uniform_nor_centred_and_sample_rows_keeps_the_ends():
    x = checks.random(np.random.default_rng(3), (50, 7), 2.0)
    assert x.dtype == np.float32 and x.std() > 1.0 and abs(float(x.mean())) > 1e-4
    rows = checks.sample_rows(1000, 9)
    assert rows[0] == 0 and rows[-1] == 999 and rows.size == 9
    assert checks.sample_rows(5).tolist() == [0, 1, 2, 3, 4]


def test_gemm_want_epilogues_and_errors():
    rng = np.random.default_rng(1)
    a, b, r = rng.standard_normal((5, 7)), rng.standard_normal((3, 7)), rng.standard_normal((5, 3))
    lin = np.einsum("mk,nk->mn", a, b)
    np.testing.assert_allclose(checks.gemm_want(a, b, "none"), lin, rtol=1e-12)
    np.testing.assert_allclose(checks.gemm_want(a, b, "residual", r), lin + r, rtol=1e-12)
    erf = np.vectorize(math.erf)
    np.testing.assert_allclose(checks.gemm_want(a, b, "gelu_erf"), 0.5 * lin * (1 + erf(lin / math.sqrt(2))), 1e-12)
    with pytest.raises(ValueError, match="residual"):
        checks.gemm_want(a, b, "residual")
    with pytest.raises(ValueError, match="epilogue 'relu'"):
        checks.gemm_want(a, b, "relu")


def _attention_loops(qkv, bounds, heads, hd, row):
    """One query row's attention, head by head with Python sums: a second formulation."""
    Q = heads * hd
    item = int(np.searchsorted(bounds, row, side="right") - 1)
    s, e = bounds[item], bounds[item + 1]
    o, lse = np.empty(Q), np.empty(heads)
    for h in range(heads):
        q = qkv[row, h * hd : (h + 1) * hd]
        scores = [float(q @ qkv[j, Q + h * hd : Q + (h + 1) * hd]) / math.sqrt(hd) for j in range(s, e)]
        m = max(scores)
        w = [math.exp(x - m) for x in scores]
        z = sum(w)
        o[h * hd : (h + 1) * hd] = sum(
            wi * qkv[j, 2 * Q + h * hd : 2 * Q + (h + 1) * hd] for wi, j in zip(w, range(s, e), strict=True)
        )
        o[h * hd : (h + 1) * hd] /= z
        lse[h] = m + math.log(z)
    return o, lse


def test_attention_want_matches_loops_on_sampled_rows_of_packed_items():
    heads, hd = 3, 8
    bounds = np.array([0, 1, 24, 37])  # a lone token, then items of 23 and 13
    qkv = checks.random(np.random.default_rng(5), (37, 3 * heads * hd), 1.5).astype(np.float64)
    rows = np.array([0, 3, 23, 24, 36])
    o, lse = checks.attention_want(qkv, bounds, heads, hd, rows)
    for i, row in enumerate(rows):
        o_loop, lse_loop = _attention_loops(qkv, bounds, heads, hd, int(row))
        np.testing.assert_allclose(o[i], o_loop, rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(lse[i], lse_loop, rtol=1e-12)
    # every row at once is the packed reference
    o_all, lse_all = checks.attention_want(qkv, bounds, heads, hd)
    L, Q = 37, heads * hd
    q, k, v = (qkv[:, j * Q : (j + 1) * Q].reshape(L, heads, hd) for j in range(3))
    want_o, want_lse = ref.attention(q, k, v, bounds, return_lse=True)
    np.testing.assert_allclose(o_all, want_o.reshape(L, Q), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(lse_all, want_lse, rtol=1e-12)


def test_rope_merge_and_rmsnorm_wants_leave_what_they_must():
    grid = np.array([[1, 4, 6], [2, 2, 2]])
    heads, hd = 2, 8
    L, Q = 32, heads * hd
    qkv = checks.random(np.random.default_rng(2), (L, 3 * Q))
    out = checks.rope_want(qkv, grid, heads, hd)
    np.testing.assert_array_equal(out[:, 2 * Q :], qkv[:, 2 * Q :].astype(np.float64))  # v untouched
    # a rotation keeps the norm of every (x_2i, x_2i+1) pair
    pairs = lambda a: np.hypot(a[:, 0 : 2 * Q : 2], a[:, 1 : 2 * Q : 2])  # noqa: E731
    np.testing.assert_allclose(pairs(out), pairs(qkv.astype(np.float64)), rtol=1e-6)
    x = checks.random(np.random.default_rng(4), (L, 5))
    merged = checks.merge_want(x, grid, (2, 2))
    assert merged.shape == (6 + 1, 4 * 5)  # the video's two frames are pooled into one
    y, rstd = checks.rmsnorm_want(x, np.ones(5), 1e-6)
    np.testing.assert_allclose(rstd, 1 / np.sqrt((x.astype(np.float64) ** 2).mean(1) + 1e-6), rtol=1e-12)
    np.testing.assert_allclose(y, x * rstd[:, None], rtol=1e-12)


def test_input_check_want_names_the_first_bad_row():
    x = checks.random(np.random.default_rng(6), (9, 4))
    assert checks.input_check_want(x) == -1
    x[7, 1], x[3, 0] = np.nan, np.inf
    assert checks.input_check_want(x) == 3
