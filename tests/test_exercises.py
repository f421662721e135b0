"""The "your turn" exercises: every stub in a notebook fails its check with a helpful message, every
solution passes, every planted wrong kernel is rejected with a message that points at its bug, and
`check` itself catches each kind of bug it promises to explain.

The stubs are read from the notebooks' jupytext sources (the cell holding `# YOUR TURN: <name>`), so
the test checks the stub a learner actually sees. The planted kernels are one- or two-line edits of
the solutions (`PLANTS`): the plausible slips a learner makes, including those an earlier, single-case
checker let through (thread axes swapped on a square grid, no block offsets on a one-block case, two
frames and ÷kh where t = kh = 2, uncoalesced tile staging in the exercise that teaches coalescing).
"""

from __future__ import annotations

import linecache
import math
import re
from pathlib import Path

import numpy as np
import pytest
from numba import cuda, float32

from moonvit_kernels import exercises
from moonvit_kernels.exercises import EXERCISES, CheckResult, ExerciseFailed, check, hint, load_solution, solution
from moonvit_kernels.exercises import core as checker
from moonvit_kernels.tools.emulation import build

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = list(EXERCISES)
CUDA_C = [n for n in NAMES if EXERCISES[n].language == "cuda_c"]
needs_cxx = pytest.mark.skipif(build.compiler() is None, reason="no C++ compiler (g++ >= 11) for the CUDA C emulator")


def _marks(name: str) -> list:
    return [needs_cxx] if EXERCISES[name].language == "cuda_c" else []


# What the message for each committed stub must say (the stub's particular failure).
STUB_SAYS = {
    "warm_map": "never wrote the output",
    "warm_guard": "never wrote the output",
    "warm_broadcast_2d": "never wrote the output",
    "warm_shared_window": "never wrote the output",
    "warm_block_sum": "never wrote the output",
    "warm_scan": "never wrote the output",
    "warm_transpose": "never wrote the output",
    "gemm_naive": "never wrote the output",
    "gemm_tile_loads": ("outputs are wrong", "uninitialised memory", "race"),  # empty tiles: garbage or zeros
    "gemm_register_tile": "never wrote the output",
    "rmsnorm_reduction": "outputs are wrong",
    "rmsnorm_sum_and_scale": "never wrote the output",
    "rope_rotate_pairs": "tokens 1–34",
    "rope_token_position": "never wrote the output",
    "rope_qkv_epilogue": "tokens 1–14; columns (q | k | v) 0–31",  # v columns and token (0, 0) are right
    "attention_softmax": "NaN",
    "online_softmax_rescale": "never rescales",
    "flash_attention_tiles": ("never wrote the output", "NaN"),
    "merge_index": "outputs are wrong",
    "pos_emb_bilinear": "align_corners=True formula",
    "gelu_tanh_epilogue": "outputs are wrong",
    "fused_gather_gemm": ("out of bounds", "outputs are wrong"),  # the simulator raises, a GPU reads garbage
    "swizzle_128b": "tile rows r 1–7, 9–15, 17–20; all columns k",  # rows r % 8 == 0 are not permuted
    "wgmma_desc": "outputs are wrong: all descriptors",
    "rmsnorm_warp_sum": "scale by their own partial sums",
    "mma_fragments": "never wrote the output",
}

# Planted wrong kernels: exercise -> [(what the slip is, [(solution text, replacement), ...], what the verdict
# must say)]. Each replaced text must occur exactly once in the solution.
PLANTS: dict[str, list[tuple[str, list[tuple[str, str]], str]]] = {
    "warm_map": [
        ("forgets the + 1", [("2 * a[i] + 1", "2 * a[i]")], "off by the same -1"),
        ("indexes by block", [("i = cuda.threadIdx.x", "i = cuda.blockIdx.x")], "31 of 32 outputs were never written"),
    ],
    "warm_guard": [
        ("no bounds test", [("if i < n:", "if True:")], "out of bounds"),
        ("off-by-one bound", [("if i < n:", "if i <= n:")], "out of bounds"),
        ("ignores the block", [("cuda.blockIdx.x * cuda.blockDim.x + ", "")], "case 2 of 3"),
        ("blockDim hard-coded as 16", [("cuda.blockIdx.x * cuda.blockDim.x", "cuda.blockIdx.x * 16")], "a fixed 16"),
        ("blockDim hard-coded as 64", [("cuda.blockIdx.x * cuda.blockDim.x", "cuda.blockIdx.x * 64")], "a fixed 64"),
    ],
    "warm_broadcast_2d": [
        (
            "rows along x",
            [
                (
                    "c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x",
                    "c = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y",
                ),
                (
                    "r = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y",
                    "r = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x",
                ),
            ],
            "r and c swapped",
        ),  # fmt: skip
        ("forgets blockIdx.y", [("r = cuda.blockIdx.y * cuda.blockDim.y + ", "r = ")], "never written: rows r 4–10"),
        (
            "blockDim hard-coded as 8×4",
            [
                ("cuda.blockIdx.x * cuda.blockDim.x", "cuda.blockIdx.x * 8"),
                ("cuda.blockIdx.y * cuda.blockDim.y", "cuda.blockIdx.y * 4"),
            ],
            "by 8 and blockIdx.y by 4 (the first case's block)",
        ),  # fmt: skip
    ],
    "warm_shared_window": [
        (
            "no halo",
            [
                ("tile[0] = a[i - 1] if i > 0 else float32(0.0)", "tile[0] = float32(0.0)"),
                ("tile[THREADS + 1] = a[i + 1] if i + 1 < n else float32(0.0)", "tile[THREADS + 1] = float32(0.0)"),
            ],
            "never loads the halo",
        ),  # fmt: skip
        ("unguarded halo read", [("a[i + 1] if i + 1 < n else float32(0.0)", "a[i + 1]")], "out of bounds"),
    ],
    "warm_block_sum": [
        (
            "a barrier in each branch",  # issue 28, class 5: threads of one block wait at two syncthreads() sites
            [
                (
                    "        cuda.syncthreads()  # outside the if: every thread of the block reaches it\n"
                    "        if t < stride:\n",
                    "        if t < stride:\n            cuda.syncthreads()\n",
                ),
                (
                    "            partial[t] += partial[t + stride]\n",
                    "            partial[t] += partial[t + stride]\n        else:\n            cuda.syncthreads()\n",
                ),
            ],
            "divergent barrier",
        ),  # fmt: skip
        ("tree starts at 8", [("stride = THREADS // 2", "stride = THREADS // 4")], "starts at stride 8"),
        ("one element per thread", [("x1 = a[base + THREADS + t] if", "x1 = float32(0.0) if")], "only one element"),
        (
            "unguarded second load",
            [("a[base + THREADS + t] if base + THREADS + t < n else", "a[base + THREADS + t] if True else")],
            "out of bounds",
        ),  # fmt: skip
    ],
    "warm_scan": [
        ("exclusive", [("out[i] = buf[t]", "out[i] = buf[t] - a[i]")], "exclusive scan"),
        ("stops early", [("while d < THREADS:", "while d < THREADS // 2:")], "stops after offset 8"),
    ],
    "warm_transpose": [
        (
            "writes out straight from a",
            [
                ("tile[ty + j, tx] = a[r0 + ty + j, c0 + tx]", "out[c0 + tx, r0 + ty + j] = a[r0 + ty + j, c0 + tx]"),
                ("out[c0 + ty + j, r0 + tx] = tile[tx, ty + j]", "pass"),
            ],
            "the store to out",
        ),  # fmt: skip
        ("unpadded tile", [("(TILE, TILE + 1)", "(TILE, TILE)")], "32.0-way bank conflicts"),
        ("padded by two", [("(TILE, TILE + 1)", "(TILE, TILE + 2)")], "2.0-way bank conflicts"),
    ],
    "gemm_naive": [
        (
            "m and n swapped",
            [
                (
                    "n = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x",
                    "n = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y",
                ),
                (
                    "m = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y",
                    "m = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x",
                ),
            ],
            "m and n swapped",
        ),  # fmt: skip
        ("no bounds test", [("if m < M and n < N:", "if True:")], "out of bounds"),
        (
            "blockDim hard-coded as 16",
            [
                ("cuda.blockIdx.x * cuda.blockDim.x", "cuda.blockIdx.x * 16"),
                ("cuda.blockIdx.y * cuda.blockDim.y", "cuda.blockIdx.y * 16"),
            ],
            "multiplies blockIdx by 16",
        ),
    ],
    "gemm_tile_loads": [
        (
            "uncoalesced staging",
            [
                (
                    "a_tile[ty, tx] = A[m0 + ty, k0 + tx] if (m0 + ty < M and k0 + tx < K)",
                    "a_tile[tx, ty] = A[m0 + tx, k0 + ty] if (m0 + tx < M and k0 + ty < K)",
                ),
                (
                    "b_tile[ty, tx] = B[n0 + ty, k0 + tx] if (n0 + ty < N and k0 + tx < K)",
                    "b_tile[tx, ty] = B[n0 + tx, k0 + ty] if (n0 + tx < N and k0 + ty < K)",
                ),
            ],
            "sectors per warp request",
        ),  # fmt: skip
        ("no zero fill past K", [("if (m0 + ty < M and k0 + tx < K)", "if (m0 + ty < M)")], "out of bounds"),
        (
            "B rows by tx",
            [("B[n0 + ty, k0 + tx] if (n0 + ty < N", "B[n0 + tx, k0 + tx] if (n0 + tx < N")],
            "outputs are wrong",
        ),
    ],
    "gemm_register_tile": [
        (
            "no block offsets",
            [("m0 = cuda.blockIdx.y * TM * TILE", "m0 = 0"), ("n0 = cuda.blockIdx.x * TN * TILE", "n0 = 0")],
            "every block except block (0, 0)",
        ),
        ("register rows mismatched", [("a_tile[ty * TM + i, kk]", "a_tile[ty + i * TILE, kk]")], "outputs are wrong"),
    ],
    "rmsnorm_reduction": [
        ("tree starts at 8", [("stride = THREADS // 2", "stride = THREADS // 4")], "a different one per row"),
        (
            "overwrites instead of adding",
            [("partial[tid] += partial[tid + stride]", "partial[tid] = partial[tid + stride]")],
            "a different one per row",
        ),  # fmt: skip
    ],
    "rmsnorm_sum_and_scale": [
        (
            "divides by THREADS",
            [("partial[0] / float32(cols)", "partial[0] / float32(THREADS)")],
            "a different one per row",
        ),
        (
            "one column per thread",
            [("for j in range(tid, cols, THREADS):  # columns", "for j in range(tid, THREADS, THREADS):  #")],
            "a different one per row",
        ),  # fmt: skip
        (
            "contiguous chunk per thread",
            [
                (
                    "for j in range(tid, cols, THREADS):  # columns",
                    "chunk = (cols + THREADS - 1) // THREADS\n"
                    "    for j in range(tid * chunk, min(cols, tid * chunk + chunk)):  #",
                ),
                (
                    "for j in range(tid, cols, THREADS):\n        out[row, j]",
                    "for j in range(tid * chunk, min(cols, tid * chunk + chunk)):\n        out[row, j]",
                ),
            ],
            "is uncoalesced",
        ),  # fmt: skip
    ],
    "rope_rotate_pairs": [
        (
            "axes swapped",
            [("cols[l] if pair == 0 else rows[l]", "rows[l] if pair == 0 else cols[l]")],
            "width pair by the row",
        ),
        (
            "frequency exponent 2i",
            [("float32(4 * i) / float32(head_dim)", "float32(2 * i) / float32(head_dim)")],
            "outputs are wrong",
        ),  # fmt: skip
    ],
    "rope_token_position": [
        (
            "frames do not restart",
            [("p = (l - cu_seqlens[item]) % (h * w)", "p = l - cu_seqlens[item]")],
            "do not restart",
        ),
        (
            "divides by h",
            [("pos[l, 0] = p // w", "pos[l, 0] = p // h"), ("pos[l, 1] = p % w", "pos[l, 1] = p % h")],
            "outputs are wrong",
        ),  # fmt: skip
    ],
    "rope_qkv_epilogue": [
        ("rotates v too", [("if c < 2 * Q:", "if True:")], "rotates the v columns too"),
        ("dim not reduced mod head_dim", [("d = c % head_dim", "d = c")], "outputs are wrong"),
    ],
    "attention_softmax": [
        ("no max subtracted", [("p = math.exp(s * scale - m)", "p = math.exp(s * scale)")], "overflow"),
        (
            "last key skipped",
            [("for j in range(L):  # pass 2", "for j in range(L - 1):  # pass 2")],
            "outputs are wrong",
        ),
    ],
    "online_softmax_rescale": [
        ("never rescales", [("alpha = math.exp(m - m_new)", "alpha = float32(1.0)")], "never rescales"),
        (
            "rescales l only",
            [("acc[d] = acc[d] * alpha + p * v[j, d]", "acc[d] = acc[d] + p * v[j, d]")],
            "outputs are wrong",
        ),
    ],
    "flash_attention_tiles": [
        ("never rescales", [("alpha = math.exp(m_i - m_new)", "alpha = float32(1.0)")], "never rescales"),
        ("keys past the item not masked", [("s = float32(-math.inf)", "pass")], "does not mask the keys"),
        ("query not scaled", [("q[row, tx] * scale if", "q[row, tx] if")], "outputs are wrong"),
    ],
    "merge_index": [
        (
            "slot split by kh",
            [("a = slot // kw", "a = slot // kh"), ("b = slot % kw", "b = slot % kh")],
            "merge kh×kw = 2×3",
        ),
        ("sum, not mean", [("out[m, col] = acc / float32(t)", "out[m, col] = acc")], "2× the expected one"),
    ],
    "fused_gather_gemm": [
        (
            "2 frames, ÷kh",
            [("for f in range(t):", "for f in range(2):"), ("a / float32(t)", "a / float32(kh)")],
            "averages 2 frames and divides by kh",
        ),  # fmt: skip
        ("÷kh", [("a / float32(t)", "a / float32(kh)")], "divides the frame sum by kh"),
        (
            "slot split by kh",
            [("slot // kw) * w + (kw * j + slot % kw)", "slot // kh) * w + (kw * j + slot % kh)")],
            "case 2 of 2",
        ),  # fmt: skip
    ],
    "pos_emb_bilinear": [
        (
            "align_corners=True",
            [
                (
                    "max((float32(r) + float32(0.5)) * float32(H0) / float32(h) - float32(0.5), float32(0.0))",
                    "float32(r) * float32(H0 - 1) / float32(h - 1)",
                ),
                (
                    "max((float32(c) + float32(0.5)) * float32(W0) / float32(w) - float32(0.5), float32(0.0))",
                    "float32(c) * float32(W0 - 1) / float32(w - 1)",
                ),
            ],
            "align_corners=True formula",
        ),  # fmt: skip
        (
            "H0 and W0 swapped",
            [
                ("float32(H0) / float32(h)", "float32(W0) / float32(h)"),
                ("float32(W0) / float32(w)", "float32(H0) / float32(w)"),
            ],
            "scales rows by W0/h",
        ),  # fmt: skip
    ],
    "gelu_tanh_epilogue": [
        (
            "erf form",
            [
                (
                    "float32(0.5) * v * (float32(1.0) + math.tanh(GELU_C * (v + float32(0.044715) * v * v * v)))",
                    "float32(0.5) * v * (float32(1.0) + math.erf(v / math.sqrt(2.0)))",
                )
            ],
            "erf form",
        ),  # fmt: skip
        ("missing 0.5", [("C[m, n] = float32(0.5) * v *", "C[m, n] = v *")], "2× the expected one"),
    ],
    "swizzle_128b": [
        ("XOR with r", [("(chunk ^ (r % 8))", "(chunk ^ r)")], "tile rows r 8–20; all columns k"),
        ("chunk of k, not of bytes", [("chunk = byte // 16", "chunk = k // 16")], "outputs are wrong"),
    ],
    "wgmma_desc": [
        ("address not masked", [("(addr & 0x3FFFF) >> 4", "addr >> 4")], "case 2 of 2"),
        ("mode at bit 12", [("mode << 14", "mode << 12")], "16-bit words (0 start, 1 LBO, 2 SBO, 3 mode) 3"),
    ],
    "rmsnorm_warp_sum": [
        (
            "no reduction across lanes",
            [("for (int offset = 16; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffffu, s, offset);", "")],
            "scale by their own partial sums",
        ),
        ("divides by 32", [("rsqrtf(s / cols + eps)", "rsqrtf(s / 32 + eps)")], "a different one per row"),
        (
            "half-warp mask",  # issue 28, class 3: 0xffff names lanes 0-15 while all 32 lanes shuffle
            [("__shfl_xor_sync(0xffffffffu, s, offset)", "__shfl_xor_sync(0xffffu, s, offset)")],
            "bad warp mask: __shfl_xor_sync(0x0000ffff, ...) at module.cpp:9",
        ),  # fmt: skip
    ],
    "mma_fragments": [
        (
            "a[1] and a[2] swapped",
            [
                ("a[1] = pair(A, M, K, m0 + g + 8, k0 + 2 * c);", "a[1] = pair(A, M, K, m0 + g, k0 + 2 * c + 8);"),
                ("a[2] = pair(A, M, K, m0 + g, k0 + 2 * c + 8);", "a[2] = pair(A, M, K, m0 + g + 8, k0 + 2 * c);"),
            ],
            "outputs are wrong",
        ),  # fmt: skip
        ("no column bound on the store", [("if (m < M && n < N)", "if (m < M)")], "past the end of the output"),
    ],
}


def notebook_cells(path: Path) -> list[str]:
    """The code and markdown cells of a jupytext percent-format source, as text."""
    return [c for c in re.split(r"^# %%.*$", path.read_text(encoding="utf-8"), flags=re.M)[1:]]


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


def planted(name: str, edits: list[tuple[str, str]]):
    """The solution of `name` with `edits` applied (each text found exactly once): a kernel or CUDA C source."""
    text = solution(name, show=False)
    for old, new in edits:
        assert text.count(old) == 1, f"{name}: the plant's text {old!r} occurs {text.count(old)} times in the solution"
        text = text.replace(old, new)
    if EXERCISES[name].language == "cuda_c":
        return text
    filename = f"planted_{name}.py"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)  # as IPython does for cells
    namespace: dict = {"__name__": f"planted_{name}"}
    exec(compile(text, filename, "exec"), namespace)
    return namespace[name]


PLANT_CASES = [
    pytest.param(name, what, edits, says, id=f"{name}-{what.replace(' ', '_')}", marks=_marks(name))
    for name, plants in PLANTS.items()
    for what, edits, says in plants
]


def test_the_course_has_its_exercises():
    by_notebook: dict[str, int] = {}
    for e in EXERCISES.values():
        by_notebook[e.notebook] = by_notebook.get(e.notebook, 0) + 1
        assert "▼" in stub_cell(e.name) and "▲" in stub_cell(e.name), f"{e.name}: the gap is not marked"
        assert len(e.hints) >= 2, f"{e.name}: hints go from a nudge to the algorithm"
    assert len(EXERCISES) >= 24
    assert by_notebook["00a_warmups"] >= 6
    assert len(CUDA_C) >= 2
    assert "flash_attention_tiles" in EXERCISES
    for stage in ("01", "02", "03", "04", "05", "06", "08"):
        assert sum(n for nb, n in by_notebook.items() if nb.startswith(stage)) >= 2, stage


def test_every_exercise_has_two_plants_and_several_cases():
    rng = np.random.default_rng(0)
    for name, e in EXERCISES.items():
        assert len(PLANTS.get(name, [])) >= 2, f"{name}: plant at least two wrong kernels"
        cases = e.cases(rng)
        assert 2 <= len(cases) <= 3, f"{name}: {len(cases)} cases"
        assert all(c.label for c in cases), f"{name}: every case says what it exercises"
        shapes = {(c.out_shape, str(c.grid)) for c in cases}
        assert len(shapes) == len(cases), f"{name}: two cases with the same launch test the same thing"


def test_stubs_carry_no_algorithm():
    """The stubs leave the thinking to the learner: no hint sentence is pasted into a stub."""
    for name, e in EXERCISES.items():
        cell = stub_cell(name)
        for h in e.hints:
            for sentence in re.split(r"(?<=[.:;])\s+", h):
                if len(sentence) > 40:
                    assert sentence not in cell, f"{name}: the stub quotes its hint: {sentence!r}"


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in NAMES])
def test_stub_fails_with_a_helpful_message(name, capsys):
    result = run_stub(name)
    assert isinstance(result, CheckResult)
    assert not result.passed, f"the committed stub of {name} passes its check"
    assert result.message.startswith(f"✗ {name}: not yet")
    says = STUB_SAYS[name]
    assert any(s in result.message for s in ((says,) if isinstance(says, str) else says)), result.message
    assert "hint:" in result.message and f'hint("{name}")' in result.message
    assert result.message in capsys.readouterr().out  # printed for the learner


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in NAMES])
def test_solution_passes(name):
    result = check(name, load_solution(name), strict=True, verbose=False)
    assert result.passed and result.problems == []
    assert "correct on all" in result.message


@pytest.mark.parametrize(("name", "what", "edits", "says"), PLANT_CASES)
def test_planted_wrong_kernel_is_rejected_with_its_bug_named(name, what, edits, says):
    result = check(name, planted(name, edits), verbose=False)
    assert not result.passed, f"{name}: the planted kernel ({what}) passes"
    assert says in result.message, f"{name} ({what}): the verdict does not say {says!r}:\n{result.message}"


# Seeds at which an earlier flash checker (random scores only) accepted the unmasked tile (issue 28).
FLASH_SEEDS = (0, 2, 3, 4, 17, 18)


@pytest.mark.parametrize("seed", FLASH_SEEDS)
def test_an_unmasked_flash_tile_fails_at_every_seed(seed):
    """The case whose scores are all negative makes the unmasked tail keys (score 0) dominate at any seed."""
    ((_, edits, _),) = [p for p in PLANTS["flash_attention_tiles"] if p[0] == "keys past the item not masked"]
    result = check("flash_attention_tiles", planted("flash_attention_tiles", edits), seed=seed, verbose=False)
    assert not result.passed and "does not mask the keys past the item's end" in result.message, result.message
    assert check("flash_attention_tiles", load_solution("flash_attention_tiles"), seed=seed, verbose=False).passed


def test_the_checkers_teach_what_the_notebooks_teach():
    """A blockDim written as a number fails (the cases change the block size); a transpose tile padded to 34
    is 2-way conflicted and slow (notebook 07: 33 is conflict-free, 34 costs 2 wavefronts); a contiguous chunk
    of the row per thread in RMSNorm is uncoalesced, on the loads of x."""
    assert len({c.block for c in EXERCISES["warm_guard"].cases(np.random.default_rng(0))}) >= 3
    from numba import config

    if not config.ENABLE_CUDASIM:
        pytest.skip("coalescing and bank conflicts are traced only under the CUDA simulator")
    plants = {(n, what): edits for n, ps in PLANTS.items() for what, edits, _ in ps}
    result = check(
        "warm_transpose", planted("warm_transpose", plants["warm_transpose", "padded by two"]), verbose=False
    )
    assert not result.passed and "but slow" in result.message and "33 words, not 34" in result.message
    chunked = planted("rmsnorm_sum_and_scale", plants["rmsnorm_sum_and_scale", "contiguous chunk per thread"])
    result = check("rmsnorm_sum_and_scale", chunked, verbose=False)
    assert not result.passed and "but slow" in result.message
    assert "the load of x (line" in result.message and "is uncoalesced" in result.message
    assert "12 bytes apart" in result.message  # a chunk of 3 columns of 4 bytes


def test_catalogue_lists_every_exercise_once():
    table = exercises.catalogue().splitlines()
    assert len(table) == 2 + len(EXERCISES)
    for name, e in EXERCISES.items():
        assert sum(f"`{name}`" in row and e.notebook in row for row in table) == 1


def test_solution_and_hints_are_printed_on_request(capsys):
    text = solution("merge_index")
    assert "def merge_index" in text and text in capsys.readouterr().out
    hints = hint("gemm_naive")
    out = capsys.readouterr().out
    assert len(hints) >= 2 and all(h in out for h in hints) and out.startswith("hint 1/")
    with pytest.raises(ValueError, match="no exercise named"):
        solution("no_such_exercise")
    with pytest.raises(ValueError, match="no exercise named"):
        hint("no_such_exercise")


def test_strict_raises_on_a_wrong_kernel():
    with pytest.raises(ExerciseFailed, match="never wrote"):
        check("rope_token_position", _noop_position, strict=True, verbose=False)


def test_unknown_exercise_and_wrong_kernel_types_are_clear_errors():
    with pytest.raises(ValueError, match="no exercise named 'gemm'"):
        check("gemm", _noop_position)
    with pytest.raises(TypeError, match="@cuda.jit"):
        check("gemm_naive", lambda *a: None)
    with pytest.raises(TypeError, match="source text"):
        check("rmsnorm_warp_sum", _noop_position)


@needs_cxx
def test_cuda_c_compile_errors_and_missing_kernels_are_reported():
    result = check("rmsnorm_warp_sum", 'extern "C" __global__ void other(float* x) {}', verbose=False)
    assert not result.passed and 'no extern "C" __global__ void rmsnorm_warp_sum' in result.message
    broken = (
        'extern "C" __global__ void rmsnorm_warp_sum(const float* x, const float* w, float* o, int c, float e) '
        "{ y = 1; }"
    )
    result = check("rmsnorm_warp_sum", broken, verbose=False)
    assert not result.passed and "does not compile" in result.message
    assert "your source, line 1" in result.message and "was not declared" in result.message


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
def _position_past_the_end(grid_thws, cu_seqlens, n_items, pos, L):
    l = cuda.grid(1)  # no bounds test: 64 threads for 42 tokens
    if l < pos.shape[0] + 2:  # writes into the guard rows only on a GPU; the simulator raises IndexError
        pos[l, 0] = 0


def test_partial_write_names_the_rows_never_written():
    result = check("rope_token_position", _position_partial, verbose=False)
    assert not result.passed
    assert "24 of 84 outputs were never written: tokens 30–41 (item 1 only); all entries" in result.message


def test_out_of_bounds_is_reported_not_raised():
    result = check("rope_token_position", _position_past_the_end, verbose=False)
    assert not result.passed
    assert "out of bounds" in result.message or "past the end" in result.message


def test_results_that_change_between_runs_suspect_a_race():
    real = checker.run_check
    runs = []

    def flaky_launch(kernel, case):
        from moonvit_kernels.exercises.launch import launch_numba

        got, guard = launch_numba(kernel, case)
        runs.append(1)
        if len(runs) == 2:
            got = got.copy()
            got[3, 1] += 1  # the second run differs in one element, as a race would make it
        return got, guard

    result = real(EXERCISES["rope_token_position"], load_solution("rope_token_position"), flaky_launch)
    assert not result.passed
    assert (
        "race: the output depends on the order of the threads" in result.message
        and "tokens 3 (item 0 only); entries (0 = row, 1 = col) 1" in result.message
    )


def test_nan_and_zeros_are_explained():
    @cuda.jit
    def nan_kernel(q, k, v, out, L, scale):
        i = cuda.grid(1)
        if i < L:
            for d in range(v.shape[1]):
                out[i, d] = math.nan if i == 4 else float32(0.0)

    result = check("attention_softmax", nan_kernel, verbose=False)
    assert "16 outputs are NaN (queries 4; all dims)" in result.message
    assert "exactly 0: nothing was accumulated" in result.message


def test_a_kernel_edit_is_picked_up_without_caching():
    # The same name, redefined: check sees the new kernel (nothing cached by name).
    namespace = {"cuda": cuda, "float32": float32}
    exec("@cuda.jit\ndef rope_token_position(g, c, n, pos, L):\n    pass\n", namespace)
    assert not check("rope_token_position", namespace["rope_token_position"], verbose=False).passed
    exec(exercises.solution_path("rope_token_position").read_text(), namespace)
    assert check("rope_token_position", namespace["rope_token_position"], verbose=False).passed


def test_ranges_are_compact():
    assert exercises.ranges([0, 1, 2, 5, 7, 8]) == "0–2, 5, 7–8"
    assert exercises.ranges(list(range(0, 40, 2)), limit=3) == "0, 2, 4, …"


def test_patterns_name_the_kind_of_bug():
    """The generic patterns on a hand-made 2×2-block output: block (0, 0) only, one factor, one offset, a shift."""
    want = np.arange(1.0, 1.0 + 8 * 6).reshape(8, 6)
    case = checker.Case([], want.shape, (2, 2), (4, 3), want, 1e-9, "out", out_tile=(4, 3))
    only_first = np.full_like(want, checker.SENTINEL)
    only_first[:4, :3] = want[:4, :3]
    assert "every block except block (0, 0)" in " ".join(checker.diagnose(case, only_first.astype(np.float32), None))
    assert "0.5× the expected one" in " ".join(checker.diagnose(case, (want / 2).astype(np.float32), None))
    assert "off by the same +3" in " ".join(checker.diagnose(case, (want + 3).astype(np.float32), None))
    noisy = np.random.default_rng(0).standard_normal(want.shape)
    case.expected = noisy
    shifted = np.roll(noisy, 1, axis=1)
    shifted[:, 0] = noisy[:, 0]
    assert "previous entry along columns" in " ".join(checker.diagnose(case, shifted.astype(np.float32), None))
