"""The register file's launch rule (`moonvit_kernels.launch_rules`), by the numbers of issue 17 and
against the CUDA occupancy calculator itself (`cuda_occupancy.h`, compiled with the host C++ compiler).

The simplified rule registers x threads <= 65,536 accepts blocks the hardware refuses: registers go
to warps in units of 256 and to each of an SM's 4 sub-partitions. `_old_rule_*` below is that rule,
kept to show that each test here tells the two apart.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess

import pytest

from moonvit_kernels import launch_rules as lr
from moonvit_kernels import registry


def _old_rule_fits(registers: int, threads: int) -> bool:
    return registers * threads <= 65536


def _old_rule_max_threads(registers: int) -> int:
    per_warp = -(-registers * 32 // 256) * 256
    return min(1024, 65536 // per_warp * 32)


# ============================================================================ the numbers
def test_add_pos_emb_bicubic_at_80_registers_launches_at_most_768_threads():
    assert lr.registers_per_warp(80) == 2560  # 80·32, already a multiple of 256
    assert lr.warps_by_registers(80) == 24  # floor(16,384 / 2,560) = 6 per sub-partition, x 4
    assert lr.max_threads_for(80) == 768
    assert lr.register_problem(80, 768) is None
    for threads in range(769, 801):  # the simplified rule accepts all of these
        assert _old_rule_fits(80, threads)
        problem = lr.register_problem(80, threads)
        assert problem and "at most 24 warps" in problem and "6 warps per SM sub-partition" in problem


def test_attention_v1_hd24_at_129_registers_launches_at_most_384_threads():
    assert lr.registers_per_warp(129) == 4352  # 4,128 rounded up to 17 x 256
    assert lr.max_threads_for(129) == 384 != _old_rule_max_threads(129) == 480
    assert lr.register_problem(129, 384) is None
    assert all(lr.register_problem(129, t) for t in (385, 416, 448, 480))


@pytest.mark.parametrize(
    "threads, registers, old",
    [(128, 255, 255), (256, 255, 255), (384, 168, 170), (480, 128, 136), (512, 128, 128), (800, 72, 81),
     (1024, 64, 64), (33, 255, 255)],
)  # fmt: skip
def test_max_registers_for_a_block_size(threads, registers, old):
    assert lr.max_registers_for(threads) == registers
    assert min(255, 65536 // threads) == old  # the bound the compile tiers used before
    assert lr.register_problem(registers, threads) is None
    if registers < 255:
        assert lr.register_problem(registers + 1, threads)


def test_blocks_per_sm_by_registers():
    # 96 registers: 3,072 per warp, 5 per sub-partition = 20 warps = 2 blocks of 8 (not 21 // 8 = 2: same here)
    assert lr.blocks_by_registers(96, 256) == 2
    # 88 registers: 2,816 per warp, 5 per sub-partition = 20 warps -> 2 blocks; 65,536 // 2,816 = 23 -> also 2
    assert lr.blocks_by_registers(88, 256) == 2
    # 40 registers, 384 threads: 1,280 per warp, 12 per sub-partition = 48 warps = 4 blocks of 12
    # (65,536 // 1,280 = 51 warps would also give 4); 72 registers, 224 threads: 7 warps per block,
    # 2,304 per warp, 7 per sub-partition = 28 warps = 4 blocks (65,536 // 2,304 = 28 too)
    assert lr.blocks_by_registers(40, 384) == 4 and lr.blocks_by_registers(72, 224) == 4
    # where they differ: 80 registers, 64 threads: 24 warps = 12 blocks (the simplified count: 25 // 2 = 12);
    # 80 registers, 160 threads (5 warps): 24 // 5 = 4 blocks, 25 // 5 = 5 by the simplified count
    assert lr.blocks_by_registers(80, 160) == 4
    assert lr.blocks_by_registers(129, 512) == 0 and lr.blocks_by_registers(256, 32) == 0


def test_the_three_views_of_the_rule_agree():
    """register_problem, max_threads_for and max_registers_for describe one rule, for every register count
    and a spread of block sizes (multiples of 32 and odd sizes)."""
    sizes = sorted({*range(32, 1025, 32), *range(1, 1025, 37)})
    for registers, threads in itertools.product(range(0, 256), sizes):
        fits = lr.register_problem(registers, threads) is None
        assert fits == (threads <= lr.max_threads_for(registers)), (registers, threads)
        assert fits == (registers <= lr.max_registers_for(threads)), (registers, threads)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="threads=0"):
        lr.register_problem(32, 0)
    with pytest.raises(ValueError, match="threads=1025"):
        lr.max_registers_for(1025)
    assert "256 registers per thread > 255" in lr.register_problem(256, 32)
    assert lr.max_threads_for(256) == 0


# ============================================================================ the occupancy calculator
OCCUPANCY_PROGRAM = r"""
#include <cstdio>
#include "cuda_occupancy.h"
int main() {
  const int archs[3][3] = {{8, 0, 2048}, {8, 9, 1536}, {9, 0, 2048}};  // major, minor, threads per SM
  for (const auto& a : archs) {
    cudaOccDeviceProp p;
    p.computeMajor = a[0]; p.computeMinor = a[1];
    p.maxThreadsPerBlock = 1024; p.maxThreadsPerMultiprocessor = a[2];
    p.regsPerBlock = 65536; p.regsPerMultiprocessor = 65536; p.warpSize = 32;
    p.sharedMemPerBlock = 48 * 1024; p.sharedMemPerMultiprocessor = 100 * 1024;
    p.sharedMemPerBlockOptin = 99 * 1024; p.reservedSharedMemPerBlock = 1024; p.numSms = 100;
    cudaOccDeviceState state;
    for (int regs = 1; regs <= 255; ++regs) {
      for (int threads = 1; threads <= 1024; threads += (threads < 64 ? 1 : 7)) {
        cudaOccFuncAttributes f;
        f.maxThreadsPerBlock = 1024; f.numRegs = regs; f.sharedSizeBytes = 0;
        f.partitionedGCConfig = PARTITIONED_GC_OFF; f.shmemLimitConfig = FUNC_SHMEM_LIMIT_DEFAULT;
        f.maxDynamicSharedSizeBytes = 0; f.numBlockBarriers = 1; f.virtualResourceCount = 0;
        cudaOccResult r;
        if (cudaOccMaxActiveBlocksPerMultiprocessor(&r, &p, &f, &state, threads, 0) != CUDA_OCC_SUCCESS) return 1;
        std::printf("%d %d %d %d\n", a[0] * 10 + a[1], regs, threads, r.blockLimitRegs);
      }
    }
  }
  return 0;
}
"""


def _occupancy_header_dir() -> str | None:
    from moonvit_kernels.cuda_backend import sources

    for d in sources.include_candidates(None):
        if os.path.isfile(os.path.join(d, "cuda_occupancy.h")):
            return d
    return None


@pytest.fixture(scope="module")
def calculator(tmp_path_factory) -> dict[tuple[int, int, int], int]:
    """{(cc, registers, threads): blocks per SM the register file allows} from cuda_occupancy.h."""
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    include = _occupancy_header_dir()
    if cxx is None or include is None:
        pytest.skip("needs a C++ compiler and cuda_occupancy.h (pip install nvidia-cuda-runtime)")
    tmp = tmp_path_factory.mktemp("occ")
    (tmp / "occ.cpp").write_text(OCCUPANCY_PROGRAM)
    subprocess.run([cxx, "-O1", "-std=c++17", "-I", include, "occ.cpp", "-o", "occ"], cwd=tmp, check=True)
    out = subprocess.run([str(tmp / "occ")], capture_output=True, text=True, check=True).stdout
    table = {}
    for line in out.splitlines():
        cc, regs, threads, blocks = (int(x) for x in line.split())
        table[(cc, regs, threads)] = blocks
    assert len(table) > 3 * 255 * 150
    return table


def test_the_rule_is_the_occupancy_calculators(calculator):
    """For sm_80, sm_89 and sm_90, every register count and a spread of block sizes: the blocks per SM
    the register file allows (0 = the block cannot launch) are cuda_occupancy.h's `blockLimitRegs`."""
    wrong = [
        (cc, regs, threads, blocks, lr.blocks_by_registers(regs, threads))
        for (cc, regs, threads), blocks in calculator.items()
        if lr.blocks_by_registers(regs, threads) != blocks
    ]
    assert not wrong, f"{len(wrong)} cases differ, e.g. (cc, regs, threads, calculator, ours) {wrong[:5]}"


def test_the_calculator_refuses_what_the_simplified_rule_accepts(calculator):
    """The oracle can tell the rules apart: it refuses 800 threads at 80 registers and 480 at 129."""
    for cc in (80, 89, 90):
        assert calculator[(cc, 80, 799)] == 0 and _old_rule_fits(80, 799)
        assert calculator[(cc, 80, 764)] == 1
        assert calculator[(cc, 129, 477)] == 0 and _old_rule_fits(129, 477)


# ============================================================================ the launch checks that use it
def test_numba_launch_check_refuses_769_to_800_threads_of_add_pos_emb_bicubic():
    from moonvit_kernels.numba_backend import launch, pos_emb
    from moonvit_kernels.numba_backend.registers import registers_for

    kernel = pos_emb.KERNELS["bicubic"]
    assert registers_for("numba-cuda")["add_pos_emb_bicubic"] == 80  # the simulator's compiler
    launch.check_launch(kernel, 6, 768)
    for threads in (769, 800):
        with pytest.raises(ValueError, match=r"add_pos_emb_bicubic: .*threads x 80 registers.* at most 768 threads"):
            launch.check_launch(kernel, 6, threads)


def test_compile_tier_judges_registers_by_the_rule():
    from moonvit_kernels.cuda_backend import sources
    from moonvit_kernels.tools import nvrtc_check

    spec = sources.KernelSpec("t.cu", "t", threads=800, max_registers=255)
    assert nvrtc_check.judge(spec, nvrtc_check.PtxasInfo(registers=72), "sm_90") == []
    (problem,) = nvrtc_check.judge(spec, nvrtc_check.PtxasInfo(registers=80), "sm_90")
    assert "800 threads x 80 registers" in problem  # 64,000 <= 65,536, yet only 24 warps fit
    hopper_gemms = {s.max_registers for s in registry.hopper_specs() if s.source == "gemm_bf16_sm90.cu"}
    assert hopper_gemms == {168}  # __launch_bounds__(384, 1): what ptxas allots the Hopper GEMM


def test_numba_attention_register_limits_follow_the_rule():
    from moonvit_kernels.numba_backend import attention

    assert attention.register_limit(480) == 128  # 65,536 // 480 = 136 would not launch
    assert attention.register_limit(attention.V1_THREADS) == 255
