"""Target-environment tier, numba side: the package set of a CUDA image (Python 3.12, numpy 2.5, the newest
numba / numba-cuda, CUDA 13 wheels) and, where installed, numba-cuda-mlir. Without a GPU:

- the package and its numba backend import with the CUDA simulator off;
- numba-cuda compiles on numpy 2.5 through `_cuda`'s scoped `np.row_stack` shim (upstream issue 907), and the
  shim is still needed (when it is not, this says so: remove it);
- `compile_check` builds every numba kernel for sm_80 and sm_90 with each installed compiler, with no spills,
  registers within each compiler's table (`registers.py`), PTX a CUDA 13.0 driver loads (ISA <= 9.0), and,
  where nvdisasm is installed, hot loops within their SASS budgets;
- one kernel source (merge_gather, which calls find_item) builds with both compilers and runs on the simulator.

Run by .ci/target_tier.sh in the target venv (tests/target/conftest.py keeps this folder out of the main
suite, whose compile tier already covers numba-cuda); skips say what is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from helpers import row_stack_probe

from moonvit_kernels.numba_backend.compilers import NUMBA_CUDA, NUMBA_CUDA_MLIR, installed, version
from moonvit_kernels.tools.compile_check import KernelReport, format_table, parse_arch, register_table_problems

pytestmark = pytest.mark.target

ARCHES = ("sm_80", "sm_90")
MLIR_MISSING = "numba-cuda-mlir not installed (pip install 'numba-cuda-mlir[cu13]>=0.6', the `mlir` extra)"


def _python(code: str, simulator: bool = False, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter, with the CUDA simulator on or off."""
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_ENABLE_CUDASIM", "MOONVIT_NUMBA_COMPILER")}
    if simulator:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=timeout
    )


def _last_json(r: subprocess.CompletedProcess) -> object:
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _nvdisasm() -> bool:
    from moonvit_kernels.tools.xray.sass import nvdisasm_path

    return nvdisasm_path() is not None


@pytest.fixture(scope="module")
def reports() -> dict[str, list[KernelReport]]:
    """`compile_check --compiler each --json [--sass]` per architecture: every kernel, every installed compiler."""
    out = {}
    for arch in ARCHES:
        args = ["--arch", arch, "--compiler", "each", "--json", *(["--sass"] if _nvdisasm() else [])]
        r = _python(f"from moonvit_kernels.tools.compile_check import main; main({args!r})", timeout=900)
        try:
            out[arch] = [KernelReport.from_dict(d) for d in json.loads(r.stdout)]
        except json.JSONDecodeError:
            pytest.fail(f"compile_check {arch} printed no JSON (exit {r.returncode}):\n{r.stderr[-4000:]}")
    return out


def test_package_and_numba_backend_import_without_the_simulator():
    versions = _last_json(
        _python(
            """
            import json, importlib.metadata as md
            import moonvit_kernels, moonvit_kernels.numba_backend
            from moonvit_kernels.numba_backend import _cuda, backend
            names = ["numpy", "numba", "numba-cuda", "numba-cuda-mlir", "nvidia-nvvm", "nvidia-nvjitlink"]
            found = {}
            for name in names:
                try:
                    found[name] = md.version(name)
                except md.PackageNotFoundError:
                    found[name] = None
            print(json.dumps({"compiler": _cuda.compiler_label(), **found}))
            """
        )
    )
    print(f"\ntarget environment: Python {sys.version.split()[0]}, {versions}")
    assert versions["compiler"] == f"numba-cuda {version(NUMBA_CUDA)}"  # the default: mlir is opt-in


def test_numba_cuda_compiles_on_numpy_25_through_the_row_stack_shim():
    import numpy as np

    if tuple(int(p) for p in np.__version__.split(".")[:2]) < (2, 5):
        pytest.skip(f"numpy {np.__version__} still has row_stack (the main suite simulates numpy 2.5)")
    unshimmed, _, ok, error, row_stack_left = row_stack_probe()
    assert "row_stack" in unshimmed, (
        f"numba-cuda {version(NUMBA_CUDA)} imports its arrayobj on numpy 2.5 without the shim ({unshimmed}): "
        "remove import_numba_cuda_arrayobj from numba_backend/_cuda.py"
    )
    assert ok and error is None and not row_stack_left


@pytest.mark.parametrize("arch", ARCHES)
def test_every_kernel_compiles_with_each_compiler(reports, arch):
    """No spills, registers within the kernel's limit and its compiler's table, SASS budgets (with nvdisasm);
    both compilers build the same kernels."""
    built = reports[arch]
    compilers = [c for c in (NUMBA_CUDA, NUMBA_CUDA_MLIR) if installed(c)]
    by_compiler = {c: [r for r in built if r.compiler == c] for c in compilers}
    for compiler, found in by_compiler.items():
        print(f"\n{compiler} {version(compiler)}, {arch}:\n" + format_table(found, parse_arch(arch)))
    assert all(by_compiler.values()), {c: len(r) for c, r in by_compiler.items()}
    kernel_sets = {c: sorted(r.kernel for r in found) for c, found in by_compiler.items()}
    assert len({tuple(k) for k in kernel_sets.values()}) == 1, kernel_sets
    failures = [f"{r.compiler} {r.module}.{r.kernel}: {'; '.join(r.problems())}" for r in built if not r.ok]
    assert not failures, "kernels failing the compile tier:\n" + "\n".join(failures)
    problems = register_table_problems(built)
    assert not problems, "registers.KERNEL_REGISTERS is below the compiler:\n" + "\n".join(problems)


# The newest PTX ISA a CUDA 13.0 driver (R580) loads: NVVM 13.0 emits it, a newer NVVM a newer one.
MAX_PTX_ISA = (9, 0)


def test_ptx_is_what_a_cuda_13_0_driver_accepts(reports):
    isas = {(r.compiler, r.ptx_version) for built in reports.values() for r in built if r.error is None}
    too_new = sorted(f"{c}: PTX ISA {v}" for c, v in isas if v is None or tuple(map(int, v.split("."))) > MAX_PTX_ISA)
    assert not too_new, (
        f"{too_new}: a CUDA 13.0 driver loads PTX ISA <= {MAX_PTX_ISA[0]}.{MAX_PTX_ISA[1]}; "
        "pin nvidia-nvvm==13.0.* (the NVVM decides the ISA)"
    )


@pytest.mark.skipif(not _nvdisasm(), reason="nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")
def test_sass_budgets_were_checked(reports):
    for arch, built in reports.items():
        unchecked = [f"{r.compiler} {r.kernel}" for r in built if r.loops is None]
        assert not unchecked, f"{arch}: no SASS loops recorded for {unchecked}"


@pytest.mark.skipif(not installed(NUMBA_CUDA_MLIR), reason=MLIR_MISSING)
def test_numba_cuda_mlir_builds_the_kernels(reports):
    for arch, built in reports.items():
        mlir = [r for r in built if r.compiler == NUMBA_CUDA_MLIR]
        assert len(mlir) >= 25 and all(r.ok for r in mlir), (arch, [r.problems() for r in mlir if not r.ok])


@pytest.mark.skipif(not installed(NUMBA_CUDA_MLIR), reason=MLIR_MISSING)
def test_one_kernel_source_builds_with_both_compilers_and_runs_on_the_simulator(reports):
    """merge_gather_kernel (with find_item's binary search): one Python source, compiled by numba-cuda and by
    numba-cuda-mlir for sm_90, and run by numba-cuda's simulator against the NumPy reference."""
    built = {r.compiler: r for r in reports["sm_90"] if r.kernel == "merge_gather_kernel"}
    assert set(built) == {NUMBA_CUDA, NUMBA_CUDA_MLIR} and all(r.ok for r in built.values()), built
    assert built[NUMBA_CUDA].signature == built[NUMBA_CUDA_MLIR].signature
    max_error = _last_json(
        _python(
            """
            import json
            import numpy as np
            from moonvit_kernels import reference as ref
            from moonvit_kernels.numba_backend import _cuda, merge
            from moonvit_kernels.numba_backend.launch import item_table

            assert _cuda.compiler_label().endswith("(CUDA simulator)"), _cuda.compiler_label()
            grid = np.array([[1, 2, 6], [3, 4, 2], [1, 2, 2]])  # 3 items, a 3-frame video
            L = int(np.prod(grid, axis=1).sum())
            x = np.random.default_rng(7).standard_normal((L, 5)).astype(np.float32)
            got = merge.merge_gather(x, item_table(grid, (2, 2)), (2, 2)).copy_to_host()
            want = np.concatenate([m.reshape(m.shape[0], -1) for m in ref.tpool_patch_merger(x, grid, (2, 2))])
            assert got.shape == want.shape and np.isfinite(got).all()
            print(json.dumps(float(np.abs(got - want).max())))
            """,
            simulator=True,
        )
    )
    assert max_error <= 1e-6
