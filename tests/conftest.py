"""Test set-up: numba's CUDA simulator is switched on before numba is imported when there is no GPU."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from moonvit_kernels.device import gpu_available, use_simulator_without_gpu

SIMULATOR = use_simulator_without_gpu()


# The longest modules run first, so that pytest-xdist (one scope per module or class, handed out in collection
# order) never leaves one worker alone with a long module at the end of the run. Longest first, as measured on
# CI's 2 cores: the simulator forward, the notebook runs, the X-ray report, the Hopper emulator, gpu_check. Not Ray
# (tests/test_dataset.py): its local cluster does not start under the load of the run's first minutes, when CI
# also installs the target tier, and the tests then skip.
LONG_FIRST = (
    "test_backend_numba.py",
    "test_notebooks.py",
    "test_xray.py",
    "test_hopper_emulation.py",
    "test_gpu_check.py",
    "test_cli.py",
    "test_exercises.py",
)


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: LONG_FIRST.index(item.path.name) if item.path.name in LONG_FIRST else len(LONG_FIRST))
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU: cuInit failed or found no device (gpu tier)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
