"""Packed block-diagonal softmax attention (flash-style tiles, log-sum-exp), every tier."""

import math

import numpy as np
import pytest
from compile_tier import assert_cuda_stage_builds, assert_numba_stage_compiles, cuda_archs
from cuda_kernel_checks import (
    check_attention,
)
from formulations import (
    TIGHT,
    attention_loop,
    rnd,
)
from helpers import FP32_EPS, assert_close, fp32_rtol
from tiers import EMULATOR, GPU_GRID, GPU_L, K3, gpu_rand

from moonvit_kernels import reference as ref
from moonvit_kernels.numba_backend import attention as attn
from moonvit_kernels.numba_backend.launch import cu_seqlens_table
from moonvit_kernels.tools.xray import counters
from moonvit_kernels.tools.xray.sass import nvdisasm_path

# ============================================================================
# reference: against the second formulations in tests/formulations.py


def packed_qkv(sizes, H=2, hd=12, seed=70):
    L = sum(sizes)
    q, k, v = (rnd((L, H, hd), seed + i, scale=1.5) for i in range(3))
    return q, k, v, np.concatenate([[0], np.cumsum(sizes)])


class TestReference:
    pytestmark = [pytest.mark.reference]

    def test_attention_equals_per_item_softmax_loop_with_lse(self):
        q, k, v, bounds = packed_qkv([5, 1, 9])
        o, lse = ref.attention(q, k, v, bounds, return_lse=True)
        o_loop, lse_loop = attention_loop(q, k, v, bounds)
        assert_close(o, o_loop, **TIGHT, name="attention o")
        assert_close(lse, lse_loop, **TIGHT, name="attention lse")

    def test_attention_float32_close_to_float64(self):
        q, k, v, bounds = packed_qkv([7, 4])
        o32, lse32 = ref.attention(*(a.astype(np.float32) for a in (q, k, v)), bounds, return_lse=True)
        o_loop, lse_loop = attention_loop(*(a.astype(np.float32).astype(np.float64) for a in (q, k, v)), bounds)
        assert o32.dtype == np.float32
        assert_close(o32, o_loop, fp32_rtol(7), 1e-5, "attention fp32")
        assert_close(lse32, lse_loop, fp32_rtol(12), 1e-5, "lse fp32")

    @pytest.mark.parametrize("budget", [1, 7, 50])
    def test_attention_chunking_gives_same_result(self, budget):
        q, k, v, bounds = packed_qkv([5, 1, 9])
        o_full, lse_full = ref.attention(q, k, v, bounds, return_lse=True)
        o, lse = ref.attention(q, k, v, bounds, return_lse=True, score_budget=budget)
        assert_close(o, o_full, **TIGHT, name=f"chunked o (budget {budget})")
        assert_close(lse, lse_full, **TIGHT, name=f"chunked lse (budget {budget})")

    def test_attention_items_do_not_see_each_other(self):
        q, k, v, bounds = packed_qkv([6, 5])
        o = ref.attention(q, k, v, bounds)
        q2, k2, v2 = q.copy(), k.copy(), v.copy()
        for a in (q2, k2, v2):
            a[6:] = rnd(a[6:].shape, 77, scale=3.0)
        o2 = ref.attention(q2, k2, v2, bounds)
        assert np.array_equal(o2[:6], o[:6])
        assert np.abs(o2[6:] - o[6:]).max() > 1e-2
        # As one item, the same tokens do mix: the packing is what isolates them.
        joint = ref.attention(q, k, v, np.array([0, 11]))
        assert np.abs(joint[:6] - o[:6]).max() > 1e-3


# ============================================================================
# numba kernel (the CUDA simulator without a GPU)
# Launch shapes used here: v1 with 8 threads (several keys per thread), v2 with 8 x 8 tiles, and
# 5-row x 3-key tiles (3 does not divide head_dim 8 or 24's dims-per-thread evenly with 5 rows).
LAUNCHES = {
    "v1_t8": dict(version=1, threads=8),
    "v2_8x8": dict(version=2, block_q=8, block_k=8),
    "v2_5x3": dict(version=2, block_q=5, block_k=3),
}


def random_qkv(lengths: list[int], heads: int, head_dim: int, seed: int, spread: float = 1.0):
    """Non-uniform q, k, v `[L, H, hd]` (float32) and int32 cu_seqlens for items of `lengths`.

    Every query row gets its own magnitude (up to `spread` x), so some rows have large scores.
    """
    r = np.random.default_rng(seed)
    L = sum(lengths)
    row_scale = np.exp(r.uniform(0.0, math.log(spread), size=(L, 1, 1))) if spread > 1 else 1.0
    q = (r.standard_normal((L, heads, head_dim)) * row_scale + r.uniform(-0.5, 0.5)).astype(np.float32)
    k = (r.standard_normal((L, heads, head_dim)) * r.uniform(0.5, 2.0, size=(1, heads, head_dim))).astype(np.float32)
    v = (r.standard_normal((L, heads, head_dim)) * 1.5 + r.uniform(-1, 1, size=(1, heads, head_dim))).astype(np.float32)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return q, k, v, cu


def scaled_scores(q, k, cu):
    """Per item, float64 scaled scores `[H, n, n]` (used to size tolerances and check test preconditions)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    return [
        np.einsum("qhd,khd->hqk", q[s:e].astype(np.float64) * scale, k[s:e].astype(np.float64))
        for s, e in zip(cu[:-1], cu[1:], strict=True)
    ]


def run(q, k, v, cu, launch):
    o, lse = attn.attention(attn.pack_qkv(q, k, v), cu, q.shape[1], **launch)
    return o.copy_to_host(), lse.copy_to_host()


def check_against_reference(q, k, v, cu, launch, name):
    """Compare o and lse with the float64 reference; tolerances follow the fp32 rounding of the scores."""
    L, H, hd = q.shape
    ref_o, ref_lse = ref.attention(
        q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), cu, return_lse=True
    )
    o, lse = run(q, k, v, cu, launch)
    # A score is a length-hd fp32 dot product: its error is ~eps·Σ|q_d·k_d|·scale. exp() turns that
    # absolute error into a relative error of each probability, hence of o (times |v|) and of lse.
    scale = 1.0 / math.sqrt(hd)
    abs_terms = max(
        float(np.einsum("qhd,khd->hqk", np.abs(q[s:e]) * scale, np.abs(k[s:e])).max())
        for s, e in zip(cu[:-1], cu[1:], strict=True)
    )
    score_err = 4 * FP32_EPS * abs_terms
    n = int(np.max(np.diff(cu)))
    v_max = float(np.abs(v).max())
    assert_close(o, ref_o.reshape(L, H * hd), rtol=fp32_rtol(n), atol=(score_err + fp32_rtol(n)) * v_max, name=name)
    assert_close(lse, ref_lse, rtol=fp32_rtol(n), atol=score_err, name=name + " lse")
    return o, lse


CASES = {
    "L1_hd8": ([1], 8),
    "L7_hd24": ([7], 24),
    "two_items_hd8": ([3, 14], 8),
    "three_items_L33_hd24": ([20, 1, 12], 24),
}


def _good(L=7, H=2, hd=8):
    q, k, v, cu = random_qkv([L], heads=H, head_dim=hd, seed=0)
    return attn.pack_qkv(q, k, v), cu


def _conflict(words_by_lane: dict[int, int]) -> int:
    """Wavefronts / ideal of one warp's 4-byte shared access (lane -> word index)."""
    wavefronts, ideal = counters.wavefronts([(lane, 4 * word, 4) for lane, word in words_by_lane.items()])
    return wavefronts // ideal


def _v2_worst_conflicts(hd: int, bq: int = attn.V2_BLOCK_Q, bk: int = attn.V2_BLOCK_K) -> dict[str, int]:
    """Worst conflict over all warps and instances of each shared access of attention v2, from the
    kernel's shapes (`v2_shared_shapes`) and thread layout: threadIdx (x, y) = (key tx, query row ty),
    tid = ty·bk + tx; tiles are staged row-major by flat index tid + s·(bq·bk)."""
    (_, q_w), (_, k_w), (_, v_w), (_, s_w) = attn.v2_shared_shapes(hd, bq, bk)
    nt = bq * bk
    worst: dict[str, int] = {}

    def note(site: str, words: dict[int, int]) -> None:
        if words:
            worst[site] = max(worst.get(site, 0), _conflict(words))

    for warp in range(-(-nt // 32)):
        lanes = {lane: warp * 32 + lane for lane in range(32) if warp * 32 + lane < nt}
        tx = {lane: t % bk for lane, t in lanes.items()}
        ty = {lane: t // bk for lane, t in lanes.items()}
        for rows, width, site in ((bq, q_w, "q_s store"), (bk, k_w, "k_s store"), (bk, v_w, "v_s store")):
            for s in range(-(-rows * hd // nt)):
                idx = {lane: t + s * nt for lane, t in lanes.items() if t + s * nt < rows * hd}
                note(site, {lane: (i // hd) * width + i % hd for lane, i in idx.items()})
        for d in range(hd):
            note("q_s load (QK)", {lane: ty[lane] * q_w + d for lane in lanes})
            note("k_s load (QK)", {lane: tx[lane] * k_w + d for lane in lanes})
        note("s_s/p_s store", {lane: ty[lane] * s_w + tx[lane] for lane in lanes})
        for j in range(bk):
            note("s_s/p_s load", {lane: ty[lane] * s_w + j for lane in lanes})
            for k in range(-(-hd // bk)):
                note("v_s load (PV)", {lane: j * v_w + tx[lane] + k * bk for lane in lanes if tx[lane] + k * bk < hd})
    return worst


class TestNumba:
    pytestmark = [pytest.mark.numba]

    @pytest.mark.parametrize("launch", LAUNCHES, ids=list(LAUNCHES))
    @pytest.mark.parametrize("case", CASES, ids=list(CASES))
    def test_matches_reference(self, case, launch):
        lengths, hd = CASES[case]
        q, k, v, cu = random_qkv(lengths, heads=2, head_dim=hd, seed=list(CASES).index(case))
        check_against_reference(q, k, v, cu, LAUNCHES[launch], f"{case}/{launch}")

    @pytest.mark.parametrize("launch", LAUNCHES, ids=list(LAUNCHES))
    def test_large_scores_exercise_online_rescaling(self, launch):
        """Scores in the hundreds: without max-subtraction exp() overflows, and in v2 many rows find their
        max only in a later key tile, so the running output and sum must be rescaled."""
        lengths = [19, 13]
        q, k, v, cu = random_qkv(lengths, heads=2, head_dim=8, seed=11, spread=40.0)
        scores = scaled_scores(q, k, cu)
        assert max(float(np.abs(s).max()) for s in scores) > 100.0, "precondition: scores must be large"
        late_max = sum(int(np.sum(np.argmax(s, axis=-1) >= 8)) for s in scores)
        assert late_max >= 10, "precondition: rows whose max key lies past the first 8-key tile"
        check_against_reference(q, k, v, cu, LAUNCHES[launch], f"large/{launch}")

    @pytest.mark.parametrize("version", [1, 2])
    def test_default_launch_shapes(self, version):
        """The launch shapes the model uses (v1: 128 threads, v2: 32 x 16 tiles) on a short sequence."""
        q, k, v, cu = random_qkv([7], heads=1, head_dim=8, seed=5)
        check_against_reference(q, k, v, cu, dict(version=version), f"default v{version}")

    @pytest.mark.parametrize("launch", ["v1_t8", "v2_5x3"])
    def test_packed_items_do_not_see_each_other(self, launch):
        """Changing the middle item's tokens leaves the items before and after it bit-identical (a leak in
        either direction shows), and does change the middle item's own output."""
        q, k, v, cu = random_qkv([5, 4, 3], heads=2, head_dim=8, seed=3)
        o, lse = run(q, k, v, cu, LAUNCHES[launch])
        r = np.random.default_rng(4)
        q2, k2, v2 = q.copy(), k.copy(), v.copy()
        middle = slice(cu[1], cu[2])
        for a in (q2, k2, v2):
            a[middle] = r.standard_normal(a[middle].shape).astype(np.float32) * 2
        o2, lse2 = run(q2, k2, v2, cu, LAUNCHES[launch])
        for name, rows in (("first", slice(cu[0], cu[1])), ("last", slice(cu[2], cu[3]))):
            np.testing.assert_array_equal(o2[rows], o[rows], err_msg=f"output of the {name} item changed")
            np.testing.assert_array_equal(lse2[rows], lse[rows], err_msg=f"lse of the {name} item changed")
        assert np.all(np.abs(o2[middle] - o[middle]).max(axis=1) > 1e-3), "the middle item's own output did not change"

    def test_length_one_item_copies_its_value(self):
        """A 1-token item attends only to itself: o = v, lse = its own scaled score."""
        q, k, v, cu = random_qkv([4, 1, 3], heads=2, head_dim=8, seed=8)
        for launch in ("v1_t8", "v2_8x8"):
            o, lse = run(q, k, v, cu, LAUNCHES[launch])
            assert_close(o[4], v[4].reshape(-1), rtol=0, atol=0, name=f"{launch}: 1-token item output")
            own = np.einsum("hd,hd->h", q[4].astype(np.float64), k[4].astype(np.float64)) / math.sqrt(8)
            assert_close(lse[4], own, rtol=fp32_rtol(8), atol=1e-6, name=f"{launch}: 1-token item lse")

    def test_query_tiles_cover_each_item_without_straddling(self):
        cu = np.array([0, 5, 5, 6, 23], dtype=np.int32)  # includes an empty item and a 1-token item
        tiles = attn.query_tiles(cu, block_q=4)
        assert tiles.dtype == np.int32 and tiles.shape[1] == 2 and tiles.flags.c_contiguous
        covered = []
        for item, q0 in tiles.tolist():
            start, end = int(cu[item]), int(cu[item + 1])
            assert start <= q0 < end, f"tile ({item}, {q0}) starts outside its item [{start}, {end})"
            covered.extend(range(q0, min(q0 + 4, end)))
        assert sorted(covered) == list(range(int(cu[-1]))), "every row in exactly one tile"

    def test_pack_qkv_layout(self):
        """Column s·Q + head·hd + d of the packed buffer holds slot s (q, k, v), head, dim d."""
        q, k, v, _ = random_qkv([3], heads=2, head_dim=4, seed=1)
        qkv = attn.pack_qkv(q, k, v)
        Q = 8
        for s, a in enumerate((q, k, v)):
            for head in range(2):
                np.testing.assert_array_equal(qkv[:, s * Q + head * 4 : s * Q + head * 4 + 4], a[:, head])

    @pytest.mark.parametrize(
        "mutate, match",
        [
            (lambda qkv, cu: (qkv.astype(np.float64), cu, 2, {}), "qkv: dtype float64"),
            (lambda qkv, cu: (qkv[:, :-1].copy(), cu, 2, {}), "not 3·Q"),
            (lambda qkv, cu: (qkv, cu, 3, {}), "not divisible by num_heads"),
            (lambda qkv, cu: (qkv, cu, 0, {}), "num_heads must be a positive integer"),
            (lambda qkv, cu: (np.asfortranarray(qkv), cu, 2, {}), "not C-contiguous"),
            (lambda qkv, cu: (qkv.reshape(7, 3, 16), cu, 2, {}), "3 dimensions, expected 2"),
            (lambda qkv, cu: (qkv, cu.astype(np.int64), 2, {}), "cu_seqlens: dtype int64"),
            (lambda qkv, cu: (qkv, np.array([7], np.int32), 2, {}), "at least 2 entries"),
            (lambda qkv, cu: (qkv, np.array([1, 7], np.int32), 2, {}), "must start at 0"),
            (lambda qkv, cu: (qkv, np.array([0, 5, 3, 7], np.int32), 2, {}), "decreases at index 2"),
            (lambda qkv, cu: (qkv, np.array([0, 3, 6], np.int32), 2, {}), "ends at 6 but qkv has L = 7"),
            (lambda qkv, cu: (qkv, cu, 2, dict(version=3)), "version must be one of"),
            (lambda qkv, cu: (qkv, cu, 2, dict(version=1, threads=12)), "threads must be a power of two"),
            (lambda qkv, cu: (qkv, cu, 2, dict(version=2, block_q=64, block_k=32)), "exceeds 1024"),
            (lambda qkv, cu: (qkv, cu, 2, dict(version=2, block_q=0)), "block_q must be a positive integer"),
        ],
    )
    def test_launcher_rejects_bad_input(self, mutate, match):
        qkv, cu = _good()
        qkv, cu, heads, kwargs = mutate(qkv, cu)
        with pytest.raises(ValueError, match=match):
            attn.attention(qkv, cu, heads, **kwargs)

    def test_v1_rejects_items_longer_than_its_score_buffer(self):
        L = attn.V1_MAX_KEYS + 3
        qkv = np.zeros((L, 3 * 8), dtype=np.float32)
        cu = np.array([0, 2, L], dtype=np.int32)  # the second item holds V1_MAX_KEYS + 1 tokens
        with pytest.raises(ValueError, match="V1_MAX_KEYS"):
            attn.attention(qkv, cu, 1, version=1)

    @pytest.mark.parametrize("version", [1, 2])
    def test_rejects_launch_shapes_beyond_static_shared_memory(self, version):
        qkv = np.zeros((3, 3 * 4096), dtype=np.float32)  # one head of head_dim 4096
        cu = np.array([0, 3], dtype=np.int32)
        with pytest.raises(ValueError, match=f"attention v{version} .* bytes of shared memory"):
            attn.attention(qkv, cu, 1, version=version)

    @pytest.mark.parametrize("hd", [128, 24, 72, 64])
    def test_v2_shared_accesses_are_at_most_2_way_bank_conflicted(self, hd):
        worst = _v2_worst_conflicts(hd)
        assert len(worst) == 8 and max(worst.values()) <= 2, worst

    def test_v2_bank_count_sees_an_unpadded_q_tile(self):
        """Without the pad, q_s rows 128 floats apart put a warp's two query rows in one bank: 2 words, 2-way;
        and an unpadded K tile (stride 128) is 16-way. The counter used above sees both."""
        assert _conflict({lane: (lane // 16) * 128 for lane in range(32)}) == 2
        assert _conflict({lane: (lane % 16) * 128 for lane in range(32)}) == 16
        assert attn.v2_shared_shapes(128, 32, 16)[0] == (32, 129)


# ============================================================================
# CUDA C kernel on the CPU emulator, through the real launchers
class TestCudaEmulator:
    pytestmark = EMULATOR

    @pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
    @pytest.mark.parametrize(
        "head_dim, heads, lens",
        [(24, 2, [1, 70, 130]), (128, 1, [65, 3]), (8, 3, [64, 17]), (40, 2, [5])],
        ids=["hd24-items-1-70-130", "hd128-items-65-3", "hd8-items-64-17", "hd40-one-item"],
    )
    def test_attention(self, k, dtype, head_dim, heads, lens):
        check_attention(k, dtype, head_dim, heads, lens)


# ============================================================================
# compile tier (no GPU): the stage's numba kernels for sm_90, its CUDA C kernels with NVRTC per architecture
class TestCompile:
    pytestmark = [pytest.mark.compile]

    @pytest.fixture(scope="class")
    def numba_reports(self):
        return assert_numba_stage_compiles("attention")

    def test_numba_kernels_compile_within_limits(self, numba_reports):
        assert numba_reports

    @pytest.mark.parametrize("arch", cuda_archs("attention"))
    def test_cuda_c_kernels_build_within_limits(self, arch):
        assert_cuda_stage_builds("attention", arch)

    def test_attention_v2_qk_and_pv_loops_are_held_to_the_sass_budget(self, numba_reports):
        """The budgets of `--sass` hold attention v2's QK and PV loops at hd 128, and both loops exist."""
        if nvdisasm_path() is None:
            pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm, part of the dev extra)")
        for r in numba_reports:
            if r.kernel == "attention_v2_hd128_q32_k16":
                assert len([lp for lp in r.loops if lp["fma"]]) >= 2, (r.compiler, r.loops)
        for r in numba_reports:
            if r.kernel.startswith(("attention_v1", "attention_v2")):
                assert r.shared_bytes and r.shared_bytes > 1024, r


# ============================================================================
# GPU (CuPy launchers and numba kernels at real sizes; skipped without a GPU)
class TestGpu:
    pytestmark = [pytest.mark.gpu]

    @pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
    @pytest.mark.parametrize(
        "head_dim, heads, lens",
        [
            (24, 2, [1, 70, 130]),
            (8, 3, [64, 17]),
            (40, 2, [5]),
            (128, 12, [1024]),
            (128, 12, [1000, 333, 64, 1]),
            (128, 12, [4096]),
        ],
        ids=["hd24-1-70-130", "hd8-64-17", "hd40-5", "hd128-L1024", "hd128-packed", "hd128-L4096"],
    )
    def test_attention(self, k, dtype, head_dim, heads, lens):
        check_attention(k, dtype, head_dim, heads, lens)

    @pytest.mark.parametrize("version", attn.VERSIONS)
    def test_attention_real_size(self, version):
        H, hd = K3.vt_num_attention_heads, K3.head_dim
        qkv = gpu_rand(GPU_L, 3 * H * hd)
        cu = cu_seqlens_table(GPU_GRID)
        o, lse = attn.attention(qkv, cu, H, version=version)
        q, k, v = (qkv[:, s * H * hd : (s + 1) * H * hd].reshape(GPU_L, H, hd).astype(np.float64) for s in range(3))
        want, want_lse = ref.attention(q, k, v, cu, return_lse=True)
        assert_close(o.copy_to_host(), want.reshape(GPU_L, H * hd), rtol=1e-4, atol=1e-4, name=f"attention v{version}")
        assert_close(lse.copy_to_host(), want_lse, rtol=1e-5, atol=1e-4, name=f"lse v{version}")
