"""Interleaved 2D RoPE with width/height slots, applied in place to q and k, every tier."""

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from compile_tier import assert_cuda_stage_builds, assert_numba_stage_compiles, cuda_archs
from cuda_kernel_checks import (
    check_rope,
)
from formulations import (
    TIGHT,
    rnd,
    rope_angles_by_hand,
    rope_complex,
    rope_rotate_half,
)
from helpers import assert_close
from tiers import EMULATOR, GPU_GRID, GPU_L, K3, gpu_rand

from moonvit_kernels import reference as ref
from moonvit_kernels.numba_backend import launch
from moonvit_kernels.numba_backend import rope as R
from moonvit_kernels.numba_backend.launch import cu_seqlens_table, grid_table
from moonvit_kernels.tools import compile_check
from moonvit_kernels.tools.xray import sass

# ============================================================================
# reference: against the second formulations in tests/formulations.py


def single_pair_errors(rope_fn, angle_fn) -> float:
    """Max error of `rope_fn` vs docs/model.md's by-hand rule on vectors with one nonzero pair."""
    h, w = 3, 5
    angles = angle_fn(h, w, HD)
    worst = 0.0
    rng = np.random.default_rng(51)
    for r in range(h):
        for c in range(w):
            for i in range(HD // 4):
                f = 10000.0 ** (-4 * i / HD)
                for first, turn in ((4 * i, c * f), (4 * i + 2, r * f)):
                    a, b = rng.uniform(0.5, 2.0, 2) * rng.choice([-1, 1], 2)
                    x = np.zeros((1, 1, HD))
                    x[0, 0, first], x[0, 0, first + 1] = a, b
                    want = np.zeros(HD)
                    want[first] = a * math.cos(turn) - b * math.sin(turn)
                    want[first + 1] = a * math.sin(turn) + b * math.cos(turn)
                    got = rope_fn(x, angles[r * w + c : r * w + c + 1])[0, 0]
                    worst = max(worst, float(np.abs(got - want).max()))
    return worst


class TestReference:
    pytestmark = [pytest.mark.reference]

    def test_rope_angles_match_spec_words(self):
        assert_close(ref.rope_angles(3, 5, HD, np.float64), rope_angles_by_hand(3, 5, HD), 1e-14, 0, "angles")
        f = ref.rope_frequencies(HD)
        assert f.dtype == np.float32
        assert_close(f, [10000.0 ** (-4 * i / HD) for i in range(HD // 4)], 1e-6, 0, "f_i (fp32)")

    def test_apply_rope_equals_complex_form(self):
        h, w = 3, 5
        x = rnd((h * w, 2, HD), 50)
        angles = ref.rope_angles(h, w, HD, np.float64)
        assert_close(ref.apply_rope(x, angles), rope_complex(x, angles), **TIGHT, name="rope")

    def test_rope_single_pair_by_hand(self):
        def angles(h, w, hd):
            return ref.rope_angles(h, w, hd, np.float64)

        assert single_pair_errors(ref.apply_rope, angles) < 1e-12
        # The same check catches the two classic mistakes: rotate-half, and width/height slots swapped.
        assert single_pair_errors(rope_rotate_half, angles) > 0.1
        assert single_pair_errors(ref.apply_rope, lambda h, w, hd: rope_angles_by_hand(h, w, hd, swap=True)) > 0.1

    def test_rope_rotate_half_fails_the_complex_form_check(self):
        x = rnd((15, 2, HD), 52)
        angles = ref.rope_angles(3, 5, HD, np.float64)
        with pytest.raises(AssertionError):
            assert_close(rope_rotate_half(x, angles), rope_complex(x, angles), **TIGHT, name="rotate-half")

    def test_rope_scores_depend_only_on_relative_offset(self):
        h, w = 6, 7
        angles = ref.rope_angles(h, w, HD, np.float64)
        q, k = rnd((1, 1, HD), 53), rnd((1, 1, HD), 54)

        def score(pq, pk):
            rq = ref.apply_rope(q, angles[pq[0] * w + pq[1]][None])
            rk = ref.apply_rope(k, angles[pk[0] * w + pk[1]][None])
            return float(np.dot(rq.ravel(), rk.ravel()))

        pairs = [((1, 2), (3, 1)), ((0, 4), (5, 0)), ((2, 2), (2, 6)), ((4, 0), (0, 5))]
        for pq, pk in pairs:
            base = score(pq, pk)
            for dr, dc in ((1, 0), (0, 1), (-1, 1)):
                sq, sk = (pq[0] + dr, pq[1] + dc), (pk[0] + dr, pk[1] + dc)
                if all(0 <= p[0] < h and 0 <= p[1] < w for p in (sq, sk)):
                    assert math.isclose(score(sq, sk), base, rel_tol=1e-10, abs_tol=1e-10), (pq, pk, dr, dc)
        # ... and does depend on the offset (the check is not vacuous): row and column offsets both matter.
        assert abs(score((1, 2), (3, 1)) - score((1, 2), (3, 2))) > 1e-3
        assert abs(score((1, 2), (3, 1)) - score((1, 2), (4, 1))) > 1e-3

    def test_rope_frames_reuse_the_2d_table(self):
        grid = np.array([[1, 2, 3], [3, 4, 2]])
        packed = ref.rope_angles_packed(grid, HD, np.float64)
        assert packed.shape == (6 + 3 * 8, HD // 2)
        assert np.array_equal(packed[:6], ref.rope_angles(2, 3, HD, np.float64))
        table = ref.rope_angles(4, 2, HD, np.float64)
        for f in range(3):
            assert np.array_equal(packed[6 + 8 * f : 6 + 8 * (f + 1)], table)


# ============================================================================
# numba kernel (the CUDA simulator without a GPU)
HEADS, HD = 2, 24  # head_dim a multiple of 4 but not a power of two


Q = HEADS * HD


GRID = np.array([(1, 4, 6), (3, 2, 5)])  # an image and a video; h != w so swapped slots fail


def qkv_data(L: int, seed: int) -> np.ndarray:
    r = np.random.default_rng(seed)
    return (r.standard_normal((L, 3 * Q)) + r.uniform(-0.5, 0.5, (1, 3 * Q))).astype(np.float32)


def expected(qkv: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Reference: rotate q and k by float32 angles (as the source does), in float64 maths."""
    L = qkv.shape[0]
    angles = ref.rope_angles_packed(grid, HD, np.float32)
    x = qkv.astype(np.float64)
    out = x.copy()
    out[:, :Q] = ref.apply_rope(x[:, :Q].reshape(L, HEADS, HD), angles).reshape(L, Q)
    out[:, Q : 2 * Q] = ref.apply_rope(x[:, Q : 2 * Q].reshape(L, HEADS, HD), angles).reshape(L, Q)
    return out


# A pass of the per-head loop (one value per thread: two loads, FMUL + FFMA, barrier, store, loop
# control) in SASS on sm_90: 29 instructions with uint32 indices, ~67 with numba's signed 64-bit
# `range()` arithmetic. Held at the compile tier's budget (32) so that signed or 64-bit index
# arithmetic cannot creep back in.
MAX_PASS_INSTRUCTIONS = compile_check.MAX_PASS_INSTRUCTIONS["numba-cuda"]["rope2d_kernel"]


class TestNumba:
    pytestmark = [pytest.mark.numba]

    @pytest.mark.parametrize("threads", [None, 32, 10, 72])
    def test_rope2d_matches_reference(self, threads):
        """Blocks (24, 4), (24, 1), (10, 1): three passes over a head, the last one part idle, and
        (24, 3): the second pass over the 4 q and k heads holds one head."""
        L = int(np.prod(GRID, axis=1).sum())
        qkv = qkv_data(L, seed=1)
        qkv_d = launch.to_device(qkv)
        got = R.rope2d(
            qkv_d, launch.grid_table(GRID), launch.cu_seqlens_table(GRID), HEADS, HD, threads=threads
        ).copy_to_host()
        want = expected(qkv, GRID)
        assert_close(got[:, :Q], want[:, :Q], rtol=1e-5, atol=2e-6, name="q")
        assert_close(got[:, Q : 2 * Q], want[:, Q : 2 * Q], rtol=1e-5, atol=2e-6, name="k")
        np.testing.assert_array_equal(got[:, 2 * Q :], qkv[:, 2 * Q :], err_msg="v must be untouched")

    def test_rope2d_numpy_in_place_and_every_frame_same(self):
        grid = np.array([(2, 3, 2)])
        qkv = np.tile(qkv_data(6, seed=2), (2, 1))  # both frames hold the same tokens
        before = qkv.copy()
        R.rope2d(qkv, launch.grid_table(grid), launch.cu_seqlens_table(grid), HEADS, HD)
        assert_close(qkv, expected(before, grid), rtol=1e-5, atol=2e-6, name="qkv")
        np.testing.assert_array_equal(qkv[:6], qkv[6:], err_msg="frames of a video share the 2D table")

    def test_position_zero_is_identity_and_rotation_moves_values(self):
        qkv = qkv_data(int(np.prod(GRID, axis=1).sum()), seed=3)
        got = R.rope2d(qkv.copy(), launch.grid_table(GRID), launch.cu_seqlens_table(GRID), HEADS, HD).copy_to_host()
        np.testing.assert_allclose(got[0], qkv[0], rtol=0, atol=0)  # patch (0, 0) of the image: angle 0
        np.testing.assert_allclose(got[24], qkv[24], rtol=0, atol=0)  # patch (0, 0) of the video
        assert np.abs(got[1:24, : 2 * Q] - qkv[1:24, : 2 * Q]).max() > 0.1

    def test_launcher_rejects_bad_arguments(self):
        L = int(np.prod(GRID, axis=1).sum())
        qkv = qkv_data(L, seed=4)
        grid, cu = launch.grid_table(GRID), launch.cu_seqlens_table(GRID)
        cases = [
            (dict(qkv=qkv.astype(np.float64)), "qkv: dtype float64"),
            (dict(qkv=qkv[:, :-1].copy()), r"qkv: shape \(54, 143\) does not match \(\?, 144\)"),
            (dict(qkv=np.repeat(qkv, 2, axis=1)[:, ::2]), "qkv: array is not C-contiguous"),
            (dict(qkv=launch.to_device(np.repeat(qkv, 2, axis=0))[::2]), "qkv: array is not C-contiguous"),
            (dict(grid_thws=grid.astype(np.int64)), "grid_thws: dtype int64"),
            (dict(cu_seqlens=cu[:-1].copy()), r"cu_seqlens: shape \(2,\) does not match \(3,\)"),
            (dict(cu_seqlens=cu.astype(np.float32)), "cu_seqlens: dtype float32"),
            (dict(cu_seqlens=np.array([0, 20, 54], np.int32)), "does not match grid_thws"),
            (dict(qkv=qkv[:50].copy()), "covers 54 tokens but qkv holds L = 50"),
            (dict(grid_thws=np.array([(1, 4, 6), (3, 2, 0)], np.int32)), ">= 1"),
            (dict(head_dim=22), "head_dim=22 must be a multiple of 4"),
            (dict(heads=0), "heads must be a positive integer"),
            (dict(threads=7), "threads=7 is odd and below head_dim=24"),
            (dict(threads=1025), "threads=1025 is more than a block can hold"),
        ]
        for changes, message in cases:
            kwargs = dict(qkv=qkv.copy(), grid_thws=grid, cu_seqlens=cu, heads=HEADS, head_dim=HD) | changes
            with pytest.raises(ValueError, match=message):
                R.rope2d(**kwargs)

    def test_block_shape_puts_a_head_along_x_and_heads_along_y(self):
        assert R.block_shape(12, 128, 128) == (128, 1)  # K3: one head per pass, 24 passes
        assert R.block_shape(2, 24, 128) == (24, 4)  # at most the 2·heads of q and k
        assert R.block_shape(2, 24, 72) == (24, 3)
        assert R.block_shape(2, 24, 10) == (10, 1)  # a head in three passes
        assert R.block_shape(12, 128, 1024) == (128, 8)

    @pytest.mark.compile
    def test_per_head_pass_compiles_to_few_sass_instructions(self):
        if sass.nvdisasm_path() is None:
            pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm, part of the dev extra)")
        script = textwrap.dedent(
            """
            import json
            from moonvit_kernels.tools.compile_check import build_cubins
            from moonvit_kernels.tools.xray.sass import disassemble
            ((label, cubin, report),) = build_cubins((9, 0), ["moonvit_kernels.numba_backend.rope"])
            fn = max(disassemble(cubin), key=lambda f: len(f.instructions))
            loops = [(lp.size, dict(lp.mix)) for lp in fn.innermost if lp.mix["bar"]]
            print(json.dumps(loops))
            """
        )
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        found = json.loads(r.stdout.strip().splitlines()[-1])
        (pass_loop,) = found  # the loop over heads: the only innermost loop holding the barrier
        size, mix = pass_loop
        assert mix["ldg"] == 2 and mix["stg"] == 1 and mix["fma"] == 1, mix  # one pass, not unrolled
        assert size <= MAX_PASS_INSTRUCTIONS, (
            f"{size} SASS instructions per pass (limit {MAX_PASS_INSTRUCTIONS}): {mix}"
        )


# ============================================================================
# CUDA C kernel on the CPU emulator, through the real launchers
class TestCudaEmulator:
    pytestmark = EMULATOR

    @pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
    @pytest.mark.parametrize("heads, head_dim", [(2, 24), (1, 128), (3, 4)])
    def test_rope(self, k, dtype, heads, head_dim):
        check_rope(k, dtype, np.array([[1, 3, 5], [2, 4, 2], [1, 9, 7]]), heads, head_dim)


# ============================================================================
# compile tier (no GPU): the stage's numba kernels for sm_90, its CUDA C kernels with NVRTC per architecture
class TestCompile:
    pytestmark = [pytest.mark.compile]

    def test_numba_kernels_compile_within_limits(self):
        assert_numba_stage_compiles("rope")

    @pytest.mark.parametrize("arch", cuda_archs("rope"))
    def test_cuda_c_kernels_build_within_limits(self, arch):
        assert_cuda_stage_builds("rope", arch)


# ============================================================================
# GPU (CuPy launchers and numba kernels at real sizes; skipped without a GPU)
class TestGpu:
    pytestmark = [pytest.mark.gpu]

    @pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
    @pytest.mark.parametrize(
        "grid, heads, head_dim",
        [
            (np.array([[1, 3, 5], [2, 4, 2], [1, 9, 7]]), 2, 24),
            (np.array([[1, 64, 64], [2, 32, 48]]), 12, 128),
            (np.array([[1, 512, 6]]), 1, 128),  # the largest RoPE angle: column and row up to 511
        ],
        ids=["tiny", "k3", "edge-512"],
    )
    def test_rope(self, k, dtype, grid, heads, head_dim):
        check_rope(k, dtype, grid, heads, head_dim)

    def test_rope_real_size(self):
        H, hd = K3.vt_num_attention_heads, K3.head_dim
        qkv = gpu_rand(GPU_L, 3 * H * hd)
        got = R.rope2d(qkv.copy(), grid_table(GPU_GRID), cu_seqlens_table(GPU_GRID), H, hd).copy_to_host()
        ang = ref.rope_angles_packed(GPU_GRID, hd, np.float64)
        Q = H * hd
        for s in range(2):
            want = ref.apply_rope(qkv[:, s * Q : (s + 1) * Q].reshape(GPU_L, H, hd).astype(np.float64), ang).reshape(
                GPU_L, Q
            )
            # angles reach 45 rad: fp32 angle rounding bounds the error at ~45·eps
            assert_close(got[:, s * Q : (s + 1) * Q], want, rtol=1e-5, atol=2e-5 * np.abs(qkv).max(), name="rope")
        np.testing.assert_array_equal(got[:, 2 * Q :], qkv[:, 2 * Q :])
