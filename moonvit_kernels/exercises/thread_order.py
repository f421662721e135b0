"""The order a learner's kernel runs its threads in: reversed, to ask whether its output depends on it (a race)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def reversed_thread_order() -> Iterator[None]:
    """Within the block, learner kernels run with their threads in the opposite order: on the CPU emulator
    (warps, lanes, blocks) and under the simulator (start order); on a GPU nothing changes."""
    from moonvit_kernels.tools import simulator
    from moonvit_kernels.tools.emulation import device

    with device.reversed_thread_order(), simulator.reversed_thread_order():
        yield
