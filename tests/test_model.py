"""MoonViT: backend choice, clear errors for backends that cannot run, the layer callback."""

import numpy as np
import pytest
from helpers import random_pixels

from moonvit_kernels import reference as ref
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.device import gpu_available
from moonvit_kernels.model import MoonViT, resolve_backend
from moonvit_kernels.weights import random_weights

CFG = VisionConfig.tiny()
GRID = np.array([[1, 2, 4], [2, 2, 2]])


def test_auto_backend_without_gpu_is_numpy():
    if gpu_available():
        pytest.skip("a GPU is present: auto may pick cupy")
    assert resolve_backend("auto") == "numpy"
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        MoonViT(CFG, random_weights(CFG, 0), backend="cupy")


def test_unknown_backend_and_dtype():
    w = random_weights(CFG, 0)
    with pytest.raises(ValueError, match="unknown backend 'jax'"):
        MoonViT(CFG, w, backend="jax")
    with pytest.raises(ValueError, match="float32 or float64"):
        MoonViT(CFG, w, backend="numpy", dtype="bfloat16")
    del w["mm_projector.post_norm.weight"]
    with pytest.raises(KeyError, match="post_norm"):
        MoonViT(CFG, w, backend="numpy")


def test_numpy_backend_equals_reference_and_reports_layers():
    w = random_weights(CFG, 3)
    pv = random_pixels(GRID, CFG.patch_size, seed=4)
    seen = []
    out = MoonViT(CFG, w, backend="numpy")(pv, GRID, on_layer=seen.append)
    assert seen == list(range(CFG.vt_num_hidden_layers))
    for a, b in zip(out, ref.vision_forward(pv, GRID, w, CFG), strict=True):
        np.testing.assert_array_equal(a, b)
