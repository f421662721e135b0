"""plots.hopper: the swizzle tables read off an address function, the figure, the accumulator owners."""

import numpy as np
import pytest

from moonvit_kernels.plots.hopper import (
    accumulator_owners,
    plot_accumulator_owners,
    plot_swizzle,
    swizzle_layout,
)
from moonvit_kernels.tools.emulation import compiler


def doc_swizzle(addr: int, span: int) -> int:
    """The documented atoms as address arithmetic: chunk bits [4, 4 + log2(span/16)) XOR row bits (PTX ISA)."""
    mask = {128: 7, 64: 3, 32: 1}[span]
    return addr ^ (((addr >> 7) & mask) << 4)


def test_swizzle_layout_reads_the_documented_atoms():
    sw128 = swizzle_layout(doc_swizzle, 128)
    assert sw128.shape == (8, 8)
    np.testing.assert_array_equal(sw128, np.arange(8)[:, None] ^ np.arange(8)[None, :])  # row 3: 3 2 1 0 7 6 5 4
    assert swizzle_layout(doc_swizzle, 64)[:, 0].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]  # two 64-byte rows per 128
    np.testing.assert_array_equal(swizzle_layout(lambda a, s: a, 32), np.tile([0, 1], (8, 1)))
    for span in (32, 64, 128):  # every row a permutation of its chunks
        assert all(sorted(row) == list(range(span // 16)) for row in swizzle_layout(doc_swizzle, span))


def test_swizzle_layout_rejects_bad_arguments():
    with pytest.raises(ValueError, match="32, 64 or 128"):
        swizzle_layout(doc_swizzle, 256)
    with pytest.raises(ValueError, match="multiple of 1024"):
        swizzle_layout(doc_swizzle, 128, base=4096 + 128)
    with pytest.raises(ValueError, match="outside its 128-byte row"):
        swizzle_layout(lambda a, s: a + 128, 128)


@pytest.mark.skipif(compiler() is None, reason="no C++ compiler (g++ >= 11) for the CUDA C emulation")
def test_the_emulator_model_matches_the_documented_atoms():
    from moonvit_kernels.tools.emulation import hopper

    for span in (32, 64, 128):
        np.testing.assert_array_equal(swizzle_layout(hopper.swizzle, span), swizzle_layout(doc_swizzle, span))


def test_plot_swizzle_draws_one_panel_per_layout():
    fig = plot_swizzle({"none": swizzle_layout(lambda a, s: a), "128B": swizzle_layout(doc_swizzle)})
    assert [ax.get_title() for ax in fig.axes] == ["none", "128B"]
    texts = [t.get_text() for t in fig.axes[1].texts]
    assert texts[8 + 0] == "1\nk8–15"  # row 1, slot 0 holds chunk 1 (elements k 8..15)
    with pytest.raises(ValueError, match="no layout"):
        plot_swizzle({})


def documented_registers(n: int) -> np.ndarray:
    """[128, n/2]: the codes 64·m + c each thread holds, per the PTX ISA's m64nNk16 accumulator figure."""
    regs = np.zeros((128, n // 2))
    for t in range(128):
        w, lane = divmod(t, 32)
        for i in range(n // 8):
            for j in range(4):
                regs[t, 4 * i + j] = 64 * (16 * w + lane // 4 + 8 * (j // 2)) + 8 * i + 2 * (lane % 4) + j % 2
    return regs


def test_accumulator_owners_inverts_the_fragment():
    thread, register = accumulator_owners(documented_registers(16))
    assert thread.shape == register.shape == (64, 16)
    assert (thread[9, 2], register[9, 2]) == (5, 2)  # lane 5 (row 1 + 8, column 2·1): its third register
    assert (thread[63, 15], register[63, 15]) == (127, 7)
    assert sorted(zip(thread.ravel(), register.ravel(), strict=True)) == [(t, i) for t in range(128) for i in range(8)]
    fig = plot_accumulator_owners(thread, register)
    assert len(fig.axes) == 2 and fig.axes[1].texts[0].get_text() == "0/0"


def test_accumulator_owners_rejects_what_is_not_a_fragment():
    regs = documented_registers(8)
    with pytest.raises(ValueError, match="128 threads"):
        accumulator_owners(regs[:64])
    dup = regs.copy()
    dup[1, 0] = dup[0, 0]
    with pytest.raises(ValueError, match="held twice"):
        accumulator_owners(dup)
    regs[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        accumulator_owners(regs)
