"""Position-embedding kernel (interpolated grid + video time term, in place, packed items) vs the NumPy reference."""

import numpy as np
import pytest
from helpers import assert_close

from moonvit_kernels import reference
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.numba_backend import launch
from moonvit_kernels.numba_backend import pos_emb as P

H0, W0 = 6, 5  # a non-square learned grid, so swapped axes fail

# image upsampled rows / downsampled columns + video with the opposite; identity image + one identity axis
GRIDS = {
    "resized": [(1, 8, 4), (3, 4, 6)],
    "same_size": [(1, H0, W0), (2, H0, 2)],
}


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


@pytest.mark.parametrize("mode", P.MODES)
@pytest.mark.parametrize("grids", GRIDS.keys())
def test_add_position_embedding_matches_reference(mode, grids):
    cfg = config(mode)
    grid = np.array(GRIDS[grids])
    L = int(np.prod(grid, axis=1).sum())
    x, pos = tokens(L, cfg.vt_hidden_size, seed=len(grids))
    time = P.time_table(cfg.vt_hidden_size, cfg.init_pos_emb_time)
    ref = reference.add_position_embedding(x.astype(np.float64), grid, pos.astype(np.float64), cfg)

    x_d = launch.to_device(x)
    got = P.add_position_embedding(x_d, pos, time, launch.item_table(grid), mode=mode)
    assert got is x_d
    assert_close(x_d.copy_to_host(), ref, rtol=1e-5, atol=2e-6, name=f"{mode} {grids}")


def test_time_term_only_for_videos():
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


def test_odd_width_and_strided_columns():
    """D = 33 with 32 threads per block: one thread handles two columns (images only: D odd has no time table)."""
    D = 33
    grid = np.array([(1, 3, 7), (1, 4, 4)])
    x, pos = tokens(37, D, seed=4)
    time = np.random.default_rng(5).standard_normal((4, D)).astype(np.float32)  # unused by images
    for mode in P.MODES:
        ref = x.astype(np.float64).copy()
        start = 0
        for _, h, w in grid.tolist():
            ref[start : start + h * w] += reference.interpolate_pos_grid(pos.astype(np.float64), h, w, mode).reshape(
                h * w, D
            )
            start += h * w
        got = P.add_position_embedding(x.copy(), pos, time, launch.item_table(grid), mode=mode, threads=32)
        assert_close(got.copy_to_host(), ref, rtol=1e-5, atol=2e-6, name=f"D=33 {mode}")


def test_item_table_layout():
    table = launch.item_table([(1, 4, 6), (3, 2, 2)], merge_kernel_size=(2, 2))
    assert table.dtype == np.int32 and table.flags.c_contiguous
    assert table.tolist() == [[1, 4, 6, 0, 0], [3, 2, 2, 24, 6]]
    assert launch.item_table([(1, 4, 6), (3, 2, 2)]).shape == (2, 4)
    with pytest.raises(ValueError, match="divisible"):
        launch.item_table([(1, 3, 6)], merge_kernel_size=(2, 2))
    with pytest.raises(ValueError, match=">= 1"):
        launch.item_table([(0, 4, 6)])


def test_launcher_rejects_bad_arguments():
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
