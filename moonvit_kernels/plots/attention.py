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


def attention_mask_picture(grid_thws: Any, block_q: int | None = None, block_k: int | None = None) -> Figure:
    """The packed sequence's attention mask: one square block per media item, zero elsewhere.

    With `block_q` and `block_k`, the tiles attention v2 works on are outlined: query tiles of
    `block_q` rows and key tiles of `block_k` keys, both starting at each item's first token (a tile
    never straddles two items; the last tile of an item is partial).
    """
    from matplotlib.patches import Patch, Rectangle

    grid = np.asarray(grid_thws).reshape(-1, 3)
    mask = attention_mask(grid)
    fig = Figure(figsize=(6.0, 6.4), layout="constrained")
    ax = fig.subplots()
    ax.imshow(mask, cmap="Greys", vmin=0, vmax=1.6, interpolation="nearest")
    bounds = reference.cu_seqlens(grid)
    handles = [
        Patch(fc=(0.45, 0.45, 0.45), ec="0.3", label="may attend (same item)"),
        Patch(fc="white", ec="0.3", label="masked: another item, never computed"),
    ]
    if block_q is not None and block_k is not None:
        if block_q < 1 or block_k < 1:
            raise ValueError(f"block_q and block_k must be >= 1, got {block_q}, {block_k}")
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            for q0 in range(a, b, block_q):
                for k0 in range(a, b, block_k):
                    h, w = min(block_q, b - q0), min(block_k, b - k0)
                    ax.add_patch(Rectangle((k0 - 0.5, q0 - 0.5), w, h, fill=False, ec="C1", lw=1.2))
        handles.append(Patch(fill=False, ec="C1", lw=1.2, label=f"v2 tile: {block_q} queries × {block_k} keys"))
    ax.set_xticks(bounds[:-1])
    ax.set_yticks(bounds[:-1])
    ax.set_xlabel("key token")
    ax.set_ylabel("query token")
    fig.legend(handles=handles, fontsize=8, loc="outside lower center", ncols=min(3, len(handles)))
    items = ", ".join(str(tuple(g)) for g in grid.tolist())
    ax.set_title(f"{len(grid)} packed items, L = {bounds[-1]}\n(t, h, w) = {items}", fontsize=9)
    return fig


@dataclass(frozen=True)
class MemoryRow:
    """Score memory of one approach, for all heads at once (`elements`) and for one head (`per_head`)."""

    approach: str
    elements: int
    nbytes: int
    where: str
    per_head: int = 0


def attention_memory_table(
    seq_lens: Sequence[int], heads: int, head_dim: int, block_q: int, block_k: int, itemsize: int = 4
) -> list[MemoryRow]:
    """Score memory of three approaches for packed items of lengths `seq_lens`, every row counted the
    same way: the scores of **all `heads` heads and all query rows** if they were computed at once.

    - "naive, one L×L matrix": the masked scores over the packed sequence (`H·L²`);
    - "naive, per item": each item's `n×n` scores, the largest item's held at a time (`H·max n²`);
    - "tiled online softmax": per (query tile, head) block a `block_q × block_k` tile of scores plus
      the running max and sum of its rows (`block_q·block_k + 2·block_q`, in shared memory), times the
      number of such blocks, `H·Σ ceil(n/block_q)`: linear in L. Only the blocks resident on the SMs
      hold theirs at any moment, so the real footprint is smaller still.

    `per_head` is the same count for one head (the tiled row: for one block). Output and log-sum-exp
    are `L·H·(hd + 1)` in every approach and are not counted (`head_dim` is accepted for symmetry).
    """
    lens = [int(n) for n in seq_lens]
    if not lens or min(lens) < 1 or heads < 1 or head_dim < 1 or block_q < 1 or block_k < 1:
        raise ValueError("seq_lens, heads, head_dim, block_q and block_k must be positive")
    L = sum(lens)
    tile = block_q * block_k + 2 * block_q
    tiles = sum(-(-n // block_q) for n in lens)
    rows = [
        ("naive, one L×L matrix", heads * L * L, L * L, "global memory"),
        ("naive, per item", heads * max(lens) ** 2, max(lens) ** 2, "global memory"),
        ("tiled online softmax", heads * tiles * tile, tile, "shared memory, one tile per block"),
    ]
    return [MemoryRow(name, n, n * itemsize, where, per) for name, n, per, where in rows]


def attention_kv_traffic(
    seq_lens: Sequence[int], heads: int, head_dim: int, block_q: int, itemsize: int = 4
) -> dict[str, int]:
    """Bytes of K and V read from global memory by attention v1 and v2 over packed items.

    v1 (one block per query row) reads its item's whole K and V for every query row:
    `H·Σ n·n·hd·2·itemsize`. v2 (one block per tile of `block_q` query rows) reads them once per
    query tile: `H·Σ ceil(n/block_q)·n·hd·2·itemsize` — about `block_q` times less.
    """
    lens = [int(n) for n in seq_lens]
    if not lens or min(lens) < 1 or heads < 1 or head_dim < 1 or block_q < 1:
        raise ValueError("seq_lens, heads, head_dim and block_q must be positive")
    per_key = 2 * head_dim * itemsize * heads  # one key's K and V row, all heads
    return {
        "v1": sum(n * n for n in lens) * per_key,
        "v2": sum(-(-n // block_q) * n for n in lens) * per_key,
    }


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
