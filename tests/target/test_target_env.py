"""The target environment: what a CUDA machine's image runs, checked without its GPU.

Run by .ci/target_tier.sh in a Python 3.12 venv holding a CUDA image's package set (numpy 2.5, the
newest numba / numba-cuda, cupy-cuda13x 14, cuda-bindings 13, the CUDA 13.0 NVRTC / nvJitLink / NVVM
wheels a driver-580 machine accepts; no threadpoolctl, jupytext, nbclient, ipykernel, ray). Each test
is a step a first GPU session takes: import, gpu_check's start, the CUDA C and Hopper compiles with
the launchers' own options, the tensor-map encoding up to the driver.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from moonvit_kernels import registry

pytestmark = pytest.mark.target
ROOT = Path(__file__).resolve().parents[2]


def test_the_image_lacks_what_a_cuda_image_lacks():
    for name in ("threadpoolctl", "jupytext", "nbclient", "ray"):
        assert importlib.util.find_spec(name) is None, f"{name} is installed: this is not the target package set"
    assert tuple(int(x) for x in np.__version__.split(".")[:2]) >= (2, 5), np.__version__


def test_the_package_and_gpu_check_import():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = "import moonvit_kernels, moonvit_kernels.gpu_check.run, moonvit_kernels.reference; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


def test_gpu_check_without_a_gpu_says_so_and_writes_nothing_wrong(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, "-m", "moonvit_kernels.gpu_check", "--out", str(tmp_path / "out")],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-3000:]


@pytest.mark.timeout(600)
def test_gpu_check_simulate_quick_runs_from_a_source_tree(tmp_path):
    """The first GPU session's command, on the CPU (--simulate): from the source tree, nothing installed for it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "moonvit_kernels.gpu_check", "--simulate", "--quick", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=580, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    report = (out / "report.md").read_text()
    assert "numpy | 2.5" in report and "0 failed" in r.stdout, r.stdout[-2000:]


def test_the_reference_runs_on_the_bundled_checkpoint():
    from moonvit_kernels import load_checkpoint, vision_forward
    from moonvit_kernels.bundled import TINY_DIR

    config, weights = load_checkpoint(TINY_DIR)
    inputs = np.load(TINY_DIR / "inputs.npz")
    outs = vision_forward(inputs["pixel_values"], inputs["grid_thws"], weights, config)
    assert [o.shape for o in outs] == [(12, 40), (4, 40)] and all(np.isfinite(o).all() for o in outs)


class TestCudaCCompiles:
    """Its own xdist scope: the NVRTC builds run beside gpu_check's simulated run."""

    @pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_90a"])
    def test_every_cuda_c_kernel_compiles_with_the_run_time_options(self, arch):
        """NVRTC 13.0 with `sources.runtime_options` (what the Hopper launcher passes; CuPy adds its own arch
        to the same shared options): every instantiation of the catalogue for `arch`, no spills."""
        from cuda.bindings import nvrtc

        from moonvit_kernels.cuda_backend import nvrtc_check
        from moonvit_kernels.cuda_backend import sources as kcuda

        err, major, minor = nvrtc.nvrtcVersion()
        assert (major, minor) == (13, 0), f"the target tier pins NVRTC 13.0 (driver 580), found {major}.{minor}"
        every = registry.kernel_specs((128, 24)) + registry.hopper_specs((128, 64))
        specs = [s for s in dict.fromkeys(every) if s.builds_for(arch)]
        assert specs
        for source, group in kcuda.specs_by_source(specs).items():
            names = tuple(s.name for s in group)
            cubin, log, lowered = nvrtc_check.compile_text(kcuda.load_source(source), source, names, arch, strict=False)
            assert cubin and set(lowered) == set(names), source
            infos = nvrtc_check.parse_ptxas_log(log)
            for name in names:
                info = infos[lowered[name]]
                assert info.spill_stores == 0 and info.spill_loads == 0, (source, name, info)


def test_tensor_maps_reach_the_driver_or_say_it_is_absent():
    from moonvit_kernels.cuda_backend import tensor_maps
    from moonvit_kernels.cuda_backend.emulation import compiler, device, hopper

    m = tensor_maps.gemm_operand_map(300, 72)
    try:
        tensor_maps.driver_encoder()
    except RuntimeError as e:
        assert "CUDA driver (libcuda.so.1)" in str(e)
    if compiler() is not None:  # the same call, its last step the emulator's model of the driver's entry point
        g = device.empty(300 * 72, np.uint16)
        assert tensor_maps.encode(m, g.data.ptr, hopper.encode_tiled_driver()).size == 16


def test_the_toolchain_versions_are_read():
    from moonvit_kernels.cuda_backend import toolchain

    v = toolchain.toolchain_versions()
    assert v["nvrtc"] == (13, 0) and v["nvjitlink"] == (13, 0), v
