"""Plots: the data behind each figure (returned arrays, the axes' image data), never pixels."""

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

from moonvit_kernels import viz
from moonvit_kernels.reference import rope_frequencies


def image_arrays(ax):
    return [np.asarray(im.get_array()) for im in ax.get_images()]


# ============================================================================ RoPE
def test_rope_angle_maps_width_on_even_slots_height_on_odd():
    h, w, hd = 5, 7, 24
    maps = viz.rope_angle_maps(h, w, hd, "angle")
    assert maps.shape == (hd // 2, h, w)
    f = rope_frequencies(hd, dtype=np.float64)
    rows, cols = np.mgrid[0:h, 0:w]
    for i in range(hd // 4):
        np.testing.assert_allclose(maps[2 * i], cols * f[i], rtol=1e-12)
        np.testing.assert_allclose(maps[2 * i + 1], rows * f[i], rtol=1e-12)
    np.testing.assert_allclose(viz.rope_angle_maps(h, w, hd, "cos"), np.cos(maps))


def test_rope_frequency_maps_figure_holds_one_map_per_slot():
    fig = viz.rope_frequency_maps(3, 6, 24)
    assert isinstance(fig, Figure)
    shown = [ax for ax in fig.axes if ax.get_visible() and ax.get_images()]
    assert len(shown) == 12
    maps = viz.rope_angle_maps(3, 6, 24, "cos")
    for j, ax in enumerate(shown):
        (data,) = image_arrays(ax)
        np.testing.assert_array_equal(data, maps[j])
    # slot 0 (width) varies along columns only, slot 1 (height) along rows only
    assert np.ptp(maps[0], axis=0).max() == 0 and np.ptp(maps[0], axis=1).min() > 0
    assert np.ptp(maps[1], axis=1).max() == 0 and np.ptp(maps[1], axis=0).min() > 0


@pytest.mark.parametrize("axis", ["width", "height"])
def test_rope_scores_depend_on_offset_only(axis):
    starts = [(0, 0), (4, 9), (13, 2)]
    offsets = range(0, 17, 3)
    scores = viz.rope_offset_scores(24, offsets, starts, axis, seed=1)
    assert scores.shape == (3, 6)
    for row in scores[1:]:
        np.testing.assert_allclose(row, scores[0], rtol=1e-10, atol=1e-10)
    assert np.ptp(scores[0]) > 1e-3  # the curve is not flat: the rotation does something


def test_rope_offset_invariance_figure_plots_the_scores():
    starts = ((0, 0), (2, 5))
    fig = viz.rope_offset_invariance(24, max_offset=10, starts=starts, seed=2)
    width_ax, height_ax = fig.axes[:2]
    for ax, axis in ((width_ax, "width"), (height_ax, "height")):
        lines = ax.get_lines()
        assert len(lines) == 2
        want = viz.rope_offset_scores(24, range(11), starts, axis, seed=2)
        for line, row in zip(lines, want, strict=True):
            np.testing.assert_array_equal(line.get_ydata(), row)


# ============================================================================ errors
def test_error_heatmap_shows_the_error_matrix():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((4, 3, 5))
    got = ref + rng.standard_normal(ref.shape) * 1e-3
    fig = viz.error_heatmap(got, ref, title="stage")
    (data,) = image_arrays(fig.axes[0])
    np.testing.assert_allclose(data, np.abs(got - ref).reshape(4, 15))
    assert f"{np.abs(got - ref).max():.3e}" in fig.axes[0].get_title()
    rel = viz.error_matrix(got[0, 0], ref[0, 0], relative=True)
    np.testing.assert_allclose(rel, (np.abs(got - ref) / np.abs(ref))[0, 0][None])


def test_error_heatmap_counts_nan_and_checks_shapes():
    ref = np.ones((3, 4)) * np.arange(1, 5)
    got = ref.copy()
    got[1, 2] = np.nan
    assert "1 NaN/Inf" in viz.error_heatmap(got, ref).axes[0].get_title()
    with pytest.raises(ValueError, match="shape"):
        viz.error_heatmap(np.zeros(3), np.zeros(4))


# ============================================================================ merge and packing
@pytest.mark.parametrize("h, w, k", [(4, 6, (2, 2)), (6, 3, (3, 1)), (2, 8, (1, 4))])
def test_merge_index_table_follows_spec(h, w, k):
    kh, kw = k
    merged, slot = viz.merge_index_table(h, w, k)
    for r in range(h):
        for c in range(w):
            assert merged[r, c] == (r // kh) * (w // kw) + c // kw
            assert slot[r, c] == (r % kh) * kw + c % kw


def test_merge_index_map_figure_and_errors():
    fig = viz.merge_index_map(4, 6)
    merged, slot = viz.merge_index_table(4, 6, (2, 2))
    (a,), (b,) = (image_arrays(ax) for ax in fig.axes[:2])
    np.testing.assert_array_equal(a, merged)
    np.testing.assert_array_equal(b, slot)
    with pytest.raises(ValueError, match="not divisible"):
        viz.merge_index_table(5, 6, (2, 2))


def test_attention_mask_is_block_diagonal():
    grid = [[1, 2, 4], [2, 2, 2], [1, 1, 3]]
    mask = viz.attention_mask(grid)
    sizes = [8, 8, 3]
    assert mask.shape == (19, 19)
    item = np.repeat(np.arange(3), sizes)
    for i in range(19):
        for j in range(19):
            assert mask[i, j] == (item[i] == item[j])
    (data,) = image_arrays(viz.attention_mask_picture(grid).axes[0])
    np.testing.assert_array_equal(data, mask)


# ============================================================================ images
def test_patch_grid_overlay_draws_the_image_and_lines():
    img = np.random.default_rng(3).integers(0, 256, (12, 20, 3), dtype=np.uint8)
    fig = viz.patch_grid_overlay(img, 4, merge_kernel_size=(2, 2), content_size=(17, 10))
    ax = fig.axes[0]
    (data,) = image_arrays(ax)
    np.testing.assert_array_equal(data, img)
    segments = [len(c.get_segments()) for c in ax.collections if isinstance(c, LineCollection)]
    assert segments == [6, 4, 3, 2]  # lines at multiples of 4 (columns, rows) and of 8 (merge)
    assert len(ax.patches) == 2  # padding on the right and at the bottom
    assert "3 rows × 5 columns" in ax.get_title()
    with pytest.raises(ValueError, match=r"\[H, W, 3\]"):
        viz.patch_grid_overlay(np.zeros((4, 4)), 2)


def test_pca_colors_are_the_top_components():
    rng = np.random.default_rng(4)
    h, w, D = 3, 5, 7
    basis = rng.standard_normal((3, D))
    feats = rng.standard_normal((h * w, 3)) * [5.0, 2.0, 1.0] @ basis + 0.01 * rng.standard_normal((h * w, D))
    colors = viz.pca_colors(feats, (h, w))
    assert colors.shape == (h, w, 3)
    assert colors.min() >= 0 and colors.max() <= 1
    centred = feats - feats.mean(axis=0)
    evals, evecs = np.linalg.eigh(centred.T @ centred)
    for c in range(3):
        proj = centred @ evecs[:, -1 - c]
        scaled = (proj - proj.min()) / np.ptp(proj)
        got = colors[..., c].ravel()
        assert np.allclose(got, scaled, atol=1e-8) or np.allclose(got, 1 - scaled, atol=1e-8), c


def test_pca_overlay_figure_holds_colours_over_the_image():
    rng = np.random.default_rng(5)
    img = rng.uniform(0, 1, (16, 24, 3))
    feats = rng.standard_normal((4 * 6, 8))
    fig = viz.pca_overlay(feats, (4, 6), img)
    plain, colours, overlay = (image_arrays(ax) for ax in fig.axes[:3])
    np.testing.assert_array_equal(plain[0], img)
    np.testing.assert_allclose(colours[0], viz.pca_colors(feats, (4, 6)))
    assert len(overlay) == 2
    assert overlay[1].shape == (4, 6, 3)
    with pytest.raises(ValueError, match="not \\[h·w"):
        viz.pca_colors(feats, (5, 6))
