"""Patch-merge gather kernel (mean over frames, kh x kw gather into [M, kh·kw·D]) vs the NumPy reference."""

import numpy as np
import pytest
from helpers import assert_close

from moonvit_kernels import reference
from moonvit_kernels.numba_backend import launch
from moonvit_kernels.numba_backend import merge as Mg

D = 9  # odd width


def case(grid, seed):
    grid = np.array(grid)
    L = int(np.prod(grid, axis=1).sum())
    x = np.random.default_rng(seed).standard_normal((L, D)).astype(np.float32)
    return grid, x


def expected(x, grid, kernel_size):
    parts = reference.tpool_patch_merger(x.astype(np.float64), grid, kernel_size)
    return np.concatenate([p.reshape(p.shape[0], -1) for p in parts], axis=0)


# an image and a video (frames averaged); a non-square merge kernel so that swapped a/b or i/j fail
@pytest.mark.parametrize(
    "grid,kernel_size",
    [([(1, 4, 6), (3, 2, 4)], (2, 2)), ([(1, 4, 6), (2, 2, 3)], (2, 3)), ([(4, 2, 2)], (1, 2))],
)
def test_merge_gather_matches_reference(grid, kernel_size):
    grid, x = case(grid, seed=len(grid) + kernel_size[1])
    items = launch.item_table(grid, kernel_size)
    got = Mg.merge_gather(launch.to_device(x), items, kernel_size)
    assert launch.is_device_array(got)
    assert_close(got.copy_to_host(), expected(x, grid, kernel_size), rtol=1e-6, atol=1e-6, name=f"merge {kernel_size}")


def test_device_table_and_numpy_out_and_strided_columns():
    grid, x = case([(1, 4, 6), (3, 2, 4)], seed=9)
    items = launch.item_table(grid, (2, 2))
    out = np.full((8, 4 * D), np.nan, np.float32)
    got = Mg.merge_gather(x, launch.to_device(items), (2, 2), m_total=8, out=out, threads=32)
    ref = expected(x, grid, (2, 2))
    assert_close(out, ref, rtol=1e-6, atol=1e-6, name="numpy out")
    assert_close(got.copy_to_host(), ref, rtol=1e-6, atol=1e-6, name="device result")


def test_device_table_without_size_is_read_back():
    grid, x = case([(2, 4, 2), (1, 2, 2)], seed=11)
    got = Mg.merge_gather(launch.to_device(x), launch.to_device(launch.item_table(grid, (2, 2))), (2, 2))
    assert_close(got.copy_to_host(), expected(x, grid, (2, 2)), rtol=1e-6, atol=1e-6, name="merge")


def test_launcher_rejects_bad_arguments():
    grid, x = case([(1, 4, 6), (3, 2, 4)], seed=10)
    items = launch.item_table(grid, (2, 2))
    bad_merged = items.copy()
    bad_merged[1, 4] = 5
    cases = [
        (dict(x=x.astype(np.float64)), "x: dtype float64"),
        (dict(x=x[:, ::2]), "x: array is not C-contiguous"),
        (dict(x=x[:40].copy()), "items cover 48 tokens but x holds L = 40"),
        (dict(items=items[:, :4].copy()), "items: shape"),
        (dict(items=items.astype(np.int64)), "items: dtype int64"),
        (dict(items=bad_merged), "merged offsets"),
        (dict(merge_kernel_size=(2, 4)), "divisible"),
        (dict(merge_kernel_size=(0, 2)), "merge_kernel_size must be a positive integer"),
        (dict(m_total=9), "m_total=9 but items hold 8"),
        (dict(out=np.empty((8, 4 * D), np.float64)), "out: dtype float64"),
        (dict(out=launch.device_array((8, 4 * D + 1))), "out: shape"),
        (dict(items=launch.to_device(bad_merged)), "merged offsets"),
        (dict(out=np.empty((9, 4 * D), np.float32)), "m_total=9 but items hold 8"),
    ]
    for changes, message in cases:
        kwargs = dict(x=x, items=items, merge_kernel_size=(2, 2)) | changes
        with pytest.raises(ValueError, match=message):
            Mg.merge_gather(**kwargs)
