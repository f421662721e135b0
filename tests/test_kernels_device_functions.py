"""The shared inline device functions (block tree reduction, token -> item lookup), run in small kernels
under the simulator and compared with NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import rng

from moonvit_kernels.numba_backend import launch
from moonvit_kernels.numba_backend._cuda import cuda, float32
from moonvit_kernels.numba_backend.device_functions import REDUCE_MAX, REDUCE_SUM, block_reduce, find_item

THREADS = 32


@cuda.jit
def _reduce_kernel(x, out):
    buf = cuda.shared.array(THREADS, float32)
    v = x[cuda.blockIdx.x, cuda.threadIdx.x]
    s = block_reduce(buf, v, REDUCE_SUM)
    m = block_reduce(buf, v, REDUCE_MAX)  # buf reused at once: the first call's last sync allows it
    if cuda.threadIdx.x == 0:
        out[cuda.blockIdx.x, 0] = s
        out[cuda.blockIdx.x, 1] = m


@cuda.jit
def _find_kernel(items, col, n_items, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = find_item(items[:, col], n_items, i)


@cuda.jit
def _find_1d_kernel(offsets, n_items, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = find_item(offsets, n_items, i)


def test_block_reduce_sum_and_max_match_numpy():
    x = (rng(3).standard_normal((3, THREADS)) * 5 - 2).astype(np.float32)
    out = np.zeros((3, 2), np.float32)
    _reduce_kernel[3, THREADS](x, out)
    np.testing.assert_allclose(out[:, 0], x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[:, 1], x.max(axis=1))


def test_block_reduce_propagates_nan():
    x = rng(4).standard_normal((1, THREADS)).astype(np.float32)
    x[0, 7] = np.nan
    out = np.zeros((1, 2), np.float32)
    _reduce_kernel[1, THREADS](x, out)
    assert np.isnan(out[0, 0])


@pytest.mark.parametrize("merged", [False, True])
def test_find_item_matches_searchsorted_for_many_items(merged):
    grid = [(1, 2, 4), (2, 2, 2), (1, 4, 2), (3, 2, 6), (1, 2, 2), (1, 6, 4), (2, 4, 4)]  # 7 items, odd sizes
    items = launch.item_table(grid, (2, 2))
    col = launch.ITEM_MERGED_OFFSET if merged else launch.ITEM_TOKEN_OFFSET
    total = int(items[-1, col]) + (
        (grid[-1][1] // 2) * (grid[-1][2] // 2) if merged else grid[-1][0] * grid[-1][1] * grid[-1][2]
    )
    out = np.full(total, -7, np.int32)
    _find_kernel[1, 128](items, np.int32(col), np.int32(len(grid)), out)
    want = np.searchsorted(items[:, col], np.arange(total), side="right") - 1
    np.testing.assert_array_equal(out, want)
    assert set(out.tolist()) == set(range(len(grid)))


def test_find_item_before_the_first_item_is_minus_one():
    items = np.array([[1, 1, 1, 3], [1, 1, 2, 4]], np.int32)
    out = np.zeros(6, np.int32)
    _find_kernel[1, 8](items, np.int32(launch.ITEM_TOKEN_OFFSET), np.int32(2), out)
    np.testing.assert_array_equal(out, [-1, -1, -1, 0, 1, 1])


def test_find_item_on_cu_seqlens_skips_empty_items():
    """cu_seqlens may hold empty items (attention accepts them): the token goes to the non-empty item."""
    cu = np.array([0, 3, 3, 5, 5, 5, 9], np.int32)  # items 1, 3 and 4 are empty
    out = np.full(9, -7, np.int32)
    _find_1d_kernel[1, 16](cu, np.int32(cu.shape[0] - 1), out)
    np.testing.assert_array_equal(out, [0, 0, 0, 2, 2, 5, 5, 5, 5])
