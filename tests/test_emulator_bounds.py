"""Bounds-checked device memory on the CPU emulator (issue 28, class 4): what compute-sanitizer reports on a GPU.

Every emulated device array ends against a PROT_NONE guard region (`emulation/guard.py`): a kernel that reads
or writes past an array's end raises `OutOfBounds` naming the kernel, the block and thread, the address, the
argument it ran past (shape, dtype, size) and how far, and the process lives on. Writes into the fewer than 256
bytes between an array's end and its 256-byte-aligned guard are found after the launch (a canary). Before this,
a kernel whose out-of-bounds reads reached only outputs it does not store passed.
"""

from __future__ import annotations

import numpy as np
import pytest

from moonvit_kernels.exercises import check, solution
from moonvit_kernels.tools.emulation import build, device, guard

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C++ compiler (g++ >= 11) for the CUDA C emulation")

KERNELS = r"""
extern "C" __global__ void copy_from(const float* x, float* y, int at) {
  if (threadIdx.x == 5) y[0] = x[at];
}
extern "C" __global__ void store_at(float* y, int at) {
  if (blockIdx.x == 1 && threadIdx.x == 9) y[at] = 1.0f;
}
"""


@pytest.fixture(scope="module")
def kernels():
    return device.RawModule(code=KERNELS)


def _inputs(n: int) -> tuple[device.ndarray, device.ndarray]:
    return device.asarray(np.arange(n, dtype=np.float32)), device.empty(1, np.float32)


def test_reading_the_last_element_passes(kernels):
    x, y = _inputs(64)
    kernels.get_function("copy_from")((1,), (32,), (x, y, np.int32(63)))
    assert y.get().tolist() == [63.0]


def test_reading_one_element_past_the_end_names_the_array_and_the_overrun(kernels):
    x, y = _inputs(64)
    with pytest.raises(device.OutOfBounds) as e:
        kernels.get_function("copy_from")((1,), (32,), (x, y, np.int32(64)))
    assert (
        r"copy_from: out-of-bounds access: block (0, 0, 0), thread (5, 0, 0) made a read of address "
        f"0x{x.data.ptr + 256:x}, byte 1 past the end of argument 0 (shape (64,) float32, 256 bytes, "
        f"at 0x{x.data.ptr:x})"
    ) in str(e.value)
    kernels.get_function("copy_from")((1,), (32,), (x, y, np.int32(0)))  # the device still works
    assert y.get().tolist() == [0.0]


def test_reading_before_the_start_is_named_too(kernels):
    x, y = _inputs(64)
    with pytest.raises(device.OutOfBounds, match=r"before the start of argument 0 \(shape \(64,\) float32"):
        kernels.get_function("copy_from")((1,), (32,), (x, y, np.int32(-1200)))


def test_writing_one_element_past_the_end_names_the_array(kernels):
    y = device.empty((8, 8), np.float32)
    with pytest.raises(device.OutOfBounds) as e:
        kernels.get_function("store_at")((2,), (32,), (y, np.int32(64)))
    assert (
        "store_at: out-of-bounds access: block (1, 0, 0), thread (9, 0, 0) made a write to address "
        f"0x{y.data.ptr + 256:x}, byte 1 past the end of argument 0 (shape (8, 8) float32, 256 bytes"
    ) in str(e.value)


def test_a_write_into_the_alignment_slack_is_found_after_the_launch(kernels):
    """70 floats end 232 bytes before their guard (the start stays 256-byte aligned): the canary there."""
    y = device.empty(70, np.float32)
    assert y.data.ptr % guard.START_ALIGN == 0
    with pytest.raises(device.OutOfBounds, match=r"store_at: out-of-bounds write into bytes 1 to 4 past the end of "
                       r"argument 0 \(shape \(70,\) float32, 280 bytes; found after the launch"):  # fmt: skip
        kernels.get_function("store_at")((2,), (32,), (y, np.int32(70)))
    kernels.get_function("store_at")((2,), (32,), (y, np.int32(69)))  # the canary was restored
    assert y.get()[69] == 1.0


def test_a_private_array_is_staged_into_guarded_memory(kernels):
    """NumPy arithmetic makes private memory; its shared copy for the launch is guarded as well."""
    x = device.asarray(np.zeros(64, np.float32)) + 1
    assert not device.is_shared(x)
    with pytest.raises(device.OutOfBounds, match=r"byte 1 past the end of argument 0 \(shape \(64,\) float32"):
        kernels.get_function("copy_from")((1,), (32,), (x, device.empty(1, np.float32), np.int32(64)))


def test_a_view_reports_the_array_it_belongs_to(kernels):
    x = device.asarray(np.arange(64, dtype=np.float32))
    with pytest.raises(device.OutOfBounds, match=r"byte 1 past the end of argument 0 \(shape \(64,\) float32"):
        kernels.get_function("copy_from")((1,), (32,), (x[32:], device.empty(1, np.float32), np.int32(32)))


def test_the_mma_exercise_rejects_reading_rows_past_the_end_of_a():
    """Without its row bound, `pair` reads rows M..M+10 of A in the partial tile (M = 37): garbage that reaches
    only outputs the kernel does not store, so the comparison alone passed it."""
    text = solution("mma_fragments", show=False)
    unbounded = text.replace("  if (r >= rows) return 0u;\n", "")
    assert unbounded != text
    result = check("mma_fragments", unbounded, verbose=False)
    assert not result.passed
    assert "mma_fragments: out-of-bounds access: block (" in result.message
    assert "made a read of address 0x" in result.message
    assert "past the end of argument 0 (shape (37, 32) uint16, 2368 bytes" in result.message
