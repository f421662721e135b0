"""What the tier classes of the stage files (tests/stages) share: the emulator tier's marks, and the real K3
sizes the gpu tier's numba tests run at (one image and one video, packed)."""

import numpy as np
import pytest

from moonvit_kernels.config import VisionConfig
from moonvit_kernels.tools import emulation

# class TestCudaEmulator: the `.cu` files built for the CPU by g++ (skipped, with the reason, without one)
EMULATOR = [
    pytest.mark.emulator,
    pytest.mark.skipif(emulation.compiler() is None, reason="no C++ compiler (g++ >= 11) for the CUDA C emulation"),
]

K3 = VisionConfig.k3()
# a 30x46-patch image (interpolated from the 64x64 grid) and a 3-frame 16x12 video: GPU_L = 1956 tokens
GPU_GRID = np.array([[1, 30, 46], [3, 16, 12]])
GPU_L = int(np.sum(np.prod(GPU_GRID, axis=1)))
_GPU_RNG = np.random.default_rng(2026)


def gpu_rand(*shape: int, scale: float = 1.0) -> np.ndarray:
    """float32 normal noise times `scale` plus 0.1, from one generator shared by the gpu tier's tests."""
    return (_GPU_RNG.standard_normal(shape) * scale + 0.1).astype(np.float32)
