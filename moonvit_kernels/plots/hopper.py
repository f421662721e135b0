"""Hopper layouts: where the swizzle puts each 16-byte chunk of a shared-memory row, and source excerpts.

- `swizzle_layout(swizzle, span)`: for an 8-row atom of `span`-byte rows, the chunk position that
  logical chunk j of row r is stored at, read off an address function (the emulator's model of the
  hardware, `cuda_backend.emulation.hopper.swizzle`, or any other with its signature).
- `plot_swizzle(layouts)`: one panel per layout, the physical rows of shared memory with each slot
  coloured and labelled by the logical chunk it holds; the x axis names the 4 banks of each slot.
- `excerpt(text, start, end)`: the lines of a source file between two markers, so a notebook shows a
  piece of a kernel found by its text, not by line numbers that drift.
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


def excerpt(text: str, start: str, end: str | None = None) -> str:
    """Lines of `text` from the first line containing `start` through the first later line containing `end`
    (to the end of the text when `end` is None). ValueError naming the marker that is missing."""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if start in line), None)
    if first is None:
        raise ValueError(f"marker {start!r} not found in the source")
    if end is None:
        return "\n".join(lines[first:])
    last = next((i for i in range(first + 1, len(lines)) if end in lines[i]), None)
    if last is None:
        raise ValueError(f"end marker {end!r} not found after {start!r}")
    return "\n".join(lines[first : last + 1])
