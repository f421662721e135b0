"""The launcher module `k` a stage's CUDA C checks (tests/cuda_kernel_checks.py) run through, chosen by the
test class's tier: the same launchers on the emulated device from NumPy (`emulation.OnEmulator`) for
`TestCudaEmulator` (marker `emulator`), CuPy on this machine's GPU for `TestGpu` (marker `gpu`)."""

import pytest


@pytest.fixture(scope="class")
def k(request):
    if request.node.get_closest_marker("emulator") is not None:
        from moonvit_kernels.cuda_backend import launchers
        from moonvit_kernels.tools import emulation

        emulation.library()  # built once, cached per user by source hash (private_dirs)
        return emulation.OnEmulator(launchers)
    if request.node.get_closest_marker("gpu") is not None:
        pytest.importorskip("cupy", reason="CuPy not installed (pip install -e '.[cuda13]')")
        from moonvit_kernels.cuda_backend import launchers

        return launchers
    raise pytest.UsageError(f"{request.node.nodeid}: `k` is for the emulator and gpu tiers' classes")
