"""2D RoPE kernel (in place on q and k of the packed qkv buffer) vs the NumPy reference."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import assert_close

from moonvit_kernels import reference
from moonvit_kernels.numba_backend import compile_check, launch
from moonvit_kernels.numba_backend import rope as R
from moonvit_kernels.xray import sass

HEADS, HD = 2, 24  # head_dim a multiple of 4 but not a power of two
Q = HEADS * HD
GRID = np.array([(1, 4, 6), (3, 2, 5)])  # an image and a video; h != w so swapped slots fail


def qkv_data(L: int, seed: int) -> np.ndarray:
    r = np.random.default_rng(seed)
    return (r.standard_normal((L, 3 * Q)) + r.uniform(-0.5, 0.5, (1, 3 * Q))).astype(np.float32)


def expected(qkv: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Reference: rotate q and k by float32 angles (as the source does), in float64 maths."""
    L = qkv.shape[0]
    angles = reference.rope_angles_packed(grid, HD, np.float32)
    x = qkv.astype(np.float64)
    out = x.copy()
    out[:, :Q] = reference.apply_rope(x[:, :Q].reshape(L, HEADS, HD), angles).reshape(L, Q)
    out[:, Q : 2 * Q] = reference.apply_rope(x[:, Q : 2 * Q].reshape(L, HEADS, HD), angles).reshape(L, Q)
    return out


@pytest.mark.parametrize("threads", [None, 32, 10, 72])
def test_rope2d_matches_reference(threads):
    """Blocks (24, 4), (24, 1), (10, 1): three passes over a head, the last one part idle, and
    (24, 3): the second pass over the 4 q and k heads holds one head."""
    L = int(np.prod(GRID, axis=1).sum())
    qkv = qkv_data(L, seed=1)
    qkv_d = launch.to_device(qkv)
    got = R.rope2d(
        qkv_d, launch.grid_table(GRID), launch.cu_seqlens_table(GRID), HEADS, HD, threads=threads
    ).copy_to_host()
    ref = expected(qkv, GRID)
    assert_close(got[:, :Q], ref[:, :Q], rtol=1e-5, atol=2e-6, name="q")
    assert_close(got[:, Q : 2 * Q], ref[:, Q : 2 * Q], rtol=1e-5, atol=2e-6, name="k")
    np.testing.assert_array_equal(got[:, 2 * Q :], qkv[:, 2 * Q :], err_msg="v must be untouched")


def test_rope2d_numpy_in_place_and_every_frame_same():
    grid = np.array([(2, 3, 2)])
    qkv = np.tile(qkv_data(6, seed=2), (2, 1))  # both frames hold the same tokens
    before = qkv.copy()
    R.rope2d(qkv, launch.grid_table(grid), launch.cu_seqlens_table(grid), HEADS, HD)
    assert_close(qkv, expected(before, grid), rtol=1e-5, atol=2e-6, name="qkv")
    np.testing.assert_array_equal(qkv[:6], qkv[6:], err_msg="frames of a video share the 2D table")


def test_position_zero_is_identity_and_rotation_moves_values():
    qkv = qkv_data(int(np.prod(GRID, axis=1).sum()), seed=3)
    got = R.rope2d(qkv.copy(), launch.grid_table(GRID), launch.cu_seqlens_table(GRID), HEADS, HD).copy_to_host()
    np.testing.assert_allclose(got[0], qkv[0], rtol=0, atol=0)  # patch (0, 0) of the image: angle 0
    np.testing.assert_allclose(got[24], qkv[24], rtol=0, atol=0)  # patch (0, 0) of the video
    assert np.abs(got[1:24, : 2 * Q] - qkv[1:24, : 2 * Q]).max() > 0.1


def test_launcher_rejects_bad_arguments():
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


def test_block_shape_puts_a_head_along_x_and_heads_along_y():
    assert R.block_shape(12, 128, 128) == (128, 1)  # K3: one head per pass, 24 passes
    assert R.block_shape(2, 24, 128) == (24, 4)  # at most the 2·heads of q and k
    assert R.block_shape(2, 24, 72) == (24, 3)
    assert R.block_shape(2, 24, 10) == (10, 1)  # a head in three passes
    assert R.block_shape(12, 128, 1024) == (128, 8)


# A pass of the per-head loop (one value per thread: two loads, FMUL + FFMA, barrier, store, loop
# control) in SASS on sm_90: 29 instructions with uint32 indices, ~67 with numba's signed 64-bit
# `range()` arithmetic. Held at the compile tier's budget (32) so that signed or 64-bit index
# arithmetic cannot creep back in.
MAX_PASS_INSTRUCTIONS = compile_check.MAX_PASS_INSTRUCTIONS["numba-cuda"]["rope2d_kernel"]


@pytest.mark.compile
def test_per_head_pass_compiles_to_few_sass_instructions():
    if sass.nvdisasm_path() is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm, part of the dev extra)")
    script = textwrap.dedent(
        """
        import json
        from moonvit_kernels.numba_backend.compile_check import build_cubins
        from moonvit_kernels.xray.sass import disassemble
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
    assert size <= MAX_PASS_INSTRUCTIONS, f"{size} SASS instructions per pass (limit {MAX_PASS_INSTRUCTIONS}): {mix}"
