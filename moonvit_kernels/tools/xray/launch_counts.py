"""Dynamic instruction counts of one launch at K3 shape, modelled from the SASS of the loops doing its FMAs.

The catalogue knows a launch's FLOPs; the SASS knows what one trip through each loop costs. The
loops holding the kernel's FMA-class instructions ("FMA loops") are scaled so that together they do
the launch's FLOPs:

    trips(loop) = share(loop) x FLOPs / 2 / (multiply-adds of one trip of the loop, per warp)

A trip's multiply-adds are its own FFMAs x 32, or in a tensor-core loop its MMAs by shape (HMMA.16816:
16·8·16 = 2,048 per warp; HGMMA.64xNx16, one per warp of a warpgroup: 64·N·16 / 4 per warp). `share`
is the fraction of the FLOPs a loop does: 1 for the hot loop (`sass.Function.hot_loop`) unless the
catalogue gives `fma_shares` for the kernel's phases (numba attention v2: QK and PV, half each), which
go, in address order, to the as many loops doing the most multiply-adds per trip (on sm_90 the QK and
PV loops; on sm_80 the compiler unrolls PV into the key-tile loop, which then takes PV's share). Then,
summed over the FMA loops:

    issued instructions  = trips x own instructions (NOPs excluded), warp-instructions
    shared wavefronts    = trips x sum over own shared instructions of
                           (ideal wavefronts of the access width) x (traced conflict factor)

Ideal wavefronts of one warp-wide shared instruction: 1 for LDS/STS of 4 bytes or less per lane, 2 for
.64, 4 for .128 (32 banks x 4 bytes serve 128 bytes per wavefront); LDSM (ldmatrix) one per 8x8 matrix
of 16-bit values (.4: 4); LDGSTS (cp.async) its shared-memory write, as STS of its width. The conflict
factor is wavefronts / ideal over every traced request of the kernel (`trace.TraceResult`), loads
(LDS, LDSM) and stores (STS, LDGSTS) apart; untraced kernels are taken as conflict-free and say so.

Not counted: HGMMA operand reads through matrix descriptors and TMA (UTMALDG) writes into shared
memory (they bypass the load/store wavefronts; no documented rate), and everything outside the FMA
loops (staging loops nested in them, prologue, epilogue). Both counts are therefore at most the
launch's real counts: the roofs built on them stay lower bounds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from moonvit_kernels.tools.xray.sass import Function, Instruction, Loop
from moonvit_kernels.tools.xray.trace import TraceResult

_WIDTH = re.compile(r"\.(64|128)(?:\.|$)")
_LDSM_COUNT = re.compile(r"\.(\d)$")
_HGMMA_SHAPE = re.compile(r"^\.(\d+)x(\d+)x(\d+)")
_HMMA_MACS = {".16816": 16 * 8 * 16, ".1688": 16 * 8 * 8, ".1684": 16 * 8 * 4}
SHARED_LOADS = ("LDS", "LDSM")
UNTRACED = "assumed conflict-free (untraced)"


def wavefronts(ins: Instruction) -> int:
    """Ideal (conflict-free) wavefronts of one warp-wide shared-memory instruction; 0 if it is not one."""
    op, mods = ins.opcode, ins.modifiers
    if op in ("LDSM", "STSM"):
        m = _LDSM_COUNT.search(mods)
        return int(m.group(1)) if m else 1
    if op in ("LDS", "STS", "LDGSTS", "ATOMS"):
        m = _WIDTH.search(mods)
        return {None: 1, "64": 2, "128": 4}[m.group(1) if m else None]
    return 0


def multiply_adds(ins: Instruction) -> int:
    """Multiply-adds one warp does in one FMA-class instruction (FFMA 32; HMMA and HGMMA by shape); else 0."""
    if ins.opcode == "FFMA":
        return 32
    if ins.opcode == "HMMA":
        shape = ins.modifiers.split(".F")[0]
        if shape not in _HMMA_MACS:
            raise ValueError(f"HMMA shape {ins.modifiers!r} not modelled")
        return _HMMA_MACS[shape]
    if ins.opcode == "HGMMA":
        m = _HGMMA_SHAPE.match(ins.modifiers)
        if not m:
            raise ValueError(f"HGMMA shape {ins.modifiers!r} not modelled")
        mm, nn, kk = (int(g) for g in m.groups())
        return mm * nn * kk // 4  # one HGMMA per warp of the warpgroup
    return 0


def loop_multiply_adds(loop: Loop) -> int:
    """Multiply-adds per warp in one trip of `loop`'s own instructions: its MMAs when it has any
    (FFMAs beside MMAs are softmax or epilogue arithmetic, not the modelled FLOPs), else its FFMAs."""
    mma = sum(multiply_adds(i) for i in loop.own if i.opcode in ("HMMA", "HGMMA"))
    return mma or sum(multiply_adds(i) for i in loop.own if i.opcode == "FFMA")


def conflict_factors(trace: TraceResult | None) -> tuple[float, float] | None:
    """(load, store) wavefronts over ideal of the traced shared accesses; None without a usable trace."""
    if trace is None or trace.error is not None:
        return None
    out = []
    for store in (False, True):
        sites = [s for s in trace.sites if s.space == "shared" and s.store == store]
        cost, ideal = sum(s.cost for s in sites), sum(s.ideal for s in sites)
        out.append(cost / ideal if ideal else 1.0)
    return out[0], out[1]


@dataclass
class LaunchCounts:
    """Modelled dynamic counts of one launch (warp-level), and how they were made."""

    loops: list[tuple[int, float]]  # (start address of each FMA loop, trips per launch)
    issued: float  # warp-instructions
    shared_instructions: float
    shared_wavefronts: float
    load_factor: float = 1.0
    store_factor: float = 1.0
    conflicts: str = UNTRACED
    notes: list[str] = field(default_factory=list)


def fma_loops(fn: Function, shares: Sequence[float] = ()) -> tuple[list[tuple[Loop, float]], list[str]]:
    """[(loop, share of the FLOPs)] of `fn`, and notes: with `shares`, the len(shares) loops with the most
    multiply-adds per trip (innermost first on a tie), in address order; else, or when fewer loops hold
    FMAs, the hot loop alone."""
    notes = []
    if shares:
        loops = [lp for lp in fn.loops if loop_multiply_adds(lp)]
        if len(loops) >= len(shares):
            top = sorted(loops, key=lambda lp: (-loop_multiply_adds(lp), not lp.innermost, lp.start))[: len(shares)]
            return list(zip(sorted(top, key=lambda lp: lp.start), shares, strict=True)), notes
        notes.append(f"{len(loops)} loops hold FMAs where the catalogue names {len(shares)} phases: hot loop only")
    hot = fn.hot_loop
    return ([(hot, 1.0)] if hot is not None else []), notes


def count(
    fn: Function, flops: float, shares: Sequence[float] = (), trace: TraceResult | None = None
) -> LaunchCounts | None:
    """Issued instructions and shared wavefronts of a launch doing `flops` FLOPs with the SASS `fn`;
    None when the kernel has no FMA loop (nothing to scale by)."""
    chosen, notes = fma_loops(fn, shares)
    chosen = [(lp, s) for lp, s in chosen if loop_multiply_adds(lp)]
    if not chosen or flops <= 0:
        return None
    factors = conflict_factors(trace)
    load_f, store_f = factors if factors else (1.0, 1.0)
    how = f"traced: loads x{load_f:.2f}, stores x{store_f:.2f} the ideal wavefronts" if factors else UNTRACED
    counts = LaunchCounts([], 0.0, 0.0, 0.0, load_f, store_f, how, notes)
    for loop, share in chosen:
        trips = share * flops / 2 / loop_multiply_adds(loop)
        counts.loops.append((loop.start, trips))
        counts.issued += trips * loop.size
        for ins in loop.own:
            wf = wavefronts(ins)
            if wf:
                factor = load_f if ins.opcode in SHARED_LOADS else store_f
                counts.shared_instructions += trips
                counts.shared_wavefronts += trips * wf * factor
    return counts
