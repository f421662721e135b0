"""The temporal-pool 2x2 patch merge (a gather), every tier."""

import numpy as np
import pytest
from compile_tier import assert_cuda_stage_builds, assert_numba_stage_compiles, cuda_archs
from cuda_kernel_checks import (
    check_merge,
)
from formulations import (
    TIGHT,
    merge_loop,
    rnd,
)
from helpers import assert_close
from tiers import EMULATOR, GPU_GRID, GPU_L, gpu_rand

from moonvit_kernels import reference as ref
from moonvit_kernels.numba_backend import launch
from moonvit_kernels.numba_backend import merge as Mg
from moonvit_kernels.numba_backend.launch import item_table


# ============================================================================
# reference: against the second formulations in tests/formulations.py
class TestReference:
    pytestmark = [pytest.mark.reference]

    @pytest.mark.parametrize("kernel", [(2, 2), (1, 2), (3, 2)])
    def test_merger_equals_index_loops(self, kernel):
        kh, kw = kernel
        grid = [(1, 3 * kh, 2 * kw), (3, kh, 3 * kw), (2, 2 * kh, kw)]
        L = sum(t * h * w for t, h, w in grid)
        x = rnd((L, 5), 80)
        got = ref.tpool_patch_merger(x, np.array(grid), kernel)
        want = merge_loop(x, grid, kh, kw)
        assert len(got) == len(want)
        for i, (g, wnt) in enumerate(zip(got, want, strict=True)):
            assert_close(g, wnt, **TIGHT, name=f"merged item {i}")

    def test_merged_token_zero_holds_patches_0_1_w_w1(self):
        h, w = 4, 6
        x = rnd((h * w, 3), 81)
        merged = ref.tpool_patch_merger(x, np.array([[1, h, w]]), (2, 2))[0]
        assert merged.shape == (h * w // 4, 4, 3)
        assert np.array_equal(merged[0], x[[0, 1, w, w + 1]])
        # second merged token of row 0: patches 2, 3, w+2, w+3; first of merged row 1: 2w, 2w+1, 3w, 3w+1
        assert np.array_equal(merged[1], x[[2, 3, w + 2, w + 3]])
        assert np.array_equal(merged[w // 2], x[[2 * w, 2 * w + 1, 3 * w, 3 * w + 1]])

    def test_merger_temporal_mean(self):
        t, h, w = 3, 2, 4
        x = rnd((t * h * w, 3), 82)
        video = ref.tpool_patch_merger(x, np.array([[t, h, w]]), (2, 2))[0]
        frames = [
            ref.tpool_patch_merger(x[f * h * w : (f + 1) * h * w], np.array([[1, h, w]]), (2, 2))[0] for f in range(t)
        ]
        assert_close(video, (frames[0] + frames[1] + frames[2]) / 3, **TIGHT, name="temporal mean")


# ============================================================================
# numba kernel (the CUDA simulator without a GPU)
D = 9  # odd width


def case(grid, seed):
    grid = np.array(grid)
    L = int(np.prod(grid, axis=1).sum())
    x = np.random.default_rng(seed).standard_normal((L, D)).astype(np.float32)
    return grid, x


def expected(x, grid, kernel_size):
    parts = ref.tpool_patch_merger(x.astype(np.float64), grid, kernel_size)
    return np.concatenate([p.reshape(p.shape[0], -1) for p in parts], axis=0)


class TestNumba:
    pytestmark = [pytest.mark.numba]

    # an image and a video (frames averaged); a non-square merge kernel so that swapped a/b or i/j fail
    @pytest.mark.parametrize(
        "grid,kernel_size",
        [([(1, 4, 6), (3, 2, 4)], (2, 2)), ([(1, 4, 6), (2, 2, 3)], (2, 3)), ([(4, 2, 2)], (1, 2))],
    )
    def test_merge_gather_matches_reference(self, grid, kernel_size):
        grid, x = case(grid, seed=len(grid) + kernel_size[1])
        items = launch.item_table(grid, kernel_size)
        got = Mg.merge_gather(launch.to_device(x), items, kernel_size)
        assert launch.is_device_array(got)
        assert_close(
            got.copy_to_host(), expected(x, grid, kernel_size), rtol=1e-6, atol=1e-6, name=f"merge {kernel_size}"
        )

    def test_device_table_and_numpy_out_and_strided_columns(self):
        grid, x = case([(1, 4, 6), (3, 2, 4)], seed=9)
        items = launch.item_table(grid, (2, 2))
        out = np.full((8, 4 * D), np.nan, np.float32)
        got = Mg.merge_gather(x, launch.to_device(items), (2, 2), m_total=8, out=out, threads=32)
        want = expected(x, grid, (2, 2))
        assert_close(out, want, rtol=1e-6, atol=1e-6, name="numpy out")
        assert_close(got.copy_to_host(), want, rtol=1e-6, atol=1e-6, name="device result")

    def test_device_table_without_size_is_read_back(self):
        grid, x = case([(2, 4, 2), (1, 2, 2)], seed=11)
        got = Mg.merge_gather(launch.to_device(x), launch.to_device(launch.item_table(grid, (2, 2))), (2, 2))
        assert_close(got.copy_to_host(), expected(x, grid, (2, 2)), rtol=1e-6, atol=1e-6, name="merge")

    def test_launcher_rejects_bad_arguments(self):
        grid, x = case([(1, 4, 6), (3, 2, 4)], seed=10)
        items = launch.item_table(grid, (2, 2))
        bad_merged = items.copy()
        bad_merged[1, 4] = 5
        cases = [
            (dict(x=x.astype(np.float64)), "x: dtype float64"),
            (dict(x=x[:, ::2]), "x: array is not C-contiguous"),
            (dict(x=x[:40].copy()), "items cover 48 tokens but x holds L = 40"),
            (dict(items=items[:, :4].copy()), "items: shape"),
            (dict(items=items.astype(np.int64)), "items: dtype int64"),
            (dict(items=bad_merged), "merged offsets"),
            (dict(merge_kernel_size=(2, 4)), "divisible"),
            (dict(merge_kernel_size=(0, 2)), "merge_kernel_size must be a positive integer"),
            (dict(m_total=9), "m_total=9 but items hold 8"),
            (dict(out=np.empty((8, 4 * D), np.float64)), "out: dtype float64"),
            (dict(out=launch.device_array((8, 4 * D + 1))), "out: shape"),
            (dict(items=launch.to_device(bad_merged)), "merged offsets"),
            (dict(out=np.empty((9, 4 * D), np.float32)), "m_total=9 but items hold 8"),
        ]
        for changes, message in cases:
            kwargs = dict(x=x, items=items, merge_kernel_size=(2, 2)) | changes
            with pytest.raises(ValueError, match=message):
                Mg.merge_gather(**kwargs)


# ============================================================================
# CUDA C kernel on the CPU emulator, through the real launchers
class TestCudaEmulator:
    pytestmark = EMULATOR

    @pytest.mark.parametrize("merge_kernel_size", [(2, 2), (2, 1), (1, 3)])
    def test_merge(self, k, merge_kernel_size):
        grid = np.array([[1, 4, 6], [3, 2, 6], [4, 6, 6]])
        for in_dtype in ("float32", "bfloat16"):
            for out_dtype in ("float32", "bfloat16"):
                check_merge(k, grid, merge_kernel_size, 40, in_dtype, out_dtype)


# ============================================================================
# compile tier (no GPU): the stage's numba kernels for sm_90, its CUDA C kernels with NVRTC per architecture
class TestCompile:
    pytestmark = [pytest.mark.compile]

    def test_numba_kernels_compile_within_limits(self):
        assert_numba_stage_compiles("merge")

    @pytest.mark.parametrize("arch", cuda_archs("merge"))
    def test_cuda_c_kernels_build_within_limits(self, arch):
        assert_cuda_stage_builds("merge", arch)


# ============================================================================
# GPU (CuPy launchers and numba kernels at real sizes; skipped without a GPU)
class TestGpu:
    pytestmark = [pytest.mark.gpu]

    @pytest.mark.parametrize("merge_kernel_size", [(2, 2), (2, 1), (1, 3)])
    @pytest.mark.parametrize("D_", [40, 1024])
    def test_merge(self, k, merge_kernel_size, D_):
        grid = np.array([[1, 4, 6], [3, 2, 6], [4, 6, 6], [1, 64, 48]])
        for in_dtype in ("float32", "bfloat16"):
            for out_dtype in ("float32", "bfloat16"):
                check_merge(k, grid, merge_kernel_size, D_, in_dtype, out_dtype)

    def test_merge_real_size(self):
        x = gpu_rand(GPU_L, 1024)
        m_total = sum((h // 2) * (w // 2) for _, h, w in GPU_GRID.tolist())
        got = Mg.merge_gather(x, item_table(GPU_GRID, (2, 2)), (2, 2), m_total).copy_to_host()
        want = np.concatenate([m.reshape(m.shape[0], -1) for m in ref.tpool_patch_merger(x, GPU_GRID, (2, 2))])
        assert_close(got, want, rtol=1e-6, atol=1e-6, name="merge")
