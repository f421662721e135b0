"""The compile tier of one stage (class TestCompile of tests/stages/test_<stage>.py): every numba kernel of the
stage built for sm_90 and every CUDA C instantiation of it built with NVRTC for sm_80 / sm_90 (/ sm_90a), no
GPU needed, each judged against its limits (registers, spills, stack, shared memory, the SASS budgets of hot
loops where nvdisasm is installed, the register table the launch checks read).

The tier-wide files (tests/test_compile_numba.py, tests/test_nvrtc_compile.py) test the checkers themselves."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from moonvit_kernels.config import VisionConfig
from moonvit_kernels.cuda_backend import sources as kcuda
from moonvit_kernels.tools.compile_check import KernelReport, format_table, register_table_problems
from moonvit_kernels.tools.xray.sass import nvdisasm_path

# the configs' head dims, one more, and the largest supported (the register file is full there: no spills allowed)
HEAD_DIMS = tuple(sorted({VisionConfig.k3().head_dim, VisionConfig.tiny().head_dim, 64, kcuda.MAX_HEAD_DIM}))


def run_without_simulator(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """`python ARGS` with the CUDA simulator off (the compilers need the real numba.cuda)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout)


def numba_reports(module: str) -> list[KernelReport]:
    """Every kernel of `numba_backend.<module>` with every installed compiler, for sm_90; with the SASS budgets
    where nvdisasm is installed."""
    sass = ["--sass"] if nvdisasm_path() else []
    args = ["-m", "moonvit_kernels.tools.compile_check", "--json", "--module", module, *sass]
    r = run_without_simulator(args, timeout=300)
    try:
        data = json.loads(r.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"compile_check printed no JSON (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return [KernelReport.from_dict(d) for d in data]


def assert_numba_stage_compiles(stage: str) -> list[KernelReport]:
    """Every numba kernel the registry lists for `stage` compiles within its limits and its compiler's register
    table; returns the reports (one per kernel and compiler)."""
    from moonvit_kernels import registry

    entries = [e for e in registry.numba_entries() if e.stage == stage]
    (module,) = {e.module for e in entries}
    reports = numba_reports(module)
    print("\n" + format_table(reports))
    missing = {e.label for e in entries} - {r.kernel for r in reports}
    assert not missing, f"missing from the compile tier: {sorted(missing)}"
    failures = [f"{r.compiler} {r.kernel}: {'; '.join(r.problems())}" for r in reports if not r.ok]
    assert not failures, "kernels failing the compile tier:\n" + "\n".join(failures)
    problems = register_table_problems(reports)
    assert not problems, "the register table is below the compiler:\n" + "\n".join(problems)
    for r in reports:
        assert r.registers is not None and r.registers > 0, r
        if nvdisasm_path():
            assert r.loops is not None, f"compile_check --sass recorded no loops for {r.kernel}"
    return reports


def cuda_archs(stage: str) -> list[str]:
    """The architectures the compile tier builds some CUDA C instantiation of `stage` for."""
    from moonvit_kernels import registry
    from moonvit_kernels.tools.nvrtc_check import ARCHS

    specs = [e.spec for e in registry.entries(HEAD_DIMS, "cuda") if e.stage == stage]
    return [arch for arch in ARCHS if any(s.builds_for(arch) for s in specs)]


def assert_cuda_stage_builds(stage: str, arch: str) -> None:
    """Every CUDA C instantiation of registry stage `stage` built for `arch` with the launchers' options (front-end
    warnings as errors): no spills, stack only where allowed, registers and shared memory within the bounds."""
    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings (numba-cuda[cu13]) not installed")
    from moonvit_kernels import registry
    from moonvit_kernels.tools import nvrtc_check

    reports = nvrtc_check.run_checks([arch], HEAD_DIMS, workers=1, stages=(stage,))
    expected = [e.spec for e in registry.entries(HEAD_DIMS, "cuda") if e.stage == stage and e.spec.builds_for(arch)]
    assert sorted(r.spec.name for r in reports) == sorted(s.name for s in expected)
    bad = [f"{r.spec.name}: {'; '.join(r.problems)}" for r in reports if not r.ok]
    assert not bad, "\n".join(bad)
    for r in reports:  # the report is real: ptxas said something about every kernel
        assert r.info is not None and r.info.registers > 0
