"""The tower as a whole: stage shapes and the architecture figure, parameter and FLOP tables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from ..config import VisionConfig
from ..weights import expected_shapes


def _grid(grid_thws: Any) -> np.ndarray:
    g = np.asarray(grid_thws, dtype=np.int64)
    if g.ndim == 1 and g.shape == (3,):
        g = g[None]
    if g.ndim != 2 or g.shape[1] != 3 or g.shape[0] == 0 or np.any(g < 1):
        raise ValueError(f"grid_thws must be [N, 3] rows (t, h, w) of positive integers, got {g.tolist()}")
    return g


def _token_counts(config: VisionConfig, grid_thws: Any) -> tuple[int, int]:
    """`(L, M)`: patch tokens and merged tokens of a packed grid."""
    g = _grid(grid_thws)
    kh, kw = config.merge_kernel_size
    L = int(np.sum(np.prod(g, axis=1)))
    M = int(np.sum((g[:, 1] // kh) * (g[:, 2] // kw)))
    return L, M


@dataclass(frozen=True)
class Stage:
    """One box of the architecture picture: a stage, the array it produces, and what it does."""

    name: str
    shape: tuple[int, ...]
    what: str
    in_layer: bool = False  # True for the steps inside one encoder block
    adds_residual: bool = False  # True where the block adds its skip branch (x + ...)


def stage_shapes(config: VisionConfig, grid_thws: Any) -> list[Stage]:
    """The stages of docs/model.md in order, with the shape each produces for a packed `grid_thws [N, 3]`.

    Names outside the encoder block match the keys of `reference.vision_forward(...,
    return_intermediates=True)` (`layer_{i}` appears once, as `layer_i`); steps inside a block
    have `in_layer=True`.
    """
    L, M = _token_counts(config, grid_thws)
    D, Q, I = config.vt_hidden_size, config.qkv_hidden_size, config.vt_intermediate_size
    H, hd, p = config.vt_num_attention_heads, config.head_dim, config.patch_size
    kh, kw = config.merge_kernel_size
    n = config.vt_num_hidden_layers
    return [
        Stage("pixel_values", (L, 3, p, p), "patches cut from the media, frame / row / column order"),
        Stage("patch_embed", (L, D), f"one GEMM: [L, 3·{p}·{p}] @ W[D, 3·{p}·{p}]ᵀ"),
        Stage("pos_emb", (L, D), "+ interpolated 2D grid (+ sin/cos time for videos)"),
        Stage("norm0", (L, D), "rmsnorm", True),
        Stage("qkv", (L, 3 * Q), "a @ wqkvᵀ; index s·Q + head·hd + d", True),
        Stage("rope2d(q, k)", (L, H, hd), "interleaved pairs: width on even, height on odd slots", True),
        Stage("attention", (L, Q), "per media item, non-causal, softmax in fp32", True),
        Stage("x + o @ woᵀ", (L, D), "wo is [D, Q]; adds the skip branch", True, True),
        Stage("norm1", (L, D), "rmsnorm", True),
        Stage("mlp", (L, I), "fc0 → GELU(tanh)", True),
        Stage("x + fc1(·)", (L, D), "adds the skip branch", True, True),
        Stage("layer_i", (L, D), f"× {n} encoder blocks"),
        Stage("final_norm", (L, D), "rmsnorm"),
        Stage("merged", (M, kh * kw * D), f"{kh}×{kw} neighbours side by side, mean over frames"),
        Stage("projected", (M, config.text_hidden_size), "Linear → GELU(erf) → Linear → rmsnorm"),
    ]


def plot_architecture(config: VisionConfig, grid_thws: Any, title: str | None = None) -> Figure:
    """The tower as a column of boxes, one per `stage_shapes` entry, with shapes.

    The encoder block is framed and drawn once, marked "× N" with an arrow from its output back
    to its input; its two skip branches are drawn as arrows from the block input (and from the
    attention sum) around the norms into the two `⊕` residual adds.
    """
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    stages = stage_shapes(config, grid_thws)
    n = len(stages)
    fig = Figure(figsize=(9.5, 0.62 * n + 0.9), layout="constrained")
    ax = fig.subplots()
    ax.set_xlim(0, 10.6)
    ax.set_ylim(-0.6, n + 0.2)
    ax.axis("off")

    def y_of(i: int) -> float:
        return n - 1 - i

    arrow = {"arrowstyle": "->", "color": "0.5"}
    for i, s in enumerate(stages):
        y = y_of(i)
        x0 = 1.4 if s.in_layer else 0.3
        colour = "#dbe9f6" if s.in_layer else ("#fde2c8" if i in (0, n - 1) else "#e4f2df")
        ax.add_patch(FancyBboxPatch((x0, y - 0.32), 3.4, 0.64, boxstyle="round,pad=0.02", fc=colour, ec="0.35"))
        ax.text(x0 + 0.15, y, s.name, va="center", fontsize=10, family="monospace", weight="bold")
        ax.text(x0 + 3.6, y + 0.1, "[" + ", ".join(str(d) for d in s.shape) + "]", va="center", fontsize=10)
        ax.text(x0 + 3.6, y - 0.2, s.what, va="center", fontsize=8, color="0.3")
        if i + 1 < n:
            ax.annotate("", (2.6, y - 0.62), (2.6, y - 0.34), arrowprops=arrow)
    block = [i for i, s in enumerate(stages) if s.in_layer]
    if block:
        top, bottom = y_of(block[0]) + 0.5, y_of(block[-1]) - 0.5
        ax.add_patch(FancyBboxPatch((0.75, bottom), 9.7, top - bottom, boxstyle="round,pad=0.02", fc="none", ec="C0"))
        layers = config.vt_num_hidden_layers
        ax.text(10.35, top - 0.25, f"encoder block × {layers}", ha="right", color="C0", weight="bold")
        ax.text(10.35, top - 0.55, "(one block drawn; its output feeds the next)", ha="right", color="C0", fontsize=8)
        ax.add_patch(
            FancyArrowPatch(
                (10.1, bottom + 0.15),
                (10.1, top - 0.75),
                connectionstyle="arc3,rad=-0.25",
                color="C0",
                arrowstyle="->",
                mutation_scale=12,
            )
        )
        # Skip branches: from the junction above each norm to the residual add below it.
        start = y_of(block[0]) + 0.47
        for i, s in enumerate(stages):
            if not (s.in_layer and s.adds_residual):
                continue
            y = y_of(i)
            ax.plot([2.6, 1.05, 1.05], [start, start, y], color="C3", lw=1.3)
            ax.annotate("", (1.4, y), (1.05, y), arrowprops={"arrowstyle": "->", "color": "C3", "lw": 1.3})
            ax.text(1.2, y + 0.02, "⊕", ha="center", va="center", fontsize=13, color="C3")
            start = y - 0.47  # the next branch starts from this sum
        ax.text(0.93, (top + bottom) / 2, "skip branches", color="C3", fontsize=8, rotation=90, ha="right", va="center")
    L, M = _token_counts(config, grid_thws)
    ax.set_title(title or f"MoonViT-V2 on grid_thws {_grid(grid_thws).tolist()}: L = {L} tokens, M = {M} merged")
    return fig


@dataclass(frozen=True)
class CountRow:
    """One row of a parameter or FLOP table."""

    component: str
    count: int
    detail: str


def parameter_table(config: VisionConfig) -> list[CountRow]:
    """Parameters per component, summed from `weights.expected_shapes` (the checkpoint's tensors).

    Rows: patch_embed.proj, patch_embed.pos_emb, encoder blocks (all N), final_layernorm,
    mm_projector; their counts add up to `weights.parameter_count(config)["total"]`.
    """
    groups = {
        "patch_embed.proj": "vision_tower.patch_embed.proj.",
        "patch_embed.pos_emb": "vision_tower.patch_embed.pos_emb.",
        "encoder blocks": "vision_tower.encoder.blocks.",
        "final_layernorm": "vision_tower.encoder.final_layernorm.",
        "mm_projector": "mm_projector.",
    }
    shapes = expected_shapes(config)
    rows = []
    for component, prefix in groups.items():
        names = [k for k in shapes if k.startswith(prefix)]
        count = sum(int(np.prod(shapes[k])) for k in names)
        if component == "encoder blocks":
            n = config.vt_num_hidden_layers
            detail = f"{n} × {count // max(n, 1):,} (norm0, wqkv, wo, norm1, fc0, fc1)"
        else:
            detail = ", ".join(f"{k.split('.')[-2]} {list(shapes[k])}" for k in names)
        rows.append(CountRow(component, count, detail))
    return rows


def flop_table(config: VisionConfig, grid_thws: Any) -> list[CountRow]:
    """Multiply-add FLOPs (2 per MAC) per stage for a packed grid, from the cost formulas of docs/model.md.

    patch embed `2·L·3p²·D`; encoder GEMMs `N·2·L·D·(3Q + Q + 2I)`; attention `N·4·Σ nᵢ²·Q`
    (nᵢ tokens of item i: items never see each other); projector `2·M·K² + 2·M·K·T` with K = kh·kw·D.
    Norms, RoPE, softmax and the merge are O(L·D) and left out.
    """
    g = _grid(grid_thws)
    L, M = _token_counts(config, g)
    D, Q, I = config.vt_hidden_size, config.qkv_hidden_size, config.vt_intermediate_size
    n, K, T = config.vt_num_hidden_layers, config.merged_hidden_size, config.text_hidden_size
    seq_sq = int(np.sum(np.prod(g, axis=1) ** 2))
    return [
        CountRow("patch_embed", 2 * L * config.patch_dim * D, "2·L·3p²·D"),
        CountRow("encoder GEMMs", n * 2 * L * D * (4 * Q + 2 * I), "N·2·L·D·(3Q + Q + 2I)"),
        CountRow("attention", n * 4 * seq_sq * Q, "N·4·Σ nᵢ²·Q"),
        CountRow("projector", 2 * M * K * K + 2 * M * K * T, "2·M·K² + 2·M·K·T"),
    ]
