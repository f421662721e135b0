"""Compile tier: every numba.cuda kernel compiles for sm_90 (PTX -> SASS) without a GPU, with no spills
and registers within its limit. The compiler runs in a subprocess with the CUDA simulator off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from moonvit_kernels.numba_backend.compile_check import KernelReport, format_table, parse_ptxas_log

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
    r = _run_without_simulator(["-m", "moonvit_kernels.numba_backend.compile_check", "--json"], timeout=170)
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
        from numba import cuda, float32
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


# Hot loops held to at most this many SASS instructions per FFMA (sm_90): every innermost loop with
# FFMAs in these kernels. numba `for ... in range` loops cost ~24 (attention v2 QK at hd 128).
MAX_INSTRUCTIONS_PER_FFMA = 4.0
HOT_LOOP_KERNELS = ("gemm_v3_", "attention_v2_")


def test_hot_loops_cost_at_most_4_sass_instructions_per_ffma():
    from moonvit_kernels.xray.sass import nvdisasm_path

    if nvdisasm_path() is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm, part of the dev extra)")
    script = textwrap.dedent(
        f"""
        import json
        from moonvit_kernels.numba_backend.compile_check import build_cubins
        from moonvit_kernels.xray.sass import disassemble
        out = {{}}
        mods = ["moonvit_kernels.numba_backend.gemm", "moonvit_kernels.numba_backend.attention"]
        for label, cubin, report in build_cubins((9, 0), mods):
            if label.startswith({HOT_LOOP_KERNELS!r}):
                out[label] = [
                    (loop.size, loop.fmas, loop.per_fma)
                    for f in disassemble(cubin) if not f.name.startswith("__")
                    for loop in f.innermost if loop.fmas
                ]
        print(json.dumps(out))
        """
    )
    r = _run_without_simulator(["-c", script], timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    loops = json.loads(r.stdout.strip().splitlines()[-1])
    assert {f"gemm_v3_{ep}" for ep in ("none", "gelu_tanh", "gelu_erf", "residual")} <= set(loops)
    assert {"attention_v2_hd128_q32_k16", "attention_v2_hd24_q32_k16"} <= set(loops)
    # The loops must exist where the trip counts are long (a test that finds no loop proves nothing):
    # GEMM v3's k-slab loop, attention v2's key-tile loop holding the QK and PV loops at hd 128.
    assert loops["gemm_v3_none"] and len(loops["attention_v2_hd128_q32_k16"]) >= 2, loops
    slow = {
        label: [f"{size} instructions / {fmas} FFMA = {ratio:.2f}" for size, fmas, ratio in found]
        for label, found in loops.items()
        if any(ratio > MAX_INSTRUCTIONS_PER_FFMA for _, _, ratio in found)
    }
    assert not slow, f"hot loops above {MAX_INSTRUCTIONS_PER_FFMA} SASS instructions per FFMA: {slow}"


def test_register_table_covers_what_the_compiler_reports_now(reports):
    """The launch checks read `registers.KERNEL_REGISTERS`: it must list every compiled kernel, with at
    least the registers ptxas now reports for sm_90 (the table holds the max over sm_80/89/90)."""
    from moonvit_kernels.numba_backend.registers import KERNEL_REGISTERS

    missing = sorted(r.kernel for r in reports if r.kernel not in KERNEL_REGISTERS)
    assert not missing, f"kernels missing from registers.KERNEL_REGISTERS: {missing}"
    low = {
        r.kernel: (KERNEL_REGISTERS[r.kernel], r.registers) for r in reports if r.registers > KERNEL_REGISTERS[r.kernel]
    }
    assert not low, f"(stored, compiled) registers: the table is below the compiler, regenerate it: {low}"
