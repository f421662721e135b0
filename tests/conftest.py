"""Test set-up: numba's CUDA simulator is switched on before numba is imported when there is no GPU."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from moonvit_kernels.device import gpu_available, use_simulator_without_gpu

SIMULATOR = use_simulator_without_gpu()


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU: cuInit failed or found no device (gpu tier)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
