"""The bundled golden values (`data/golden_tiny/`, written by
`python -m moonvit_kernels golden --weights data/tiny --out data/golden_tiny --float64`) are reproduced by
today's reference.

A regression guard: any change to the reference's numerics, to the tiny checkpoint or to the
inputs shows up here first. Regenerate the folder with that command when a change is intended (with
`--overwrite` when the checkpoint or the inputs changed: the folder's provenance.json records them).
"""

import numpy as np
import pytest
from helpers import assert_close

from moonvit_kernels import reference as ref
from moonvit_kernels.bundled import GOLDEN_DIR, TINY_DIR
from moonvit_kernels.weights import load_checkpoint

GOLDEN = GOLDEN_DIR


@pytest.fixture(scope="module")
def golden():
    config, weights = load_checkpoint(TINY_DIR)
    inputs = np.load(GOLDEN / "inputs.npz")
    return config, weights, inputs["pixel_values"], inputs["grid_thws"]


def test_inputs_are_the_bundled_inputs(golden):
    _, _, pv, grid = golden
    bundled = np.load(TINY_DIR / "inputs.npz")
    np.testing.assert_array_equal(pv, bundled["pixel_values"])
    np.testing.assert_array_equal(grid, bundled["grid_thws"])


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-10), (np.float32, 2e-5)])
def test_reference_reproduces_golden_stages(golden, dtype, rtol):
    config, weights, pv, grid = golden
    stored = np.load(GOLDEN / f"stages_{np.dtype(dtype).name}.npz")
    outputs, stages = ref.vision_forward(pv, grid, weights, config, dtype=dtype, return_intermediates=True)
    for i, out in enumerate(outputs):
        stages[f"output_{i}"] = out
    assert sorted(stored.files) == sorted(stages)
    for name in stored.files:
        scale = float(np.abs(stored[name]).max())
        assert_close(stages[name], stored[name], rtol=rtol, atol=rtol * scale, name=name)


def test_extras_match_reference(golden):
    config, weights, _, grid = golden
    extras = np.load(GOLDEN / "extras.npz")
    np.testing.assert_array_equal(extras["cu_seqlens"], ref.cu_seqlens(grid))
    assert_close(extras["rope_angles"], ref.rope_angles_packed(grid, config.head_dim), 1e-6, 1e-6, "rope_angles")
    pos = weights["vision_tower.patch_embed.pos_emb.weight"]
    assert_close(extras["position_term"], ref.position_embedding(grid, pos, config), 1e-6, 1e-6, "position_term")


def test_the_bundled_folder_is_what_its_provenance_says():
    from moonvit_kernels.golden import check_golden
    from moonvit_kernels.weights import checkpoint_digest

    record = check_golden(GOLDEN)
    assert record["made_with"]["checkpoint"] == checkpoint_digest(TINY_DIR)
