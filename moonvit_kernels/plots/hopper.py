"""Hopper layouts: where the swizzle puts each 16-byte chunk of a shared-memory row, and who holds each
accumulator element.

- `swizzle_layout(swizzle, span)`: for an 8-row atom of `span`-byte rows, the chunk position that
  logical chunk j of row r is stored at, read off an address function (the emulator's model of the
  hardware, `tools.emulation.hopper.swizzle`, or any other with its signature).
- `plot_swizzle(layouts)`: one panel per layout, the physical rows of shared memory with each slot
  coloured and labelled by the logical chunk it holds; the x axis names the 4 banks of each slot.
- `accumulator_owners(registers)` / `plot_accumulator_owners`: which thread and register of a warpgroup
  holds element (m, n) of a wgmma m64nNk16 accumulator, read off a run where D[m, n] = 64·m + n.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
from matplotlib.figure import Figure

CHUNK_BYTES = 16  # the swizzle permutes 16-byte chunks
BANK_BYTES, BANKS = 4, 32
ATOM_ROWS = 8  # a swizzle pattern repeats every 8 rows


def swizzle_layout(swizzle: Callable[[int, int], int], span: int = 128, base: int = 4096) -> np.ndarray:
    """`[8, span // 16]` int: the chunk position where logical 16-byte chunk j of row r is stored.

    Row r of the atom starts at `base + r·span` (`base` pattern-aligned: a multiple of 1024); the
    address of chunk j is passed through `swizzle(address, span)` and its position within the row is
    read back. The identity table (`position[r, j] == j`) means no swizzle."""
    if span not in (32, 64, 128):
        raise ValueError(f"swizzle spans are 32, 64 or 128 bytes, not {span}")
    if base % 1024:
        raise ValueError(f"base {base:#x} is not a multiple of 1024: the pattern would not start at row 0")
    chunks = span // CHUNK_BYTES
    out = np.empty((ATOM_ROWS, chunks), dtype=np.int64)
    for r in range(ATOM_ROWS):
        row = base + r * span
        for j in range(chunks):
            moved = int(swizzle(row + CHUNK_BYTES * j, span)) - row
            if moved % CHUNK_BYTES or not 0 <= moved < span:
                raise ValueError(f"swizzle moved chunk {j} of row {r} to byte {moved}, outside its {span}-byte row")
            out[r, j] = moved // CHUNK_BYTES
    return out


def plot_swizzle(layouts: Mapping[str, np.ndarray], elem_bytes: int = 2) -> Figure:
    """One panel per `swizzle_layout` table: shared-memory rows (y) by chunk slots (x), each slot coloured
    and labelled by the logical chunk it holds (`k` range of `elem_bytes`-byte elements); under each
    slot, the banks it occupies for 128-byte rows (rows of 32 or 64 bytes share the banks of a 128-byte
    line with their neighbours)."""
    if not layouts:
        raise ValueError("no layout to draw")
    fig = Figure(figsize=(4.6 * len(layouts), 3.8), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(layouts)))
    per_chunk = CHUNK_BYTES // elem_bytes
    for ax, (title, pos) in zip(axes, layouts.items(), strict=True):
        rows, chunks = pos.shape
        held = np.empty_like(pos)  # held[r, p]: the logical chunk stored at slot p of row r
        for r in range(rows):
            held[r, pos[r]] = np.arange(chunks)
        ax.imshow(held, cmap="tab10", vmin=0, vmax=9, interpolation="nearest", aspect="auto")
        for (r, p), j in np.ndenumerate(held):
            ax.text(
                p, r, f"{j}\nk{per_chunk * j}–{per_chunk * j + per_chunk - 1}", ha="center", va="center", fontsize=6
            )
        ax.set_xticks(range(chunks))
        ax.set_xticklabels(
            [f"{p}\nb{4 * p}–{4 * p + 3}" for p in range(chunks)] if chunks == 8 else [str(p) for p in range(chunks)],
            fontsize=7,
        )
        ax.set_yticks(range(rows))
        ax.set_xlabel("16-byte slot of the row (banks)")
        ax.set_ylabel("row r of the tile (mod 8)")
        ax.set_title(title, fontsize=9)
    fig.suptitle("which logical 16-byte chunk j (bf16 elements k) each shared-memory slot holds", fontsize=9)
    return fig


def accumulator_owners(registers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(thread [64, N], register [64, N])` int: who holds D[m, n] of a wgmma m64nNk16 accumulator.

    `registers` `[128, N/2]`: each thread's accumulator registers after a wgmma that computed
    D[m, n] = 64·m + n (exact in fp32), N ≤ 64. ValueError unless every element is held exactly once."""
    regs = np.asarray(registers)
    if regs.ndim != 2 or regs.shape[0] != 128 or not 1 <= regs.shape[1] <= 32:
        raise ValueError(f"expected [128 threads, N/2 <= 32 registers], got {regs.shape}")
    n = 2 * regs.shape[1]
    if not np.all(np.isfinite(regs)) or np.any(regs != np.round(regs)):
        raise ValueError("the registers do not hold the codes 64·m + n (NaN or fractions)")
    thread = np.full((64, n), -1, dtype=np.int64)
    register = np.full((64, n), -1, dtype=np.int64)
    for (t, i), code in np.ndenumerate(regs.astype(np.int64)):
        m, c = divmod(int(code), 64)
        if not (0 <= m < 64 and 0 <= c < n) or thread[m, c] >= 0:
            raise ValueError(f"thread {t} register {i} holds {code}: not a code, or an element held twice")
        thread[m, c], register[m, c] = t, i
    return thread, register


def plot_accumulator_owners(thread: np.ndarray, register: np.ndarray, rows: int = 16) -> Figure:
    """Left: the 64 x N accumulator coloured by warp (thread // 32). Right: its first `rows` rows, each
    element labelled `lane/register` of the thread that holds it."""
    fig = Figure(figsize=(11, 5.2), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=(1, 2))
    warp = thread // 32
    left.imshow(warp, cmap="tab10", vmin=0, vmax=9, interpolation="nearest", aspect="auto")
    for w in range(4):
        left.text(thread.shape[1] / 2 - 0.5, 16 * w + 7.5, f"warp {w}", ha="center", va="center", fontsize=9)
    left.set_title("which warp holds D[m, n]", fontsize=9)
    left.set_xlabel("column n")
    left.set_ylabel("row m")
    lane = thread[:rows] % 32
    right.imshow(lane % 4, cmap="Pastel1", vmin=0, vmax=8, interpolation="nearest", aspect="auto")
    for (m, c), t in np.ndenumerate(lane):
        right.text(c, m, f"{t}/{register[m, c]}", ha="center", va="center", fontsize=5.5)
    right.set_title(f"rows 0–{rows - 1}: lane/register (colour: lane mod 4)", fontsize=9)
    right.set_xlabel("column n")
    right.set_ylabel("row m")
    right.set_xticks(range(thread.shape[1]))
    right.set_yticks(range(rows))
    return fig
