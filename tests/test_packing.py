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


# ---------------------------------------------------------------------------- a validated, packed batch
def test_pack_holds_every_table_once_and_checks_the_model_limits():
    from moonvit_kernels.config import VisionConfig

    cfg = VisionConfig.tiny()
    grid = [(1, 4, 6), (2, 2, 4)]
    batch = packing.pack(grid, cfg)
    assert batch.grid.dtype == np.int64 and batch.grid.tolist() == [list(g) for g in grid]
    assert batch.tokens == 24 + 16
    np.testing.assert_array_equal(batch.cu_seqlens, packing.cu_seqlens(grid))
    np.testing.assert_array_equal(batch.token_positions, packing.token_positions(grid))
    np.testing.assert_array_equal(batch.item_table, packing.item_table(grid))
    np.testing.assert_array_equal(batch.merge_item_table, packing.item_table(grid, cfg.merge_kernel_size))
    np.testing.assert_array_equal(batch.merge_sources, packing.merge_sources(grid, cfg.merge_kernel_size))
    assert batch.merged_sizes == (6, 2)
    assert packing.as_batch(batch, cfg) is batch  # packed for these limits: not validated again
    with pytest.raises(ValueError, match=r"grid_thws\[0\] = \(1, 4, 6\): h must be divisible by 3"):
        packing.as_batch(batch, cfg.replace(merge_kernel_size=(3, 2)))  # other limits: checked again
    with pytest.raises(ValueError, match="exceeds init_pos_emb_time=1"):
        packing.validate_grid_thws(batch, cfg.replace(init_pos_emb_time=1))
    for bad, match in (([(1, 3, 4)], "h must be divisible by 2"), ([[1, 2]], r"not \[N, 3\]"), ([(0, 2, 2)], ">= 1")):
        with pytest.raises(ValueError, match=match):
            packing.pack(bad, cfg)


def test_moonvit_validates_and_packs_once_and_the_backend_takes_the_batch(monkeypatch):
    from moonvit_kernels.bundled import TINY_DIR
    from moonvit_kernels.model import MoonViT
    from moonvit_kernels.reference import vision_forward
    from moonvit_kernels.weights import load_checkpoint

    config, weights = load_checkpoint(TINY_DIR)
    inputs = np.load(TINY_DIR / "inputs.npz")
    calls = []
    real_pack = packing.pack
    monkeypatch.setattr(packing, "pack", lambda *a, **k: calls.append(a) or real_pack(*a, **k))
    model = MoonViT(config, weights, backend="numpy")
    seen = []
    real_forward = model.backend.forward
    monkeypatch.setattr(model.backend, "forward", lambda pv, g, **k: seen.append(g) or real_forward(pv, g, **k))
    outputs = model(inputs["pixel_values"], inputs["grid_thws"])
    assert len(calls) == 1 and isinstance(seen[0], packing.PackedBatch)
    want = vision_forward(inputs["pixel_values"], inputs["grid_thws"], weights, config)
    for got, w in zip(outputs, want, strict=True):
        np.testing.assert_array_equal(got, w)
