"""The stage-by-stage comparison finds the first stage a port gets wrong."""

import numpy as np
import pytest
from helpers import random_pixels

from moonvit_kernels import reference as ref
from moonvit_kernels.compare import compare_backends, compare_stages, tolerance_for
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.model import MoonViT
from moonvit_kernels.weights import random_weights

CFG = VisionConfig.tiny()
GRID = np.array([[1, 4, 6], [3, 2, 2]])


@pytest.fixture(scope="module")
def stages():
    w = random_weights(CFG, 1)
    pv = random_pixels(GRID, CFG.patch_size, seed=2)
    _, s64 = ref.vision_forward(pv, GRID, w, CFG, dtype=np.float64, return_intermediates=True)
    _, s32 = ref.vision_forward(pv, GRID, w, CFG, dtype=np.float32, return_intermediates=True)
    return s32, s64


def test_float32_matches_float64_at_every_stage(stages):
    s32, s64 = stages
    report = compare_stages(s32, s64)
    assert report.ok, report.table()
    assert [r.stage for r in report.rows] == list(s64)
    assert "all stages within tolerance" in report.table()


def test_first_divergence_is_named(stages):
    s32, s64 = stages
    broken = dict(s32)
    broken["layer_1"] = s32["layer_1"].copy()
    broken["layer_1"][3, 5] += 0.5
    report = compare_stages(broken, s64)
    assert report.first_divergence == "layer_1"
    assert "first divergence: layer_1" in report.table()


def test_nan_diverges(stages):
    s32, s64 = stages
    broken = dict(s32)
    broken["merged"] = s32["merged"].copy()
    broken["merged"][0, 0] = np.nan
    assert compare_stages(broken, s64).first_divergence == "merged"


def test_missing_or_misshaped_stage_is_an_error(stages):
    s32, s64 = stages
    with pytest.raises(ValueError, match="no stage 'final_norm'"):
        compare_stages({k: v for k, v in s32.items() if k != "final_norm"}, s64)
    with pytest.raises(ValueError, match="stage 'pos_emb'.*shape"):
        compare_stages({**s32, "pos_emb": s32["pos_emb"][:-1]}, s64)
    with pytest.raises(ValueError, match="no tolerance"):
        tolerance_for("int8")


def test_compare_backends_numpy_float32_vs_float64():
    w = random_weights(CFG, 4)
    pv = random_pixels(GRID, CFG.patch_size, seed=5)
    report = compare_backends(
        MoonViT(CFG, w, backend="numpy"), MoonViT(CFG, w, backend="numpy", dtype="float64"), pv, GRID
    )
    assert report.ok, report.table()
    assert report.candidate == "numpy"
