"""The target environment: what the GPU machine's image runs, checked without its GPU.

Run by .ci/target_tier.sh in a Python 3.12 venv holding the image's package set and nothing it lacks
(.ci/target_requirements.txt: numpy 2.5, numba 0.68, numba-cuda 0.30, cupy-cuda13x 14.2, cuda-bindings 13, the
CUDA 13.0 NVRTC / nvJitLink / runtime; no nvidia-nvvm, cccl, numba-cuda-mlir, jupyter or ray), with this machine's
own NVVM hidden. Each test is a step a first GPU session takes: import, gpu_check's start, the whole
`gpu_check --simulate --quick` in the three NVVM situations a GPU session can meet (the prepared 13.0 it brings,
none at all, one newer than nvJitLink), the CUDA C and Hopper compiles with the launchers' own options, the
tensor-map encoding up to the driver.
"""

from __future__ import annotations

import importlib.metadata
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
CI_NVVM = os.environ.get("MOONVIT_CI_NVVM", "")
# pulled in by newer releases of the image's packages than the image holds (python-dateutil -> tzdata)
TRANSITIVE = {"tzdata"}


def image_packages() -> set[str]:
    text = (ROOT / ".ci" / "target_image.txt").read_text()
    return {w.lower() for line in text.splitlines() if not line.startswith("#") for w in line.split()}


def _name(dist: importlib.metadata.Distribution) -> str:
    return dist.metadata["Name"].lower().replace("_", "-")


def test_the_venv_holds_the_images_packages_and_nothing_else():
    # (a clone's own metadata, egg-info of the main venv's editable install, lies in the source tree: not installed)
    installed = {_name(d) for d in importlib.metadata.distributions() if Path(d.locate_file("")).resolve() != ROOT}
    assert "moonvit-kernels" not in installed, "the GPU session runs the source tree (PYTHONPATH), nothing installed"
    extra = sorted(installed - image_packages() - TRANSITIVE)
    assert not extra, f"installed here but not on the GPU image: {extra}"
    for name in ("nvidia-nvvm", "nvidia-cuda-cccl", "numba-cuda-mlir", "jupytext", "nbclient", "ray"):
        assert name not in installed, f"{name} is installed: this is not the image's package set"
    assert tuple(int(x) for x in np.__version__.split(".")[:2]) >= (2, 5), np.__version__


def test_the_package_and_gpu_check_import():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = "import moonvit_kernels, moonvit_kernels.tools.gpu_check.run, moonvit_kernels.reference; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


def test_gpu_check_without_a_gpu_says_so_and_writes_nothing_wrong(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, "-m", "moonvit_kernels.gpu_check", "--out", str(tmp_path / "out")],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-3000:]


def simulate_quick(tmp_path: Path, toolchain: str, *only: str) -> tuple[subprocess.CompletedProcess, Path, str]:
    """README's first-run command with --simulate --quick (and `only`: more options), from the source tree (nothing
    of it installed), with `toolchain` as the prepared NVVM folder (MOONVIT_GPU_TOOLCHAIN) and the compile cache
    off."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MOONVIT_GPU_TOOLCHAIN": toolchain, "MOONVIT_COMPILE_CACHE": "off"}
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "moonvit_kernels.gpu_check", "--simulate", "--quick", *only, "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=580, cwd=tmp_path,
    )  # fmt: skip
    return r, out, (out / "report.md").read_text() if (out / "report.md").is_file() else ""


def problems(report: str) -> list[str]:
    """The verdict lines that are not pass or skip."""
    verdicts = report.split("## (d) Verdicts", 1)[-1].splitlines()
    return [v for v in verdicts if v.startswith("- **") and v.split("**")[1] not in ("pass", "skip")]


@pytest.mark.timeout(600)
def test_gpu_check_simulate_quick_with_the_prepared_nvvm_passes_whole(tmp_path):
    """What the GPU session brings (gpu_toolchain/ of NVVM 13.0): every item passes, the numba build included."""
    r, out, report = simulate_quick(tmp_path, os.path.join(CI_NVVM, "13.0"))
    assert r.returncode == 0 and not problems(report), (problems(report), r.stdout[-2000:], r.stderr[-2000:])
    assert "numpy | 2.5" in report and "0 failed" in r.stdout, r.stdout[-2000:]
    assert "NVVM prepared" in report and "PTX ISA 9.0" in report, report[-3000:]
    diag = (out / "diagnostics.md").read_text()
    assert "CuPy RawModule gemm_bf16.cu" in diag and "built:" in diag and "not rehearsed" not in diag


class TestNvvmMissingOrTooNew:
    """The two NVVM situations that stop numba on a GPU: the report is written, the numba build is one clear line
    naming what is missing and the wheel and version that fix it, and everything else passes."""

    @staticmethod
    def only_the_numba_build_fails(r: subprocess.CompletedProcess, report: str) -> str:
        found = problems(report)
        assert report and found, (r.stdout[-2000:], r.stderr[-2000:])
        assert all("numba GPU build" in line for line in found), found
        assert "nvidia-nvvm==13.0.*" in found[0] and "scripts/prepare_nvvm.py" in found[0], found[0]
        return found[0]

    @pytest.mark.timeout(600)
    def test_no_nvvm_at_all(self, tmp_path):
        if os.environ.get("MOONVIT_SYSTEM_NVVM_VISIBLE"):
            pytest.skip(f"this machine's NVVM could not be hidden ({os.environ['MOONVIT_SYSTEM_NVVM_VISIBLE']})")
        r, _, report = simulate_quick(tmp_path, str(tmp_path / "no-toolchain"))
        line = self.only_the_numba_build_fails(r, report)
        assert "no NVVM (libnvvm) here" in line, line

    @pytest.mark.timeout(600)
    def test_an_nvvm_newer_than_nvjitlink(self, tmp_path):
        """The numba family only: the rest of the run does not read NVVM, and test_no_nvvm_at_all runs it whole."""
        newest = os.path.join(CI_NVVM, "newest")
        r, _, report = simulate_quick(tmp_path, newest, "--sections", "kernels", "--backends", "numba")
        line = self.only_the_numba_build_fails(r, report)
        assert "which nvJitLink 13.0 cannot link" in line and "PTX ISA 9." in line, line


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

        from moonvit_kernels.cuda_backend import sources as kcuda
        from moonvit_kernels.tools import nvrtc_check

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
    from moonvit_kernels.tools.emulation import compiler, device, hopper

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
    assert v["nvrtc"] == (13, 0) and v["nvjitlink"] == (13, 0) and v["nvvm"] is None, v  # the image has no NVVM
