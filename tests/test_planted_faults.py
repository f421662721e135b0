"""Plant a fault in the real launch path and see the CPU suite catch it.

Each case copies the package and the tests to a scratch folder, breaks one line of a launcher the
way a real bug would (two scalar arguments swapped in a launch, an alignment check dropped, a struct
passed with the wrong alignment, a scalar of the wrong width), and runs the tests that guard that
line against the broken copy in a fresh interpreter (`-s`, so that an access the emulator stops is
reported): they must fail. The same tests pass on the real code in this suite. A case whose line is
no longer found fails too, so the harness cannot go quietly stale.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moonvit_kernels.tools.emulation import compiler

ROOT = Path(__file__).resolve().parents[1]
GUARD = "tests/test_emulated_device.py"

# (what is planted, file, the real line, the planted line, the tests that must catch it)
FAULTS = [
    (
        "M and N swapped in the GEMM launch",
        "moonvit_kernels/cuda_backend/launchers.py",
        "(a, b, out, r, np.int32(M), np.int32(N), np.int32(K), np.int32(vec))",
        "(a, b, out, r, np.int32(N), np.int32(M), np.int32(K), np.int32(vec))",
        f"{GUARD}::test_real_gemm_launcher_on_the_emulated_device",
    ),
    (
        "the paired-store alignment check of the GEMM output dropped",
        "moonvit_kernels/cuda_backend/launchers.py",
        'check_aligned("gemm: out", device_pointer(out), pair, why)',
        "pass",
        f"{GUARD}::test_misaligned_paired_store_is_refused_before_the_launch",
    ),
    (
        "the tensor map passed as a struct without its 64-byte alignment",
        "moonvit_kernels/cuda_backend/hopper_launchers.py",
        'make_aligned_dtype(np.dtype([("opaque", np.uint64, (16,))]), alignment=64)',
        'make_aligned_dtype(np.dtype([("opaque", np.uint64, (16,))]), alignment=8)',
        f"{GUARD}::test_hopper_gemm_launcher_on_the_emulated_device",
    ),
    (
        "the RMSNorm eps cast to float64 (8 bytes for a float parameter)",
        "moonvit_kernels/cuda_backend/launchers.py",
        "(x, weight, out, rstd, np.int32(D), np.float32(eps))",
        "(x, weight, out, rstd, np.int32(D), float(eps))",
        f"{GUARD}::test_real_rmsnorm_launcher_on_the_emulated_device",
    ),
]


@pytest.mark.slow
@pytest.mark.skipif(compiler() is None, reason="no C++ compiler (g++ >= 11) for the CUDA C emulation")
@pytest.mark.parametrize("what, path, real, planted, tests", FAULTS, ids=[f[0] for f in FAULTS])
def test_a_planted_launcher_fault_fails_the_cpu_suite(tmp_path, what, path, real, planted, tests):
    copy = tmp_path / "repo"
    for part in ("moonvit_kernels", "tests"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__", "*.ipynb"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    target = copy / path
    text = target.read_text(encoding="utf-8")
    assert text.count(real) == 1, f"{path} no longer holds the line this case breaks: {real!r}"
    target.write_text(text.replace(real, planted), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(copy)}
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-n0", "-p", "no:cacheprovider", "-o", "addopts=", tests],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = r.stdout[-3000:] + r.stderr[-2000:]
    assert r.returncode != 0, f"planted fault ({what}) passed {tests}:\n{log}"
    # a failed assertion, or the emulator stopping a misaligned access (-fsanitize=alignment) as a GPU would fault
    assert " failed" in r.stdout or "runtime error: " in r.stderr, log
