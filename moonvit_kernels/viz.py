"""Pictures of the model's index maths and results, for the notebooks and the demo.

Each plot takes arrays (never file paths) and returns a `matplotlib.figure.Figure` built without
pyplot, so nothing is shown, no backend is chosen and no global figure list grows; save it with
`fig.savefig(path)` or let Jupyter display it. The data behind each plot comes from a function
beside it (`rope_angle_maps`, `rope_offset_scores`, `merge_index_table`, `attention_mask`,
`pca_colors`), which the tests check; the index maths itself comes from `reference`.

| plot                      | shows                                                               |
|---------------------------|---------------------------------------------------------------------|
| `rope_frequency_maps`     | per complex RoPE slot, cos(angle) over the h × w patch grid          |
| `rope_offset_invariance`  | q·k after RoPE vs token offset, for several start positions          |
| `error_heatmap`           | |got − ref| as a heat map                                            |
| `merge_index_map`         | which merged token and slot each source patch lands in               |
| `attention_mask_picture`  | the block-diagonal mask of packed media items                        |
| `patch_grid_overlay`      | an image with its patch (and merge) grid                             |
| `pca_overlay`             | the top-3 PCA components of patch features as colours over the image |
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from . import reference


# ============================================================================ RoPE
def rope_angle_maps(h: int, w: int, head_dim: int, quantity: str = "cos") -> np.ndarray:
    """`[hd/2, h, w]` float64: for each complex slot j, the angle (or its cos / sin) at each patch.

    Slot `2i` turns by `column·f_i` (width), slot `2i+1` by `row·f_i` (height) — `reference.rope_angles`.
    """
    if quantity not in ("angle", "cos", "sin"):
        raise ValueError(f"quantity must be 'angle', 'cos' or 'sin', got {quantity!r}")
    angles = reference.rope_angles(h, w, head_dim, dtype=np.float64)  # [h·w, hd/2]
    maps = angles.T.reshape(head_dim // 2, h, w)
    return {"angle": maps, "cos": np.cos(maps), "sin": np.sin(maps)}[quantity]


def rope_frequency_maps(h: int, w: int, head_dim: int, quantity: str = "cos", max_columns: int = 8) -> Figure:
    """One heat map per complex slot `j < hd/2` over the h × w grid: width slots (even j) vary
    along columns, height slots (odd j) along rows; low i turns fast, high i barely turns."""
    maps = rope_angle_maps(h, w, head_dim, quantity)
    n = maps.shape[0]
    cols = min(max_columns, n)
    rows = -(-n // cols)
    fig = Figure(figsize=(1.9 * cols, 1.9 * rows * h / max(w, 1) + 0.6), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    vmin, vmax = (-1.0, 1.0) if quantity != "angle" else (0.0, float(maps.max()) or 1.0)
    for j, ax in enumerate(axes):
        ax.set_xticks([])
        ax.set_yticks([])
        if j >= n:
            ax.set_visible(False)
            continue
        ax.imshow(maps[j], cmap="twilight" if quantity == "angle" else "RdBu", vmin=vmin, vmax=vmax)
        ax.set_title(f"slot {j}: {'w' if j % 2 == 0 else 'h'}, i={j // 2}", fontsize=7)
    fig.suptitle(f"2D RoPE {quantity}(angle) on a {h}×{w} patch grid, head_dim {head_dim}", fontsize=9)
    return fig


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


# ============================================================================ errors
def error_heatmap(got: Any, ref: Any, title: str = "", relative: bool = False) -> Figure:
    """Heat map of `|got − ref|` (or `/ max(|ref|, tiny)` with `relative`) as `[rows, rest]`:
    1-D arrays become one row, N-D arrays are flattened after their first axis. NaN shows as
    the colormap's 'bad' colour and is counted in the title."""
    g = np.asarray(got, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if g.shape != r.shape:
        raise ValueError(f"got shape {g.shape} != reference shape {r.shape}")
    err = error_matrix(g, r, relative)
    fig = Figure(figsize=(7, 3.6), layout="constrained")
    ax = fig.subplots()
    im = ax.imshow(err, aspect="auto", interpolation="nearest", cmap="magma")
    fig.colorbar(im, ax=ax, label="relative error" if relative else "|got − ref|")
    finite = np.isfinite(err)
    worst = float(err[finite].max()) if finite.any() else float("nan")
    bad = int((~finite).sum())
    ax.set_xlabel("flattened trailing axes" if g.ndim > 2 else "column")
    ax.set_ylabel("row")
    ax.set_title(f"{title + ': ' if title else ''}max {worst:.3e}" + (f", {bad} NaN/Inf" if bad else ""))
    return fig


def error_matrix(got: np.ndarray, ref: np.ndarray, relative: bool = False) -> np.ndarray:
    """The 2-D float64 array `error_heatmap` draws: `|got − ref|` (relative if asked), `[rows, rest]`."""
    err = np.abs(got - ref)
    if relative:
        err = err / np.maximum(np.abs(ref), np.finfo(np.float64).tiny)
    if err.ndim == 0:
        return err.reshape(1, 1)
    if err.ndim == 1:
        return err[None, :]
    return err.reshape(err.shape[0], -1)


# ============================================================================ merge and packing
def merge_index_table(h: int, w: int, merge_kernel_size: Sequence[int] = (2, 2)) -> tuple[np.ndarray, np.ndarray]:
    """`(merged [h, w], slot [h, w])` int64: the merged token and slot each source patch lands in.

    Read off `reference.tpool_patch_merger` applied to the patch numbers themselves.
    """
    kh, kw = (int(k) for k in merge_kernel_size)
    if h % kh or w % kw:
        raise ValueError(f"grid {h}×{w} is not divisible by merge_kernel_size ({kh}, {kw})")
    ids = np.arange(h * w, dtype=np.float64)[:, None]
    (gathered,) = reference.tpool_patch_merger(ids, np.array([[1, h, w]]), (kh, kw))  # [M, kh·kw, 1]
    source = gathered[..., 0].astype(np.int64)
    merged = np.empty(h * w, dtype=np.int64)
    slot = np.empty(h * w, dtype=np.int64)
    M, S = source.shape
    merged[source.ravel()] = np.repeat(np.arange(M), S)
    slot[source.ravel()] = np.tile(np.arange(S), M)
    return merged.reshape(h, w), slot.reshape(h, w)


def merge_index_map(h: int, w: int, merge_kernel_size: Sequence[int] = (2, 2)) -> Figure:
    """Two maps over the h × w patch grid: merged token index, and slot inside the merged token."""
    merged, slot = merge_index_table(h, w, merge_kernel_size)
    fig = Figure(figsize=(9, 4.2 * h / max(w, 1) + 0.8), layout="constrained")
    axes = fig.subplots(1, 2)
    panels = ((merged, "merged token m", "tab20"), (slot, "slot a·kw + b", "Set2"))
    for ax, (data, name, cmap) in zip(axes, panels, strict=True):
        ax.imshow(data, cmap=cmap, interpolation="nearest")
        ax.set_title(name)
        ax.set_xlabel("patch column")
        ax.set_ylabel("patch row")
        if h * w <= 400:
            for (r, c), v in np.ndenumerate(data):
                ax.text(c, r, str(v), ha="center", va="center", fontsize=7)
    fig.suptitle(f"patch merge {tuple(merge_kernel_size)} on a {h}×{w} grid", fontsize=9)
    return fig


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


# ============================================================================ images
def _display_image(image: Any) -> np.ndarray:
    img = np.asarray(image)
    if img.ndim == 4 and img.shape[0] == 1:
        img = img[0]
    if img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"image shape {img.shape} is not [H, W, 3]")
    if img.dtype != np.uint8 and not np.issubdtype(img.dtype, np.floating):
        raise ValueError(f"image dtype {img.dtype}: pass uint8 or float in [0, 1]")
    return img


def patch_grid_overlay(
    image: Any,
    patch_size: int,
    merge_kernel_size: Sequence[int] | None = None,
    content_size: tuple[int, int] | None = None,
) -> Figure:
    """The image (uint8 or float in [0, 1], `[H, W, 3]`) with thin lines every `patch_size` pixels,
    thick lines around merged tokens, and the padding beyond `content_size` (width, height) hatched."""
    img = _display_image(image)
    H, W = img.shape[:2]
    p = int(patch_size)
    fig = Figure(figsize=(6, 6 * H / W + 0.5), layout="constrained")
    ax = fig.subplots()
    ax.imshow(img, interpolation="nearest")
    ax.vlines(np.arange(0, W + 1, p) - 0.5, -0.5, H - 0.5, colors="white", linewidths=0.4, alpha=0.7)
    ax.hlines(np.arange(0, H + 1, p) - 0.5, -0.5, W - 0.5, colors="white", linewidths=0.4, alpha=0.7)
    if merge_kernel_size is not None:
        kh, kw = (int(k) for k in merge_kernel_size)
        ax.vlines(np.arange(0, W + 1, p * kw) - 0.5, -0.5, H - 0.5, colors="yellow", linewidths=0.9)
        ax.hlines(np.arange(0, H + 1, p * kh) - 0.5, -0.5, W - 0.5, colors="yellow", linewidths=0.9)
    if content_size is not None:
        cw, ch = content_size
        for x, y, ww, hh in ((cw - 0.5, -0.5, W - cw, H), (-0.5, ch - 0.5, cw, H - ch)):
            if ww > 0 and hh > 0:
                ax.add_patch(_hatch(x, y, ww, hh))
    ax.set_title(f"{W}×{H} pixels (W×H) = {H // p} rows × {W // p} columns of {p}×{p} patches", fontsize=9)
    ax.set_xlim(-0.5, W - 0.5)
    ax.set_ylim(H - 0.5, -0.5)
    return fig


def _hatch(x: float, y: float, width: float, height: float) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), width, height, fill=False, hatch="//", edgecolor="red", linewidth=0.8, label="padding")


def pca_colors(features: Any, grid_hw: tuple[int, int], n_components: int = 3) -> np.ndarray:
    """`[h, w, n_components]` in [0, 1]: the patch features `[h·w, D]` projected on their top
    principal components (centred, via SVD), each component min-max scaled. Signs are fixed so
    that the largest loading of each component is positive."""
    x = np.asarray(features, dtype=np.float64)
    h, w = (int(v) for v in grid_hw)
    if x.ndim != 2 or x.shape[0] != h * w:
        raise ValueError(f"features shape {x.shape} is not [h·w = {h * w}, D]")
    if x.shape[1] < n_components:
        raise ValueError(f"features have {x.shape[1]} channels, fewer than {n_components} components")
    x = x - x.mean(axis=0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    comps = vt[:n_components]
    comps = comps * np.sign(comps[np.arange(n_components), np.argmax(np.abs(comps), axis=1)])[:, None]
    proj = x @ comps.T
    lo, hi = proj.min(axis=0), proj.max(axis=0)
    proj = (proj - lo) / np.where(hi > lo, hi - lo, 1.0)
    return proj.reshape(h, w, n_components)


def pca_overlay(
    features: Any, grid_hw: tuple[int, int], image: Any, patch_size: int | None = None, alpha: float = 0.65
) -> Figure:
    """Three panels: the image, the PCA colours of its patch features (`pca_colors`), and the
    colours laid over the image (each patch's colour on its p × p pixels)."""
    img = _display_image(image)
    h, w = (int(v) for v in grid_hw)
    p = int(patch_size) if patch_size else img.shape[1] // w
    colors = pca_colors(features, (h, w))
    fig = Figure(figsize=(12, 4.2 * img.shape[0] / img.shape[1] + 0.6), layout="constrained")
    axes = fig.subplots(1, 3)
    extent = (-0.5, w * p - 0.5, h * p - 0.5, -0.5)
    axes[0].imshow(img)
    axes[0].set_title("input")
    axes[1].imshow(colors, interpolation="nearest")
    axes[1].set_title(f"PCA of patch features ({h}×{w})")
    axes[2].imshow(img)
    axes[2].imshow(colors, extent=extent, alpha=alpha, interpolation="nearest")
    axes[2].set_xlim(-0.5, img.shape[1] - 0.5)
    axes[2].set_ylim(img.shape[0] - 0.5, -0.5)
    axes[2].set_title("overlay")
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    return fig
