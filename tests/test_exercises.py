"""The "your turn" exercises: every stub in a notebook fails its check with a helpful message, every
solution passes, and `check` itself catches each kind of bug it promises to explain.

The stubs are read from the notebooks' jupytext sources (the cell holding `# YOUR TURN: <name>`), so
the test checks the stub a learner actually sees.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from numba import cuda, float32

from moonvit_kernels import exercises
from moonvit_kernels.exercises import EXERCISES, CheckResult, ExerciseFailed, check, load_solution, solution

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = list(EXERCISES)

# What the message for each committed stub must say (the stub's particular failure).
STUB_SAYS = {
    "gemm_naive": "never wrote the output",
    "gemm_tile_loads": ("outputs are wrong", "uninitialised memory"),  # empty tiles: garbage or zeros
    "gemm_register_tile": "Every wrong output is exactly 0",
    "rmsnorm_reduction": "outputs are wrong",
    "rmsnorm_sum_and_scale": "never wrote the output",
    "rope_rotate_pairs": "tokens 1–34",
    "rope_token_position": "never wrote the output",
    "rope_qkv_epilogue": "tokens 1–14; columns (q | k | v) 0–31",  # v columns and token (0, 0) are right
    "attention_softmax": "NaN",
    "online_softmax_rescale": "outputs are wrong",
    "merge_index": "outputs are wrong",
    "pos_emb_bilinear": "outputs are wrong",
    "gelu_tanh_epilogue": "outputs are wrong",
    "fused_gather_gemm": ("out of bounds", "outputs are wrong"),  # the simulator raises, a GPU reads garbage
    "swizzle_128b": "tile rows r 1–7, 9–15, 17–20; all columns k",  # rows r % 8 == 0 are not permuted
    "wgmma_desc": "outputs are wrong: all descriptors",
}


def notebook_cells(path: Path) -> list[str]:
    """The code and markdown cells of a jupytext percent-format source, as text."""
    return [c for c in re.split(r"^# %%.*$", path.read_text(), flags=re.M)[1:]]


def stub_cell(name: str) -> str:
    """The notebook cell of exercise `name` (the one marked `# YOUR TURN: name`)."""
    (path,) = NOTEBOOKS.glob(f"{EXERCISES[name].notebook}.py")
    found = [c for c in notebook_cells(path) if re.search(rf"^# YOUR TURN: {name}\b", c, re.M)]
    assert len(found) == 1, f"{path.name}: expected one cell marked '# YOUR TURN: {name}', found {len(found)}"
    return found[0]


def run_stub(name: str) -> CheckResult:
    """Execute every your-turn cell of the notebook up to the exercise's own (they share constants)."""
    (path,) = NOTEBOOKS.glob(f"{EXERCISES[name].notebook}.py")
    namespace = {"cuda": cuda, "np": np, "math": math, "float32": float32}
    for cell in notebook_cells(path):
        marked = re.search(r"^# YOUR TURN: (\w+)", cell, re.M)
        if not marked:
            continue
        if marked.group(1) != name:  # define an earlier cell's constants, without running its check
            exec(compile(cell.replace("result = check(", "_ = ("), path.name, "exec"), namespace)
            continue
        exec(compile(cell, path.name, "exec"), namespace)
        return namespace["result"]
    raise AssertionError(f"no stub for {name}")


def test_every_stage_notebook_has_two_exercises():
    per_notebook: dict[str, int] = {}
    for e in EXERCISES.values():
        per_notebook[e.notebook] = per_notebook.get(e.notebook, 0) + 1
        assert "▼" in stub_cell(e.name) and "▲" in stub_cell(e.name), f"{e.name}: the gap is not marked"
    for stage in ("01", "02", "03", "04", "05", "06"):
        assert sum(n for nb, n in per_notebook.items() if nb.startswith(stage)) >= 2, stage


@pytest.mark.parametrize("name", NAMES)
def test_stub_fails_with_a_helpful_message(name, capsys):
    result = run_stub(name)
    assert isinstance(result, CheckResult)
    assert not result.passed, f"the committed stub of {name} passes its check"
    assert result.message.startswith(f"✗ {name}: not yet")
    says = STUB_SAYS[name]
    assert any(s in result.message for s in ((says,) if isinstance(says, str) else says)), result.message
    assert "hint:" in result.message
    assert result.message in capsys.readouterr().out  # printed for the learner


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes(name):
    result = check(name, load_solution(name), strict=True)
    assert result.passed and result.problems == []
    assert "correct" in result.message


def test_catalogue_lists_every_exercise_once():
    table = exercises.catalogue().splitlines()
    assert len(table) == 2 + len(EXERCISES)
    for name, e in EXERCISES.items():
        assert sum(f"`{name}`" in row and e.notebook in row for row in table) == 1


def test_solution_is_printed_on_request(capsys):
    text = solution("merge_index")
    assert "def merge_index" in text and text in capsys.readouterr().out
    with pytest.raises(ValueError, match="no exercise named"):
        solution("no_such_exercise")


def test_strict_raises_on_a_wrong_kernel():
    with pytest.raises(ExerciseFailed, match="never wrote"):
        check("rope_token_position", _noop_position, strict=True, verbose=False)


def test_unknown_exercise_and_non_kernel_are_clear_errors():
    with pytest.raises(ValueError, match="no exercise named 'gemm'"):
        check("gemm", _noop_position)
    with pytest.raises(TypeError, match="@cuda.jit"):
        check("gemm_naive", lambda *a: None)


@cuda.jit
def _noop_position(grid_thws, cu_seqlens, n_items, pos, L):
    pass


@cuda.jit
def _position_partial(grid_thws, cu_seqlens, n_items, pos, L):
    l = cuda.grid(1)
    if l < 30:  # only the first item
        p = l % 15
        pos[l, 0] = p // 5
        pos[l, 1] = p % 5


@cuda.jit
def _position_no_frame_restart(grid_thws, cu_seqlens, n_items, pos, L):
    l = cuda.grid(1)
    if l < L:
        item = 0 if l < 30 else 1
        w = grid_thws[item, 2]
        p = l - cu_seqlens[item]  # forgets the modulo h·w: frame 2 of the video gets rows 3–5
        pos[l, 0] = p // w
        pos[l, 1] = p % w


@cuda.jit
def _position_past_the_end(grid_thws, cu_seqlens, n_items, pos, L):
    l = cuda.grid(1)  # no bounds test: 64 threads for 42 tokens
    if l < pos.shape[0] + 2:  # writes into the guard rows only on a GPU; the simulator raises IndexError
        pos[l, 0] = 0


def test_partial_write_names_the_rows_never_written():
    result = check("rope_token_position", _position_partial, verbose=False)
    assert not result.passed
    assert "24 of 84 outputs were never written: tokens 30–41; all entries" in result.message


def test_wrong_rows_are_named():
    result = check("rope_token_position", _position_no_frame_restart, verbose=False)
    assert not result.passed
    assert "outputs are wrong: tokens 15–29; entries (0 = row, 1 = col) 0" in result.message


def test_out_of_bounds_is_reported_not_raised():
    result = check("rope_token_position", _position_past_the_end, verbose=False)
    assert not result.passed
    assert "out of bounds" in result.message or "past the last" in result.message


def test_results_that_change_between_runs_suspect_a_race(monkeypatch):
    runs = []
    real_launch = exercises._launch

    def flaky_launch(kernel, case):
        got, guard = real_launch(kernel, case)
        runs.append(1)
        if len(runs) == 2:
            got = got.copy()
            got[3, 1] += 1  # the second run differs in one element, as a race would make it
        return got, guard

    monkeypatch.setattr(exercises, "_launch", flaky_launch)
    result = check("rope_token_position", load_solution("rope_token_position"), verbose=False)
    assert not result.passed
    assert "a race is suspected" in result.message and "tokens 3; entries (0 = row, 1 = col) 1" in result.message


def test_nan_and_zeros_are_explained():
    @cuda.jit
    def nan_kernel(q, k, v, out, L, scale):
        i = cuda.grid(1)
        if i < L:
            for d in range(v.shape[1]):
                out[i, d] = math.nan if i == 4 else float32(0.0)

    result = check("attention_softmax", nan_kernel, verbose=False)
    assert "1 of 368" not in result.message  # NaN counted per element, not per row
    assert "16 outputs are NaN (queries 4; all dims)" in result.message
    assert "exactly 0: nothing was accumulated" in result.message


def test_a_kernel_edit_is_picked_up_without_caching():
    # The same name, redefined: check sees the new kernel (nothing cached by name).
    namespace = {"cuda": cuda, "float32": float32}
    src = "@cuda.jit\ndef rope_token_position(g, c, n, pos, L):\n    pass\n"
    exec(src, namespace)
    assert not check("rope_token_position", namespace["rope_token_position"], verbose=False).passed
    exec(exercises.solution_path("rope_token_position").read_text(), namespace)
    assert check("rope_token_position", namespace["rope_token_position"], verbose=False).passed


def test_ranges_are_compact():
    assert exercises._ranges([0, 1, 2, 5, 7, 8]) == "0–2, 5, 7–8"
    assert exercises._ranges(list(range(0, 40, 2)), limit=3) == "0, 2, 4, …"
