"""The Hopper models of the CPU emulator (emulation/hopper.cuh) against the documentation, one at a time.

Every expectation here is written from the PTX ISA and the CUDA driver API documentation, not
from the kernels: the wgmma matrix-descriptor bit fields ("Matrix Descriptor Format"), the swizzle
atoms as tables of 16-byte chunks ("Shared Memory Matrix Layout", the K-major 128B / 64B / 32B
swizzling figures), the K-major core-matrix layout without swizzling (8 rows x 16 bytes, LBO
between the two K halves, SBO between 8-row groups), the wgmma .m64nNk16 accumulator fragment
(warp w holds rows 16w..16w+15; lane l holds rows 16w + l/4 and +8, columns 8i + 2(l%4), +1),
mbarrier phases (a phase completes when pending arrivals and tx-count reach zero; try_wait.parity(P)
is true once the phase of parity P is done), cuTensorMapEncodeTiled's argument requirements and the
bulk tensor copy's zero fill outside the tensor. Misuse the models must catch (a missing
wgmma.fence, diverging warpgroup operands, extra arrivals, extra transaction bytes, setmaxnreg
breaking its rules, a deadlock) aborts the emulating process, so those run in a subprocess. So do
the hardware rules of the PTX ISA the models enforce: ordinary stores read or overwritten by the
async proxy (wgmma, bulk copies) only after a fence.proxy.async of the storing thread ("Async
Proxy"); a bulk copy completing on an mbarrier only after its initialiser's fence.mbarrier_init
(or fence.proxy.async); a swizzled operand's repeating pattern on a 1024 / 512 / 256-byte
boundary when the descriptor's base offset is 0 ("Matrix Descriptor Format").
"""

import numpy as np
import pytest

from moonvit_kernels.tools.emulation import compiler

pytestmark = [
    pytest.mark.compile,
    pytest.mark.skipif(compiler() is None, reason="no C++ compiler (g++ >= 11) for the CUDA C emulation"),
]


@pytest.fixture(scope="module")
def hop():
    from moonvit_kernels.tools.emulation import hopper

    hopper.library()
    return hopper


# The swizzle atoms of the documentation's K-major figures: row r of the atom (one row = `span`
# bytes) stores its 16-byte chunk j at chunk position TABLE[r][j].
SW128 = [
    [0, 1, 2, 3, 4, 5, 6, 7],
    [1, 0, 3, 2, 5, 4, 7, 6],
    [2, 3, 0, 1, 6, 7, 4, 5],
    [3, 2, 1, 0, 7, 6, 5, 4],
    [4, 5, 6, 7, 0, 1, 2, 3],
    [5, 4, 7, 6, 1, 0, 3, 2],
    [6, 7, 4, 5, 2, 3, 0, 1],
    [7, 6, 5, 4, 3, 2, 1, 0],
]
SW64 = [[0, 1, 2, 3], [0, 1, 2, 3], [1, 0, 3, 2], [1, 0, 3, 2], [2, 3, 0, 1], [2, 3, 0, 1], [3, 2, 1, 0], [3, 2, 1, 0]]
SW32 = [[0, 1], [0, 1], [0, 1], [0, 1], [1, 0], [1, 0], [1, 0], [1, 0]]
TABLES = {128: SW128, 64: SW64, 32: SW32}


def doc_offset(row: int, byte: int, span: int) -> int:
    """Byte offset (from a pattern-aligned base) of byte `byte` of row `row` in a swizzled K-major tile."""
    group, r = divmod(row, 8)
    chunk, within = divmod(byte, 16)
    return group * 8 * span + r * span + 16 * TABLES[span][r][chunk] + within


def bits(x: np.ndarray) -> np.ndarray:
    from moonvit_kernels.weights import float32_to_bf16_bits

    return float32_to_bf16_bits(np.asarray(x, np.float32))


def place_kmajor(image, x_bits, off, span, k0=0, lbo=0, sbo=0):
    """Write K-major operand x [rows, 16] into `image` at `off` per the documentation's layouts.

    Swizzled: rows of `span` bytes, 8-row atoms (SBO = 8 * span), x's 16 columns at byte 2 * k0 of each
    row. Not swizzled: 8x8 core matrices (8 rows of 16 bytes), `lbo` between the K halves, `sbo` between
    8-row groups."""
    for r in range(x_bits.shape[0]):
        for k in range(16):
            if span:
                a = off + doc_offset(r, 2 * (k0 + k), span)
            else:
                a = off + (r // 8) * sbo + (k // 8) * lbo + (r % 8) * 16 + (k % 8) * 2
            image[a : a + 2] = np.frombuffer(np.uint16(x_bits[r, k]).tobytes(), np.uint8)


def fragment_owner(n: int):
    """For the wgmma m64nNk16 accumulator: (thread, register) -> (row, col) per the PTX ISA figure."""
    rows = np.zeros((128, n // 2), int)
    cols = np.zeros((128, n // 2), int)
    for t in range(128):
        w, lane = divmod(t, 32)
        for i in range(n // 8):
            for j in range(4):
                rows[t, 4 * i + j] = 16 * w + lane // 4 + 8 * (j // 2)
                cols[t, 4 * i + j] = 8 * i + 2 * (lane % 4) + j % 2
    return rows, cols


# ============================================================================ descriptor
def test_descriptor_bits_follow_the_documented_format(hop):
    # start 0x12340 -> bits 0..13 = 0x1234; LBO 16 -> 1 at bit 16; SBO 1024 -> 64 at bit 32; 128B -> 1 at bit 62
    d = hop.desc_encode(0x12340, 16, 1024, 128)
    assert d == 0x1234 | (1 << 16) | (64 << 32) | (1 << 62)
    assert hop.desc_decode(d) == {"start": 0x12340, "lbo": 16, "sbo": 1024, "base_offset": 0, "mode": 1}
    # swizzle codes: none 0, 128B 1, 64B 2, 32B 3 in bits 62..63
    assert [hop.desc_encode(0, 0, 0, s) >> 62 for s in (0, 128, 64, 32)] == [0, 1, 2, 3]
    # the low 4 bits of addresses and offsets are dropped; only 18 address bits exist
    assert hop.desc_decode(hop.desc_encode(0x4_0000 + 0x35, 0x2F, 0x10F, 0)) == {
        "start": 0x30,
        "lbo": 0x20,
        "sbo": 0x100,
        "base_offset": 0,
        "mode": 0,
    }


def test_swizzle_tables_match_the_documented_atoms(hop):
    base = 4 * 1024  # pattern-aligned
    for span, table in TABLES.items():
        for r in range(8):
            for j in range(span // 16):
                for within in (0, 6, 15):
                    a = base + r * span + 16 * j + within
                    assert hop.swizzle(a, span) == base + r * span + 16 * table[r][j] + within, (span, r, j)
    assert hop.swizzle(base + 1234, 0) == base + 1234


def test_kmajor_addresses(hop):
    # no swizzle: element (9, 10) = group 1 (SBO 256) + K half 1 (LBO 128) + row 1 (16 B) + element 2 (4 B)
    d = hop.desc_encode(2048, 128, 256, 0)
    assert hop.kmajor_addr(d, 9, 10) == 2048 + 256 + 128 + 16 + 4
    # 128B swizzle, SBO 1024: element (9, 10) sits in row 1 of atom 1, byte 20 = chunk 1 -> chunk 1 ^ 1 = 0
    d = hop.desc_encode(2048, 16, 1024, 128)
    assert hop.kmajor_addr(d, 9, 10) == 2048 + 1024 + 128 + 0 * 16 + 4
    # K slice 2 of the same rows (start + 32 bytes): element (3, 0) is byte 32 of row 3 -> chunk 2 ^ 3 = 1
    d = hop.desc_encode(2048 + 32, 16, 1024, 128)
    assert hop.kmajor_addr(d, 3, 0) == 2048 + 3 * 128 + 16


# ============================================================================ wgmma accumulator fragment
def test_m64n8_accumulator_fragment_matches_the_figure(hop):
    # D[r][c] = 64 r + c: A[r] = (r, 1, 0, ...), B[c] = (64, c, 0, ...), exact in bf16 and fp32
    a = np.zeros((64, 16), np.float32)
    a[:, 0] = np.arange(64)
    a[:, 1] = 1
    b = np.zeros((8, 16), np.float32)
    b[:, 0] = 64
    b[:, 1] = np.arange(8)
    image = np.zeros(4096, np.uint8)
    place_kmajor(image, bits(a), 0, 0, lbo=1024, sbo=128)  # core matrices of all 8 row groups, then the K half
    place_kmajor(image, bits(b), 2048, 0, lbo=128, sbo=256)
    out, _ = hop.wgmma_probe(image, 8, (0, 1024, 128, 0), (2048, 128, 256, 0))

    def code(r, c):
        return 64 * r + c

    # the figure, read off for four threads: d0, d1 = row l/4, columns 2(l%4), +1; d2, d3 = the row + 8
    assert out[0].tolist() == [code(0, 0), code(0, 1), code(8, 0), code(8, 1)]
    assert out[5].tolist() == [code(1, 2), code(1, 3), code(9, 2), code(9, 3)]
    assert out[37].tolist() == [code(17, 2), code(17, 3), code(25, 2), code(25, 3)]
    assert out[127].tolist() == [code(55, 6), code(55, 7), code(63, 6), code(63, 7)]
    rows, cols = fragment_owner(8)
    np.testing.assert_array_equal(out, code(rows, cols))


@pytest.mark.parametrize("span", [128, 64, 32, 0])
@pytest.mark.parametrize("n", [128, 24])
def test_wgmma_from_swizzled_shared_memory(hop, span, n):
    """Random A [64, 16], B [n, 16] placed per the documented layout; every register checked."""
    r = np.random.default_rng(span + n)
    a = bits(r.standard_normal((64, 16)) + 0.2)
    b = bits(r.standard_normal((n, 16)) - 0.1)
    image = np.zeros(8 * 1024 + 32 * 1024, np.uint8)
    k0 = {128: 2, 64: 1, 32: 0, 0: 0}[span]  # a later K slice of the swizzled rows: start + 32 bytes per slice
    if span:
        place_kmajor(image, a, 0, span, k0=16 * k0)
        place_kmajor(image, b, 8 * 1024, span, k0=16 * k0)
        a_desc = (32 * k0, 16, 8 * span, span)
        b_desc = (8 * 1024 + 32 * k0, 16, 8 * span, span)
    else:  # K halves side by side: LBO 128, SBO 256
        place_kmajor(image, a, 0, 0, lbo=128, sbo=256)
        place_kmajor(image, b, 8 * 1024, 0, lbo=128, sbo=256)
        a_desc, b_desc = (0, 128, 256, 0), (8 * 1024, 128, 256, 0)
    init = r.standard_normal((128, n // 2)).astype(np.float32)
    from moonvit_kernels.weights import bf16_bits_to_float32

    d = bf16_bits_to_float32(a).astype(np.float64) @ bf16_bits_to_float32(b).astype(np.float64).T
    rows, cols = fragment_owner(n)
    for scale_d in (1, 0):
        out, early = hop.wgmma_probe(image, n, a_desc, b_desc, scale_d=scale_d, init=init)
        want = d[rows, cols] + (init if scale_d else 0)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        # asynchronous: before wgmma.wait_group the accumulators are not the result (NaN in the model)
        assert np.isnan(early).all()


def a_fragment(a_bits: np.ndarray) -> np.ndarray:
    """[128, 4] uint32: thread t's A registers for wgmma m64nNk16 with A in registers, per the PTX ISA
    figure (matrix A): warp w holds rows 16w..16w+15; lane l's a0, a1 = row l/4, columns 2(l%4), +1;
    a2, a3 = row l/4 + 8; a4..a7 = the same rows, columns + 8; two bf16 per register, low half first."""
    regs = np.zeros((128, 4), np.uint32)
    for t in range(128):
        w, lane = divmod(t, 32)
        for i in range(8):
            row = 16 * w + lane // 4 + 8 * ((i // 2) % 2)
            col = 2 * (lane % 4) + i % 2 + 8 * (i // 4)
            regs[t, i // 2] |= np.uint32(a_bits[row, col]) << np.uint32(16 * (i % 2))
    return regs


@pytest.mark.parametrize("n", [128, 64, 16])
def test_wgmma_with_a_in_registers(hop, n):
    r = np.random.default_rng(n)
    a = bits(r.standard_normal((64, 16)))
    b = bits(r.standard_normal((n, 16)) + 0.3)
    image = np.zeros(32 * 1024, np.uint8)
    place_kmajor(image, b, 0, 128, k0=16)
    from moonvit_kernels.weights import bf16_bits_to_float32

    d = bf16_bits_to_float32(a).astype(np.float64) @ bf16_bits_to_float32(b).astype(np.float64).T
    rows, cols = fragment_owner(n)
    init = r.standard_normal((128, n // 2)).astype(np.float32)
    out, _ = hop.wgmma_probe(image, n, (0, 0, 0, 0), (32, 16, 1024, 128), init=init, a_regs=a_fragment(a))
    np.testing.assert_allclose(out, d[rows, cols] + init, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "flags, message",
    [
        (1, "without a wgmma.fence"),
        (2, "issued different operations"),
        (4, "overwrites shared memory"),
        (16, "written between its issue and its completion"),
        (0, ""),
    ],
)
def test_wgmma_misuse_aborts(hop, flags, message):
    img = np.zeros(8192, np.uint8)
    rc, err = hop.run_forked(hop.wgmma_probe, img, 8, (0, 16, 1024, 128), (4096, 16, 1024, 128), flags=flags)
    assert (rc != 0 and message in err) if message else rc == 0, err


def test_wgmma_needs_a_proxy_fence_after_ordinary_stores(hop):
    """The probe's thread 0 stores the operands with memcpy; without its fence.proxy.async, wgmma's read aborts."""
    img = np.zeros(8192, np.uint8)  # zeros over the 0xCD garbage shared memory starts with: every byte changes
    rc, err = hop.run_forked(hop.wgmma_probe, img, 8, (0, 16, 1024, 128), (4096, 16, 1024, 128), flags=32)
    assert rc != 0 and "no fence.proxy.async in that thread" in err and "operand A" in err, err
    assert "hopper_driver.cpp:" in err  # the issuing call site


# (span, offset of A in the 1024-aligned image): the pattern starts on its boundary or it does not
PATTERN_CASES = [
    (128, 1024 + 32, ""),  # the K slice 32 bytes into row 0 of a pattern-aligned tile: fine
    (128, 512, "not on a 1024-byte boundary"),
    (128, 128, "not on a 1024-byte boundary"),
    (64, 512 + 32, ""),
    (64, 256, "not on a 512-byte boundary"),
    (32, 256, ""),
    (32, 128, "not on a 256-byte boundary"),
    (0, 16, ""),  # no swizzle: any 16-byte aligned start
]


@pytest.mark.parametrize("span, offset, message", PATTERN_CASES)
def test_swizzled_operand_pattern_alignment(hop, span, offset, message):
    img = np.zeros(16384, np.uint8)
    lbo, sbo = (16, 8 * span) if span else (128, 256)
    rc, err = hop.run_forked(hop.wgmma_probe, img, 8, (offset, lbo, sbo, span), (8192, 16, 1024, 128))
    assert (rc != 0 and message in err and "operand A" in err) if message else rc == 0, err


# ============================================================================ mbarrier
def test_mbarrier_phases(hop):
    steps = [
        ("init", 2),
        ("try_wait", 0),  # phase 0 in progress
        ("try_wait", 1),  # the "previous" phase (parity 1) counts as complete
        ("arrive", 0),
        ("try_wait", 0),  # one of two arrivals: still in progress
        ("arrive", 0),
        ("try_wait", 0),  # phase 0 complete
        ("try_wait", 1),  # phase 1 now in progress
        ("arrive_expect_tx", 64),
        ("arrive", 0),
        ("try_wait", 1),  # arrivals done, 64 bytes outstanding
        ("complete_tx", 32),
        ("try_wait", 1),
        ("complete_tx", 32),
        ("try_wait", 1),  # phase 1 complete
        ("try_wait", 0),  # phase 2 (parity 0) in progress
    ]
    assert hop.mbar_script(steps) == [0, 1, 0, 1, 0, 0, 0, 1, 0]


@pytest.mark.parametrize(
    "script, message",
    [
        ([("arrive", 0)], "used before mbarrier.init"),
        ([("init", 1), ("expect_tx", 16), ("arrive", 0), ("arrive", 0)], "more arrivals"),
        ([("init", 1), ("expect_tx", 16), ("complete_tx", 32), ("arrive", 0)], "more transaction bytes"),
        ([("init", 0)], "count outside"),
    ],
)
def test_mbarrier_misuse_aborts(hop, script, message):
    rc, err = hop.run_forked(hop.mbar_script, script)
    assert rc != 0 and message in err, err


@pytest.mark.parametrize(
    "how, message",
    [
        (0, "ran no fence.mbarrier_init"),
        (1, ""),
        (2, ""),  # the CUDA Programming Guide's fence.proxy.async.shared::cta after the init
        (3, "ran no fence.mbarrier_init"),  # fenced by a thread that did not initialise it
        (4, "ran no fence.mbarrier_init"),  # fenced before the init
        (5, "cp.async.bulk.tensor (shared write)"),  # ordinary stores into the destination, no proxy fence
        (6, ""),
    ],
)
def test_bulk_copy_ordering_rules(hop, how, message):
    rc, err = hop.run_forked(lambda: hop.library().hop_tma_order_probe(how))
    assert (rc != 0 and message in err) if message else rc == 0, err


def test_deadlock_is_reported(hop):
    rc, err = hop.run_forked(hop.mbar_deadlock)
    assert rc != 0 and "deadlock" in err, err


# ============================================================================ tensor maps and bulk copies
def matrix(rows: int, cols: int) -> np.ndarray:
    """A uint16 matrix whose every element is distinct and non-zero (1 + its flat index)."""
    return (np.arange(rows * cols, dtype=np.uint32) + 1).astype(np.uint16).reshape(rows, cols)


def unswizzle_box(raw: np.ndarray, box0: int, box1: int, span: int) -> np.ndarray:
    """The box [box1, box0] read back from its raw shared bytes using the documentation's atom tables."""
    raw8 = raw.view(np.uint8)
    out = np.zeros((box1, box0), np.uint16)
    for y in range(box1):
        for x in range(box0):
            a = doc_offset(y, 2 * x, span) if span else (y * box0 + x) * 2
            out[y, x] = raw8[a : a + 2].view(np.uint16)[0]
    return out


@pytest.mark.parametrize(
    "shape, box, coords, span",
    [
        ((11, 104), (64, 8), (64, 5), 128),  # partial in both dimensions: columns 104.., rows 11.. are zero
        ((20, 72), (64, 16), (0, -3), 128),  # negative start row: 3 leading zero rows
        ((9, 40), (32, 8), (16, 2), 64),
        ((9, 40), (16, 8), (30, 0), 32),
        ((5, 24), (8, 4), (20, 3), 0),
    ],
)
def test_tensor_copy_fills_and_swizzles(hop, shape, box, coords, span):
    g = matrix(*shape)
    landed, before, state = hop.tma_probe(g, box, coords, span)
    want = np.zeros((box[1], box[0]), np.uint16)
    for y in range(box[1]):
        for x in range(box[0]):
            gy, gx = coords[1] + y, coords[0] + x
            if 0 <= gy < shape[0] and 0 <= gx < shape[1]:
                want[y, x] = g[gy, gx]
    np.testing.assert_array_equal(unswizzle_box(landed, box[0], box[1], span), want)
    assert (before == 0xCDCD).all()  # the destination is undefined until the barrier completes
    assert state.tolist() == [2 * box[0] * box[1], 1, 0]  # all box bytes expected; phase 0 done after


def test_tensor_copy_nan_fill(hop):
    g = matrix(4, 64)
    landed, _, _ = hop.tma_probe(g, (64, 8), (0, 0), 128, oob_nan=True)
    box = unswizzle_box(landed, 64, 8, 128)
    np.testing.assert_array_equal(box[:4], g)
    assert (box[4:] == 0x7FFF).all()  # a bf16 NaN


@pytest.mark.parametrize(
    "dims, strides, box, span, message",
    [
        ((588, 16), (1176,), (64, 16), 128, "globalStrides"),  # K = 588 bf16: 1176-byte rows
        ((512, 16), (1024,), (512, 8), 0, "boxDim[0] not in 1..256"),
        ((512, 16), (1024,), (128, 8), 128, "exceeds the swizzle span"),
        ((512, 16), (1024,), (4, 8), 0, "multiple of 16 bytes"),
        ((0, 16), (1024,), (64, 8), 128, "globalDim[0]"),
    ],
)
def test_tensor_map_requirements(hop, dims, strides, box, span, message):
    g = np.zeros(64 * 1024, np.uint16)
    rc, why = hop.encode_tiled(g, dims, strides, box, span)
    assert rc == 1 and message in why


def test_tensor_map_accepts_the_gemm_boxes(hop):
    g = np.zeros(4096, np.uint16)
    assert hop.encode_tiled(g, (40, 70), (80,), (64, 128), 128) == (0, "")


# ============================================================================ setmaxnreg
def test_setmaxnreg_within_the_pool(hop):
    hop.setmaxnreg_probe([-40, 232, 232], regs_at_entry=168)  # 128 x (40 + 2 x 232) = 64512 = 384 x 168


@pytest.mark.parametrize(
    "counts, diverge, message",
    [
        ([-40, 240, 240], False, "deadlock"),  # 66560 registers wanted, 64512 held: the .inc waits forever
        ([-40, 236, 232], False, "multiple of 8"),
        ([-40, 160, 232], False, "inc below"),
        ([-176, 232, 232], False, "dec above"),
        ([-40, 232, 232], True, "different counts"),
    ],
)
def test_setmaxnreg_misuse_aborts(hop, counts, diverge, message):
    rc, err = hop.run_forked(hop.setmaxnreg_probe, counts, 168, diverge)
    assert rc != 0 and message in err, err
