"""The checker: run a learner's kernel on a few cases, compare with NumPy, explain what is wrong.

An `Exercise` builds 2–3 `Case`s (each a launch with its inputs and a float64 reference, chosen to
exercise something: several blocks, non-square, sizes that are not tile multiples, …). `run_check`
launches the kernel on each in turn and stops at the first case it gets wrong; the verdict names the
case, what it was testing, and the problems in plain words (`diagnose`), plus any `Suspect` — a known
bug modelled in NumPy — whose output the kernel reproduced exactly. A kernel that is right everywhere
may still be checked for speed by the exercise's `perf` check (the tracer: sectors and wavefronts).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import FP32_EPS
from .barriers import kernel_barrier_problems

# Every output element starts as this value (float) or INT_SENTINEL (int32): what still holds it was
# never written.
SENTINEL = np.float32(-7.77e37)
INT_SENTINEL = np.int32(-999_999)
GUARD_ROWS = 2  # extra rows after the output, filled with the sentinel: a write there is out of bounds
TIME_LIMIT = 60.0  # seconds one launch of a learner's kernel may take (the emulators run a case in ~1 s)


class KernelStopped(RuntimeError):
    """The learner's kernel crashed or did not finish in time (`launch.py`); the message says which."""


class _Out:
    def __repr__(self) -> str:
        return "OUT"


OUT = _Out()  # placeholder for the output array in Case.args


@dataclass
class Case:
    """One launch of an exercise: arguments in order (`OUT` marks the output), grid, block, reference.

    `label` says what the case exercises (shown when it fails); `out_tile` is the (rows, columns) of the
    output one block owns, for "only block (0, 0) is right"-style diagnoses; `row_groups` names ranges
    of output rows (packed items, frames) in the verdict.
    """

    args: list[Any]
    out_shape: tuple[int, ...]
    grid: tuple[int, ...] | int
    block: tuple[int, ...] | int
    expected: np.ndarray  # float64 (or int) reference of the output
    bound: np.ndarray | float  # allowed |got − expected|, elementwise or one number
    arg_names: str  # the launch as the learner reads it, e.g. "A, B, C, M, N, K"
    axes: tuple[str, str] = ("rows", "columns")  # plural names of the output's two axes
    out_dtype: Any = np.float32
    label: str = ""
    out_tile: tuple[int, int] | None = None
    row_groups: Sequence[tuple[int, int, str]] = ()
    shared_mem: int = 0  # dynamic shared memory bytes (CUDA C launches)

    @property
    def fill(self) -> Any:
        return INT_SENTINEL if np.dtype(self.out_dtype) == np.int32 else SENTINEL


@dataclass(frozen=True)
class Suspect:
    """A known bug: `model(case)` is the output a kernel with that bug writes (NaN where it writes
    nothing), `says` the sentence shown when the kernel's output matches it exactly."""

    says: str
    model: Callable[[Case], np.ndarray]


@dataclass(frozen=True)
class Exercise:
    """A "your turn" kernel: its notebook, what it computes, its cases, hints from gentle to explicit.

    `language` is "numba" (the learner passes a @cuda.jit kernel) or "cuda_c" (the kernel's source
    text, compiled by the CPU emulator; `entry` is the __global__ function's name). `perf`, when set,
    takes (kernel, case) and returns problems about speed (empty: fine), with notes for the verdict; it
    traces case `perf_case` (an index into the cases; the last by default).
    """

    name: str
    notebook: str
    task: str
    cases: Callable[[np.random.Generator], list[Case]]
    hints: tuple[str, ...]
    suspects: tuple[Suspect, ...] = ()
    perf: Callable[[Any, Case], tuple[list[str], list[str]]] | None = None
    language: str = "numba"
    entry: str = ""
    perf_case: int = -1


@dataclass
class CheckResult:
    """The verdict of `check`: `passed`, the explanation `message`, and the arrays compared."""

    name: str
    passed: bool
    message: str
    got: np.ndarray | None = None
    expected: np.ndarray | None = None
    problems: list[str] = field(default_factory=list)
    case: int = 0  # the 1-based case that failed (0 when none did)

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return f"CheckResult({self.name!r}, passed={self.passed})"


class ExerciseFailed(AssertionError):
    """Raised by `check(..., strict=True)` when the kernel is wrong; the message says why."""


# ============================================================================ helpers for the cases
def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def gemm_bound(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`8·eps·√K · (|A|·|B|ᵀ)`: the fp32 error bound of a length-K dot product, elementwise."""
    k = a.shape[1]
    return 8 * FP32_EPS * math.sqrt(k) * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T) + 1e-30


def awkward(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
    """Non-uniform random float32 values: normal, scaled, shifted, with a few larger entries."""
    x = rng.standard_normal(shape) * scale + rng.uniform(-0.3, 0.3) * scale
    x.flat[rng.integers(0, x.size, max(1, x.size // 20))] *= 4
    return x.astype(np.float32)


# ============================================================================ words
def ranges(idx: Sequence[int], limit: int = 8) -> str:
    """`[0, 1, 2, 5, 7, 8]` -> `"0–2, 5, 7–8"` (at most `limit` runs, then "…")."""
    idx = sorted(set(int(i) for i in idx))
    runs: list[tuple[int, int]] = []
    for i in idx:
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    text = ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in runs[:limit])
    return text + (", …" if len(runs) > limit else "")


def where(mask: np.ndarray, case: Case) -> str:
    """Which rows and columns hold the True entries of a 2-D mask, in words (and which row groups)."""
    axes, total = case.axes, mask.shape
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    row_text = f"all {axes[0]}" if len(rows) == total[0] else f"{axes[0]} {ranges(rows)}"
    col_text = f"all {axes[1]}" if len(cols) == total[1] else f"{axes[1]} {ranges(cols)}"
    groups = [name for a, b, name in case.row_groups if mask[a:b].any()]
    if case.row_groups and len(groups) < len(case.row_groups):
        row_text += f" ({', '.join(groups)} only)"
    return row_text if total[1] == 1 else f"{row_text}; {col_text}"


def _blocks_text(mask: np.ndarray, case: Case) -> str | None:
    """When the True entries of `mask` are exactly the outputs of some blocks, name those blocks."""
    if case.out_tile is None:
        return None
    th, tw = case.out_tile
    rows, cols = mask.shape
    by, bx = ceil_div(rows, th), ceil_div(cols, tw)
    if by * bx < 2:
        return None
    per_block = np.zeros((by, bx), dtype=int)
    full = np.zeros((by, bx), dtype=bool)
    for y in range(by):
        for x in range(bx):
            tile = mask[y * th : (y + 1) * th, x * tw : (x + 1) * tw]
            per_block[y, x] = tile.sum()
            full[y, x] = tile.all()
    hit = per_block > 0
    if not np.array_equal(hit, full):  # some block is partly affected: not a block pattern
        return None
    if hit.all():
        return None
    if not hit[0, 0] and hit.sum() == by * bx - 1:
        return (
            f"every block except block (0, 0) — the launch has {by}×{bx} blocks (blockIdx.y × blockIdx.x), each "
            f"owning {th}×{tw} outputs: does every block start at its own offset, blockIdx·tile?"
        )
    names = ", ".join(f"({y}, {x})" for y, x in zip(*np.nonzero(hit), strict=True))
    return f"exactly the outputs of blocks {names} (blockIdx.y, blockIdx.x) of the {by}×{bx} launch"


# ============================================================================ diagnosis
def diagnose(case: Case, got: np.ndarray, guard: np.ndarray | None) -> list[str]:
    """Plain-words problems of one run's output (empty when it matches the reference)."""
    fill = case.fill
    integer = np.dtype(case.out_dtype) == np.int32
    shape2 = got.reshape(got.shape[0], -1).shape
    problems = []
    if guard is not None and np.any(guard != fill):
        problems.append(
            f"the kernel wrote past the end of the output (into the {GUARD_ROWS} guard rows "
            "after it): an index runs out of bounds — is a bounds test missing or off by one?"
        )
    unwritten = (got == fill).reshape(shape2)
    if unwritten.all():
        shown = fill if integer else format(fill, ".3g")
        problems.append(
            f"the kernel never wrote the output: every element still holds the fill value {shown}. "
            "Is the gap still empty, or does a bounds test skip every thread?"
        )
        return problems
    if unwritten.any():
        text = f"{int(unwritten.sum())} of {unwritten.size} outputs were never written: {where(unwritten, case)}"
        blocks = _blocks_text(unwritten, case)
        if blocks:
            text += f". They are {blocks}"
        problems.append(text)
    written = ~unwritten
    got64 = got.astype(np.float64).reshape(shape2)
    expected = np.asarray(case.expected, dtype=np.float64).reshape(shape2)
    if not integer:
        bad_value = ~np.isfinite(got64) & written
        if bad_value.any():
            kinds = "NaN" if np.isnan(got64[bad_value]).any() else "Inf"
            problems.append(
                f"{int(bad_value.sum())} outputs are {kinds} ({where(bad_value, case)}): "
                "an overflow (exp of a large number?), a 0/0, or a read of uninitialised memory"
            )
        written &= ~bad_value
    err = np.abs(got64 - expected)
    bound = np.broadcast_to(np.asarray(case.bound, dtype=np.float64), got.shape).reshape(shape2)
    wrong = (err > bound) & written
    if wrong.any():
        i = np.unravel_index(np.argmax(np.where(wrong, err - bound, -np.inf)), shape2)
        full_index = np.unravel_index(np.ravel_multi_index(i, shape2), got.shape)
        index = ", ".join(str(int(j)) for j in full_index)
        text = (
            f"{int(wrong.sum())} of {wrong.size} outputs are wrong: {where(wrong, case)}. "
            f"Worst at [{index}]: got {_num(got64[i], integer)}, expected {_num(expected[i], integer)}"
            + ("" if integer else f" (allowed error {bound[i]:.2g})")
        )
        if not integer:
            text += "".join(f". {t}" for t in _patterns(got64, expected, bound, wrong, written, case))
        problems.append(text)
    return problems


def _num(v: float, integer: bool) -> str:
    return f"{int(v)}" if integer else f"{v:.6g}"


def _patterns(
    got: np.ndarray, want: np.ndarray, bound: np.ndarray, wrong: np.ndarray, written: np.ndarray, case: Case
) -> list[str]:
    """Regularities of the wrong outputs that point at a kind of bug."""
    out = []
    g, w = got[wrong], want[wrong]
    if np.all(g == 0):
        out.append("Every wrong output is exactly 0: nothing was accumulated there")
        return out
    blocks = _blocks_text(wrong, case)
    if blocks:
        out.append(f"The wrong outputs are {blocks}")
    nonzero = np.abs(w) > 1e-12
    if nonzero.sum() >= 3:
        ratio = g[nonzero] / w[nonzero]
        r0 = float(np.median(ratio))
        if abs(r0 - 1) > 1e-3 and np.allclose(ratio, r0, rtol=1e-3):
            out.append(
                f"Every wrong output is {r0:.4g}× the expected one: a wrong scale or divisor "
                "(a count, a length or a normalisation)?"
            )
            return out
        rows_ratio = _per_row_ratio(got, want, wrong)
        if rows_ratio is not None:
            out.append(
                "Within each row every wrong output is off by one factor, a different one per row "
                f"({rows_ratio}): the row's own scale — a sum, a norm or its reduction — is wrong"
            )
            return out
    if g.size >= 3:
        diff = g - w
        d0 = float(np.median(diff))
        if abs(d0) > 0 and np.allclose(diff, d0, rtol=1e-3, atol=float(np.max(bound[wrong]))):
            out.append(f"Every wrong output is off by the same {d0:+.4g}: a constant added or left out?")
            return out
    for axis, name in ((0, case.axes[0]), (1, case.axes[1])):
        for step in (1, -1):
            shifted = np.roll(want, step, axis=axis)
            sl = [slice(None), slice(None)]
            sl[axis] = slice(1, None) if step == 1 else slice(None, -1)
            sl = tuple(sl)
            m = written[sl] & wrong[sl]
            if m.sum() >= 3 and np.all(
                np.abs(got[sl][m] - shifted[sl][m]) <= bound[sl][m] + 1e-6 * np.abs(shifted[sl][m])
            ):
                out.append(
                    f"The wrong outputs hold the expected values of the {'previous' if step == 1 else 'next'} "
                    f"entry along {name}: an index off by one?"
                )
                return out
    return out


def _per_row_ratio(got: np.ndarray, want: np.ndarray, wrong: np.ndarray) -> str | None:
    """ "0.91, 1.4, …" when, in every row with wrong outputs, got/expected is one number (not all rows alike)."""
    factors = []
    for r in np.flatnonzero(wrong.any(axis=1)):
        g, w = got[r], want[r]
        ok = np.abs(w) > 1e-12
        if ok.sum() < 2:
            return None
        ratio = g[ok] / w[ok]
        r0 = float(np.median(ratio))
        if not np.allclose(ratio, r0, rtol=1e-3):
            return None
        factors.append(r0)
    if len(factors) < 2 or np.allclose(factors, factors[0], rtol=1e-3):
        return None
    return ", ".join(f"×{f:.3g}" for f in factors[:4]) + (", …" if len(factors) > 4 else "")


def suspects_matching(case: Case, got: np.ndarray, suspects: Sequence[Suspect]) -> list[str]:
    """The sentences of the suspects whose modelled output the kernel's output reproduces."""
    said = []
    written = got != case.fill
    for s in suspects:
        try:
            model = np.asarray(s.model(case), dtype=np.float64).reshape(got.shape)
        except Exception:  # a model that does not apply to this case (e.g. needs a size it lacks)
            continue
        writes = ~np.isnan(model)
        if not np.array_equal(writes, written):
            continue
        bound = np.broadcast_to(np.asarray(case.bound, dtype=np.float64), got.shape)
        g = got.astype(np.float64)
        if np.all(np.abs(g[writes] - model[writes]) <= 2 * bound[writes] + 1e-6 * np.abs(model[writes])):
            said.append(s.says)
    return said


# ============================================================================ the run
Launcher = Callable[[Any, Case], tuple[np.ndarray, np.ndarray]]


def race_verdict(kernel: Any, launch: Launcher, case: Case, got: np.ndarray) -> str | None:
    """The race message when `kernel` run again on `case` with its threads in the opposite order (warps, lanes
    and blocks reversed on the emulator; threads started last to first on the simulator) gives an output that
    differs from `got` by more than the case's error bound somewhere; None otherwise (a last-bit difference,
    e.g. of atomics adding in another order, is not a race), or when it cannot run again (the first verdict
    stands)."""
    from .thread_order import reversed_thread_order

    try:
        with reversed_thread_order():
            again, _ = launch(kernel, case)
    except Exception:
        return None
    g, a = got.astype(np.float64), again.astype(np.float64)
    bound = np.broadcast_to(np.asarray(case.bound, dtype=np.float64), g.shape)
    with np.errstate(invalid="ignore"):
        changed = (np.abs(g - a) > bound) | (np.isnan(g) != np.isnan(a))
    if not changed.any():
        return None
    changed = changed.reshape(got.shape[0], -1)
    return (
        f"race: the output depends on the order of the threads ({where(changed, case)} changed when they ran in "
        "the opposite order) — a barrier (cuda.syncthreads() / __syncthreads()) missing between a write and a "
        "read of shared memory, two threads writing one element, or a read of memory nothing wrote (shared "
        "memory starts as garbage)"
    )


def run_check(ex: Exercise, kernel: Any, launch: Launcher, seed: int = 0) -> CheckResult:
    """Launch `kernel` on every case of `ex` (stopping at the first wrong one) and build the verdict."""
    cases = ex.cases(np.random.default_rng(seed))
    n = len(cases)
    got, problems, failed_at, said = None, [], 0, []
    for number, case in enumerate(cases, start=1):
        got, problems = None, []
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore", RuntimeWarning)
                got, guard = launch(kernel, case)
                problems = diagnose(case, got, guard)
                if number == 1 or problems:
                    race = race_verdict(kernel, launch, case, got)
                    problems = [race, *problems] if race else problems
                if problems and got is not None:
                    said = suspects_matching(case, got, ex.suspects)
        except IndexError as e:
            problems.append(f"an index is out of bounds ({e}). Check the bounds test and the index arithmetic.")
        except KernelStopped as e:
            problems.append(str(e))
        except Exception as e:  # a compile or launch error: the learner's code, reported not raised
            text = str(e).strip()
            first = text.splitlines()[0] if text else ""
            detail = "\n".join(text.splitlines()[1:12]) if ex.language == "cuda_c" else ""
            problems.append(f"the kernel did not run: {type(e).__name__}: {first}" + (f"\n{detail}" if detail else ""))
        if problems:
            failed_at = number
            break
    head = _launch_text(ex, cases[failed_at - 1] if failed_at else cases[0])
    divergent = kernel_barrier_problems(kernel) if ex.language == "numba" else []
    if divergent and not problems:
        message = "\n".join(
            [
                f"✗ {ex.name}: correct on all {n} cases here, but not a kernel a GPU can run safely",
                *(f"  • {p}" for p in divergent),
                f"  hint: {ex.hints[0]}",
                f'  more hints: hint("{ex.name}")',
            ]
        )
        return CheckResult(ex.name, False, message, got, cases[-1].expected, divergent, 0)
    problems = [*divergent, *problems]
    notes: list[str] = []
    if not problems and ex.perf is not None:
        traced = cases[ex.perf_case]
        traced_number = ex.perf_case % n + 1
        try:
            perf_problems, notes = ex.perf(kernel, traced)
        except Exception as e:  # the tracer could not run this kernel: say so, do not fail it
            perf_problems, notes = [], [f"the performance check could not run: {type(e).__name__}: {e}"]
        if perf_problems:
            message = "\n".join(
                [
                    f"✗ {ex.name}: correct on all {n} cases, but slow — traced on case {traced_number} "
                    f"({traced.label}), CUDA simulator, model, no GPU",
                    *(f"  • {p}" for p in perf_problems),
                    f"  hint: {ex.hints[0]}",
                    f'  more hints: hint("{ex.name}")',
                ]
            )
            return CheckResult(ex.name, False, message, got, traced.expected, perf_problems, traced_number)
    if not problems:
        message = f"✓ {ex.name}: correct on all {n} cases ({'; '.join(c.label for c in cases)})."
        message += "".join(f"\n  {t}" for t in notes)
        return CheckResult(ex.name, True, message, got, cases[-1].expected, [], 0)
    case = cases[failed_at - 1]
    lines = [f"✗ {ex.name}: not yet — case {failed_at} of {n}: {case.label}", f"  launch: {head}"]
    lines += [f"  • {p}" for p in problems]
    lines += [f"  • this is exactly what {s}" for s in said]
    lines += [f"  hint: {ex.hints[0]}", f'  more hints: hint("{ex.name}")']
    return CheckResult(ex.name, False, "\n".join(lines), got, case.expected, problems + said, failed_at)


def _launch_text(ex: Exercise, case: Case) -> str:
    name = ex.entry or ex.name
    if ex.language == "cuda_c":
        return f"{name}<<<{case.grid}, {case.block}>>>({case.arg_names}), output {case.out_shape}"
    return f"{name}[{case.grid}, {case.block}]({case.arg_names}), output {case.out_shape}"
