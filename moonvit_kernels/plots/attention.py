"""Attention over packed items: the block-diagonal mask, score-memory table, the online softmax traced."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from .. import reference


def attention_mask(grid_thws: Any) -> np.ndarray:
    """`[L, L]` bool: token i may attend to token j iff both lie in the same media item."""
    bounds = reference.cu_seqlens(np.asarray(grid_thws).reshape(-1, 3))
    item = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    return item[:, None] == item[None, :]


def attention_mask_picture(grid_thws: Any) -> Figure:
    """The packed sequence's attention mask: one square block per media item, zero elsewhere."""
    grid = np.asarray(grid_thws).reshape(-1, 3)
    mask = attention_mask(grid)
    fig = Figure(figsize=(4.6, 4.2), layout="constrained")
    ax = fig.subplots()
    ax.imshow(mask, cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
    bounds = reference.cu_seqlens(grid)
    ax.set_xticks(bounds[:-1])
    ax.set_yticks(bounds[:-1])
    ax.set_xlabel("key token")
    ax.set_ylabel("query token")
    ax.set_title(f"{len(grid)} packed items, L = {bounds[-1]}: " + ", ".join(str(tuple(g)) for g in grid.tolist()))
    return fig


@dataclass(frozen=True)
class MemoryRow:
    """Bytes one approach keeps for attention scores."""

    approach: str
    elements: int
    nbytes: int
    where: str


def attention_memory_table(
    seq_lens: Sequence[int], heads: int, head_dim: int, block_q: int, block_k: int, itemsize: int = 4
) -> list[MemoryRow]:
    """Score memory of three approaches for packed items of lengths `seq_lens`:

    - "naive, one L×L matrix": all heads' scores over the packed sequence, masked (`H·L²`);
    - "naive, per item": each item's `n×n` scores, the largest item's held at a time (`H·max n²`);
    - "tiled online softmax": per block of queries a `block_q × block_k` tile of scores plus
      running max / sum per query row (`block_q·block_k + 2·block_q`), independent of L — this is
      per thread block, in shared memory / registers; output and log-sum-exp are `L·H·(hd + 1)`
      in every approach and are not counted.
    """
    lens = [int(n) for n in seq_lens]
    if not lens or min(lens) < 1 or heads < 1 or head_dim < 1 or block_q < 1 or block_k < 1:
        raise ValueError("seq_lens, heads, head_dim, block_q and block_k must be positive")
    L = sum(lens)
    rows = [
        ("naive, one L×L matrix", heads * L * L, "global memory"),
        ("naive, per item", heads * max(lens) ** 2, "global memory"),
        ("tiled online softmax", block_q * block_k + 2 * block_q, "shared memory, per block"),
    ]
    return [MemoryRow(name, n, n * itemsize, where) for name, n, where in rows]


def online_softmax_trace(scores: Any, block: int, values: Any = None) -> dict[str, np.ndarray]:
    """One query row's softmax computed key tile by key tile (the flash-attention recurrence), float64.

    `scores [n]` (already scaled), `values [n, d]` (optional). After each tile of `block` keys:
    `m = max(m_old, max(tile))`, `l = l_old·exp(m_old − m) + Σ exp(tile − m)`, and the unnormalised
    output `acc = acc_old·exp(m_old − m) + Σ exp(tile − m)·v`. Returns per tile: `tile_end` (first key
    after the tile), `running_max`, `running_sum`, `lse = m + log l`, and with values `output = acc / l`
    `[tiles, d]`. The last entries equal the direct softmax's: nothing is approximated.
    """
    x = np.asarray(scores, dtype=np.float64)
    if x.ndim != 1 or x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError(f"scores must be a non-empty 1-D array of finite values, got shape {x.shape}")
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    v = None if values is None else np.asarray(values, dtype=np.float64).reshape(x.size, -1)
    m, l_sum = -np.inf, 0.0
    acc = None if v is None else np.zeros(v.shape[1])
    out: dict[str, list] = {"tile_end": [], "running_max": [], "running_sum": [], "lse": [], "output": []}
    for start in range(0, x.size, block):
        tile = x[start : start + block]
        m_new = max(m, float(tile.max()))
        rescale = np.exp(m - m_new)  # exp(−inf) = 0 on the first tile
        p = np.exp(tile - m_new)
        l_sum = l_sum * rescale + float(p.sum())
        if v is not None:
            acc = acc * rescale + p @ v[start : start + block]
            out["output"].append(acc / l_sum)
        m = m_new
        out["tile_end"].append(min(start + block, x.size))
        out["running_max"].append(m)
        out["running_sum"].append(l_sum)
        out["lse"].append(m + np.log(l_sum))
    result = {k: np.asarray(val) for k, val in out.items() if k != "output"}
    if v is not None:
        result["output"] = np.asarray(out["output"])
    return result


def plot_online_softmax(scores: Any, block: int) -> Figure:
    """Left: one row's scores, key tiles shaded, the running max after each tile. Right: the running
    log-sum-exp per tile against the direct one — it is exact once the last tile is in."""
    x = np.asarray(scores, dtype=np.float64)
    trace = online_softmax_trace(x, block)
    fig = Figure(figsize=(10, 3.4), layout="constrained")
    ax, ax2 = fig.subplots(1, 2, width_ratios=(2, 1))
    starts = np.concatenate([[0], trace["tile_end"][:-1]])
    for t, (a, b) in enumerate(zip(starts, trace["tile_end"], strict=True)):
        ax.axvspan(a - 0.5, b - 0.5, color=f"C{t % 2}", alpha=0.08)
        ax.hlines(
            trace["running_max"][t], a - 0.5, b - 0.5, color="C3", lw=2, label="running max m" if t == 0 else None
        )
    ax.bar(np.arange(x.size), x, color="0.4", width=0.8, label="score s_j")
    ax.set_xlabel(f"key j (tiles of {block})")
    ax.set_ylabel("scaled score")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("scores arrive one key tile at a time", fontsize=9)
    direct = np.log(np.sum(np.exp(x - x.max()))) + x.max()
    ax2.plot(np.arange(1, len(trace["lse"]) + 1), trace["lse"], "o-", color="C0", label="running lse")
    ax2.axhline(direct, color="k", ls=":", label="log Σ exp(s) (direct)")
    ax2.set_xlabel("tiles seen")
    ax2.set_ylabel("log-sum-exp")
    ax2.legend(fontsize=8, loc="lower right")
    ax2.set_title("m + log l after each tile", fontsize=9)
    return fig
