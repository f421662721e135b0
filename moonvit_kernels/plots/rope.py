"""2D RoPE: angle/frequency maps over the patch grid, offset invariance of q·k, which dims pair up."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure

from .. import reference


def rope_angle_maps(h: int, w: int, head_dim: int, quantity: str = "cos") -> np.ndarray:
    """`[hd/2, h, w]` float64: for each complex slot j, the angle (or its cos / sin) at each patch.

    Slot `2i` turns by `column·f_i` (width), slot `2i+1` by `row·f_i` (height) — `reference.rope_angles`.
    """
    if quantity not in ("angle", "cos", "sin"):
        raise ValueError(f"quantity must be 'angle', 'cos' or 'sin', got {quantity!r}")
    angles = reference.rope_angles(h, w, head_dim, dtype=np.float64)  # [h·w, hd/2]
    maps = angles.T.reshape(head_dim // 2, h, w)
    return {"angle": maps, "cos": np.cos(maps), "sin": np.sin(maps)}[quantity]


def rope_frequency_maps(
    h: int,
    w: int,
    head_dim: int,
    quantity: str = "cos",
    max_columns: int = 8,
    slots: Sequence[int] | None = None,
) -> Figure:
    """One heat map per complex slot (all `hd/2`, or the given `slots`) over the h × w grid, with one
    shared colour bar: width slots (even j) vary along columns, height slots (odd j) along rows; low i
    turns fast, high i barely turns.

    `quantity` "cos" / "sin" share the scale −1 … 1. "angle" (radians) uses a shared logarithmic scale,
    so a slot turning 10⁻⁴ rad per patch and one turning 1 rad per patch both show their gradient and
    the bar reads off how far apart they are; angle 0 (row or column 0) is drawn in the "bad" colour.
    """
    from matplotlib.colors import LogNorm, Normalize

    maps = rope_angle_maps(h, w, head_dim, quantity)
    chosen = list(range(maps.shape[0])) if slots is None else [int(j) for j in slots]
    if not chosen or min(chosen) < 0 or max(chosen) >= maps.shape[0]:
        raise ValueError(f"slots must be indices in 0..{maps.shape[0] - 1}, got {chosen}")
    n = len(chosen)
    cols = min(max_columns, n)
    rows = -(-n // cols)
    fig = Figure(figsize=(1.9 * cols + 1.0, 1.9 * rows * h / max(w, 1) + 0.8), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    if quantity == "angle":
        positive = maps[chosen][maps[chosen] > 0]
        lo, hi = (float(positive.min()), float(positive.max())) if positive.size else (1e-6, 1.0)
        norm, cmap, label = LogNorm(lo, max(hi, lo * 10)), "viridis", "angle (rad), log scale"
    else:
        norm, cmap, label = Normalize(-1.0, 1.0), "RdBu", f"{quantity}(angle)"
    image = None
    for k, ax in enumerate(axes):
        ax.set_xticks([])
        ax.set_yticks([])
        if k >= n:
            ax.set_visible(False)
            continue
        j = chosen[k]
        data = np.ma.masked_less_equal(maps[j], 0) if quantity == "angle" else maps[j]
        image = ax.imshow(data, cmap=cmap, norm=norm)
        ax.set_title(f"slot {j}: {'w' if j % 2 == 0 else 'h'}, i={j // 2}", fontsize=7)
    fig.colorbar(image, ax=axes.tolist(), shrink=0.8, label=label)
    shown = "angle" if quantity == "angle" else f"{quantity}(angle)"
    fig.suptitle(f"2D RoPE {shown} on a {h}×{w} patch grid, head_dim {head_dim}", fontsize=9)
    return fig


def rope_angle_range(h: int, w: int, head_dim: int) -> np.ndarray:
    """`[hd/4]` float64: the largest angle (radians) frequency `i` reaches on an h × w grid,
    `(max(h, w) − 1)·f_i` — below about π/2 its cos barely changes over the whole image."""
    return (max(h, w) - 1) * reference.rope_frequencies(head_dim, dtype=np.float64)


def rope_offset_scores(
    head_dim: int,
    offsets: Sequence[int],
    starts: Sequence[tuple[int, int]],
    axis: str = "width",
    seed: int = 0,
) -> np.ndarray:
    """`[len(starts), len(offsets)]` float64: `rope(q, start) · rope(k, start + offset)` for one
    random q, k pair, the offset taken along `axis` ("width" = columns, "height" = rows).

    RoPE makes this depend on the offset only, so every row is the same curve.
    """
    if axis not in ("width", "height"):
        raise ValueError(f"axis must be 'width' or 'height', got {axis!r}")
    offsets = [int(o) for o in offsets]
    starts = [(int(r), int(c)) for r, c in starts]
    if min(offsets) < 0 or min(min(s) for s in starts) < 0:
        raise ValueError("offsets and start positions must be >= 0")
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, 1, 1, head_dim))
    dr, dc = (0, 1) if axis == "width" else (1, 0)
    H = max(r for r, _ in starts) + dr * max(offsets) + 1
    W = max(c for _, c in starts) + dc * max(offsets) + 1
    table = reference.rope_angles(H, W, head_dim, dtype=np.float64)  # [H·W, hd/2]
    scores = np.empty((len(starts), len(offsets)))
    for s, (r, c) in enumerate(starts):
        qr = reference.apply_rope(q, table[r * W + c][None])
        for o, off in enumerate(offsets):
            kr = reference.apply_rope(k, table[(r + dr * off) * W + (c + dc * off)][None])
            scores[s, o] = float(np.sum(qr * kr))
    return scores


def rope_offset_invariance(
    head_dim: int,
    max_offset: int = 24,
    starts: Sequence[tuple[int, int]] = ((0, 0), (3, 7), (11, 2), (20, 20)),
    seed: int = 0,
) -> Figure:
    """q·k after RoPE against the token offset (width and height panels), one line per start
    position `(row, col)`: the lines coincide because RoPE encodes relative position."""
    offsets = np.arange(max_offset + 1)
    fig = Figure(figsize=(9, 3.4), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    for ax, axis in zip(axes, ("width", "height"), strict=True):
        scores = rope_offset_scores(head_dim, offsets, starts, axis, seed)
        for (r, c), line, style in zip(starts, scores, ("-", "--", ":", "-."), strict=False):
            ax.plot(offsets, line, style, marker=".", label=f"start (row {r}, col {c})")
        ax.set_xlabel(f"offset along {axis} (patches)")
        ax.set_title(f"{axis} offset")
    axes[0].set_ylabel("q · k after RoPE")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"RoPE: q·k depends only on the offset (head_dim {head_dim}, random q, k)", fontsize=9)
    return fig


@dataclass(frozen=True)
class RopePair:
    """Two head dims rotated together as one complex number."""

    dims: tuple[int, int]
    axis: str  # "width" (column) or "height" (row)
    freq_index: int  # i in f_i = theta^(-4i/hd)


def rope_pairs(head_dim: int, convention: str = "interleaved") -> list[RopePair]:
    """Which dims of a head rotate together, and by which axis' angle.

    "interleaved" (K3, docs/model.md stage 4): complex slot j holds dims `(2j, 2j+1)`; even slots j = 2i
    turn by `column·f_i`, odd slots j = 2i+1 by `row·f_i`. "rotate_half" (the common 1-D
    convention other ports wrongly reuse) pairs dims `(j, j + hd/2)`, with the same slot→axis rule.
    """
    if head_dim <= 0 or head_dim % 4:
        raise ValueError(f"head_dim must be a positive multiple of 4, got {head_dim}")
    half = head_dim // 2
    out = []
    for j in range(half):
        if convention == "interleaved":
            dims = (2 * j, 2 * j + 1)
        elif convention == "rotate_half":
            dims = (j, j + half)
        else:
            raise ValueError(f"convention must be 'interleaved' or 'rotate_half', got {convention!r}")
        out.append(RopePair(dims, "width" if j % 2 == 0 else "height", j // 2))
    return out


def plot_rope_pairing(head_dim: int) -> Figure:
    """Arcs joining the dims that rotate together, interleaved (K3) above rotate-half below;
    blue arcs turn with the column (width), orange with the row (height)."""
    from matplotlib.patches import Arc

    fig = Figure(figsize=(min(14, 0.45 * head_dim + 2), 4.2), layout="constrained")
    axes = fig.subplots(2, 1)
    colours = {"width": "C0", "height": "C1"}
    for ax, convention in zip(axes, ("interleaved", "rotate_half"), strict=True):
        pairs = rope_pairs(head_dim, convention)
        ax.scatter(range(head_dim), np.zeros(head_dim), s=18, color="0.3", zorder=3)
        for pr in pairs:
            a, b = pr.dims
            ax.add_patch(
                Arc(((a + b) / 2, 0), b - a, (b - a) * 0.9 + 0.8, theta1=0, theta2=180, color=colours[pr.axis])
            )
            ax.text((a + b) / 2, (b - a) * 0.45 + 0.45, str(pr.freq_index), ha="center", fontsize=7)
        ax.set_xlim(-1, head_dim)
        ax.set_ylim(-0.8, head_dim * 0.5 + 1.2 if convention == "rotate_half" else 2.8)
        ax.set_yticks([])
        ax.set_xticks(range(0, head_dim, max(1, head_dim // 16)))
        for side in ("top", "right", "left"):
            ax.spines[side].set_visible(False)
        name = "interleaved pairs (K3)" if convention == "interleaved" else "rotate-half (NOT K3)"
        ax.set_title(f"{name}: arc = one complex pair, number = frequency index i", fontsize=9)
    axes[1].set_xlabel("head dim")
    axes[0].plot([], [], color="C0", label="width: angle = column · f_i")
    axes[0].plot([], [], color="C1", label="height: angle = row · f_i")
    axes[0].legend(loc="upper right", fontsize=8, ncol=2)
    return fig
