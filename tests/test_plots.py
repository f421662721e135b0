"""The plots package: each picture's data checked against hand-computed facts, each figure built."""

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
from helpers import assert_close, random_pixels
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

from moonvit_kernels import plots, registry
from moonvit_kernels import reference as ref
from moonvit_kernels.compare import compare_stages
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.reference import rope_frequencies
from moonvit_kernels.weights import parameter_count, random_weights


def image_arrays(ax):
    return [np.asarray(im.get_array()) for im in ax.get_images()]


# ============================================================================ RoPE
def test_rope_angle_maps_width_on_even_slots_height_on_odd():
    h, w, hd = 5, 7, 24
    maps = plots.rope_angle_maps(h, w, hd, "angle")
    assert maps.shape == (hd // 2, h, w)
    f = rope_frequencies(hd, dtype=np.float64)
    rows, cols = np.mgrid[0:h, 0:w]
    for i in range(hd // 4):
        np.testing.assert_allclose(maps[2 * i], cols * f[i], rtol=1e-12)
        np.testing.assert_allclose(maps[2 * i + 1], rows * f[i], rtol=1e-12)
    np.testing.assert_allclose(plots.rope_angle_maps(h, w, hd, "cos"), np.cos(maps))


def test_rope_frequency_maps_figure_holds_one_map_per_slot():
    fig = plots.rope_frequency_maps(3, 6, 24)
    assert isinstance(fig, Figure)
    shown = [ax for ax in fig.axes if ax.get_visible() and ax.get_images()]
    assert len(shown) == 12
    maps = plots.rope_angle_maps(3, 6, 24, "cos")
    for j, ax in enumerate(shown):
        (data,) = image_arrays(ax)
        np.testing.assert_array_equal(data, maps[j])
    # slot 0 (width) varies along columns only, slot 1 (height) along rows only
    assert np.ptp(maps[0], axis=0).max() == 0 and np.ptp(maps[0], axis=1).min() > 0
    assert np.ptp(maps[1], axis=1).max() == 0 and np.ptp(maps[1], axis=0).min() > 0


def test_rope_frequency_maps_k3_angles_on_a_log_scale_show_structure_in_every_panel():
    slots = list(range(0, 64, 4))  # 16 of K3's 64 slots, i from 0 to 30
    fig = plots.rope_frequency_maps(64, 64, 128, "angle", slots=slots)
    shown = [ax for ax in fig.axes if ax.get_visible() and ax.get_images()]
    assert len(shown) == 16
    for ax in shown:
        (im,) = ax.get_images()
        data = np.ma.compressed(im.get_array())
        lo, hi = im.norm(data.min()), im.norm(data.max())
        assert hi - lo > 0.05  # a visible gradient on the shared colour scale, even at i = 30
    assert any(ax.get_label() == "<colorbar>" for ax in fig.axes)
    with pytest.raises(ValueError, match="slots"):
        plots.rope_frequency_maps(4, 4, 16, slots=[8])


def test_rope_angle_range_is_the_largest_angle_per_frequency():
    r = plots.rope_angle_range(3, 64, 128)
    np.testing.assert_allclose(r, 63 * rope_frequencies(128, dtype=np.float64))
    assert r[0] == 63 and r[-1] < 0.01  # the slowest K3 frequency barely turns across an 896-pixel image


@pytest.mark.parametrize("axis", ["width", "height"])
def test_rope_scores_depend_on_offset_only(axis):
    starts = [(0, 0), (4, 9), (13, 2)]
    offsets = range(0, 17, 3)
    scores = plots.rope_offset_scores(24, offsets, starts, axis, seed=1)
    assert scores.shape == (3, 6)
    for row in scores[1:]:
        np.testing.assert_allclose(row, scores[0], rtol=1e-10, atol=1e-10)
    assert np.ptp(scores[0]) > 1e-3  # the curve is not flat: the rotation does something


def test_rope_offset_invariance_figure_plots_the_scores():
    starts = ((0, 0), (2, 5))
    fig = plots.rope_offset_invariance(24, max_offset=10, starts=starts, seed=2)
    width_ax, height_ax = fig.axes[:2]
    for ax, axis in ((width_ax, "width"), (height_ax, "height")):
        lines = ax.get_lines()
        assert len(lines) == 2
        want = plots.rope_offset_scores(24, range(11), starts, axis, seed=2)
        for line, row in zip(lines, want, strict=True):
            np.testing.assert_array_equal(line.get_ydata(), row)


def test_rope_frequency_maps_name_their_axes_and_colour_angle_zero():
    fig = plots.rope_frequency_maps(6, 9, 24, "angle", slots=[0, 1, 10, 11], max_columns=2)
    shown = [ax for ax in fig.axes if ax.get_visible() and ax.get_images()]
    assert {ax.get_xlabel() for ax in shown[2:]} == {"column"} and {shown[0].get_ylabel(), shown[2].get_ylabel()} == {
        "row"
    }
    for ax in shown:
        (im,) = ax.get_images()
        assert not np.ma.is_masked(im.get_array())  # angle 0 (row or column 0) is drawn, not a blank strip
        assert np.isfinite(im.norm(0.0))


def test_rope_comb_turns_only_width_slots_along_a_row_and_height_slots_down_a_column():
    along_row, along_col = plots.rope_comb(24, 10)
    assert along_row.shape == along_col.shape == (12, 10)
    np.testing.assert_array_equal(along_row[1::2], 1.0)  # height slots: row 0 throughout
    np.testing.assert_array_equal(along_col[0::2], 1.0)  # width slots: column 0 throughout
    f = rope_frequencies(24, dtype=np.float64)
    np.testing.assert_allclose(along_row[2 * 3], np.cos(np.arange(10) * f[3]), rtol=1e-12)
    np.testing.assert_allclose(along_col[2 * 3 + 1], np.cos(np.arange(10) * f[3]), rtol=1e-12)
    fig = plots.plot_rope_comb(24, 10)
    assert [ax.get_xlabel() for ax in fig.axes[:2]] == ["column (along a row), patches", "row (down a column), patches"]


def test_rope_offset_map_peaks_at_zero_and_swapping_the_axes_transposes_it():
    good = plots.rope_offset_map(32, 6, seed=3)
    bad = plots.rope_offset_map(32, 6, swapped=True, seed=3)
    assert good.shape == (13, 13) and good[6, 6] == pytest.approx(1.0) and good.max() == pytest.approx(1.0)
    np.testing.assert_allclose(bad, good.T, rtol=1e-12)
    assert np.abs(good - good.T).max() > 0.05  # width and height weighted differently: not symmetric
    # the brute-force score of one offset, from the reference's rotation
    rng = np.random.default_rng(3)
    q = rng.standard_normal(32)
    w = np.repeat(np.where(np.arange(16) % 2 == 0, 1.0, 0.35), 2)  # slot weights on dims, as the map's energies
    table = ref.rope_angles(7, 7, 32, dtype=np.float64)
    qr = ref.apply_rope((q * np.sqrt(w))[None, None], table[0][None])
    kr = ref.apply_rope((q * np.sqrt(w))[None, None], table[2 * 7 + 5][None])
    assert good[6 + 2, 6 + 5] == pytest.approx(float(np.sum(qr * kr)) / float(np.sum(w * q**2)), rel=1e-10)
    fig = plots.plot_rope_offset_map(32, 6)
    assert fig.axes[0].get_ylabel().startswith("row offset") and fig.axes[0].get_xlabel().startswith("column offset")


def test_rope_k3_maps_draw_every_panel_over_at_least_one_period():
    freqs = plots.k3_map_frequencies(128, 6)
    assert freqs[0] == 0 and freqs[-1] == 31 and len(freqs) == 6
    fig = plots.plot_rope_k3_maps(128, (64, 48))
    panels = [ax for ax in fig.axes if ax.get_images()]
    assert len(panels) == 12
    for ax in panels:
        (im,) = ax.get_images()
        assert np.ptp(im.get_array()) > 1.5  # cos goes through (nearly) a whole period: structure in every panel
        assert ax.get_xlabel() == "column"


def test_rope_command_writes_the_pictures_and_one_self_contained_page(tmp_path, capsys):
    from moonvit_kernels import cli

    out = tmp_path / "pics" / "rope.png"
    assert cli.main(["rope", "--head-dim", "32", "--grid", "12x20", "--out", str(out), "--html"]) == 0
    names = sorted(p.name for p in out.parent.iterdir())
    assert names == [".rope.rope.json", "rope.html", "rope.png", "rope_comb.png", "rope_offset.png"]  # and its record
    page = (out.parent / "rope.html").read_text(encoding="utf-8")
    assert page.count("data:image/png;base64,") == 3 and "http" not in page and "<script src" not in page
    assert '"headDim": 32' in page and '"rows": 12, "cols": 20' in page
    assert "wrote" in capsys.readouterr().out
    assert cli.main(["rope", "--grid", "64", "--out", str(out)]) == 2
    assert "--grid" in capsys.readouterr().err
    assert cli.main(["rope", "--head-dim", "30", "--out", str(out)]) == 2
    assert cli.main(["rope", "--out", str(tmp_path / "rope.svg")]) == 2


def test_rope_sizes_are_bounded_before_anything_is_drawn(tmp_path, capsys, monkeypatch):
    """Issue 31: `--grid 1000000000x1` took ~7.9 GB then a traceback; `--head-dim 1000000` 42-80 s and 1.1 GB."""
    from moonvit_kernels import cli, rope_command

    monkeypatch.setattr(rope_command, "write_pictures", lambda *a: pytest.fail("drew before checking the sizes"))
    out = str(tmp_path / "rope.png")
    for argv, option in [
        (["--grid", "1000000000x1"], "--grid 1000000000x1"),
        (["--grid", "1x1000000000"], "--grid 1x1000000000"),
        (["--head-dim", "1000000"], "--head-dim 1000000"),
        (["--head-dim", "1000000", "--grid", "1000000000x1"], "--head-dim 1000000"),
    ]:
        assert cli.main(["rope", *argv, "--out", out]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {option}: drawing would take about "), err
        assert "more than the limit of 1 GiB" in err[0] and "at most" in err[0], err
    assert not (tmp_path / "rope.png").exists()


@pytest.mark.parametrize("head_dim, grid", [(128, (64, 64)), (128, (512, 512)), (8, (100000, 1)), (4000, (64, 64))])
def test_rope_sizes_within_the_limit_are_accepted(head_dim, grid):
    from moonvit_kernels import rope_command

    rope_command.check_sizes(head_dim, grid)
    assert rope_command.drawing_bytes(head_dim, grid) <= rope_command.MEMORY_LIMIT


def test_rope_page_escapes_the_file_name(tmp_path):
    from moonvit_kernels import cli

    out = tmp_path / "<img src=x onerror=alert(1)>&.png"
    assert cli.main(["rope", "--head-dim", "8", "--grid", "4x4", "--out", str(out), "--html"]) == 0
    page = out.with_suffix(".html").read_text(encoding="utf-8")
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;&amp;.png" in page


def test_prediction_rows_put_measured_beside_predicted_only_when_a_report_exists(tmp_path):
    header, rows, note = plots.prediction_rows("01", results_dir=tmp_path)
    assert len(rows) == len(registry.notebook_kernels("01")) >= 4  # its kernels, from the registry
    assert all(r[-1] == "—" for r in rows) and "nothing yet" in note
    floor = float(rows[0][5].replace(",", ""))
    assert floor == pytest.approx(2 * 4096 * 4608 * 1024 / 67e12 * 1e6, rel=1e-3)  # wqkv at the fp32 datasheet peak
    run = tmp_path / "H200-2026-12-24"
    run.mkdir()
    (run / "results.csv").write_text(
        "section,item,backend,unit,rate,median_ms,shape\nkernels,gemm numba v3,numba,TFLOP/s,21.5,0.9,4096x4608x1024\n"
    )
    _, rows, note = plots.prediction_rows("01", results_dir=tmp_path)
    measured = {r[0]: r[-1] for r in rows}
    assert "21.5 TFLOP/s" in measured["`gemm_v3_none` (numba)"] and "H200-2026-12-24" in note
    assert measured["`gemm_v1_none` (numba)"] == "—"
    with pytest.raises(ValueError, match="stage"):
        plots.prediction_rows("99")


# ============================================================================ errors
def test_error_heatmap_shows_the_error_matrix():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((4, 3, 5))
    got = ref + rng.standard_normal(ref.shape) * 1e-3
    fig = plots.error_heatmap(got, ref, title="stage")
    (data,) = image_arrays(fig.axes[0])
    np.testing.assert_allclose(data, np.abs(got - ref).reshape(4, 15))
    assert f"{np.abs(got - ref).max():.3e}" in fig.axes[0].get_title()
    rel = plots.error_matrix(got[0, 0], ref[0, 0], relative=True)
    np.testing.assert_allclose(rel, (np.abs(got - ref) / np.abs(ref))[0, 0][None])


def test_error_heatmap_against_a_bound_uses_a_fixed_log_scale():
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((6, 5))
    got = ref.copy()
    got[2] += 1.0  # one bad row
    fig = plots.error_heatmap(got, ref, bound=1e-3)
    (data,) = image_arrays(fig.axes[0])
    assert data.min() >= 1e-3 and data.max() == 1e3  # clipped to the fixed scale
    np.testing.assert_array_equal(np.flatnonzero(data.max(axis=1) > 1), [2])
    assert fig.axes[0].get_images()[0].norm.vmin == 1e-3
    assert "error/bound" in fig.axes[0].get_title()
    with pytest.raises(ValueError, match="bound"):
        plots.error_heatmap(got, ref, bound=0.0)
    with pytest.raises(ValueError, match="scale"):
        plots.error_heatmap(got, ref, bound=1.0, scale=(2.0, 3.0))


def test_error_heatmap_counts_nan_and_checks_shapes():
    ref = np.ones((3, 4)) * np.arange(1, 5)
    got = ref.copy()
    got[1, 2] = np.nan
    assert "1 NaN/Inf" in plots.error_heatmap(got, ref).axes[0].get_title()
    with pytest.raises(ValueError, match="shape"):
        plots.error_heatmap(np.zeros(3), np.zeros(4))


# ============================================================================ merge and packing
@pytest.mark.parametrize("h, w, k", [(4, 6, (2, 2)), (6, 3, (3, 1)), (2, 8, (1, 4))])
def test_merge_index_table_follows_spec(h, w, k):
    kh, kw = k
    merged, slot = plots.merge_index_table(h, w, k)
    for r in range(h):
        for c in range(w):
            assert merged[r, c] == (r // kh) * (w // kw) + c // kw
            assert slot[r, c] == (r % kh) * kw + c % kw


def test_merge_index_map_figure_and_errors():
    fig = plots.merge_index_map(4, 6)
    merged, slot = plots.merge_index_table(4, 6, (2, 2))
    (a,), (b,) = (image_arrays(ax) for ax in fig.axes[:2])
    np.testing.assert_array_equal(a, merged)
    np.testing.assert_array_equal(b, slot)
    with pytest.raises(ValueError, match="not divisible"):
        plots.merge_index_table(5, 6, (2, 2))


def test_attention_mask_is_block_diagonal():
    grid = [[1, 2, 4], [2, 2, 2], [1, 1, 3]]
    mask = plots.attention_mask(grid)
    sizes = [8, 8, 3]
    assert mask.shape == (19, 19)
    item = np.repeat(np.arange(3), sizes)
    for i in range(19):
        for j in range(19):
            assert mask[i, j] == (item[i] == item[j])
    (data,) = image_arrays(plots.attention_mask_picture(grid).axes[0])
    np.testing.assert_array_equal(data, mask)


# ============================================================================ images
def test_patch_grid_overlay_draws_the_image_and_lines():
    img = np.random.default_rng(3).integers(0, 256, (12, 20, 3), dtype=np.uint8)
    fig = plots.patch_grid_overlay(img, 4, merge_kernel_size=(2, 2), content_size=(17, 10))
    ax = fig.axes[0]
    (data,) = image_arrays(ax)
    np.testing.assert_array_equal(data, img)
    segments = [len(c.get_segments()) for c in ax.collections if isinstance(c, LineCollection)]
    assert segments == [6, 4, 3, 2]  # lines at multiples of 4 (columns, rows) and of 8 (merge)
    assert len(ax.patches) == 2  # padding on the right and at the bottom
    assert "3 rows × 5 columns" in ax.get_title()
    with pytest.raises(ValueError, match=r"\[H, W, 3\]"):
        plots.patch_grid_overlay(np.zeros((4, 4)), 2)


def test_pca_colors_are_the_top_components():
    rng = np.random.default_rng(4)
    h, w, D = 3, 5, 7
    basis = rng.standard_normal((3, D))
    feats = rng.standard_normal((h * w, 3)) * [5.0, 2.0, 1.0] @ basis + 0.01 * rng.standard_normal((h * w, D))
    colors = plots.pca_colors(feats, (h, w))
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
    fig = plots.pca_overlay(feats, (4, 6), img)
    plain, colours, overlay = (image_arrays(ax) for ax in fig.axes[:3])
    np.testing.assert_array_equal(plain[0], img)
    np.testing.assert_allclose(colours[0], plots.pca_colors(feats, (4, 6)))
    assert len(overlay) == 2
    assert overlay[1].shape == (4, 6, 3)
    with pytest.raises(ValueError, match="not \\[h·w"):
        plots.pca_colors(feats, (5, 6))


TINY = VisionConfig.tiny()
GRID = np.array([[1, 4, 6], [3, 2, 2]])


@pytest.fixture(scope="module")
def tiny_stages():
    w = random_weights(TINY, 3)
    pv = random_pixels(GRID, TINY.patch_size, seed=4)
    _, stages = ref.vision_forward(pv, GRID, w, TINY, return_intermediates=True)
    return stages


def test_stage_shapes_match_the_reference_intermediates(tiny_stages):
    shapes = {s.name: s.shape for s in plots.stage_shapes(TINY, GRID)}
    for name, value in tiny_stages.items():
        key = "layer_i" if name.startswith("layer_") else name
        assert shapes[key] == value.shape, name
    L = int(np.prod(GRID, axis=1).sum())
    assert shapes["pixel_values"] == (L, 3, TINY.patch_size, TINY.patch_size)
    assert shapes["qkv"] == (L, 3 * TINY.qkv_hidden_size)
    assert shapes["mlp"] == (L, TINY.vt_intermediate_size)


def test_stage_shapes_reject_a_bad_grid():
    with pytest.raises(ValueError, match="grid_thws"):
        plots.stage_shapes(TINY, [[1, 0, 4]])


def test_plot_architecture_draws_one_box_per_stage():
    fig = plots.plot_architecture(TINY, GRID)
    texts = [t.get_text() for t in fig.axes[0].texts]
    for s in plots.stage_shapes(TINY, GRID):
        assert s.name in texts
        assert "[" + ", ".join(str(d) for d in s.shape) + "]" in texts


def test_plot_architecture_shows_both_norms_residuals_and_the_repeat():
    k3 = VisionConfig.k3()
    names = [s.name for s in plots.stage_shapes(k3, [[1, 64, 64]])]
    assert names.index("norm0") < names.index("qkv") < names.index("norm1") < names.index("mlp")
    residual = [s.name for s in plots.stage_shapes(k3, [[1, 64, 64]]) if s.adds_residual]
    assert residual == ["x + o @ woᵀ", "x + fc1(·)"]
    texts = [t.get_text() for t in plots.plot_architecture(k3, [[1, 64, 64]]).axes[0].texts]
    assert texts.count("⊕") == 2  # one residual add per skip branch
    assert "encoder block × 27" in texts


@pytest.mark.parametrize("config", [TINY, VisionConfig.k3()], ids=["tiny", "k3"])
def test_parameter_table_adds_up_to_parameter_count(config):
    rows = plots.parameter_table(config)
    counts = parameter_count(config)
    assert sum(r.count for r in rows) == counts["total"]
    assert next(r.count for r in rows if r.component == "mm_projector") == counts["mm_projector"]
    D, Q, I = config.vt_hidden_size, config.qkv_hidden_size, config.vt_intermediate_size
    per_block = 2 * D + 3 * Q * D + D * Q + 2 * I * D
    assert next(r.count for r in rows if r.component == "encoder blocks") == config.vt_num_hidden_layers * per_block


def test_k3_parameter_total_is_the_spec_number():
    assert sum(r.count for r in plots.parameter_table(VisionConfig.k3())) == 447_358_976


def test_flop_table_for_one_k3_image_is_about_6_1_tflop():
    total = sum(r.count for r in plots.flop_table(VisionConfig.k3(), [[1, 64, 64]]))
    assert 6.05e12 < total < 6.2e12  # docs/model.md: ≈ 6.1 TFLOP for an 896×896 image


def test_flop_table_attention_counts_items_separately():
    cfg = VisionConfig.k3()
    a, b = [1, 8, 10], [3, 4, 6]
    packed = {r.component: r.count for r in plots.flop_table(cfg, [a, b])}
    alone = [{r.component: r.count for r in plots.flop_table(cfg, [g])} for g in (a, b)]
    for component in packed:
        assert packed[component] == alone[0][component] + alone[1][component], component


def test_rmsnorm_output_rms_matches_the_reference_on_random_rows():
    rng = np.random.default_rng(5)
    target_rms = np.array([3e-5, 1e-3, 4e-3, 0.02, 0.3, 2.0])
    rows = rng.standard_normal((len(target_rms), 37))
    rows *= (target_rms / np.sqrt(np.mean(rows**2, axis=1)))[:, None]
    for eps in (1.1920929e-07, 2.0**-7):
        out = ref.rmsnorm(rows, np.ones(37), eps)
        got = np.sqrt(np.mean(out**2, axis=1))
        assert_close(plots.rmsnorm_output_rms(target_rms, eps), got, rtol=1e-9, atol=0, name=f"eps={eps}")
    with pytest.raises(ValueError):
        plots.rmsnorm_output_rms([-1.0], 1e-6)


def test_plot_eps_effect_draws_each_curve():
    fig = plots.plot_eps_effect({"a": 1e-7, "b": 2.0**-7}, measured={"kernel": ([0.01], [0.1])})
    labels = [line.get_label() for line in fig.axes[0].lines]
    assert sum(lbl.startswith(("a ", "b ")) for lbl in labels) == 2
    assert "kernel" in labels


@pytest.mark.parametrize("head_dim", [8, 24])
def test_interleaved_rope_pairs_are_what_the_reference_rotates(head_dim):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 1, head_dim))
    for pair in plots.rope_pairs(head_dim, "interleaved"):
        j = pair.dims[0] // 2
        angles = np.zeros((1, head_dim // 2))
        angles[0, j] = 0.7
        moved = np.flatnonzero(~np.isclose(ref.apply_rope(x, angles), x))
        assert tuple(moved) == pair.dims
        # The slot -> axis rule of the reference's angle table: a token at row 3, column 5.
        table = ref.rope_angles(4, 6, head_dim, dtype=np.float64)[3 * 6 + 5]
        f = ref.rope_frequencies(head_dim, dtype=np.float64)[pair.freq_index]
        assert np.isclose(table[j], (5 if pair.axis == "width" else 3) * f)


def test_rotate_half_pairs_cover_every_dim_once_and_differ_from_interleaved():
    pairs = plots.rope_pairs(24, "rotate_half")
    dims = sorted(d for p in pairs for d in p.dims)
    assert dims == list(range(24))
    assert {p.dims for p in pairs} != {p.dims for p in plots.rope_pairs(24)}
    with pytest.raises(ValueError):
        plots.rope_pairs(10)
    with pytest.raises(ValueError):
        plots.rope_pairs(8, "spiral")
    fig = plots.plot_rope_pairing(8)
    assert len(fig.axes) == 2


def test_attention_memory_table():
    rows = {r.approach: r for r in plots.attention_memory_table([100, 28], heads=3, head_dim=16, block_q=8, block_k=16)}
    assert rows["naive, one L×L matrix"].elements == 3 * 128 * 128
    assert rows["naive, per item"].elements == 3 * 100 * 100
    # every row counts all 3 heads: the tiled row has 3 heads × (13 + 4) query tiles of one tile each
    assert rows["tiled online softmax"].elements == 3 * (13 + 4) * (8 * 16 + 2 * 8)
    assert rows["tiled online softmax"].per_head == 8 * 16 + 2 * 8
    assert rows["naive, per item"].per_head == 100 * 100
    assert all(r.nbytes == 4 * r.elements for r in rows.values())
    with pytest.raises(ValueError):
        plots.attention_memory_table([], 1, 1, 1, 1)


def test_attention_kv_traffic_v2_reads_k_and_v_once_per_query_tile():
    t = plots.attention_kv_traffic([100, 28], heads=3, head_dim=16, block_q=8)
    per_key = 3 * 2 * 16 * 4
    assert t["v1"] == (100 * 100 + 28 * 28) * per_key
    assert t["v2"] == (13 * 100 + 4 * 28) * per_key
    assert 7 < t["v1"] / t["v2"] <= 8
    with pytest.raises(ValueError):
        plots.attention_kv_traffic([0], 1, 1, 1)


def test_attention_mask_picture_has_a_legend_and_v2_tiles():
    from matplotlib.patches import Rectangle

    fig = plots.attention_mask_picture([[1, 2, 5], [1, 1, 3]], block_q=4, block_k=3)
    ax = fig.axes[0]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]  # below the square, not beside it (squashed)
    assert any("may attend" in t for t in labels) and any("v2 tile" in t for t in labels)
    tiles = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert len(tiles) == 3 * 4 + 1 * 1  # item of 10: 3 query × 4 key tiles; item of 3: one tile
    with pytest.raises(ValueError):
        plots.attention_mask_picture([[1, 2, 2]], block_q=0, block_k=2)


def test_stage_report_series_and_plot(tiny_stages):
    broken = dict(tiny_stages)
    broken["final_norm"] = tiny_stages["final_norm"] + 0.1
    report = compare_stages(broken, tiny_stages)
    s = plots.stage_report_series(report)
    assert list(s["stage"]) == list(tiny_stages)
    assert list(s["ok"]) == [name != "final_norm" for name in tiny_stages]
    assert s["max_rel"][list(tiny_stages).index("final_norm")] > 0
    fig = plots.plot_stage_report(report)
    bars = fig.axes[0].patches
    assert len(bars) == len(tiny_stages)


def test_plot_timings_labels_where_it_ran():
    fig = plots.plot_timings({"v1": 0.002, "v2": 0.001}, where="CUDA simulator (CPU)", title="GEMM")
    assert "CUDA simulator (CPU)" in fig.axes[0].get_title()
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["v1", "v2"]


def test_plot_timings_goes_logarithmic_when_times_span_decades_and_wraps_long_titles():
    fig = plots.plot_timings({"numpy": 0.001, "numba v1": 2.0}, where="NVIDIA H200", title="x" * 30 + " " + "y" * 60)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    assert ax.get_xlim()[0] < 1.0  # the 1 ms bar is inside the axis
    assert "\n" in ax.get_title() and "NVIDIA H200" in ax.get_title().replace("\n", " ")
    assert plots.plot_timings({"a": 0.002, "b": 0.003}, where="CPU").axes[0].get_xscale() == "linear"
    assert plots.plot_timings({"a": 0.002, "b": 0.003}, where="CPU", log=True).axes[0].get_xscale() == "log"


def test_markdown_table():
    text = plots.markdown_table(["name", "count", "err", "ok"], [["a|b", 1234567, 1.23456e-7, True]])
    assert text.splitlines() == [
        "| name | count | err | ok |",
        "|---|---|---|---|",
        "| a\\|b | 1,234,567 | 1.235e-07 | True |",
    ]
    with pytest.raises(ValueError, match="row 0"):
        plots.markdown_table(["a", "b"], [[1]])


def test_plots_are_figures_outside_pyplot():
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    plots.plot_architecture(TINY, GRID)
    plots.plot_eps_effect({"a": 1e-7})
    assert plt.get_fignums() == before


def test_median_seconds_counts_calls_and_synchronises():
    calls, syncs = [], []
    t = plots.median_seconds(lambda: calls.append(1), repeat=3, warmup=2, synchronize=lambda: syncs.append(1))
    assert len(calls) == 5 and len(syncs) == 5
    assert 0 <= t["min"] <= t["median"] <= t["max"]
    with pytest.raises(ValueError):
        plots.median_seconds(lambda: None, repeat=0)


@pytest.mark.parametrize("t, h, w, kernel", [(1, 4, 6, (2, 2)), (3, 6, 4, (2, 2)), (2, 3, 4, (3, 1))])
def test_merged_to_grid_inverts_the_reference_merge(t, h, w, kernel):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((t * h * w, 5))
    (merged,) = ref.tpool_patch_merger(x, np.array([[t, h, w]]), kernel)
    grid = plots.merged_to_grid(merged.reshape(merged.shape[0], -1), h, w, kernel)
    assert_close(grid, x.reshape(t, h, w, 5).mean(axis=0), rtol=1e-12, atol=1e-12, name="grid")


def test_merged_to_grid_rejects_wrong_shapes():
    with pytest.raises(ValueError, match="not divisible"):
        plots.merged_to_grid(np.zeros((6, 8)), 3, 4)
    with pytest.raises(ValueError, match="merged shape"):
        plots.merged_to_grid(np.zeros((5, 8)), 4, 4)


@pytest.mark.parametrize("n, block", [(1, 4), (13, 4), (16, 16), (29, 5)])
def test_online_softmax_trace_ends_at_the_direct_softmax(n, block):
    rng = np.random.default_rng(8)
    scores = rng.standard_normal(n) * 3 + rng.uniform(-2, 2)
    values = rng.standard_normal((n, 6))
    trace = plots.online_softmax_trace(scores, block, values)
    tiles = -(-n // block)
    assert trace["running_max"].shape == (tiles,) and trace["output"].shape == (tiles, 6)
    ends = trace["tile_end"]
    assert_close(trace["running_max"], np.array([scores[:e].max() for e in ends]), 0, 0, "running max")
    direct_lse = np.array([np.log(np.sum(np.exp(scores[:e]))) for e in ends])
    assert_close(trace["lse"], direct_lse, rtol=1e-12, atol=1e-12, name="lse")
    p = np.exp(scores - scores.max())
    assert_close(trace["output"][-1], (p / p.sum()) @ values, rtol=1e-12, atol=1e-12, name="output")
    with pytest.raises(ValueError):
        plots.online_softmax_trace([np.nan], 2)
    fig = plots.plot_online_softmax(scores, block)
    assert len(fig.axes[1].lines[0].get_xdata()) == tiles


def test_position_grids_are_the_reference_interpolation():
    rng = np.random.default_rng(9)
    pos = rng.standard_normal((6, 6, 4))
    grids = plots.position_grids(pos, [(6, 6), (4, 10), (3, 2)], "bicubic", channel=2)
    assert [g.shape for g in grids] == [(6, 6), (4, 10), (3, 2)]
    assert_close(grids[0], pos[:, :, 2], 0, 0, "same size is the identity")
    assert_close(grids[1], ref.interpolate_pos_grid(pos, 4, 10, "bicubic")[:, :, 2], 0, 0, "resized")
    with pytest.raises(ValueError):
        plots.position_grids(pos, [(2, 2)], channel=4)
    fig = plots.plot_position_grids(pos, [(4, 10)], channel=1)
    shown = fig.axes[1].images[0].get_array()
    assert_close(np.asarray(shown), ref.interpolate_pos_grid(pos, 4, 10, "bilinear")[:, :, 1], 0, 0, "drawn")


def test_raster_rope_sees_the_patch_below_as_far_and_2d_rope_does_not():
    """The 'why 2-D' picture of notebook 03: from the centre of a 32 × 32 grid, 1-D raster-order RoPE scores the
    patch below (32 positions away) far lower than the one beside; K3's 2D RoPE scores them alike."""
    from moonvit_kernels.plots import plot_raster_vs_2d, raster_vs_2d_scores

    raster, two_d = raster_vs_2d_scores(128, 32)
    c = 16
    assert raster.shape == two_d.shape == (32, 32) and raster[c, c] == pytest.approx(1) == two_d[c, c]
    assert raster[c + 1, c] < raster[c, c + 1] - 0.3
    assert two_d[c + 1, c] == pytest.approx(two_d[c, c + 1]) and two_d[c + 1, c] > 0.9
    assert len(plot_raster_vs_2d(24, 8).axes) == 3
    with pytest.raises(ValueError, match="multiple of 4"):
        raster_vs_2d_scores(30, 8)
