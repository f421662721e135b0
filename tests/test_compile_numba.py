"""Compile tier: every numba.cuda kernel compiles for sm_90 (PTX -> SASS) without a GPU, with no spills,
registers within its limit and its compiler's register table, and hot loops within their SASS budgets.
The compiler runs in a subprocess with the CUDA simulator off; `compile_check` builds with each installed
compiler (numba-cuda here; numba-cuda-mlir too in the target-environment tier, tests/target/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from moonvit_kernels.numba_backend.compile_check import (
    KernelReport,
    format_table,
    parse_ptxas_log,
    register_table_problems,
)
from moonvit_kernels.xray.sass import nvdisasm_path

pytestmark = pytest.mark.compile

# Kernels attention.py must contribute (real head_dim 128 and the tiny config's 24).
ATTENTION_KERNELS = {
    "attention_v1_hd128_t128",
    "attention_v1_hd24_t128",
    "attention_v2_hd128_q32_k16",
    "attention_v2_hd24_q32_k16",
}


def _run_without_simulator(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def reports() -> list[KernelReport]:
    """Every kernel with every installed compiler, for sm_90; with the SASS budgets where nvdisasm is installed."""
    sass = ["--sass"] if nvdisasm_path() else []
    r = _run_without_simulator(["-m", "moonvit_kernels.numba_backend.compile_check", "--json", *sass], timeout=300)
    try:
        data = json.loads(r.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"compile_check printed no JSON (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return [KernelReport.from_dict(d) for d in data]


def test_every_kernel_compiles_for_sm90_without_spills(reports):
    print("\n" + format_table(reports))
    failures = [f"{r.module}.{r.kernel}: {'; '.join(r.problems())}" for r in reports if not r.ok]
    assert not failures, "kernels failing the compile tier:\n" + "\n".join(failures)


def test_attention_kernels_are_checked(reports):
    checked = {r.kernel for r in reports if r.module == "attention"}
    assert ATTENTION_KERNELS <= checked, f"missing from the compile tier: {sorted(ATTENTION_KERNELS - checked)}"
    for r in reports:
        if r.module == "attention":
            assert r.registers is not None and r.registers > 0 and r.shared_bytes and r.shared_bytes > 1024, r


def test_checker_reports_compile_errors_and_register_overflow():
    """The tier can fail: a kernel that does not type-check, and a register limit set too low."""
    script = textwrap.dedent(
        """
        import json
        from moonvit_kernels.numba_backend._cuda import cuda, float32
        from moonvit_kernels.numba_backend.compile_check import check_kernel

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
    r = _run_without_simulator(["-c", script], timeout=120)
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
    r = _run_without_simulator(
        ["-m", "moonvit_kernels.numba_backend.compile_check", "--module", "gemm", "--cubin-dir", str(tmp_path)],
        timeout=170,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    names = sorted(p.name for p in tmp_path.iterdir())
    expected = sorted(
        f"gemm_v{v}_{ep}.sm_90.cubin" for v in (1, 2, 3) for ep in ("none", "gelu_tanh", "gelu_erf", "residual")
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
        from moonvit_kernels.numba_backend.compile_check import build_cubins
        out = {}
        for cc in ((8, 0), (9, 0)):
            out[str(cc)] = [(label, len(cubin), cubin[:4].hex(), report.registers, report.ok)
                            for label, cubin, report in build_cubins(cc, ["moonvit_kernels.numba_backend.rope"])]
        print(json.dumps(out))
        """
    )
    r = _run_without_simulator(["-c", script], timeout=170)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for cc in ("(8, 0)", "(9, 0)"):
        [(label, size, magic, registers, ok)] = got[cc]
        assert label == "rope2d_kernel" and size > 1000 and magic == "7f454c46" and registers > 0 and ok
    simulated = subprocess.run(
        [sys.executable, "-c", "from moonvit_kernels.numba_backend.compile_check import build_cubins; build_cubins()"],
        capture_output=True,
        text=True,
        env={**os.environ, "NUMBA_ENABLE_CUDASIM": "1"},
        timeout=120,
    )
    assert simulated.returncode != 0 and "simulator off" in simulated.stderr
    bad = _run_without_simulator(["-m", "moonvit_kernels.numba_backend.compile_check", "--arch", "sm_75"], timeout=60)
    assert bad.returncode == 2 and "sm_75" in bad.stderr


def test_hot_loops_are_checked_against_their_sass_budgets(reports):
    """`--sass` holds every innermost loop to its compiler's budgets (`compile_check.MAX_INSTRUCTIONS_PER_FFMA`
    for GEMM v3 and attention v2, no local memory in any loop), and those loops exist: a budget on no loop
    proves nothing."""
    if nvdisasm_path() is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm, part of the dev extra)")
    loops = {(r.compiler, r.kernel): r.loops for r in reports}
    assert all(found is not None for found in loops.values()), "compile_check --sass recorded no loops"
    for compiler in {r.compiler for r in reports}:  # the loops the budgets hold must exist
        gemm_v3 = [lp for lp in loops[(compiler, "gemm_v3_none")] if lp["fma"]]
        attn_v2 = [lp for lp in loops[(compiler, "attention_v2_hd128_q32_k16")] if lp["fma"]]
        # GEMM v3's k-slab loop (128 FFMAs unrolled); attention v2's QK and PV loops at hd 128
        assert gemm_v3 and gemm_v3[0]["fma"] >= 64 and len(attn_v2) >= 2, (compiler, gemm_v3, attn_v2)
    print("\n" + "\n".join(f"{c} {k}: {lps}" for (c, k), lps in loops.items() if k.startswith(("gemm_v3_n", "att"))))


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
    assert register_table_problems([over, unknown]) == [
        "numba-cuda-mlir: gemm_v3_none uses 97 registers, the table holds 96: regenerate it",
        "numba-cuda-mlir: gemm_v9_none has no registry entry with its registers (moonvit_kernels/registry.py)",
    ]


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
    script = textwrap.dedent(
        """
        import importlib, json, sys
        import numpy as np
        import moonvit_kernels  # (scipy's numpy clone reads numpy.__all__, which still names row_stack here)
        if hasattr(np, "row_stack"):
            delattr(np, "row_stack")
        import numba.cuda
        try:
            importlib.import_module("numba.cuda.np.arrayobj")
            unshimmed = "imported"
        except AttributeError as e:
            unshimmed = str(e)
        for name in [m for m in sys.modules if m.startswith("numba.cuda.np.arrayobj")]:
            del sys.modules[name]
        from moonvit_kernels.numba_backend._cuda import COMPILER, cuda, float32
        from moonvit_kernels.numba_backend.compile_check import check_kernel

        def twice(out, x):
            i = cuda.grid(1)
            if i < out.shape[0]:
                out[i] = x * float32(2.0)

        report = check_kernel(twice, "void(float32[::1], float32)")
        print(json.dumps([unshimmed, COMPILER, report.ok, report.error, hasattr(np, "row_stack")]))
        """
    )
    r = _run_without_simulator(["-c", script], timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    unshimmed, compiler, ok, error, row_stack_left = json.loads(r.stdout.strip().splitlines()[-1])
    assert "has no attribute 'row_stack'" in unshimmed  # the break the shim exists for
    assert compiler == "numba-cuda" and ok and error is None and not row_stack_left
