"""Position embedding: the learned grid interpolated (bilinear / bicubic) plus the time term, every tier."""

import math

import numpy as np
import pytest
from compile_tier import assert_cuda_stage_builds, assert_numba_stage_compiles, cuda_archs
from cuda_kernel_checks import (
    check_pos_emb,
)
from formulations import (
    TIGHT,
    bicubic_scalar,
    bilinear_scalar,
    rnd,
)
from helpers import assert_close, non_square
from tiers import EMULATOR, GPU_GRID, GPU_L, K3, gpu_rand

from moonvit_kernels import reference as ref
from moonvit_kernels.checks import pos_emb_tolerance
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.numba_backend import launch
from moonvit_kernels.numba_backend import pos_emb as P
from moonvit_kernels.numba_backend.launch import item_table

# ============================================================================
# reference: against the second formulations in tests/formulations.py
TINY = VisionConfig.tiny()


RESIZES = [(5, 7, 9, 4), (5, 7, 3, 11), (4, 4, 2, 2), (3, 6, 7, 6), (6, 5, 13, 2), (2, 3, 1, 1)]


class TestReference:
    pytestmark = [pytest.mark.reference]

    @pytest.mark.parametrize(("H0", "W0", "oh", "ow"), RESIZES)
    def test_bilinear_equals_scalar_formula(self, H0, W0, oh, ow):
        grid = rnd((H0, W0, 3), 10 + oh)
        got = ref.interpolate_pos_grid(grid, oh, ow, "bilinear")
        assert_close(got, bilinear_scalar(grid, oh, ow), **TIGHT, name="bilinear")

    @pytest.mark.parametrize(("H0", "W0", "oh", "ow"), RESIZES)
    def test_bicubic_equals_scalar_formula(self, H0, W0, oh, ow):
        grid = rnd((H0, W0, 3), 20 + oh)
        got = ref.interpolate_pos_grid(grid, oh, ow, "bicubic")
        assert_close(got, bicubic_scalar(grid, oh, ow), **TIGHT, name="bicubic")

    def test_bicubic_coefficient_is_minus_075_not_minus_05(self):
        grid = rnd((5, 7, 3), 30)
        got = ref.interpolate_pos_grid(grid, 9, 4, "bicubic")
        assert np.abs(got - bicubic_scalar(grid, 9, 4, a=-0.5)).max() > 1e-3

    @pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
    def test_same_size_interpolation_is_exactly_identity(self, mode):
        grid = rnd((6, 5, 4), 31).astype(np.float32)
        assert np.array_equal(ref.interpolate_pos_grid(grid, 6, 5, mode), grid)
        assert np.array_equal(ref.interpolation_matrix(7, 7, mode), np.eye(7))

    def test_bilinear_matrix_by_hand(self):
        # in=2 -> out=4: s = (d+0.5)/2 - 0.5 = -0.25 (clamped to 0), 0.25, 0.75, 1.25 (upper neighbour clamped).
        expected = np.array([[1.0, 0.0], [0.75, 0.25], [0.25, 0.75], [0.0, 1.0]])
        assert np.array_equal(ref.interpolation_matrix(2, 4, "bilinear"), expected)
        # in=4 -> out=2 (down): s = 0.5, 2.5 -> halfway between neighbours.
        expected = np.array([[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5]])
        assert np.array_equal(ref.interpolation_matrix(4, 2, "bilinear"), expected)

    def test_bicubic_matrix_row_by_hand(self):
        # in=4 -> out=8, output 2: s = 2.5·0.5 − 0.5 = 0.75, floor 0, t = 0.75; A = −0.75:
        #   W(1.75) = A·1.75³ − 5A·1.75² + 8A·1.75 − 4A = −0.03515625   (tap −1, clamped to 0)
        #   W(0.75) = (A+2)·0.75³ − (A+3)·0.75² + 1   =  0.26171875    (tap 0)
        #   W(0.25) = (A+2)·0.25³ − (A+3)·0.25² + 1   =  0.87890625    (tap 1)
        #   W(1.25) = A·1.25³ − 5A·1.25² + 8A·1.25 − 4A = −0.10546875  (tap 2)
        row = ref.interpolation_matrix(4, 8, "bicubic")[2]
        assert_close(row, [-0.03515625 + 0.26171875, 0.87890625, -0.10546875, 0.0], 0, 1e-15, "bicubic row 2")
        # Every row sums to 1 (clamped taps keep their weight), both modes, up and down.
        for mode in ("bilinear", "bicubic"):
            for n_in, n_out in ((4, 8), (7, 3), (5, 12)):
                assert_close(ref.interpolation_matrix(n_in, n_out, mode).sum(axis=1), np.ones(n_out), 0, 1e-14)

    def test_unknown_interpolation_mode_rejected(self):
        with pytest.raises(ValueError, match="nearest"):
            ref.interpolation_matrix(3, 5, "nearest")

    @pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
    def test_interpolation_matches_torch(self, mode):
        torch = pytest.importorskip("torch", reason="torch not installed: F.interpolate comparison skipped")
        F = torch.nn.functional
        grid = rnd((5, 7, 3), 40)
        for oh, ow in ((9, 4), (3, 11), (5, 7), (2, 2)):
            t = torch.from_numpy(grid).permute(2, 0, 1)[None]
            want = F.interpolate(t, size=(oh, ow), mode=mode, align_corners=False)[0].permute(1, 2, 0).numpy()
            assert_close(ref.interpolate_pos_grid(grid, oh, ow, mode), want, 1e-10, 1e-10, f"{mode} {oh}x{ow}")

    def test_time_table_by_hand(self):
        D, T = 10, 4
        table = ref.time_sincos_table(D, T)
        assert table.shape == (T, D)
        assert np.array_equal(table[0, : D // 2], np.zeros(D // 2))
        assert np.array_equal(table[0, D // 2 :], np.ones(D // 2))
        for f in range(T):
            for i in range(D // 2):
                omega = 10000.0 ** (-i / (D // 2))
                assert math.isclose(table[f, i], math.sin(f * omega), abs_tol=1e-15)
                assert math.isclose(table[f, D // 2 + i], math.cos(f * omega), abs_tol=1e-15)

    def test_position_embedding_image_gets_grid_video_gets_grid_plus_time(self):
        cfg = TINY
        pos = rnd((cfg.init_pos_emb_height, cfg.init_pos_emb_width, cfg.vt_hidden_size), 41)
        D, half = cfg.vt_hidden_size, cfg.vt_hidden_size // 2
        h, w, t = 4, 10, 3
        image = ref.position_embedding(np.array([[1, h, w]]), pos, cfg)
        assert_close(image, bilinear_scalar(pos, h, w).reshape(h * w, D), **TIGHT, name="image pos")
        video = ref.position_embedding(np.array([[t, h, w]]), pos, cfg).reshape(t, h * w, D)
        time = ref.time_sincos_table(D, cfg.init_pos_emb_time)
        for f in range(t):
            assert_close(video[f], image + time[f], **TIGHT, name=f"video frame {f}")
        # Frame 0 of a video vs the image: +1 on the cos half, nothing on the sin half.
        diff = video[0] - image
        assert np.array_equal(diff[:, :half], np.zeros((h * w, half)))
        assert_close(diff[:, half:], np.ones((h * w, half)), 0, 1e-12, "frame 0 cos half")
        # Native size: the learned grid itself, untouched.
        native = ref.position_embedding(np.array([[1, cfg.init_pos_emb_height, cfg.init_pos_emb_width]]), pos, cfg)
        assert np.array_equal(native, pos.reshape(-1, D))
        # Packed: concatenated in item order.
        packed = ref.position_embedding(np.array([[1, h, w], [t, h, w]]), pos, cfg)
        assert np.array_equal(packed, np.concatenate([image, video.reshape(t * h * w, D)]))


# ============================================================================
# numba kernel (the CUDA simulator without a GPU)
H0, W0 = non_square(6, 5)  # a non-square learned grid, so swapped axes or a wrong row stride fail


# image upsampled rows / downsampled columns + video with the opposite; identity image + one identity axis
GRIDS = {
    "resized": [(1, 8, 4), (3, 4, 6)],
    "same_size": [(1, H0, W0), (2, H0, 2)],
}


# K3's learned grid is 64 x 64; the source coordinate's rounding grows with it. A 64 x 60 grid (non-square) with
# few channels; outputs that span each axis to its far end, upsampled (70, 66) and downsampled (3, 2), one video.
K3_SIZED_SOURCE = non_square(64, 60)
K3_SIZED = VisionConfig.tiny().replace(
    vt_hidden_size=8, mm_hidden_size=8, init_pos_emb_height=K3_SIZED_SOURCE[0], init_pos_emb_width=K3_SIZED_SOURCE[1]
)
K3_SIZED_GRIDS = [(1, 3, 70), (1, 66, 2), (2, 5, 7)]


def config(mode: str, D: int = 32) -> VisionConfig:
    return VisionConfig.tiny().replace(
        vt_hidden_size=D,
        mm_hidden_size=D,
        init_pos_emb_height=H0,
        init_pos_emb_width=W0,
        pos_emb_interpolation_mode=mode,
    )


def tokens(L: int, D: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    r = np.random.default_rng(seed)
    x = r.standard_normal((L, D)).astype(np.float32)
    pos = (r.standard_normal((H0, W0, D)) + np.linspace(-1, 1, H0 * W0).reshape(H0, W0, 1)).astype(np.float32)
    return x, pos


class TestNumba:
    pytestmark = [pytest.mark.numba]

    @pytest.mark.parametrize("mode", P.MODES)
    @pytest.mark.parametrize("grids", GRIDS.keys())
    def test_add_position_embedding_matches_reference(self, mode, grids):
        cfg = config(mode)
        grid = np.array(GRIDS[grids])
        L = int(np.prod(grid, axis=1).sum())
        x, pos = tokens(L, cfg.vt_hidden_size, seed=len(grids))
        time = P.time_table(cfg.vt_hidden_size, cfg.init_pos_emb_time)
        want = ref.add_position_embedding(x.astype(np.float64), grid, pos.astype(np.float64), cfg)

        x_d = launch.to_device(x)
        got = P.add_position_embedding(x_d, pos, time, launch.item_table(grid), mode=mode)
        assert got is x_d
        rtol, atol = pos_emb_tolerance(pos, mode)
        assert_close(x_d.copy_to_host(), want, rtol=rtol, atol=atol, name=f"{mode} {grids}")

    @pytest.mark.parametrize("mode", P.MODES)
    def test_k3_sized_learned_grid(self, mode):
        """A learned grid as large as K3's (64 rows; 60 columns, non-square): the float32 source coordinate reaches
        63, where its rounding moves the weights by ~1e-5 (the tolerance's coordinate term; a 6x5 grid hides it).
        The outputs span the whole source range on both axes, up- and downsampled."""
        cfg = K3_SIZED.replace(pos_emb_interpolation_mode=mode)
        grid = np.array(K3_SIZED_GRIDS)
        L = int(np.prod(grid, axis=1).sum())
        r = np.random.default_rng(7)
        x = r.standard_normal((L, cfg.vt_hidden_size)).astype(np.float32)
        pos = (r.standard_normal((*K3_SIZED_SOURCE, cfg.vt_hidden_size)) * 0.5).astype(np.float32)
        want = ref.add_position_embedding(x.astype(np.float64), grid, pos.astype(np.float64), cfg)
        got = P.add_position_embedding(
            x.copy(), pos, P.time_table(cfg.vt_hidden_size, cfg.init_pos_emb_time), launch.item_table(grid), mode=mode
        )
        rtol, atol = pos_emb_tolerance(pos, mode)
        assert_close(got.copy_to_host(), want, rtol=rtol, atol=atol, name=f"{mode} 64x60 source")

    def test_time_term_only_for_videos(self):
        """Frame 0 of a video gets +1 on the cos half; an image of the same grid gets nothing."""
        cfg = config("bilinear")
        grid = np.array([(1, 4, 2), (2, 4, 2)])
        x, pos = tokens(24, cfg.vt_hidden_size, seed=3)
        out = x.copy()
        P.add_position_embedding(out, pos, P.time_table(32, 4), launch.item_table(grid))
        image, frame0 = out[:8] - x[:8], out[8:16] - x[8:16]
        half = cfg.vt_hidden_size // 2
        assert_close(frame0[:, :half], image[:, :half], 1e-6, 1e-6, name="sin half of frame 0")
        assert_close(frame0[:, half:], image[:, half:] + 1, 1e-6, 1e-6, name="cos half of frame 0")

    def test_odd_width_and_strided_columns(self):
        """D = 33 with 32 threads per block: one thread handles two columns (images only: D odd has no time table)."""
        D = 33
        grid = np.array([(1, 3, 7), (1, 4, 4)])
        x, pos = tokens(37, D, seed=4)
        time = np.random.default_rng(5).standard_normal((4, D)).astype(np.float32)  # unused by images
        for mode in P.MODES:
            want = x.astype(np.float64).copy()
            start = 0
            for _, h, w in grid.tolist():
                want[start : start + h * w] += ref.interpolate_pos_grid(pos.astype(np.float64), h, w, mode).reshape(
                    h * w, D
                )
                start += h * w
            got = P.add_position_embedding(x.copy(), pos, time, launch.item_table(grid), mode=mode, threads=32)
            rtol, atol = pos_emb_tolerance(pos, mode)
            assert_close(got.copy_to_host(), want, rtol=rtol, atol=atol, name=f"D=33 {mode}")

    def test_item_table_layout(self):
        table = launch.item_table([(1, 4, 6), (3, 2, 2)], merge_kernel_size=(2, 2))
        assert table.dtype == np.int32 and table.flags.c_contiguous
        assert table.tolist() == [[1, 4, 6, 0, 0], [3, 2, 2, 24, 6]]
        assert launch.item_table([(1, 4, 6), (3, 2, 2)]).shape == (2, 4)
        with pytest.raises(ValueError, match="divisible"):
            launch.item_table([(1, 3, 6)], merge_kernel_size=(2, 2))
        with pytest.raises(ValueError, match=">= 1"):
            launch.item_table([(0, 4, 6)])

    def test_launcher_rejects_bad_arguments(self):
        grid = np.array([(1, 4, 2), (2, 4, 2)])
        x, pos = tokens(24, 32, seed=6)
        time = P.time_table(32, 4)
        items = launch.item_table(grid)
        bad_offsets = items.copy()
        bad_offsets[1, 3] = 7
        cases = [
            (dict(x=x.astype(np.float64)), "x: dtype float64"),
            (dict(pos_weight=pos[:, :, :31].copy()), r"pos_weight: shape \(6, 5, 31\) does not match"),
            (dict(pos_weight=pos[0]), "pos_weight: shape .* has 2 dimensions"),
            (dict(time=time[:, :16].copy()), "time: shape"),
            (dict(items=items.astype(np.int64)), "items: dtype int64"),
            (dict(items=items[:, :3].copy()), "items: shape"),
            (dict(items=np.asfortranarray(items)), "items: array is not C-contiguous"),
            (dict(x=x[:, ::2]), "x: array is not C-contiguous"),
            (dict(pos_weight=launch.to_device(pos)[:, ::2]), "pos_weight: .*C-contiguous"),
            (dict(x=x[:20].copy()), "items cover 24 tokens but x holds L = 20"),
            (dict(items=bad_offsets), "token offsets"),
            (dict(items=launch.item_table([(5, 4, 1), (1, 4, 1)])), "t = 5 frames exceeds"),
            (dict(mode="nearest"), "mode 'nearest'"),
        ]
        for changes, message in cases:
            kwargs = dict(x=x.copy(), pos_weight=pos, time=time, items=items) | changes
            with pytest.raises(ValueError, match=message):
                P.add_position_embedding(**kwargs)


# ============================================================================
# CUDA C kernel on the CPU emulator, through the real launchers
class TestCudaEmulator:
    pytestmark = EMULATOR

    @pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
    def test_pos_emb(self, k, mode):
        # the learned grid is H0 x W0 = 6 x 5 (non-square: a row stride taken from the height, or swapped axes,
        # would read the wrong patch); 6x5 is the grid's own size (identity), the others interpolate; t = 3 and 2
        # are videos
        h0, w0 = non_square(H0, W0)
        config = VisionConfig.tiny().replace(
            pos_emb_interpolation_mode=mode, init_pos_emb_height=h0, init_pos_emb_width=w0
        )
        check_pos_emb(k, config, np.array([[1, h0, w0], [3, 4, 8], [1, 10, 4], [2, 2, 12]]))

    @pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
    def test_k3_sized_learned_grid(self, k, mode):
        """The learned grid as large as K3's (64 x 60): the source coordinate's rounding at its far end is inside
        the tolerance (on a GPU the compiler fuses it into an FMA; `checks.pos_emb_tolerance`)."""
        check_pos_emb(k, K3_SIZED.replace(pos_emb_interpolation_mode=mode), np.array(K3_SIZED_GRIDS))


# ============================================================================
# compile tier (no GPU): the stage's numba kernels for sm_90, its CUDA C kernels with NVRTC per architecture
class TestCompile:
    pytestmark = [pytest.mark.compile]

    def test_numba_kernels_compile_within_limits(self):
        assert_numba_stage_compiles("pos_emb")

    @pytest.mark.parametrize("arch", cuda_archs("pos_emb"))
    def test_cuda_c_kernels_build_within_limits(self, arch):
        assert_cuda_stage_builds("pos_emb", arch)


# ============================================================================
# GPU (CuPy launchers and numba kernels at real sizes; skipped without a GPU)
class TestGpu:
    pytestmark = [pytest.mark.gpu]

    @pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
    @pytest.mark.parametrize("config", [VisionConfig.tiny(), K3], ids=["tiny", "k3"])
    def test_pos_emb(self, k, config, mode):
        H0, W0 = config.init_pos_emb_height, config.init_pos_emb_width
        grid = np.array([[1, H0, W0], [3, 4, 8], [1, 10, 4], [2, 2 * H0 // 3 * 2, W0 + 4]])
        check_pos_emb(k, config.replace(pos_emb_interpolation_mode=mode), grid)

    @pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
    def test_pos_emb_real_size(self, mode):
        cfg = K3.replace(pos_emb_interpolation_mode=mode)
        pos, x = gpu_rand(64, 64, 1024, scale=0.5), gpu_rand(GPU_L, 1024)
        time = P.time_table(1024, cfg.init_pos_emb_time)
        got = P.add_position_embedding(x.copy(), pos, time, item_table(GPU_GRID), mode=mode).copy_to_host()
        want = ref.add_position_embedding(x.astype(np.float64), GPU_GRID, pos.astype(np.float64), cfg)
        rtol, atol = pos_emb_tolerance(pos, mode)
        assert_close(got, want, rtol=rtol, atol=atol, name=f"pos_emb {mode}")
