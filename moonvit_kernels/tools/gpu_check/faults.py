"""`--inject-fault KIND:MATCH`: make the items whose name contains MATCH misbehave, to test the containment.

    hang   the item sleeps forever (a kernel that never finishes): the parent's timeout must stop it -> TIMEOUT
    crash  the item's process aborts (SIGABRT), as when a fault kills the CUDA context's owner -> CRASH
    wrong  the item's output is perturbed after the kernel ran (one element moved far out of tolerance) -> FAIL
    error  the item raises what a sticky CUDA error raises ("an illegal memory access was encountered"):
           the worker records ERROR and restarts in a fresh process, as after a real sticky fault

Works with and without --simulate; every injected fault is named in the report's notes.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

KINDS = ("hang", "crash", "wrong", "error")
STICKY_MESSAGE = "injected fault: an illegal memory access was encountered (cudaErrorIllegalAddress)"


@dataclass(frozen=True)
class Fault:
    kind: str
    match: str

    def hits(self, item: str) -> bool:
        """True when this fault applies to item `item`."""
        return self.match in item

    def __str__(self) -> str:
        return f"{self.kind}:{self.match}"


def parse_fault(text: str | None) -> Fault | None:
    """`"hang:cuda rope"` -> Fault("hang", "cuda rope"); None for None/""; ValueError naming the problem."""
    if not text:
        return None
    kind, sep, match = text.partition(":")
    if not sep or kind not in KINDS or not match.strip():
        raise ValueError(f"--inject-fault must be KIND:MATCH with KIND one of {', '.join(KINDS)}, got {text!r}")
    return Fault(kind, match.strip())


def before_item(fault: Fault | None, item: str) -> None:
    """Apply a hang, crash or error fault before item `item` runs (wrong faults act on outputs: `perturb`)."""
    if fault is None or not fault.hits(item):
        return
    if fault.kind == "hang":
        while True:
            time.sleep(3600)
    if fault.kind == "crash":
        os.abort()
    if fault.kind == "error":
        raise RuntimeError(STICKY_MESSAGE)


def wrong(fault: Fault | None, item: str) -> bool:
    """True when item `item` must have its output perturbed."""
    return fault is not None and fault.kind == "wrong" and fault.hits(item)


def perturb(array: Any) -> None:
    """Move the last element of `array` (NumPy or CuPy; float32 or bf16 bits) far out of any tolerance, in place."""
    flat = array.reshape(-1)
    if array.dtype == np.uint16:  # bf16 bits: 0x4480 is 1024.0
        flat[-1] = 0x4480
    else:
        flat[-1] = flat[-1] + 1e3
