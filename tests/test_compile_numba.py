"""Compile tier, the checker itself: `compile_check` builds numba.cuda kernels for sm_90 (PTX -> SASS) without a
GPU and fails a kernel with spills, registers over its limit or its compiler's register table, or hot loops over
their SASS budgets. Each stage's kernels are built by its stage file (tests/stages, class TestCompile).
The compiler runs in a subprocess with the CUDA simulator off; `compile_check` builds with each installed
compiler (numba-cuda here; numba-cuda-mlir too in the target-environment tier, tests/target/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from compile_tier import numba_reports, run_without_simulator
from helpers import row_stack_probe

from moonvit_kernels import registry
from moonvit_kernels.numba_backend import gemm
from moonvit_kernels.tools.compile_check import (
    KernelReport,
    format_table,
    parse_ptxas_log,
    register_table_problems,
)

pytestmark = pytest.mark.compile


@pytest.fixture(scope="module")
def reports() -> list[KernelReport]:
    """The one numba kernel outside the stages (the device input check) with every installed compiler, for sm_90,
    with the SASS budgets where nvdisasm is installed; each stage's kernels are built by its stage file
    (tests/stages/test_<stage>.py, class TestCompile, through tests/compile_tier.py)."""
    return numba_reports("input_check")


def test_the_input_check_kernel_compiles_within_limits(reports):
    print("\n" + format_table(reports))
    assert {r.kernel for r in reports} == {"first_nonfinite_row_kernel"}
    failures = [f"{r.module}.{r.kernel}: {'; '.join(r.problems())}" for r in reports if not r.ok]
    assert not failures, "kernels failing the compile tier:\n" + "\n".join(failures)


def test_checker_reports_compile_errors_and_register_overflow():
    """The tier can fail: a kernel that does not type-check, and a register limit set too low."""
    script = textwrap.dedent(
        """
        import json
        from moonvit_kernels.numba_backend._cuda import cuda, float32
        from moonvit_kernels.tools.compile_check import check_kernel

        def bad_types(out):
            out[0] = (1.0, 2.0)  # a tuple cannot be stored in a float32 array

        def fine(out, x):
            i = cuda.grid(1)
            if i < out.shape[0]:
                out[i] = x * float32(2.0)

        reports = [
            check_kernel(bad_types, "void(float32[::1])"),
            check_kernel(fine, "void(float32[::1], float32)", max_registers=2),
            check_kernel(fine, "void(float32[::1], float32)"),
        ]
        print(json.dumps([r.to_dict() for r in reports]))
        """
    )
    r = run_without_simulator(["-c", script], timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    bad, tight, good = json.loads(r.stdout.strip().splitlines()[-1])
    assert not bad["ok"] and bad["error"] and "does not compile" in bad["problems"][0]
    assert not tight["ok"] and any("registers, limit 2" in p for p in tight["problems"])
    assert good["ok"] and good["registers"] > 2 and good["spill_bytes"] == 0


def test_parse_ptxas_log_reads_spills_registers_and_shared_memory():
    log = textwrap.dedent(
        """
        ptxas info    : Compiling entry function '_Z1kPf' for 'sm_90'
        ptxas info    : Function properties for _Z1kPf
        ptxas         .     16 bytes stack frame, 24 bytes spill stores, 12 bytes spill loads
        ptxas info    : Used 255 registers, used 1 barriers
        info    : used 255 registers, used 1 barriers, 16 stack, 5120 bytes smem, 640 bytes cmem[0], 0 bytes lmem
        """
    )
    got = parse_ptxas_log(log)
    assert got == {"stack_bytes": 16, "spill_stores": 24, "spill_loads": 12, "registers": 255, "shared_bytes": 5120}
    report = KernelReport("m", "k", "void()", 128, **got)
    problems = report.problems()
    assert not report.ok and len(problems) == 2
    assert "spills (24 bytes stored, 12 bytes loaded)" in problems[0] and "255 registers, limit 128" in problems[1]
    assert "FAIL" in format_table([report])


def test_cubin_dir_writes_one_sm90_binary_per_specialisation(tmp_path):
    r = run_without_simulator(
        ["-m", "moonvit_kernels.tools.compile_check", "--module", "gemm", "--cubin-dir", str(tmp_path)],
        timeout=170,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    names = sorted(p.name for p in tmp_path.iterdir())
    expected = sorted(
        f"gemm_v{v}_{ep}.sm_90.cubin" for v in registry.versions("numba", "gemm") for ep in gemm.EPILOGUES
    )
    assert names == expected
    for p in tmp_path.iterdir():
        data = p.read_bytes()
        assert data[:4] == b"\x7fELF", p.name
        assert p.name.split(".")[0].encode() in data, f"{p.name} does not hold its kernel's symbol"


def test_build_cubins_api_and_arch_option(tmp_path):
    """`build_cubins` returns (label, cubin, report) per kernel, for the architecture asked; it refuses
    to run with the simulator on, and the CLI rejects an unknown --arch."""
    script = textwrap.dedent(
        """
        import json
        from moonvit_kernels.tools.compile_check import build_cubins
        out = {}
        for cc in ((8, 0), (9, 0)):
            out[str(cc)] = [(label, len(cubin), cubin[:4].hex(), report.registers, report.ok)
                            for label, cubin, report in build_cubins(cc, ["moonvit_kernels.numba_backend.rope"])]
        print(json.dumps(out))
        """
    )
    r = run_without_simulator(["-c", script], timeout=170)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for cc in ("(8, 0)", "(9, 0)"):
        [(label, size, magic, registers, ok)] = got[cc]
        assert label == "rope2d_kernel" and size > 1000 and magic == "7f454c46" and registers > 0 and ok
    simulated = subprocess.run(
        [sys.executable, "-c", "from moonvit_kernels.tools.compile_check import build_cubins; build_cubins()"],
        capture_output=True,
        text=True,
        env={**os.environ, "NUMBA_ENABLE_CUDASIM": "1"},
        timeout=120,
    )
    assert simulated.returncode != 0 and "simulator off" in simulated.stderr
    bad = run_without_simulator(["-m", "moonvit_kernels.tools.compile_check", "--arch", "sm_75"], timeout=60)
    assert bad.returncode == 2 and "sm_75" in bad.stderr


def test_register_table_covers_what_the_compiler_reports_now(reports):
    """The launch checks read the compiler's table in `registers.KERNEL_REGISTERS`: it must list every compiled
    kernel, with at least the registers ptxas now reports for sm_90 (the table holds the max over sm_80/89/90)."""
    problems = register_table_problems(reports)
    assert not problems, "registers.KERNEL_REGISTERS is below the compiler:\n" + "\n".join(problems)


def test_sass_budgets_and_register_table_can_fail():
    """The budgets of `--sass` and the register-table comparison reject what they promise to, per compiler."""
    loop = {"size": 20, "fma": 8, "ldl": 0, "stl": 0, "bar": 0}
    ok = KernelReport("gemm", "gemm_v3_none", "", 128, 90, 0, 0, 0, 0, compiler="numba-cuda-mlir", loops=[loop])
    assert ok.ok
    slow = KernelReport(**{**ok.__dict__, "loops": [{**loop, "size": 40}]})
    framed = KernelReport(**{**ok.__dict__, "kernel": "merge_gather_kernel", "loops": [{**loop, "ldl": 2, "stl": 2}]})
    filled = KernelReport(**{**framed.__dict__, "loops": [{**loop, "stl": 1}]})  # fills a local array: allowed
    rope = KernelReport(**{**ok.__dict__, "kernel": "rope2d_kernel", "loops": [{**loop, "size": 33, "bar": 1}]})
    assert "40 instructions for 8 FFMA (limit 4.0/FFMA)" in slow.problems()[0]
    assert "local memory across loop iterations: 2 LDL and 2 STL in a loop of 20" in framed.problems()[0]
    assert filled.ok
    assert "barrier of 33 instructions (limit 32)" in rope.problems()[0]
    assert register_table_problems([ok]) == []
    over = KernelReport(**{**ok.__dict__, "registers": 97})
    unknown = KernelReport(**{**ok.__dict__, "kernel": "gemm_v9_none"})
    placeholder = KernelReport(**{**ok.__dict__, "registers": 96 - 25})  # a table number no build produced
    assert register_table_problems([over, unknown, placeholder]) == [
        "numba-cuda-mlir: gemm_v3_none uses 97 registers, the table holds 96: regenerate it",
        "numba-cuda-mlir: gemm_v9_none has no registry entry with its registers (moonvit_kernels/registry.py)",
        "numba-cuda-mlir: gemm_v3_none uses 71 registers, the table holds 96, more than 24 above any measured build: "
        "measure it (registry.REGISTERS_MEASURED_WITH)",
    ]
    assert register_table_problems([KernelReport(**{**ok.__dict__, "registers": 96 - 24})]) == []


def test_the_register_numbers_were_measured_with_this_toolchain():
    """The compile tier checks the toolchain it has: the registry's numbers name the nvJitLinks they were measured
    with (registry.REGISTERS_MEASURED_WITH), and this environment's must be one of them."""
    from moonvit_kernels.tools.compile_check import toolchain_problem

    problem = toolchain_problem()
    if problem == "nvJitLink is not installed":
        pytest.skip("the compile tier needs nvJitLink (pip install -e '.[compile]')")
    assert problem is None, problem


def test_compiler_choice_from_the_environment(monkeypatch):
    """`MOONVIT_NUMBA_COMPILER` picks the compiler; a conflicting or unknown choice is one clear error."""
    from moonvit_kernels.numba_backend import compilers

    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    for value, want in (("", "numba-cuda"), ("auto", "numba-cuda"), ("numba-cuda", "numba-cuda")):
        monkeypatch.setenv("MOONVIT_NUMBA_COMPILER", value)
        assert compilers.select_compiler() == want
    monkeypatch.setenv("MOONVIT_NUMBA_COMPILER", "MLIR")
    if compilers.installed("numba-cuda-mlir"):
        assert compilers.select_compiler() == "numba-cuda-mlir"
    else:
        with pytest.raises(ValueError, match=r"not installed: pip install 'numba-cuda-mlir\[cu13\]>=0.6'"):
            compilers.select_compiler()
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    with pytest.raises(ValueError, match="numba-cuda-mlir has no simulator"):
        compilers.select_compiler()
    monkeypatch.setenv("MOONVIT_NUMBA_COMPILER", "llvm")
    with pytest.raises(ValueError, match="MOONVIT_NUMBA_COMPILER: unknown numba compiler 'llvm'"):
        compilers.select_compiler()
    assert compilers.installed_compilers()[0] == "numba-cuda" and not compilers.installed("no-such-compiler")


def test_numpy_without_row_stack_compiles_through_the_shim():
    """numpy 2.5 removed `np.row_stack`, which numba-cuda 0.30's arrayobj overloads at import (upstream
    issue 907). Here numpy's attribute is deleted to stand for 2.5 (the target tier runs the real 2.5):
    importing numba-cuda's arrayobj then fails, and `_cuda`'s scoped shim lets a kernel compile and leaves
    numpy without `row_stack`."""
    unshimmed, compiler, ok, error, row_stack_left = row_stack_probe("--simulate-numpy-2.5", timeout=120)
    assert "has no attribute 'row_stack'" in unshimmed  # the break the shim exists for
    assert compiler == "numba-cuda" and ok and error is None and not row_stack_left
