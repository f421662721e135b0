"""Images: the patch (and merge) grid over a picture, PCA of patch features as colours."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure


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
    ax.legend(handles=_grid_legend(p, merge_kernel_size, content_size is not None), fontsize=8, loc="upper center",
              bbox_to_anchor=(0.5, -0.04), ncols=3, frameon=False)  # fmt: skip
    return fig


def _grid_legend(p: int, merge_kernel_size: Sequence[int] | None, padded: bool) -> list[Any]:
    """What the overlay's lines and hatching mean."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Line2D([], [], color="0.75", lw=1.2, label=f"patch edge, thin white ({p}×{p} pixels)")]
    if merge_kernel_size is not None:
        kh, kw = (int(k) for k in merge_kernel_size)
        handles.append(Line2D([], [], color="yellow", lw=1.5, label=f"merged token ({kh}×{kw} patches)"))
    if padded:
        handles.append(Patch(fill=False, hatch="//", edgecolor="red", label="padding (to a multiple of p·merge)"))
    return handles


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
    features: Any,
    grid_hw: tuple[int, int],
    image: Any,
    patch_size: int | None = None,
    alpha: float = 0.65,
    weights_note: str = "",
) -> Figure:
    """Three panels: the image, the PCA colours of its patch features (`pca_colors`), and the
    colours laid over the image (each patch's colour on its p × p pixels); `weights_note` says what made the
    features (e.g. random weights), under the title."""
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
    if weights_note:
        fig.suptitle(weights_note, fontsize=9)
    return fig
