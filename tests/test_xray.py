"""The kernel X-ray (`moonvit_kernels.tools.xray`): counters, tracer, SASS loop finder, occupancy, roofline, report.

Known answers first (counters on hand-written requests and on tiny kernels run traced under the
simulator; occupancy cases worked by hand per architecture; a SASS loop of known body), then the
compile tier: the report over every kernel, and the hot-loop targets of the "Ready for the first
GPU" issue (numba GEMM v3 and attention v2: every innermost FMA loop <= 4 SASS instructions per
FFMA, no shared access worse than 2-way).
"""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from numba import cuda, float32

from moonvit_kernels import registry
from moonvit_kernels.tools.xray import arch, catalogue, counters, launch_counts, occupancy, roofline, sass, trace
from moonvit_kernels.tools.xray.counters import strided

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ============================================================================ counters (requests by hand)
@pytest.mark.parametrize(
    "stride_words, expected",
    [(1, 1), (32, 32), (2, 2), (0, 1), (3, 1), (16, 16), (33, 1), (64, 32)],
)
def test_wavefronts_of_strided_float_requests(stride_words, expected):
    assert counters.wavefronts(strided(4 * stride_words)) == (expected, 1)


def test_wavefronts_of_vector_requests_run_in_phases():
    # 16-byte vectors, stride 1: 4 quarter-warp phases of one wavefront each
    assert counters.wavefronts(strided(16, size=16)) == (4, 4)
    # 8-byte vectors, stride 1: 2 half-warp phases of one wavefront each
    assert counters.wavefronts(strided(8, size=8)) == (2, 2)
    # 16-byte vectors 2 rows of 32 words apart within a phase: lanes 0 and 1 of each phase collide
    assert counters.wavefronts(strided(128, size=16)) == (4 * 8, 4)


def test_wavefronts_of_partial_warps_and_broadcast_groups():
    # 8 active lanes reading consecutive words: one phase, one wavefront
    assert counters.wavefronts(strided(4, lanes=range(8))) == (1, 1)
    # lanes in pairs on one word (broadcast inside each pair), pairs 32 words apart: 16 distinct words in bank 0
    pairs = [(lane, (lane // 2) * 128, 4) for lane in range(32)]
    assert counters.wavefronts(pairs) == (16, 1)


def test_sectors_of_strided_requests():
    assert counters.sectors(strided(4)) == (4, 4)  # 128 contiguous bytes
    assert counters.sectors(strided(128)) == (32, 4)  # stride-32 floats: a sector per lane
    assert counters.sectors(strided(0)) == (1, 1)  # one address for all
    assert counters.sectors(strided(8)) == (8, 4)  # stride-2 floats: half of every sector wasted
    assert counters.sectors(strided(16, size=16)) == (16, 16)  # 512 contiguous bytes
    assert counters.sectors(strided(4, base=16)) == (5, 4)  # misaligned by half a sector: one extra


def test_counters_reject_bad_requests():
    assert counters.wavefronts([]) == (0, 0)
    assert counters.sectors([]) == (0, 0)
    with pytest.raises(ValueError, match="lane 32"):
        counters.wavefronts([(32, 0, 4)])
    with pytest.raises(ValueError, match="access size 3"):
        counters.sectors([(0, 0, 3)])
    with pytest.raises(ValueError, match="mixes access sizes"):
        counters.wavefronts([(0, 0, 4), (1, 8, 8)])
    with pytest.raises(ValueError, match="negative address"):
        counters.sectors([(0, -4, 4)])


# ============================================================================ counters on traced kernels
@cuda.jit
def _shared_stride_kernel(out, stride):
    buf = cuda.shared.array(2048, float32)
    tid = cuda.threadIdx.x
    buf[tid] = float32(tid)
    cuda.syncthreads()
    out[tid] = buf[(tid * stride) % 2048]


@cuda.jit
def _global_stride_kernel(src, out, stride):
    tid = cuda.threadIdx.x
    out[tid] = src[tid * stride]


@cuda.jit
def _transpose_padded(a, out):
    tile = cuda.shared.array((32, 33), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    tile[ty, tx] = a[ty, tx]
    cuda.syncthreads()
    out[ty, tx] = tile[tx, ty]


@cuda.jit
def _transpose_unpadded(a, out):
    tile = cuda.shared.array((32, 32), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    tile[ty, tx] = a[ty, tx]
    cuda.syncthreads()
    out[ty, tx] = tile[tx, ty]


def _trace(kernel, grid, block, args, names):
    from numba import config

    if not config.ENABLE_CUDASIM:
        pytest.skip("address tracing runs under numba's CUDA simulator (a GPU is present)")
    return trace.merge_sites(trace.analyse(trace.run_traced(kernel, grid, block, args, names)))


def _site(sites, array, store):
    (s,) = [s for s in sites if s.array == array and s.store == store]
    return s


@pytest.mark.parametrize("stride, expected", [(1, 1), (32, 32), (2, 2), (0, 1)])
def test_traced_shared_reads(stride, expected):
    out = np.zeros(64, np.float32)
    sites = _trace(_shared_stride_kernel, 1, 64, [out, np.int32(stride)], ["out", "stride"])
    load = _site(sites, "buf", False)
    assert (load.requests, load.per_request, load.factor) == (2, expected, expected)
    assert _site(sites, "buf", True).factor == 1
    assert _site(sites, "out", True).per_request == 4  # 32 floats = 4 sectors
    if stride <= 1:
        np.testing.assert_array_equal(out, np.arange(64) * stride)


@pytest.mark.parametrize("stride, sectors", [(1, 4), (32, 32), (2, 8), (0, 1)])
def test_traced_global_reads(stride, sectors):
    rng = np.random.default_rng(3)
    src = rng.standard_normal(32 * 32 + 1).astype(np.float32)
    out = np.zeros(32, np.float32)
    sites = _trace(_global_stride_kernel, 1, 32, [src, out, np.int32(stride)], ["src", "out", "stride"])
    load = _site(sites, "src", False)
    assert load.per_request == sectors
    assert load.factor == pytest.approx(sectors / (4 if stride else 1))
    np.testing.assert_array_equal(out, src[np.arange(32) * stride])
    assert "src[tid * stride]" in load.code and load.where.startswith("test_xray.py:")


def test_traced_transpose_padding_removes_bank_conflicts():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((32, 32)).astype(np.float32)
    for kernel, expected in ((_transpose_padded, 1), (_transpose_unpadded, 32)):
        out = np.zeros_like(a)
        sites = _trace(kernel, 1, (32, 32), [a, out], ["a", "out"])
        np.testing.assert_array_equal(out, a.T)
        assert _site(sites, "tile", True).factor == 1  # row-wise stores
        assert _site(sites, "tile", False).factor == expected  # column reads
        assert _site(sites, "a", False).per_request == 4 and _site(sites, "out", True).per_request == 4


def test_tracing_needs_the_simulator_or_says_so():
    from numba import config

    if config.ENABLE_CUDASIM:
        config.ENABLE_CUDASIM = False
        try:
            with pytest.raises(RuntimeError, match="simulator"):
                trace.run_traced(_global_stride_kernel, 1, 32, [], [])
        finally:
            config.ENABLE_CUDASIM = True


# ============================================================================ SASS parser and loop finder
LISTING = """
        .section        .text.k,"ax",@progbits
k:
        /*0000*/                   S2R R0, SR_TID.X ;
.L_x_0:
        /*0010*/                   LDS R2, [R0] ;
.L_x_1:
        /*0020*/                   FFMA R4, R2, R2, R4 ;
        /*0030*/                   FFMA R5, R2, R4, R5 ;
        /*0040*/                   IADD3 R0, R0, 0x1, RZ ;
        /*0050*/                   ISETP.GE.AND P0, PT, R0, 0x10, PT ;
        /*0060*/              @!P0 BRA `(.L_x_1) ;
        /*0070*/                   HFMA2.MMA R7, -RZ, RZ, 0, 0 ;
        /*0080*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0090*/                   FFMA R6, R4, R5, R6 ;
        /*00a0*/               @P1 BRA `(.L_x_0) ;
        /*00b0*/                   EXIT ;
.L_x_2:
        /*00c0*/                   BRA `(.L_x_2);
        /*00d0*/                   NOP;
"""


def test_loop_finder_on_a_listing_with_nested_loops():
    (fn,) = sass.parse(LISTING)
    assert fn.name == "k" and len(fn.instructions) == 14
    assert [(lp.start, lp.end, lp.innermost) for lp in fn.loops] == [(0x10, 0xA0, False), (0x20, 0x60, True)]
    inner = fn.loops[1]
    assert inner.size == 5 and inner.fmas == 2 and inner.per_fma == 2.5
    assert dict(inner.mix) == {"fma": 2, "int": 2, "control": 1}
    outer = fn.loops[0]
    assert outer.size == 5 and outer.fmas == 1  # LDS, HFMA2.MMA (a move), BAR, FFMA, BRA outside the inner loop
    assert outer.mix["int"] == 1 and outer.mix["bar"] == 1 and outer.mix["lds"] == 1
    assert fn.hot_loop is inner and fn.fma_loops == [inner]
    assert fn.mix["fma"] == 3 and sum(fn.mix.values()) == 13  # the NOP is not counted


# nvdisasm lines of this project's sm_90a / sm_90 cubins (the SYNCS .RED form from a cluster kernel)
REAL_SASS = """
        .section        .text.k,"ax",@progbits
k:
        /*07e0*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR12], R24 ;
        /*2750*/                   HGMMA.64x128x16.F32.BF16 R24, R100, gdesc[UR12], R24, gsb0 ;
        /*3f80*/                   HMMA.16816.F32.BF16 R28, R40.reuse, R152, RZ ;
        /*1f10*/                   LDSM.16.M88.4 R44, [R9+0x20] ;
        /*12f70*/                  UTMALDG.2D [UR12], [UR20] ;
        /*2770*/              @!P0 SYNCS.ARRIVE.TRANS64.RED.A1T0 RZ, [UR7], RZ ;
"""


def test_sass_parser_keeps_modifiers_with_lowercase_letters_whole():
    (fn,) = sass.parse(REAL_SASS)
    got = [(i.predicate, i.opcode, i.modifiers, i.operands.strip()) for i in fn.instructions]
    assert got == [
        ("", "HGMMA", ".64x128x16.F32.BF16", "R24, gdesc[UR12], R24"),
        ("", "HGMMA", ".64x128x16.F32.BF16", "R24, R100, gdesc[UR12], R24, gsb0"),
        ("", "HMMA", ".16816.F32.BF16", "R28, R40.reuse, R152, RZ"),
        ("", "LDSM", ".16.M88.4", "R44, [R9+0x20]"),
        ("", "UTMALDG", ".2D", "[UR12], [UR20]"),
        ("@!P0", "SYNCS", ".ARRIVE.TRANS64.RED.A1T0", "RZ, [UR7], RZ"),
    ]
    assert str(fn.instructions[1]) == "HGMMA.64x128x16.F32.BF16 R24, R100, gdesc[UR12], R24, gsb0"
    assert str(fn.instructions[5]) == "@!P0 SYNCS.ARRIVE.TRANS64.RED.A1T0 RZ, [UR7], RZ"
    assert [i.category for i in fn.instructions] == ["mma", "mma", "mma", "lds", "ldg", "bar"]
    assert [i.address for i in fn.instructions] == [0x7E0, 0x2750, 0x3F80, 0x1F10, 0x12F70, 0x2770]


@pytest.mark.compile
def test_loop_finder_on_a_compiled_kernel():
    from moonvit_kernels.tools import nvrtc_check

    if sass.nvdisasm_path() is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")
    src = r"""
extern "C" __global__ void dot_loop(const float* __restrict__ x, float* __restrict__ y, int n, float a) {
  __shared__ float s[100];
  float acc = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) acc = fmaf(a, x[i], acc);
  s[threadIdx.x % 100] = acc;
  __syncthreads();
  y[threadIdx.x] = s[(threadIdx.x + 1) % 100];
}
"""
    from moonvit_kernels.tools.xray.cubin import kernel_resources

    for target in ("sm_80", "sm_89", "sm_90"):  # the cubin layouts differ (register byte, shared reserve)
        cubin, log, _ = nvrtc_check.compile_text(src, "dot_loop.cu", ["dot_loop"], target)
        res = kernel_resources(cubin, target)["dot_loop"]
        info = nvrtc_check.parse_ptxas_log(log)["dot_loop"]
        assert (res["registers"], res["static_shared"]) == (info.registers, 400) == (info.registers, info.static_smem)
    (fn,) = sass.disassemble(cubin)
    (loop,) = fn.loops  # the strided for loop: one load, one FFMA, index update, compare, branch
    assert loop.innermost and loop.fmas == 1
    assert loop.mix["ldg"] == 1 and loop.mix["control"] == 1
    assert 4 <= loop.size <= 8


@pytest.mark.compile
def test_hopper_kernels_in_the_xray(tmp_path, monkeypatch):
    """The sm_90 report takes the sm_90a builds: resources from the cubin, the catalogue's model, and the
    SASS counts that tell the generations apart (HGMMA / UTMALDG vs HMMA / LDGSTS)."""
    import json

    from moonvit_kernels.cuda_backend import sources
    from moonvit_kernels.tools import nvrtc_check
    from moonvit_kernels.tools.xray import build, report

    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings (numba-cuda[cu13]) not installed")
    spec = next(s for s in registry.specs_for("sm_90a") if s.label == "gemm_bf16_sm90_bn128_bf16_gelu_tanh")
    ampere = next(s for s in registry.specs_for("sm_90") if s.label == "gemm_bf16_tc_bf16_gelu_tanh")
    built = {"sm_90a": nvrtc_check.build_cubin(spec, "sm_90a"), "sm_90": nvrtc_check.build_cubin(ampere, "sm_90")}
    calls = []

    def fake_build(arch_name, head_dims, workers):
        calls.append(arch_name)
        cubin, rep = built.get(arch_name, (b"", None))
        return [(nvrtc_check.cubin_filename(rep.spec, arch_name), cubin, rep)] if cubin else []

    monkeypatch.setattr(nvrtc_check, "build_cubins", fake_build)
    build._build_cuda_into("sm_80", tmp_path / "a", (128,))
    build._build_cuda_into("sm_90", tmp_path / "b", (128,))
    assert calls == ["sm_80", "sm_90", "sm_90a"]  # sm_90a beside sm_90 only
    index = json.loads((tmp_path / "b" / "index.json").read_text())
    bins = {b.label: b for b in (build.Binary(**d) for d in index)}
    hop = bins[spec.label]
    assert (hop.arch, hop.registers, hop.stack_bytes, hop.threads) == ("sm_90a", 168, 0, 384)
    assert hop.dynamic_shared == sources.gemm_sm90_smem_bytes(128) and hop.static_shared == 0
    info = catalogue.describe("cuda", hop.label, hop.threads, hop.dynamic_shared)
    assert (info.family, info.version, info.peak, info.k3) == ("gemm", "CUDA sm90 wgmma", "wgmma", True)
    assert info.flops == 2.0 * catalogue.L * catalogue.MLP * catalogue.D  # fc0's shape
    attn = catalogue.describe("cuda", "flash_attn_sm90_hd128", 256)
    assert attn.family == "attention" and attn.flops > 0
    if sass.nvdisasm_path() is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")
    rows = {b.label: report._row(report.Report(), b, catalogue.describe("cuda", b.label, b.threads, b.dynamic_shared),
                                 "sm_90", None, True) for b in bins.values()}  # fmt: skip
    counts = {label: dict(kv.split("=") for kv in r.generation_ops.split()) for label, r in rows.items()}
    h, a = counts[spec.label], counts[ampere.label]
    assert int(h["HGMMA"]) > 0 and int(h["UTMALDG"]) > 0 and h["HMMA"] == h["LDGSTS"] == "0"
    assert int(a["HMMA"]) > 0 and int(a["LDGSTS"]) > 0 and a["HGMMA"] == a["UTMALDG"] == "0"
    hot = rows[spec.label]
    assert "mma=4" in hot.hot_loop_mix and hot.hot_loop_per_fma < 40  # the K loop (4 HGMMA), not the GELU epilogue
    assert hot.blocks_per_sm == 1
    assert "Hopper vs Ampere ops" in report.markdown(report.Report(rows=list(rows.values())), ["sm_90"])


def test_disassembly_errors_are_clear(monkeypatch):
    monkeypatch.setattr(sass, "nvdisasm_path", lambda: None)
    with pytest.raises(RuntimeError, match="nvidia-cuda-nvdisasm"):
        sass.disassemble_text(b"\x7fELF")


# ============================================================================ occupancy (worked by hand)
@pytest.mark.parametrize(
    "arch_name, blocks, warps, limiter",
    [("sm_80", 2, 16, "registers"), ("sm_89", 2, 16, "registers"), ("sm_90", 2, 16, "registers")],
)
def test_register_limited(arch_name, blocks, warps, limiter):
    # 96 regs x 32 lanes = 3072 per warp; 16384 // 3072 = 5 warps per sub-partition, 20 per SM; 20 // 8 = 2
    o = occupancy.occupancy(arch_name, 256, 96)
    assert (o.blocks_per_sm, o.warps_per_sm, o.limiter) == (blocks, warps, limiter)


def test_register_allocation_granularity():
    # 33 regs: 1056 per warp rounds up to 1280; 12 warps per sub-partition, 48 per SM -> 6 blocks of 8 warps
    assert occupancy.occupancy("sm_90", 256, 33).blocks_per_sm == 6
    assert occupancy.occupancy("sm_90", 256, 32).blocks_per_sm == 8


def test_registers_are_allocated_per_sm_sub_partition():
    """80 registers: 2,560 per warp, 6 warps in each of the 4 sub-partitions = 24 warps per SM, not
    65,536 // 2,560 = 25: 4 blocks of 160 threads (not 5), and 800 threads cannot launch at all."""
    o = occupancy.occupancy("sm_90", 160, 80)
    assert (o.blocks_per_sm, o.limiter, o.by_limit["registers"]) == (4, "registers", 4)
    o = occupancy.occupancy("sm_90", 800, 80)
    assert o.blocks_per_sm == 0 and "at most 24 warps" in o.problems[0]
    assert occupancy.occupancy("sm_90", 768, 80).blocks_per_sm == 1


@pytest.mark.parametrize("arch_name, blocks", [("sm_80", 1), ("sm_89", 1), ("sm_90", 2)])
def test_shared_limited(arch_name, blocks):
    # flash_attn_bf16<128>: 87,040 B dynamic + 1 KiB reserve = 88,064 B per block
    # sm_90: 233,472 // 88,064 = 2; sm_80: 167,936 // 88,064 = 1; sm_89: 102,400 // 88,064 = 1
    o = occupancy.occupancy(arch_name, 128, 32, 0, 87040)
    assert (o.blocks_per_sm, o.limiter) == (blocks, "shared")


@pytest.mark.parametrize("arch_name, blocks, occ", [("sm_80", 32, 0.5), ("sm_89", 24, 0.5), ("sm_90", 32, 0.5)])
def test_block_limited(arch_name, blocks, occ):
    o = occupancy.occupancy(arch_name, 32, 16)
    assert (o.blocks_per_sm, o.occupancy, o.limiter) == (blocks, occ, "blocks")


def test_warp_limited_on_sm89():
    o = occupancy.occupancy("sm_89", 1024, 32)  # 48 warps per SM, 32 per block
    assert (o.blocks_per_sm, o.limiter) == (1, "warps")


def test_launches_that_cannot_happen():
    o = occupancy.occupancy("sm_90", 1024, 127)  # attention v1 hd24: 4,096 per warp x 32 warps > 65,536 registers
    assert o.blocks_per_sm == 0 and o.limiter == "cannot launch" and "do not fit the register file" in o.problems[0]
    assert "per block (opt-in limit)" in occupancy.occupancy("sm_89", 128, 32, 0, 100 * 1024).problems[0]
    assert "static shared" in occupancy.occupancy("sm_90", 128, 32, 49 * 1024).problems[0]
    assert "threads" in occupancy.occupancy("sm_90", 2048, 16).problems[0]
    with pytest.raises(ValueError, match="threads=0"):
        occupancy.occupancy("sm_90", 0, 32)
    with pytest.raises(ValueError, match="unknown architecture 'sm_75'"):
        occupancy.occupancy("sm_75", 128, 32)


def test_parse_archs():
    assert arch.parse_archs("sm_80, 90") == ["sm_80", "sm_90"]
    with pytest.raises(ValueError, match="unknown architecture"):
        arch.parse_archs("sm_70")
    with pytest.raises(ValueError, match="no architecture"):
        arch.parse_archs(" , ")


# ============================================================================ roofline
def test_compute_roofs_per_instruction_class():
    h200, a100 = arch.GPUS["H200"], arch.GPUS["A100"]
    wqkv = catalogue.describe("numba", "gemm_v3_none")
    M, N, K = catalogue.L, 3 * catalogue.Q, catalogue.D
    assert wqkv.flops == 2 * M * N * K and wqkv.peak == "fp32"
    b = roofline.bound(wqkv, h200)
    assert b.limit == "FFMA" and b.seconds == pytest.approx(2 * M * N * K / 67e12) and set(b.roofs) == {"FFMA", "DRAM"}
    tc = catalogue.describe("cuda", "gemm_bf16_tc_bf16_none")  # mma.sync: not held to the wgmma dense peak
    assert tc.peak == "mma_sync" and roofline.bound(tc, h200).seconds == pytest.approx(2 * M * N * K / (989e12 / 2))
    assert roofline.bound(tc, a100).seconds == pytest.approx(2 * M * N * K / 312e12)  # A100: its datasheet peak
    hopper = catalogue.describe("cuda", "gemm_bf16_sm90_bn128_bf16_none")
    assert hopper.peak == "wgmma" and roofline.bound(hopper, h200).limit == "wgmma"
    assert roofline.bound(hopper, h200).roofs["wgmma"] == pytest.approx(hopper.flops / 989e12)
    assert catalogue.describe("cuda", "flash_attn_bf16_hd128").peak == "mma_sync"
    assert h200.mma_sync_flops < h200.wgmma_flops and "not a datasheet" in h200.mma_sync_source
    with pytest.raises(ValueError, match="A100 SXM 80GB .* has no wgmma"):
        roofline.peak_flops(a100, "wgmma")
    norm = catalogue.describe("numba", "rmsnorm_kernel_t256")
    b = roofline.bound(norm, h200)
    assert b.limit == "DRAM" and b.seconds == pytest.approx(norm.dram_bytes / 4.8e12)
    assert roofline.bound(catalogue.describe("numba", "attention_v2_hd24_q32_k16"), h200) is None  # not K3
    with pytest.raises(ValueError, match="peak 'fp16'"):
        roofline.peak_flops(h200, "fp16")


def test_shared_and_issue_roofs_per_gpu():
    """Clock from the datasheet fp32 peak (fp32 / (2 x FP32 lanes x SMs)); shared memory serves one 128-byte
    wavefront per clock per SM, the schedulers issue 4 warp-instructions per clock per SM."""
    h200, a100, l40s = arch.GPUS["H200"], arch.GPUS["A100"], arch.GPUS["L40S"]
    assert h200.clock_hz == pytest.approx(1.98e9, rel=2e-3) and a100.clock_hz == pytest.approx(1.41e9, rel=2e-3)
    assert l40s.clock_hz == pytest.approx(2.52e9, rel=2e-3)
    assert h200.shared_wavefronts_per_s == pytest.approx(132 * h200.clock_hz)
    assert h200.issue_per_s == pytest.approx(4 * 132 * h200.clock_hz)
    assert h200.shared_wavefronts_per_s * 128 == pytest.approx(33.5e12, rel=0.01)  # bytes/s of shared memory
    info = catalogue.describe("numba", "gemm_v3_none")
    counts = launch_counts.LaunchCounts([(0, 1.0)], issued=2e9, shared_instructions=1e8, shared_wavefronts=5e8)
    b = roofline.bound(info, h200, counts)
    assert b.roofs["shared"] == pytest.approx(5e8 / (132 * h200.clock_hz))
    assert b.roofs["issue"] == pytest.approx(2e9 / (4 * 132 * h200.clock_hz))
    assert b.limit == "shared" and b.seconds == b.roofs["shared"] == max(b.roofs.values())
    counts.shared_wavefronts = 1e6
    assert roofline.bound(info, h200, counts).limit == "issue"


def test_request_bytes_fall_with_each_gemm_version():
    req = [catalogue.describe("numba", f"gemm_v{v}_none").request_bytes for v in (1, 2, 3)]  # the first three
    assert req[0] > req[1] > req[2] > catalogue.describe("numba", "gemm_v3_none").dram_bytes


# ============================================================================ launch counts (a listing by hand)
COUNTED = """
        .section        .text.k,"ax",@progbits
k:
        /*0000*/                   S2R R0, SR_TID.X ;
.L_x_0:
        /*0010*/                   STS [R0], R2 ;
        /*0020*/                   LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;
.L_x_1:
        /*0030*/                   LDS.128 R4, [R0] ;
        /*0040*/                   LDS R8, [R0+0x4] ;
        /*0050*/                   FFMA R9, R4, R8, R9 ;
        /*0060*/                   FFMA R10, R5, R8, R10 ;
        /*0070*/                   LDSM.16.M88.4 R12, [R0] ;
        /*0080*/                   NOP ;
        /*0090*/                   IADD3 R0, R0, 0x1, RZ ;
        /*00a0*/              @!P0 BRA `(.L_x_1) ;
.L_x_2:
        /*00b0*/                   LDS.64 R4, [R0] ;
        /*00c0*/                   FFMA R9, R4, R5, R9 ;
        /*00d0*/              @!P0 BRA `(.L_x_2) ;
        /*00e0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*00f0*/               @P1 BRA `(.L_x_0) ;
        /*0100*/                   EXIT ;
"""


def test_wavefronts_and_multiply_adds_per_instruction():
    (fn,) = sass.parse(COUNTED)
    by_op = {f"{i.opcode}{i.modifiers}": i for i in fn.instructions}
    wf = {op: launch_counts.wavefronts(i) for op, i in by_op.items() if launch_counts.wavefronts(i)}
    assert wf == {"STS": 1, "LDGSTS.E.BYPASS.128": 4, "LDS.128": 4, "LDS": 1, "LDSM.16.M88.4": 4, "LDS.64": 2}
    assert launch_counts.multiply_adds(by_op["FFMA"]) == 32
    hmma, hgmma = sass.parse(REAL_SASS)[0].instructions[2], sass.parse(REAL_SASS)[0].instructions[0]
    assert launch_counts.multiply_adds(hmma) == 16 * 8 * 16  # m16n8k16 per warp
    assert launch_counts.multiply_adds(hgmma) == 64 * 128 * 16 // 4  # m64n128k16 per warpgroup, one warp's share
    with pytest.raises(ValueError, match="HMMA shape"):
        launch_counts.multiply_adds(sass.Instruction(0, "HMMA", ".1111.F32", "R0"))


def test_counts_scale_the_fma_loops_by_the_flops():
    (fn,) = sass.parse(COUNTED)
    hot = fn.hot_loop
    assert (hot.start, hot.size, hot.fmas) == (0x30, 7, 2)  # the NOP is not an instruction issued
    flops = 2 * 64 * 1000  # 1000 trips of the hot loop (2 FFMA x 32 lanes)
    c = launch_counts.count(fn, flops)
    assert c.loops == [(0x30, 1000.0)] and c.issued == 7000 and c.shared_instructions == 3000
    assert c.shared_wavefronts == 1000 * (4 + 1 + 4)  # LDS.128, LDS, LDSM.x4; the outer loop's STS not counted
    assert c.conflicts == launch_counts.UNTRACED
    # two innermost FMA loops sharing the FLOPs 1:3 (as the catalogue says for attention v2's QK and PV)
    c = launch_counts.count(fn, flops, shares=(0.25, 0.75))
    assert c.loops == [(0x30, 250.0), (0xB0, 1500.0)]
    assert c.issued == 250 * 7 + 1500 * 3 and c.shared_wavefronts == 250 * 9 + 1500 * 2
    c = launch_counts.count(fn, flops, shares=(0.5, 0.25, 0.25))  # the SASS has 2: fall back, and say so
    assert c.loops == [(0x30, 1000.0)] and "hot loop only" in c.notes[0]
    c = launch_counts.count(fn, flops, shares=(1.0,))  # one phase: the loop with the most multiply-adds
    assert c.loops == [(0x30, 1000.0)] and not c.notes
    assert launch_counts.count(sass.parse(LISTING.replace("FFMA", "FMUL"))[0], flops) is None  # no FMA loop


def test_counts_take_the_traced_conflict_factors():
    (fn,) = sass.parse(COUNTED)
    tr = trace.TraceResult("k", "hand-made")
    tr.sites = [
        trace.SiteStats("shared", "a", "k.py", 1, False, requests=10, cost=30, ideal=10),  # loads 3-way...
        trace.SiteStats("shared", "b", "k.py", 2, False, requests=10, cost=10, ideal=10),  # ...and conflict-free
        trace.SiteStats("shared", "a", "k.py", 3, True, requests=4, cost=8, ideal=4),  # stores 2-way
        trace.SiteStats("global", "g", "k.py", 4, False, requests=4, cost=64, ideal=4),  # not shared: ignored
    ]
    assert launch_counts.conflict_factors(tr) == (2.0, 2.0)
    c = launch_counts.count(fn, 2 * 64 * 1000, trace=tr)
    assert (c.load_factor, c.conflicts) == (2.0, "traced: loads x2.00, stores x2.00 the ideal wavefronts")
    assert c.shared_wavefronts == 1000 * 9 * 2
    tr.error = "failed"
    assert launch_counts.conflict_factors(tr) is None


# ============================================================================ calibration
def _row(backend, label, arch_name="sm_90"):
    from moonvit_kernels.tools.xray import report

    info = catalogue.describe(backend, label)
    return report.Row(backend, label, info.family, info.version, info.specialisation, arch_name, info.k3,
                      info.threads, 64, 0, 0, 0, 0, 1, 8, 0.1, "registers", flops=info.flops,
                      dram_bytes=info.dram_bytes)  # fmt: skip


def test_a_measured_row_matches_only_the_kernel_it_timed():
    """Rows as the first H200 report wrote them (item, backend, dtype): a Hopper item never lands on an
    mma.sync kernel when the list has no Hopper kernel (the bug that report showed), the fp32 SIMT GEMM is
    found by its dtype, and another epilogue, output dtype or tile width is another kernel."""
    from moonvit_kernels.tools.xray import calibration

    listed = [_row("cuda", "gemm_bf16_tc_f32_none"), _row("cuda", "gemm_fp32_simt_none"),
              _row("cuda", "flash_attn_bf16_hd128"), _row("cuda", "gemm_bf16_sm90_bn128_bf16_none"),
              _row("numba", "gemm_v3_none"), _row("numba", "gemm_v3_gelu_tanh")]  # fmt: skip

    def match(item, backend, dtype, rows=listed):
        found = calibration.match_row({"item": item, "backend": backend, "dtype": dtype}, rows)
        return None if found is None else found.kernel

    assert match("flash_attn_sm90", "CUDA C", "bfloat16") is None
    assert match("attention_bfloat16", "CUDA C", "bfloat16") == "flash_attn_bf16_hd128"
    assert match("gemm_fp32 qkv", "CUDA C", "float32->float32") == "gemm_fp32_simt_none"
    assert match("gemm_bf16 patch_embed", "CUDA C", "bfloat16->float32") == "gemm_bf16_tc_f32_none"
    assert match("gemm_bf16 qkv", "CUDA C", "bfloat16->bfloat16") is None  # bf16 out: not the f32 instantiation
    assert match("gemm_bf16 wo+residual", "CUDA C", "bfloat16->float32") is None  # another epilogue
    assert match("gemm_bf16_sm90 bn128 qkv", "CUDA C", "bfloat16->bfloat16") == "gemm_bf16_sm90_bn128_bf16_none"
    assert match("gemm_bf16_sm90 bn256 qkv", "CUDA C", "bfloat16->bfloat16") is None  # another tile width
    assert match("gemm v3 fc0+gelu_tanh", "numba", "float32") == "gemm_v3_gelu_tanh"
    assert match("gemm v2 qkv", "numba", "float32") is None  # v2 is not listed


def test_calibration_puts_measured_rates_beside_the_bounds(tmp_path):
    from moonvit_kernels.tools.xray import calibration, report

    rep = report.Report(rows=[_row("numba", "gemm_v3_none"), _row("numba", "gemm_v3_gelu_tanh"),
                              _row("numba", "attention_v2_hd128_q32_k16"), _row("cuda", "gemm_bf16_tc_bf16_gelu_tanh"),
                              _row("cuda", "gemm_bf16_sm90_bn128_bf16_gelu_tanh"), _row("numba", "rmsnorm_kernel_t256"),
                              _row("numba", "gemm_v3_none", "sm_80")])  # fmt: skip
    run = tmp_path / "H200-2026-01-01"
    run.mkdir()
    (run / "results.csv").write_text(
        "section,item,backend,shape,unit,rate,peak\n"
        "kernels,gemm v3 qkv,numba,4096x4608x1024,TFLOP/s,12.5,\n"
        "kernels,gemm v3 fc0+gelu_tanh,numba,4096x4096x1024,TFLOP/s,11.0,\n"
        "kernels,attention v2,numba,L=4096 H=12 hd=128,TFLOP/s,3.0,\n"
        "kernels,gemm_bf16 fc0+gelu_tanh,cuda,4096x4096x1024,TFLOP/s,200.0,\n"
        "kernels,gemm_bf16_sm90 bn128 fc0+gelu_tanh,hopper,4096x4096x1024,TFLOP/s,600.0,\n"
        "kernels,rmsnorm,numba,4096x1024,GB/s,2000,\n"
        "kernels,rope,numba,4096,GB/s,,\n"
        "tower,forward,numba,,ms,5,\n"
    )
    assert calibration.results_files(tmp_path) == [run / "results.csv"]
    cals = calibration.calibrate(rep, run / "results.csv")
    got = {c.item: c for c in cals}
    assert list(got) == ["gemm v3 qkv", "gemm v3 fc0+gelu_tanh", "attention v2", "gemm_bf16 fc0+gelu_tanh",
                         "gemm_bf16_sm90 bn128 fc0+gelu_tanh", "rmsnorm"]  # fmt: skip
    assert [got[i].kernel for i in got] == ["gemm_v3_none", "gemm_v3_gelu_tanh", "attention_v2_hd128_q32_k16",
                                            "gemm_bf16_tc_bf16_gelu_tanh", "gemm_bf16_sm90_bn128_bf16_gelu_tanh",
                                            "rmsnorm_kernel_t256"]  # fmt: skip
    h200 = arch.GPUS["H200"]
    v3 = got["gemm v3 qkv"]  # no SASS counts here: the FFMA roof binds, 67 TFLOP/s
    assert v3.bound_rate == pytest.approx(67.0) and v3.binds == "FFMA" and v3.ratio == pytest.approx(12.5 / 67)
    norm = got["rmsnorm"]
    assert norm.bound_rate == pytest.approx(h200.dram_bytes_per_s / 1e9) and norm.ratio == pytest.approx(2000 / 4800)
    assert got["gemm_bf16_sm90 bn128 fc0+gelu_tanh"].binds == "wgmma"
    lines = calibration.markdown(cals, run / "results.csv", "H200")
    assert "H200" in lines[0] and any("| gemm v3 qkv | numba |" in line and "0.19 |" in line for line in lines)
    with pytest.raises(ValueError, match="cannot tell which GPU"):
        (tmp_path / "mystery").mkdir()
        (tmp_path / "mystery" / "results.csv").write_text("section,item,backend,unit,rate\nkernels,rope,numba,GB/s,1\n")
        calibration.calibrate(rep, tmp_path / "mystery" / "results.csv")


def test_no_gpu_run_is_said_plainly(tmp_path):
    from moonvit_kernels.tools.xray import calibration, report

    rep = report.Report(rows=[_row("numba", "gemm_v3_none")])
    assert calibration.results_files(tmp_path) == [] and calibration.attach(rep, []) == {}
    assert rep.calibration == [calibration.NO_GPU_RUN] and "No GPU run yet" in calibration.NO_GPU_RUN
    assert "No GPU run yet" in report.markdown(rep, ["sm_90"])


def test_roofline_plot_draws_every_roof_and_measured_points(tmp_path):
    from moonvit_kernels.tools.xray import calibration

    h200 = arch.GPUS["H200"]
    points = []
    for backend, label in (
        ("numba", "gemm_v3_none"),
        ("cuda", "flash_attn_bf16_hd128"),
        ("numba", "rmsnorm_kernel_t256"),
    ):
        info = catalogue.describe(backend, label)
        counts = launch_counts.LaunchCounts([(0, 1.0)], 1e9, 1e8, 3e8) if info.fma_exact else None
        points.append((info, roofline.bound(info, h200, counts)))
    measured = [calibration.Calibration("gemm v3 qkv", "numba", "", "TFLOP/s", 12.5, "gemm_v3_none", "numba", 30.0)]
    path = roofline.plot(points, h200, tmp_path / "r.png", measured)
    assert path.stat().st_size > 10_000


# ============================================================================ the report (compile tier)
def _run_cli(args, timeout=600):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    return subprocess.run(
        [sys.executable, "-m", "moonvit_kernels.tools.xray", *args],
        capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO,
    )  # fmt: skip


def test_cli_rejects_bad_arguments(tmp_path):
    r = _run_cli(["--arch", "sm_70", "--out", str(tmp_path)], timeout=120)
    assert r.returncode == 2 and "unknown architecture 'sm_70'" in r.stderr
    r = _run_cli(["--measured", str(tmp_path / "missing.csv"), "--out", str(tmp_path)], timeout=120)
    assert r.returncode == 2 and "no such file" in r.stderr


@pytest.mark.compile
@pytest.mark.timeout(900)
def test_report_covers_every_kernel_of_both_backends(tmp_path):
    """The whole report on sm_90 without traces: a row per compiled instantiation, resources and SASS
    filled in, every K3 instantiation with a roofline time. (Target: < 90 s on 2 cores once the
    cubins are cached in the temp dir.)"""

    r = _run_cli(["--arch", "sm_90", "--no-trace", "--out", str(tmp_path)])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with open(tmp_path / "xray.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    cuda_labels = {s.label for s in registry.kernel_specs((128,))}
    assert {row["kernel"] for row in rows if row["backend"] == "cuda"} == cuda_labels
    numba = {row["kernel"] for row in rows if row["backend"] == "numba"}
    for expected in ("gemm_v1_none", "gemm_v3_residual", "attention_v1_hd128_t128", "rmsnorm_kernel_t256",
                     "rope2d_kernel", "merge_gather_kernel", "add_pos_emb_bicubic"):  # fmt: skip
        assert expected in numba
    assert any(k.startswith("attention_v2_hd128") for k in numba)
    for row in rows:
        assert int(row["registers"]) > 0, row
        assert row["family"] != "other", row["kernel"]
        assert int(row["blocks_per_sm"]) >= 1 or row["limiter"] == "cannot launch", row
        if row["k3"] == "True" and row["family"] in ("gemm", "attention"):
            assert float(row["roofline_us"]) > 0 and row["hot_loop_per_fma"], row
            assert row["roof_shared_us"] and row["roof_issue_us"] and row["roofline_limit"] in roofline.ROOFS, row
    md = (tmp_path / "xray.md").read_text()
    assert md.count("## ") >= 10 and "## Calibration against a GPU run" in md
    from moonvit_kernels.tools.xray import calibration

    assert ("No GPU run yet" in md) == (not calibration.results_files())  # said plainly until a run lands
    assert (tmp_path / "roofline_H200.png").exists() and (tmp_path / "hot_loop_instr_per_fma.png").exists()
    assert "model, no GPU" in r.stdout
    # the KERNEL filter (cubins now cached): one family, and a name that matches nothing
    r = _run_cli(["gemm_v3", "--arch", "sm_90", "--no-trace", "--out", str(tmp_path / "v3")])
    with open(tmp_path / "v3" / "xray.csv", newline="") as f:
        assert {row["kernel"] for row in csv.DictReader(f)} == {f"gemm_v3_{e}" for e in catalogue.GEMM_SHAPES}
    r = _run_cli(["no_such_kernel", "--arch", "sm_90", "--no-trace", "--out", str(tmp_path / "none")])
    assert r.returncode == 1 and "no kernel matched no_such_kernel" in r.stderr


# ============================================================================ issue 9 targets (compile tier)
TARGET_PER_FFMA = 4.0
TARGET_WAYS = 2.0
TARGET_MESSAGE = "issue 9 target (numba GEMM v3 / attention v2 hot loops): "


def _numba_functions(prefixes):
    from moonvit_kernels.tools.xray import build

    if sass.nvdisasm_path() is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")
    out = {}
    for b in build.binaries("numba", "sm_90"):
        if b.label.startswith(prefixes):
            out[b.label] = max(sass.disassemble_file(b.cubin_path), key=lambda f: len(f.instructions))
    return out


@pytest.mark.compile
@pytest.mark.timeout(900)
def test_issue9_innermost_fma_loops_cost_at_most_4_instructions_per_ffma():
    fns = _numba_functions(("gemm_v3_", "attention_v2_hd128"))
    assert any(k.startswith("gemm_v3_") for k in fns) and any(k.startswith("attention_v2") for k in fns)
    too_slow = []
    for label, fn in sorted(fns.items()):
        assert fn.fma_loops, f"{label}: no innermost loop with an FFMA found"
        for lp in fn.fma_loops:
            if lp.per_fma > TARGET_PER_FFMA:
                too_slow.append(f"{label} loop {lp.start:#x}-{lp.end:#x}: {lp.per_fma:.1f} instr/FFMA ({dict(lp.mix)})")
    assert not too_slow, TARGET_MESSAGE + "; ".join(too_slow)


@pytest.mark.slow
@pytest.mark.parametrize("job_name", ["gemm_v3", "attention_v2"])
def test_issue9_no_shared_access_worse_than_2_way(job_name):
    from numba import config

    from moonvit_kernels.tools.xray import jobs_numba

    if not config.ENABLE_CUDASIM:
        pytest.skip("address tracing runs under numba's CUDA simulator (a GPU is present)")
    (job,) = [j for j in jobs_numba.jobs() if j.name == job_name]
    result = jobs_numba.run(job)
    assert result.error is None, result.error
    shared = [s for s in result.sites if s.space == "shared"]
    assert shared, "no shared-memory access traced"
    bad = [f"{s.where} {s.kind} {s.array}: {s.factor:.0f}-way (`{s.code}`)" for s in shared if s.factor > TARGET_WAYS]
    assert not bad, TARGET_MESSAGE + "; ".join(bad)
    assert all(not math.isnan(s.factor) for s in result.sites)


def test_numba_rope_qkv_loads_and_stores_are_fully_coalesced():
    """Every warp request on qkv touches the fewest 32-byte sectors its bytes fit in (one thread per
    value, consecutive threads on consecutive columns; one thread per 16-byte quad took 4x)."""
    from numba import config

    from moonvit_kernels.tools.xray import jobs_numba

    if not config.ENABLE_CUDASIM:
        pytest.skip("address tracing runs under numba's CUDA simulator (a GPU is present)")
    (job,) = [j for j in jobs_numba.jobs() if j.name == "rope"]
    result = jobs_numba.run(job)
    assert result.error is None, result.error
    qkv = [s for s in result.sites if s.array == "qkv"]
    assert sorted(s.kind for s in qkv) == ["LDG", "LDG", "STG"]  # the value, its pair partner; the value
    for s in qkv:  # H=12, hd=128, 128 threads: 24 passes of 4 warps, each 32 floats = 4 sectors
        assert (s.requests, s.per_request, s.factor, s.worst) == (96, 4.0, 1.0, 1.0), (s.where, s.code)


# ============================================================================ issue 21: shared roof (compile tier)
def _cuda_functions(labels):
    from moonvit_kernels.tools.xray import build

    if sass.nvdisasm_path() is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")
    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings (numba-cuda[cu13]) not installed")
    return {
        b.label: max(sass.disassemble_file(b.cubin_path), key=lambda f: len(f.instructions))
        for b in build.binaries("cuda", "sm_90")
        if b.label in labels
    }


def _ops(loop, *opcodes):
    """How many of `loop`'s own instructions have one of `opcodes` (opcode plus modifiers, e.g. LDS.128)."""
    return sum(1 for i in loop.own if f"{i.opcode}{i.modifiers}" in opcodes)


def _hand_counts():
    """Shared-memory wavefronts of four K3 launches counted by hand: the SASS instructions of one trip of
    each loop x the trips the kernel's tiling makes x the warps of the launch (wavefronts per instruction:
    1 for 4-byte LDS/STS, 4 for LDS.128, ldmatrix.x4 and 16-byte cp.async; conflict-free, as the trace
    tests of these kernels establish). Returns {label: (SASS function, wavefronts per launch)}."""
    from moonvit_kernels.numba_backend import attention as A
    from moonvit_kernels.numba_backend import gemm as G

    L, H, hd = catalogue.L, catalogue.HEADS, catalogue.HD
    M, N, K = catalogue.L, 3 * catalogue.Q, catalogue.D  # wqkv, the "none" epilogue's K3 GEMM
    numba = _numba_functions(("gemm_v3_none", "attention_v2_hd128"))
    cuda = _cuda_functions(("gemm_fp32_simt_none", "flash_attn_bf16_hd128"))
    out = {}

    # numba GEMM v3: the k loop trips 2x per BK = 16 slab (8 k-steps of TM x TN = 16 FFMA per trip),
    # 64 single-word LDS per trip; staging: V3_LOADS_A + V3_LOADS_B STS per thread per slab
    fn = numba["gemm_v3_none"]
    (kloop,) = fn.fma_loops
    assert (kloop.fmas, _ops(kloop, "LDS")) == (128, 64), "premise of the hand count changed: " + str(kloop.mix)
    trips = G.BK * G.TM * G.TN // kloop.fmas
    per_warp_slab = trips * 64 + (G.V3_LOADS_A + G.V3_LOADS_B)
    warps = (M // G.BM) * (N // G.BN) * (G.V3_THREADS // 32)
    out["gemm_v3_none"] = (fn, warps * (K // G.BK) * per_warp_slab)

    # numba attention v2 (hd 128, 32 x 16 tiles): per key tile a thread runs the QK loop (16 FFMA, 32 LDS
    # a trip, hd / 16 trips) and the PV loop (64 FFMA, 72 LDS, BK x hd / BK / 64 trips), reads BK scores for
    # the running max, stores its score and its probability, and stages 2 x BK x hd / threads K and V values
    label = next(k for k in numba if k.startswith("attention_v2_hd128"))
    fn = numba[label]
    qk, pv = fn.fma_loops
    assert (qk.fmas, _ops(qk, "LDS"), pv.fmas, _ops(pv, "LDS")) == (16, 32, 64, 72), "premise changed"
    bq, bk = A.V2_BLOCK_Q, A.V2_BLOCK_K
    per_warp_tile = (hd // 16) * 32 + (bk * (hd // bk) // 64) * 72 + bk + 2 + 2 * bk * hd // (bq * bk)
    warps = (L // bq) * H * (bq * bk // 32)
    out[label] = (fn, warps * (L // bk) * per_warp_tile)

    # CUDA fp32 GEMM (gemm_fp32.cu: 64 x 64 tile, BK = 16, 256 threads, 4 x 4 per thread): one trip of its
    # loop per slab: 16 k-steps x (LDS.128 of A + LDS.128 of B) and 4 + 4 STS staging the next slab
    fn = cuda["gemm_fp32_simt_none"]
    loop = fn.hot_loop
    assert (loop.fmas, _ops(loop, "LDS.128"), _ops(loop, "STS")) == (256, 32, 8), "premise changed"
    per_warp_slab = 32 * 4 + 8
    out["gemm_fp32_simt_none"] = (fn, (M // 64) * (N // 64) * (256 // 32) * (K // 16) * per_warp_slab)

    # CUDA flash bf16 (attention.cu: BQ = BKV = 64, 4 warps of 16 query rows): per key tile a warp does
    # 64 + 64 HMMA.16816 (S = Q·Kᵀ, O += P·V), reading K and V with 32 + 32 ldmatrix.x4; the block
    # copies the next K and V tiles with 16-byte cp.async, 2 x 64 x 128 x 2 B / 16 B / 128 threads = 16
    # per thread; plus the main loop's own single-word LDS
    fn = cuda["flash_attn_bf16_hd128"]
    loop = fn.hot_loop
    ldsm = _ops(loop, "LDSM.16.M88.4", "LDSM.16.MT88.4")
    assert (loop.mix["mma"], ldsm) == (128, 64), "premise changed: " + str(loop.mix)
    per_warp_tile = ldsm * 4 + 16 * 4 + _ops(loop, "LDS")
    out["flash_attn_bf16_hd128"] = (fn, (L // 64) * H * 4 * (L // 64) * per_warp_tile)
    return out


@pytest.mark.compile
@pytest.mark.timeout(900)
def test_issue21_shared_roof_binds_and_agrees_with_a_count_by_hand():
    """The X-ray's shared-memory roof (FMA loops scaled by the FLOPs, `launch_counts`) against wavefronts
    counted by hand (instructions per loop trip x trips x warps), H200, K3 shapes, model, no GPU: never above
    the hand count (the X-ray leaves the staging loops out) and within 15% of it (issue 21 asks for 1.5x; the
    tighter band catches a model that drops a loop, e.g. attention v2's QK loop), and it binds for all four."""
    h200 = arch.GPUS["H200"]
    report_lines = []
    for label, (fn, hand) in _hand_counts().items():
        backend = "numba" if label.startswith(("gemm_v", "attention_v")) else "cuda"
        info = catalogue.describe(backend, label)
        counts = launch_counts.count(fn, info.flops, info.fma_shares)
        bound = roofline.bound(info, h200, counts)
        hand_s = hand / h200.shared_wavefronts_per_s
        ratio = bound.roofs["shared"] / hand_s
        report_lines.append(f"{label}: X-ray {bound.roofs['shared'] * 1e6:.0f} us, hand {hand_s * 1e6:.0f} us")
        assert 0.85 <= ratio <= 1.0 + 1e-9, f"{label}: X-ray / hand = {ratio:.2f} ({report_lines[-1]})"
        assert bound.limit == "shared", f"{label}: {bound.limit} binds ({bound.roofs})"


# ============================================================================ CUDA C kernels on the emulator
def test_ptx_standin_patch_finds_ldmatrix_and_cp_async():
    from moonvit_kernels.tools.emulation import HERE, tracing

    patched = tracing.patch_ptx((HERE / "ptx.cuh").read_text())
    assert patched.count("emu_trace_explicit(") == 5  # declaration, cp.async store + load, ldmatrix_x4 (+ _trans)
    with pytest.raises(RuntimeError, match="changed shape"):
        tracing.patch_ptx("// no stand-ins here")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_emulator_trace_of_the_fp32_gemm():
    """The CUDA C fp32 GEMM traced on the emulator: its float4 shared reads of the k-major tiles are
    conflict-free (4 quarter-warp wavefronts per 16-byte request), so are the transposing stores that stage
    the tiles (quads of 4 k-rows padded by 8 floats: one wavefront per request), its float4 global loads
    coalesced.

    The plain emulator library is loaded first, as it is in a full test run: the traced build must keep
    its own static __shared__ arrays (no GNU-unique symbols shared across the two libraries)."""
    from moonvit_kernels.tools.emulation import compiler, library
    from moonvit_kernels.tools.xray import emulator_trace

    if compiler() is None:
        pytest.skip("no C++ compiler for the emulator")
    library()
    (job,) = [j for j in emulator_trace.jobs() if j.name == "gemm_fp32_simt"]
    sites = trace.merge_sites(trace.analyse(job.run()))
    lds = {s.array: s for s in sites if s.kind == "LDS"}
    assert set(lds) == {"As", "Bs"}
    for s in lds.values():
        assert (s.per_request, s.factor) == (4, 1), s
        assert "float4" in s.code and s.where.startswith("gemm_fp32.cu:")
    loads = [s for s in sites if s.kind == "LDG" and s.array in ("A", "B")]
    assert loads and all(s.factor == 1 and s.per_request == 16 for s in loads)
    stores = {s.array: s for s in sites if s.kind == "STS"}
    assert set(stores) == {"As", "Bs"}
    for s in stores.values():
        assert (s.per_request, s.factor, s.worst) == (1, 1, 1), s
    # the epilogue: each thread's 4 columns of a row as one float4, so a warp's 2 rows x 16 lanes x 16 bytes
    # fill 16 whole sectors (scalar stores of one column at a time touched 4x the sectors)
    (store,) = [s for s in sites if s.kind == "STG" and s.array == "C"]
    (res,) = [s for s in sites if s.kind == "LDG" and s.array == "R"]
    for s in (store, res):
        assert (s.per_request, s.factor, s.worst) == (16, 1, 1), s
        assert "float4" in s.code and s.where.startswith("gemm_fp32.cu:"), s


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_emulator_trace_of_the_bf16_gemm():
    """The CUDA C tensor-core GEMM traced on the emulator: the cp.async copies into the padded shared tiles
    are conflict-free (a quarter-warp stores 8 rows of one 16-byte chunk column: 4 wavefronts per
    request), the ldmatrix reads too, the global loads and the paired C stores coalesced."""
    from moonvit_kernels.tools.emulation import compiler
    from moonvit_kernels.tools.xray import emulator_trace

    if compiler() is None:
        pytest.skip("no C++ compiler for the emulator")
    (job,) = [j for j in emulator_trace.jobs() if j.name == "gemm_bf16_tc"]
    sites = trace.merge_sites(trace.analyse(job.run()))
    copies = {s.array: s for s in sites if s.kind == "STS"}
    reads = {s.array: s for s in sites if s.kind == "LDS"}
    assert set(copies) == set(reads) == {"As", "Bs"}
    for s in copies.values():
        assert (s.per_request, s.factor, s.worst) == (4, 1, 1), s
        assert "cp_async_16" in s.code and s.where.startswith("gemm_bf16.cu:"), s
    for s in reads.values():
        assert (s.per_request, s.factor, s.worst) == (4, 1, 1), s
        assert "ldmatrix_x4" in s.code, s
    loads = [s for s in sites if s.kind == "LDG" and s.array in ("A", "B")]
    assert loads and all((s.per_request, s.factor) == (16, 1) for s in loads)
    (store,) = [s for s in sites if s.kind == "STG" and s.array == "C"]
    assert (store.per_request, store.factor) == (8, 1), store


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_emulator_traces_the_launch_the_real_launcher_makes(monkeypatch):
    """The traced launch is the one `launchers.rmsnorm` makes, geometry included: with a block of half the
    threads planted in the launcher, the trace holds the accesses of half the threads."""
    import dataclasses

    from moonvit_kernels.cuda_backend import launchers
    from moonvit_kernels.tools.emulation import compiler
    from moonvit_kernels.tools.xray import emulator_trace

    if compiler() is None:
        pytest.skip("no C++ compiler for the emulator")
    (job,) = [j for j in emulator_trace.jobs() if j.name == "rmsnorm_rows_f32"]
    assert {thread for *_, thread, _, _, _ in job.run()} == set(range(256))
    real = launchers._kernel

    def half_the_threads(*args, **kwargs):
        kernel, spec = real(*args, **kwargs)
        return kernel, dataclasses.replace(spec, threads=spec.threads // 2)

    monkeypatch.setattr(launchers, "_kernel", half_the_threads)
    assert {thread for *_, thread, _, _, _ in job.run()} == set(range(128))


def test_the_emulator_has_one_launch_path():
    """No hand-written C entry points that copy the launchers' geometry: driver.cpp is gone, and nothing in the
    emulator or the X-ray names it (the tracer builds the device's modules, `build.build_module(traced=True)`)."""
    import re

    from moonvit_kernels.tools.emulation import HERE

    assert not (HERE / "driver.cpp").exists()
    texts = {p: p.read_text(encoding="utf-8") for d in (HERE, HERE.parent / "xray") for p in sorted(d.iterdir())
             if p.suffix in (".py", ".cpp", ".h", ".cuh")}  # fmt: skip
    assert not [p.name for p, t in texts.items() if re.search(r"(?<![\w])driver\.cpp|emu_gemm_fp32", t)]
