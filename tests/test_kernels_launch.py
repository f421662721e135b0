"""Launch checks the simulator cannot make (it runs any block size and any grid): threads x registers
against the register file, threads per block, and every grid dimension. Each case is rejected on the
host with a ValueError naming the kernel, before any device memory is touched."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import rng

from moonvit_kernels.numba_backend import attention as A
from moonvit_kernels.numba_backend import gemm as G
from moonvit_kernels.numba_backend import launch
from moonvit_kernels.numba_backend import merge as Mg
from moonvit_kernels.numba_backend import pos_emb as P
from moonvit_kernels.numba_backend import rope as R
from moonvit_kernels.numba_backend._cuda import COMPILER
from moonvit_kernels.numba_backend.registers import ASSUMED_REGISTERS, registers_for

KERNEL_REGISTERS = registers_for(COMPILER)  # the table the launch checks read in this process


def test_block_registers_round_per_warp():
    assert launch.block_registers(127, 1024) == 32 * 4096  # 127·32 = 4064 -> 4096 per warp
    assert launch.block_registers(129, 32) == 4352  # 4128 -> 17 units of 256
    assert launch.block_registers(32, 33) == 2 * 1024  # 33 threads are two warps
    assert launch.max_threads_for(129) == 384 and launch.max_threads_for(32) == 1024  # 3 warps per SM sub-partition
    assert launch.max_threads_for(ASSUMED_REGISTERS) == 256


def test_attention_v1_rejects_a_block_whose_registers_do_not_fit():
    """hd 24 uses ~128 registers per thread: 1024 (or 512) threads need more than 65,536."""
    assert KERNEL_REGISTERS["attention_v1_hd24_t128"] >= 127
    qkv = rng(1).standard_normal((3, 3 * 24)).astype(np.float32)
    cu = np.array([0, 3], np.int32)
    for threads in (1024, 512):
        with pytest.raises(ValueError, match=r"attention_v1_hd24_t\d+: \d+ threads x 1[23]\d registers .* at most 384"):
            A.attention(qkv, cu, 1, version=1, threads=threads)


def test_attention_v2_block_over_1024_threads_is_rejected():
    qkv = rng(2).standard_normal((3, 3 * 8)).astype(np.float32)
    with pytest.raises(ValueError, match="exceeds 1024"):
        A.attention(qkv, np.array([0, 3], np.int32), 1, version=2, block_q=64, block_k=32)


def _pos_emb_case():
    grid = [(1, 2, 3)]
    x = rng(3).standard_normal((6, 8)).astype(np.float32)
    pos = rng(4).standard_normal((4, 4, 8)).astype(np.float32)
    return x, pos, P.time_table(8, 2), launch.item_table(grid)


@pytest.mark.parametrize("threads", [0, -32, 2048, 2.5, "64"])
def test_pos_emb_rejects_bad_thread_counts(threads):
    with pytest.raises(ValueError, match="threads"):
        P.add_position_embedding(*_pos_emb_case(), mode="bilinear", threads=threads)


def test_pos_emb_bicubic_1024_threads_exceed_the_register_file():
    """bicubic uses 80 registers: 1024 threads need 81,920 > 65,536 (bilinear's 48 fit)."""
    with pytest.raises(ValueError, match=r"add_pos_emb_bicubic: 1024 threads x 80 registers"):
        P.add_position_embedding(*_pos_emb_case(), mode="bicubic", threads=1024)
    launch.check_launch(P.KERNELS["bilinear"], 6, 1024)  # fits: no error


@pytest.mark.parametrize("threads", [0, 1025, 4096])
def test_rope_rejects_bad_thread_counts(threads):
    grid = np.array([[1, 2, 2]], np.int32)
    qkv = rng(5).standard_normal((4, 3 * 2 * 8)).astype(np.float32)
    with pytest.raises(ValueError, match="threads|rope2d_kernel: block"):
        R.rope2d(qkv, grid, launch.cu_seqlens_table(grid), 2, 8, threads=threads)


@pytest.mark.parametrize("threads", [0, 1025, 4096])
def test_merge_rejects_bad_thread_counts(threads):
    grid = [(1, 2, 2)]
    x = rng(6).standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(ValueError, match="threads|merge_gather_kernel: block"):
        Mg.merge_gather(x, launch.item_table(grid, (2, 2)), (2, 2), threads=threads)


@pytest.mark.parametrize("version, rows", [(1, 16 * 65535 + 1), (2, 16 * 65535 + 1), (3, 64 * 65535 + 1)])
def test_gemm_grid_y_over_65535_blocks_is_rejected(version, rows):
    """Rows run along grid y (at most 65,535 blocks): v1/v2 reach it past 1,048,560 tokens, v3 past 4,194,240."""
    a = np.zeros((rows, 1), np.float32)
    b = np.ones((3, 1), np.float32)
    with pytest.raises(ValueError, match=rf"gemm_v{version}_none: grid dimension y = 65536 blocks is outside 1..65535"):
        G.gemm(a, b, version=version)


def test_gemm_grid_at_the_limit_is_accepted():
    blocks, threads = G.launch_config(2, 16 * 65535, 3)
    assert launch.check_launch(G.KERNELS[(2, "none")], blocks, threads) == (blocks, threads)


def test_check_launch_grid_and_block_limits():
    k = G.KERNELS[(1, "none")]
    with pytest.raises(ValueError, match="grid dimension x = 2147483648"):
        launch.check_launch(k, (2**31, 1), (16, 16))
    with pytest.raises(ValueError, match="grid dimension z = 65536"):
        launch.check_launch(k, (1, 1, 65536), 32)
    with pytest.raises(ValueError, match="grid dimension x = 0"):
        launch.check_launch(k, 0, 32)
    with pytest.raises(ValueError, match="at most"):
        launch.check_launch(k, 1, (1, 1, 65))


def test_unknown_specialisation_uses_its_family_or_the_maximum():
    """attention v2 at hd 8 is not in the table: the most of the listed attention_v2 kernels is used;
    a kernel of no listed family is assumed to use 255 registers (at most 256 threads)."""
    family_max = max(r for k, r in KERNEL_REGISTERS.items() if k.startswith("attention_v2_hd"))
    registers, source = launch.kernel_registers("attention_v2_hd8_q32_k16")
    assert registers == family_max and "estimated" in source
    launch.check_launch(A.attention_v2_kernel(8, 32, 16), 1, (16, 32))  # the default 512 threads fit
    assert launch.kernel_registers("no_such_kernel") == (ASSUMED_REGISTERS, "assumed: not in the compile tier's table")
    k = G.KERNELS[(1, "none")]
    with pytest.raises(ValueError, match="assumed: not in the compile tier's table"):
        launch.check_launch(k, 1, 512, registers_of="no_such_kernel")
