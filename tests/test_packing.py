"""The packing tables, computed one way (`moonvit_kernels.packing`) and checked here a second way."""

from __future__ import annotations

import numpy as np
import pytest

from moonvit_kernels import packing

GRID = [(2, 4, 6), (1, 2, 2), (3, 6, 4)]  # a video, an image, a video; h != w


def test_cu_seqlens_and_token_positions_enumerate_every_token():
    cu = packing.cu_seqlens(GRID)
    assert cu.dtype == np.int32 and cu.tolist() == [0, 48, 52, 124]
    pos = packing.token_positions(GRID)
    want = [(i, f, r, c) for i, (t, h, w) in enumerate(GRID) for f in range(t) for r in range(h) for c in range(w)]
    assert pos.tolist() == [list(x) for x in want]


def test_merge_sources_name_the_tokens_of_each_window():
    kh, kw = 2, 2
    src = packing.merge_sources(GRID, (kh, kw))
    cu = packing.cu_seqlens(GRID)
    rows = []
    for i, (t, h, w) in enumerate(GRID):
        for a in range(h // kh):
            for b in range(w // kw):
                rows.append((int(cu[i]) + kh * a * w + kw * b, t, h * w, w))
    assert src.tolist() == [list(r) for r in rows]
    items = packing.item_table(GRID, (kh, kw))
    assert items[:, packing.ITEM_MERGED_OFFSET].tolist() == [0, 6, 7]


@pytest.mark.parametrize(
    "grid, match",
    [
        ([(1, 0, 2)], ">= 1"),
        ([(1, 2)], r"not \[N, 3\]"),
        ([(1.0, 2.0, 2.0)], "integer"),
        ([(1, 65536, 65536)], "int32"),
    ],
)
def test_bad_grids_are_named(grid, match):
    with pytest.raises(ValueError, match=match):
        packing.cu_seqlens(np.asarray(grid))


def test_merge_needs_divisible_grids():
    with pytest.raises(ValueError, match=r"grid_thws\[0\] = \(1, 3, 4\)"):
        packing.merge_sources([(1, 3, 4)], (2, 2))
