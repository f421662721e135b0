""" "Your turn" exercises of the workbook: run a learner's kernel, compare it with NumPy, say what is wrong.

Each exercise is a small kernel the learner writes in a notebook cell — numba.cuda, or for a few, CUDA C
source text run on the CPU emulator. `check(name, kernel)` launches it (on the CUDA simulator without a
GPU, on the GPU where there is one; CUDA C on the emulator) on 2–3 cases of random, non-uniform inputs,
each chosen to exercise something (several blocks, non-square, sizes that are not tile multiples, more
frames than two, …), compares the output with a float64 NumPy reference under an elementwise error
bound, and prints a verdict in plain words: which case failed and what it tests, which output rows and
columns are wrong, NaN/Inf, elements never written, writes past the end, an out-of-bounds index,
results that change when the threads run in the opposite order (a race), patterns that point at a bug (only block
(0, 0) right, every wrong value off by one factor, shifted by one), and known bugs reproduced exactly. A numba
kernel's source is read for a barrier under a thread-dependent condition (`barriers`), which fails the check
even when every case passes.
Exercises that teach a performance idea also trace the kernel's memory accesses (`xray.trace`) and
fail a correct kernel that is slow, saying which access costs what and why (model, no GPU).

`check` returns a `CheckResult` and never raises for a wrong kernel (the committed notebooks keep
the stubs), unless `strict=True`. The kernel object (or source text) is passed in, so re-running the
learner's cell after an edit checks the new kernel: nothing is cached by name.

Hints go from a nudge to the algorithm: a failing check shows the first, `hint(name)` all of them.
Solutions live in `moonvit_kernels/exercises/solutions/NN_<name>.py` (`.cu` for CUDA C; shipped with the
package); `solution(name)` prints one,
and `load_solution(name)` loads it (the tests check every solution passes and every stub fails).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from moonvit_kernels import contained
from moonvit_kernels.exercises import attention, cuda_c, encoder, gemm, hopper, merge, norm, rope, warmups
from moonvit_kernels.exercises.core import (
    OUT,
    TIME_LIMIT,
    Case,
    CheckResult,
    Exercise,
    ExerciseFailed,
    Suspect,
    ranges,
    run_check,
)
from moonvit_kernels.exercises.launch import launch_numba

SOLUTIONS_DIR = Path(__file__).resolve().parent / "solutions"

EXERCISES: dict[str, Exercise] = {
    e.name: e
    for module in (warmups, gemm, norm, rope, attention, merge, encoder, hopper, cuda_c)
    for e in module.EXERCISES
}

__all__ = [
    "EXERCISES",
    "OUT",
    "Case",
    "CheckResult",
    "Exercise",
    "ExerciseFailed",
    "Suspect",
    "catalogue",
    "check",
    "hint",
    "load_solution",
    "ranges",
    "solution",
    "solution_path",
]


def _exercise(name: str) -> Exercise:
    if name not in EXERCISES:
        raise ValueError(f"no exercise named {name!r}; known: {', '.join(EXERCISES)}")
    return EXERCISES[name]


def check(
    name: str, kernel: Any, strict: bool = False, seed: int = 0, verbose: bool = True, time_limit: float = TIME_LIMIT
) -> CheckResult:
    """Run the learner's `kernel` for exercise `name` against the NumPy reference; print the verdict.

    `kernel` is a @cuda.jit function, or for a CUDA C exercise the kernel's source text. The first case,
    and a case that fails, is launched again with the threads in the opposite order (a different result
    means a race). Returns a
    `CheckResult`; with `strict=True` a wrong kernel raises `ExerciseFailed` instead. A kernel that
    raises (an index out of bounds under the simulator, a compile error) is reported, not propagated; so is
    one that crashes or runs longer than `time_limit` seconds (each launch runs in a forked child).
    """
    ex = _exercise(name)
    contained.check_time_limit(time_limit)
    if ex.language == "cuda_c":
        if not isinstance(kernel, str):
            raise TypeError(
                f"{name}: a CUDA C exercise takes the kernel's source text (a str), got {type(kernel).__name__}"
            )
        result = cuda_c.run(ex, kernel, seed, time_limit)
    else:
        if not hasattr(kernel, "__getitem__") or isinstance(kernel, str):
            raise TypeError(
                f"{name}: expected a @cuda.jit kernel, got {type(kernel).__name__}; decorate it with @cuda.jit"
            )
        result = run_check(ex, kernel, functools.partial(launch_numba, time_limit=time_limit), seed)
    if verbose:
        print(result.message)
    if strict and not result.passed:
        raise ExerciseFailed(result.message)
    return result


def hint(name: str, show: bool = True) -> list[str]:
    """Every hint of exercise `name`, from a nudge to the algorithm; printed unless `show=False`."""
    hints = list(_exercise(name).hints)
    if show:
        print("\n".join(f"hint {i}/{len(hints)}: {h}" for i, h in enumerate(hints, start=1)))
    return hints


def catalogue() -> str:
    """A Markdown table of every exercise: notebook, name, language, what the learner writes."""
    rows = ["| notebook | exercise | language | you write |", "|---|---|---|---|"]
    rows += [
        f"| {e.notebook} | `{e.name}` | {'CUDA C' if e.language == 'cuda_c' else 'numba'} | {e.task} |"
        for e in EXERCISES.values()
    ]
    return "\n".join(rows)


# ============================================================================ solutions
def solution_path(name: str) -> Path:
    """Path of the solution `solutions/<notebook prefix>_<name>.py` (or `.cu`) of exercise `name`."""
    ex = _exercise(name)
    prefix = ex.notebook.split("_", 1)[0]
    path = SOLUTIONS_DIR / f"{prefix}_{name}.{'cu' if ex.language == 'cuda_c' else 'py'}"
    if not path.is_file():
        raise FileNotFoundError(
            f"solution {path.name} not found in {SOLUTIONS_DIR}: this installation lacks the package's "
            "solution files (reinstall moonvit_kernels)"
        )
    return path


def solution(name: str, show: bool = True) -> str:
    """The source of exercise `name`'s solution; printed unless `show=False`."""
    text = solution_path(name).read_text(encoding="utf-8")
    if show:
        print(text)
    return text


def load_solution(name: str) -> Any:
    """The solution of exercise `name`, ready for `check`: a compiled kernel (numba) or source text (CUDA C)."""
    path = solution_path(name)
    text = path.read_text(encoding="utf-8")
    if _exercise(name).language == "cuda_c":
        return text
    namespace: dict[str, Any] = {"__name__": f"solution_{name}"}
    exec(compile(text, str(path), "exec"), namespace)
    return namespace[name]
