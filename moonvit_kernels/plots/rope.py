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


def _label_grid_axes(axes: Sequence, rows: int, cols: int, shown: int) -> None:
    """'column' under the bottom panels, 'row' beside the left ones, ticks at 0 and the last index."""
    for k, ax in enumerate(axes[:shown]):
        r, c = divmod(k, cols)
        last_row = r == rows - 1 or k + cols >= shown
        if last_row:
            ax.set_xlabel("column", fontsize=7, labelpad=1)
        if c == 0:
            ax.set_ylabel("row", fontsize=7, labelpad=1)


def rope_frequency_maps(
    h: int,
    w: int,
    head_dim: int,
    quantity: str = "cos",
    max_columns: int = 8,
    slots: Sequence[int] | None = None,
) -> Figure:
    """One heat map per complex slot (all `hd/2`, or the given `slots`) over the h × w grid (x: column,
    y: row), with one shared colour bar: width slots (even j) vary along columns, height slots (odd j)
    along rows; low i turns fast, high i barely turns.

    `quantity` "cos" / "sin" share the scale −1 … 1. "angle" shows each slot's angle divided by its own largest
    on the grid (0 … 1, linear), so a slot turning 10⁻⁴ rad per patch shows its gradient as plainly as one
    turning 1 rad per patch (a shared log scale made them all look uniform); each panel's title gives its
    largest angle in radians, which says how many decades apart the slots are.
    """
    from matplotlib.colors import Normalize

    maps = rope_angle_maps(h, w, head_dim, quantity)
    chosen = list(range(maps.shape[0])) if slots is None else [int(j) for j in slots]
    if not chosen or min(chosen) < 0 or max(chosen) >= maps.shape[0]:
        raise ValueError(f"slots must be indices in 0..{maps.shape[0] - 1}, got {chosen}")
    n = len(chosen)
    cols = min(max_columns, n)
    rows = -(-n // cols)
    fig = Figure(figsize=(1.9 * cols + 1.2, 1.9 * rows * h / max(w, 1) + 1.0), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    if quantity == "angle":
        norm, cmap, label = Normalize(0.0, 1.0), "viridis", "angle / the slot's largest (in each title)"
    else:
        norm, cmap, label = Normalize(-1.0, 1.0), "RdBu", f"{quantity}(angle)"
    image = None
    for k, ax in enumerate(axes):
        ax.set_xticks([0, w - 1])
        ax.set_yticks([0, h - 1])
        ax.tick_params(labelsize=6, length=2, pad=1)
        if k >= n:
            ax.set_visible(False)
            continue
        j = chosen[k]
        axis = "width" if j % 2 == 0 else "height"
        if quantity == "angle":
            top = float(maps[j].max())
            image = ax.imshow(maps[j] / top if top > 0 else maps[j], cmap=cmap, norm=norm, interpolation="nearest")
            ax.set_title(f"slot {j}: {axis}, i={j // 2}\nmax {top:.2g} rad", fontsize=7)
        else:
            image = ax.imshow(maps[j], cmap=cmap, norm=norm, interpolation="nearest")
            ax.set_title(f"slot {j}: {axis}, i={j // 2}", fontsize=7)
    _label_grid_axes(axes, rows, cols, n)
    fig.colorbar(image, ax=axes.tolist(), shrink=0.8, label=label)
    shown = "angle" if quantity == "angle" else f"{quantity}(angle)"
    fig.suptitle(f"2D RoPE {shown} on a {h}×{w} patch grid (x: column, y: row), head_dim {head_dim}", fontsize=9)
    return fig


def rope_comb(head_dim: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """`(along_row, along_column)`, each `[hd/2, length]` float64: cos of every slot's angle for a token
    moving along a row (column 0 … length−1, row 0) and down a column (row 0 … length−1, column 0).

    Interleaving makes a comb: along a row only the even (width) slots turn, down a column only the odd
    (height) slots."""
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    along_row = rope_angle_maps(1, length, head_dim, "cos")[:, 0, :]
    along_col = rope_angle_maps(length, 1, head_dim, "cos")[:, :, 0]
    return along_row, along_col


def plot_rope_comb(head_dim: int = 128, length: int = 64) -> Figure:
    """The slot × position comb of `rope_comb`: two heat maps of cos(angle), slots down, positions across."""
    along_row, along_col = rope_comb(head_dim, length)
    fig = Figure(figsize=(10, 0.06 * head_dim + 2.2), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    image = None
    panels = (
        (along_row, "column (along a row), patches", "moving along a row: only the even (width) slots turn"),
        (along_col, "row (down a column), patches", "moving down a column: only the odd (height) slots turn"),
    )
    for ax, (data, xlabel, title) in zip(axes, panels, strict=True):
        image = ax.imshow(data, cmap="RdBu", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
        ax.set_xlabel(xlabel)
        ax.set_title(title, fontsize=9)
    axes[0].set_ylabel("complex slot j (even: width, odd: height); frequency i = j // 2")
    fig.colorbar(image, ax=axes.tolist(), shrink=0.8, label="cos(angle)")
    fig.suptitle(
        f"2D RoPE, head_dim {head_dim}, θ = 10000: every slot's cos(angle) against position — a comb, fast slots "
        "at the top, slow at the bottom",
        fontsize=9,
    )
    return fig


def rope_offset_map(
    head_dim: int,
    extent: int,
    swapped: bool = False,
    width_weight: float = 1.0,
    height_weight: float = 0.35,
    seed: int = 0,
) -> np.ndarray:
    """`[2E+1, 2E+1]` float64: `rope(q, (0, 0)) · rope(q, (Δrow, Δcol)) / |q|²` for Δrow, Δcol in −E … E
    (rows: Δrow, columns: Δcol), one random q whose width slots carry `width_weight` and height slots
    `height_weight` of the energy (a query that cares more about horizontal position).

    `swapped=True` turns the width slots by the row and the height slots by the column (the bug of a
    port that swaps the axes): the map is transposed."""
    if extent < 0:
        raise ValueError(f"extent must be >= 0, got {extent}")
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(head_dim)
    energy = q[0::2] ** 2 + q[1::2] ** 2  # per complex slot
    energy[0::2] *= width_weight
    energy[1::2] *= height_weight
    f = reference.rope_frequencies(head_dim, dtype=np.float64)
    d = np.arange(-extent, extent + 1, dtype=np.float64)
    dr, dc = np.meshgrid(d, d, indexing="ij")
    width_pos, height_pos = (dr, dc) if swapped else (dc, dr)
    score = np.zeros_like(dr)
    for i, fi in enumerate(f):
        score += energy[2 * i] * np.cos(width_pos * fi) + energy[2 * i + 1] * np.cos(height_pos * fi)
    return score / energy.sum()


def plot_rope_offset_map(head_dim: int = 128, extent: int = 32, seed: int = 0) -> Figure:
    """q·k after RoPE against the (row, column) offset, K3's convention beside the width/height-swapped one."""
    fig = Figure(figsize=(10, 4.6), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    image = None
    maps = [rope_offset_map(head_dim, extent, swapped=swapped, seed=seed) for swapped in (False, True)]
    vmin = float(min(m.min() for m in maps))
    for ax, swapped, data in zip(axes, (False, True), maps, strict=True):
        image = ax.imshow(data, cmap="magma", vmin=vmin, vmax=1.0, extent=(-extent - 0.5, extent + 0.5, extent + 0.5,
                          -extent - 0.5), interpolation="nearest")  # fmt: skip
        ax.set_xlabel("column offset Δcol (patches)")
        ax.set_title(
            "SWAPPED: width slots turn by the row — transposed" if swapped else
            "K3: width (even) slots turn by the column",
            fontsize=9,
        )  # fmt: skip
    axes[0].set_ylabel("row offset Δrow (patches)")
    fig.colorbar(image, ax=axes.tolist(), shrink=0.85, label="q·k after RoPE / |q|²")
    fig.suptitle(
        f"RoPE makes q·k a function of the 2-D offset only (head_dim {head_dim}; q = k random, width slots weighted "
        "1, height 0.35)",
        fontsize=9,
    )
    return fig


def raster_vs_2d_scores(head_dim: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """`(raster, two_d)`, each `[side, side]` float64: `rope(q, centre) · rope(q, (r, c)) / |q|²` for every patch
    (r, c) of a side × side grid, q with equal energy in every slot. `raster`: 1-D RoPE over the patches in raster
    order (position r·side + c, the LLM convention: frequencies 10000^(−2i/hd), i < hd/2); `two_d`: K3's 2D RoPE
    (column on even slots, row on odd, frequencies 10000^(−4i/hd), i < hd/4)."""
    if side < 1 or head_dim % 4:
        raise ValueError(f"side must be >= 1 and head_dim a multiple of 4, got {side}, {head_dim}")
    r, c = np.meshgrid(np.arange(side, dtype=np.float64), np.arange(side, dtype=np.float64), indexing="ij")
    r0 = c0 = side // 2
    theta = 10000.0 ** (-2.0 * np.arange(head_dim // 2) / head_dim)
    delta = (r * side + c) - (r0 * side + c0)
    raster = np.cos(delta[..., None] * theta).mean(axis=-1)
    f = reference.rope_frequencies(head_dim, dtype=np.float64)
    two_d = 0.5 * (np.cos((c - c0)[..., None] * f).mean(axis=-1) + np.cos((r - r0)[..., None] * f).mean(axis=-1))
    return raster, two_d


def plot_raster_vs_2d(head_dim: int = 128, side: int = 32) -> Figure:
    """Why 2-D: q·k from the centre patch to every patch, 1-D raster-order RoPE beside K3's 2D RoPE."""
    raster, two_d = raster_vs_2d_scores(head_dim, side)
    fig = Figure(figsize=(10, 4.6), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    centre = side // 2
    image = None
    for ax, data, title in zip(
        axes,
        (raster, two_d),
        (f"1-D RoPE, raster order: the patch below is {side} positions away", "K3 2D RoPE: below = beside"),
        strict=True,
    ):
        image = ax.imshow(data, cmap="magma", vmin=-0.2, vmax=1.0, interpolation="nearest")
        ax.plot([centre], [centre], marker="+", color="cyan", markersize=10)
        ax.annotate(f"below: {data[centre + 1, centre]:.2f}\nright: {data[centre, centre + 1]:.2f}",
                    (0.02, 0.02), xycoords="axes fraction", color="white", fontsize=8)  # fmt: skip
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("patch column")
    axes[0].set_ylabel("patch row")
    fig.colorbar(image, ax=axes.tolist(), shrink=0.85, label="q·k after RoPE / |q|² (q = k, equal slot energy)")
    fig.suptitle(f"How close each patch looks to the centre (+), head_dim {head_dim}, a {side}×{side} grid", fontsize=9)
    return fig


def rope_wavelengths(head_dim: int) -> np.ndarray:
    """`[hd/4]` float64: the period `2π/f_i` of frequency i, in patches."""
    return 2 * np.pi / reference.rope_frequencies(head_dim, dtype=np.float64)


def k3_map_frequencies(head_dim: int = 128, panels: int = 6) -> list[int]:
    """`panels` frequency indices spread evenly in log-wavelength from the fastest to the slowest."""
    n = head_dim // 4
    return sorted({int(round(x)) for x in np.linspace(0, n - 1, panels)})


def plot_rope_k3_maps(head_dim: int = 128, grid: tuple[int, int] = (64, 64), panels: int = 6) -> Figure:
    """cos of the width slot (top) and the height slot (bottom) of `panels` frequencies, each drawn over at
    least one full period of its own: over the image when it turns several times inside it, else over one
    wavelength with the image outlined — so every panel shows structure, and the outline shows how much of a
    slow slot's period a real image sees (x: column, y: row, in patches)."""
    from matplotlib.patches import Rectangle

    gh, gw = grid
    if gh < 1 or gw < 1:
        raise ValueError(f"grid must be at least 1×1, got {gh}×{gw}")
    freqs = k3_map_frequencies(head_dim, panels)
    f = reference.rope_frequencies(head_dim, dtype=np.float64)
    lam = rope_wavelengths(head_dim)
    fig = Figure(figsize=(2.1 * len(freqs) + 1.3, 5.0), layout="constrained")
    axes = fig.subplots(2, len(freqs), squeeze=False)
    image = None
    for c, i in enumerate(freqs):
        extent = max(gh, gw, lam[i])
        pos = np.linspace(0, extent, 96)
        for r, axis in enumerate(("width", "height")):
            ax = axes[r, c]
            rows, cols = np.meshgrid(pos, pos, indexing="ij")
            data = np.cos((cols if axis == "width" else rows) * f[i])
            image = ax.imshow(data, cmap="RdBu", vmin=-1, vmax=1, origin="upper", extent=(0, extent, extent, 0))
            ax.add_patch(Rectangle((0, 0), gw, gh, fill=False, ls="--", lw=1.2, color="k"))
            ax.set_title(f"{axis} slot {2 * i + r}, i={i}\nλ = {lam[i]:,.0f} patches", fontsize=7)
            share = max(gh, gw) / extent
            if share < 0.1:
                ax.text(0.03, 0.97, f"image: {share * 100:.2g}%\nof a period", transform=ax.transAxes, fontsize=6,
                        va="top", bbox={"facecolor": "w", "alpha": 0.8, "lw": 0})  # fmt: skip
            ax.tick_params(labelsize=6)
            ax.set_xlabel("column", fontsize=7, labelpad=1)
            if c == 0:
                ax.set_ylabel("row", fontsize=7)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="cos(angle)")
    fig.suptitle(
        f"K3's 2D RoPE (head_dim {head_dim}, θ = 10000): width slots vary along columns, height slots along rows. "
        f"Dashed: the image ({gh}×{gw} patches)",
        fontsize=9,
    )
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
