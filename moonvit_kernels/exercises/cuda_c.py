"""The CUDA C exercises: the learner's kernel source, compiled and run by the CPU emulator.

`check(name, source)` compiles `source` as a CuPy `RawModule` of the emulated device
(`tools.emulation.device`: g++ against stand-ins for the CUDA built-ins and PTX instructions,
every CUDA thread a fiber), finds its `extern "C" __global__` kernel, and launches it on each case as
CuPy would (device arrays, NumPy scalars marshalled by their dtype). The diagnostics are the numba
exercises': sentinel-filled outputs with guard rows, two runs compared, known bugs recognised. A
compile error is reported with g++'s error lines.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any

import numpy as np

from .core import FP32_EPS, OUT, TIME_LIMIT, Case, CheckResult, Exercise, Suspect, awkward, ceil_div, run_check
from .launch import launch_cuda_c


# ============================================================================ running learner source
def _compile_error_lines(text: str, limit: int = 8) -> str:
    """The `error:` lines of a g++ log (with the line after each), in the learner's line numbers (their
    source opens the compiled module) and with the emulator's headers named by file."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if "error" in line and ":" in line:
            line = re.sub(r"\S*/module\.cpp:(\d+):(\d+):", r"your source, line \1:\2:", line.strip())
            out.append(re.sub(r"\S*/(\w+\.h|\w+\.cuh)", r"\1", line))
            if i + 1 < len(lines) and lines[i + 1].strip():
                out.append("    " + lines[i + 1].strip())
        if len(out) >= limit:
            break
    return "\n".join(out) or text[-1500:]


def compile_kernel(ex: Exercise, source: str) -> Any:
    """The learner's kernel `ex.entry`, compiled by the emulated device; ValueError with the reason otherwise."""
    from moonvit_kernels.tools.emulation import build, device

    if build.compiler() is None:
        raise RuntimeError("the CUDA C exercises need a C++20 compiler (g++ >= 11) for the CPU emulator; set CXX")
    names = build.extern_c_kernels(source)
    if ex.entry not in names:
        found = ", ".join(names) or "none"
        raise ValueError(
            f'no extern "C" __global__ void {ex.entry}(...) in the source (extern "C" kernels found: {found})'
        )
    try:
        return device.RawModule(code=source).get_function(ex.entry)
    except RuntimeError as e:
        raise ValueError(f"the source does not compile:\n{_compile_error_lines(str(e))}") from None


def run(ex: Exercise, source: str, seed: int = 0, time_limit: float = TIME_LIMIT) -> CheckResult:
    """`check` for a CUDA C exercise: compile once, then the same cases and verdicts as numba's (each launch
    contained, with `time_limit` seconds)."""
    try:
        function = compile_kernel(ex, source)
    except (ValueError, RuntimeError) as e:
        case = ex.cases(np.random.default_rng(seed))[0]
        message = "\n".join(
            [
                f"✗ {ex.name}: not yet — the kernel did not build for the CPU emulator",
                *(f"  {line}" for line in str(e).splitlines()),
                f"  (launch it would get: {ex.entry}<<<{case.grid}, {case.block}>>>({case.arg_names}))",
                f"  hint: {ex.hints[0]}",
                f'  more hints: hint("{ex.name}")',
            ]
        )
        return CheckResult(ex.name, False, message, None, None, [str(e)], 1)
    return run_check(ex, function, functools.partial(launch_cuda_c, time_limit=time_limit), seed)


# ============================================================================ 02: warp-shuffle RMSNorm
NORM_EPS = 1e-5


def warp_norm_case(rng: np.random.Generator, rows: int, cols: int, label: str) -> Case:
    from .. import reference

    x = awkward(rng, (rows, cols), scale=2.0)
    x[rows // 2] *= 1e-3
    weight = (1.0 + 0.3 * rng.standard_normal(cols)).astype(np.float32)
    want, rstd = reference.rmsnorm(x.astype(np.float64), weight.astype(np.float64), NORM_EPS, return_rstd=True)
    bound = 8 * FP32_EPS * math.sqrt(cols) * np.abs(x) * rstd[:, None] * np.abs(weight) + 1e-30
    return Case(
        args=[x, weight, OUT, np.int32(cols), np.float32(NORM_EPS)],
        out_shape=(rows, cols),
        grid=rows,
        block=32,
        expected=want,
        bound=bound,
        arg_names="x, weight, out, cols, eps",
        axes=("rows", "columns"),
        label=f"{rows} rows × {cols} columns, one warp (32 threads) per row: {label}",
    )


def warp_norm_cases(rng: np.random.Generator) -> list[Case]:
    return [
        warp_norm_case(rng, 5, 75, "75 is not a multiple of 32"),
        warp_norm_case(rng, 3, 20, "fewer columns than lanes"),
    ]


def _lane_own_sum(case: Case) -> np.ndarray:
    """Each lane scales by its own partial sum (a reduction whose result never reached every lane)."""
    x, w, _, cols, eps = case.args
    x64 = x.astype(np.float64)
    out = np.empty_like(x64)
    for lane in range(32):
        j = np.arange(lane, int(cols), 32)
        part = (x64[:, j] ** 2).sum(axis=1) if j.size else np.zeros(x.shape[0])
        out[:, j] = x64[:, j] / np.sqrt(part / int(cols) + float(eps))[:, None] * w[j]
    return out


# ============================================================================ 01: mma.sync fragments
MMA_M, MMA_N, MMA_K = 16, 8, 16


def mma_case(rng: np.random.Generator, M: int, N: int, K: int, label: str) -> Case:
    from moonvit_kernels.weights import bf16_bits_to_float32, float32_to_bf16_bits

    a_bits = float32_to_bf16_bits(awkward(rng, (M, K)))
    b_bits = float32_to_bf16_bits(awkward(rng, (N, K)))
    a = bf16_bits_to_float32(a_bits).astype(np.float64)
    b = bf16_bits_to_float32(b_bits).astype(np.float64)
    grid = (ceil_div(N, MMA_N), ceil_div(M, MMA_M))
    return Case(
        args=[a_bits, b_bits, OUT, np.int32(M), np.int32(N), np.int32(K)],
        out_shape=(M, N),
        grid=grid,
        block=32,
        expected=a @ b.T,
        bound=8 * FP32_EPS * math.sqrt(K) * (np.abs(a) @ np.abs(b).T) + 1e-30,
        arg_names="A, B, C, M, N, K",
        axes=("rows m", "columns n"),
        label=f"M = {M}, N = {N}, K = {K} (bf16 in, fp32 out): {label}, a {grid[1]}×{grid[0]} grid of one-warp "
        "blocks, each a 16×8 tile",
        out_tile=(MMA_M, MMA_N),
    )


def mma_cases(rng: np.random.Generator) -> list[Case]:
    return [mma_case(rng, 16, 8, 48, "one tile, three k-steps"), mma_case(rng, 37, 21, 32, "partial tiles")]


EXERCISES = (
    Exercise(
        "rmsnorm_warp_sum",
        "02_rmsnorm",
        "CUDA C: one warp per row, the sum of squares added across lanes with __shfl_xor_sync",
        warp_norm_cases,
        (
            "With a whole row in one warp, no shared memory is needed: lanes exchange registers. After the "
            "exchange EVERY lane must hold the row's total, since every lane scales its own columns.",
            "Each lane sums x² over columns lane, lane + 32, …; then for offset = 16, 8, 4, 2, 1: "
            "s += __shfl_xor_sync(0xffffffff, s, offset) (a butterfly: afterwards all 32 lanes hold the sum). "
            "r = rsqrtf(s / cols + eps); out[row·cols + j] = x[row·cols + j]·r·weight[j] over the lane's columns.",
            "__shfl_down_sync leaves the total in lane 0 only: broadcast it with __shfl_sync(0xffffffff, s, 0) or "
            "use the xor butterfly. (The emulator implements __shfl_sync, __shfl_xor_sync, __shfl_up_sync and "
            "__shfl_down_sync, and checks their masks as hardware requires: 0xffffffff names all 32 lanes.)",
        ),
        suspects=(
            Suspect(
                "a kernel whose lanes scale by their own partial sums writes: the reduced total must reach every "
                "lane (xor butterfly, or a broadcast from lane 0)",
                _lane_own_sum,
            ),
        ),
        language="cuda_c",
        entry="rmsnorm_warp_sum",
    ),
    Exercise(
        "mma_fragments",
        "04_attention",
        "CUDA C: one warp per 16×8 tile of C with mma.sync.m16n8k16 — the fragment addressing",
        mma_cases,
        (
            "mma.sync spreads each operand over the warp's 32 lanes by a fixed table (ptx.cuh's header): with "
            "g = lane/4 and c = lane%4, a lane holds rows g and g + 8 and column pairs 2c, 2c + 1 (+8). A register "
            "packs two bf16 values, the lower k in the low 16 bits.",
            "Per k-step k0: a[0] = A(g, k0+2c | +1), a[1] = A(g+8, k0+2c | +1), a[2] = A(g, k0+2c+8 | +1), "
            "a[3] = A(g+8, k0+2c+8 | +1); b0 = B(n = g, k0+2c | +1), b1 = B(n = g, k0+2c+8 | +1) (rows m0+…, n0+…; "
            "0 outside M or N). mma_bf16_16816(d, a, b0, b1).",
            "Store d[0], d[1] at C(m0+g, n0+2c), C(m0+g, n0+2c+1) and d[2], d[3] at C(m0+g+8, n0+2c), "
            "C(m0+g+8, n0+2c+1), each only inside M × N.",
        ),
        language="cuda_c",
        entry="mma_fragments",
    ),
)
