"""Tables and pictures the workbook (`notebooks/`) draws for each stage, beside those of `viz`.

Every picture is split in two: a function that computes what is drawn (plain data, tested in
`tests/test_viz_stages.py`) and a `plot_*` function that draws it and returns a
`matplotlib.figure.Figure` built without pyplot (as in `viz`: no backend is chosen, nothing is
shown twice; Jupyter displays a figure that ends a cell). Learners can call the data functions to
check a picture's numbers.

- `stage_shapes` / `plot_architecture`      the tower as boxes, each with the shape it produces
- `parameter_table`                          parameters per component, from `weights.expected_shapes`
- `flop_table`                               FLOPs per stage (SPEC.md's cost formulas)
- `rmsnorm_output_rms` / `plot_eps_effect`   how eps shrinks the output of low-variance rows
- `position_grids` / `plot_position_grids`  the learned position grid resized to several patch grids
- `rope_pairs` / `plot_rope_pairing`         which head dims rotate together, and along which axis
- `attention_memory_table`                   bytes of L×L scores vs one tile of the online softmax
- `online_softmax_trace` / `plot_online_softmax` the running max, sum and output of a tiled softmax
- `merged_to_grid`                           merged tokens laid back on the patch grid (for pictures)
- `stage_report_series` / `plot_stage_report` a backend comparison (`compare.StageReport`) per stage
- `median_seconds` / `plot_timings`           measure a call (median of repeats), labelled bars of times
- `markdown_table`                            rows as a Markdown table (rendered by Jupyter and GitHub)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from .config import VisionConfig
from .weights import expected_shapes


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


# ============================================================================ architecture
@dataclass(frozen=True)
class Stage:
    """One box of the architecture picture: a stage, the array it produces, and what it does."""

    name: str
    shape: tuple[int, ...]
    what: str
    in_layer: bool = False  # True for the steps inside one encoder block


def stage_shapes(config: VisionConfig, grid_thws: Any) -> list[Stage]:
    """The stages of SPEC.md in order, with the shape each produces for a packed `grid_thws [N, 3]`.

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
        Stage("x + o @ woᵀ", (L, D), "wo is [D, Q]", True),
        Stage("mlp", (L, I), "rmsnorm → fc0 → GELU(tanh)", True),
        Stage("x + fc1(·)", (L, D), "residual", True),
        Stage("layer_i", (L, D), f"× {n} encoder blocks"),
        Stage("final_norm", (L, D), "rmsnorm"),
        Stage("merged", (M, kh * kw * D), f"{kh}×{kw} neighbours side by side, mean over frames"),
        Stage("projected", (M, config.text_hidden_size), "Linear → GELU(erf) → Linear → rmsnorm"),
    ]


def plot_architecture(config: VisionConfig, grid_thws: Any, title: str | None = None) -> Figure:
    """The tower as a column of boxes (one per `stage_shapes` entry, the encoder block framed)."""
    from matplotlib.patches import FancyBboxPatch

    stages = stage_shapes(config, grid_thws)
    fig = Figure(figsize=(9, 0.62 * len(stages) + 0.8), layout="constrained")
    ax = fig.subplots()
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.6, len(stages) + 0.2)
    ax.axis("off")
    block_rows = [i for i, s in enumerate(stages) if s.in_layer]
    for i, s in enumerate(stages):
        y = len(stages) - 1 - i
        x0 = 0.9 if s.in_layer else 0.3
        colour = "#dbe9f6" if s.in_layer else ("#fde2c8" if i in (0, len(stages) - 1) else "#e4f2df")
        ax.add_patch(FancyBboxPatch((x0, y - 0.32), 3.6, 0.64, boxstyle="round,pad=0.02", fc=colour, ec="0.35"))
        ax.text(x0 + 0.15, y, s.name, va="center", fontsize=10, family="monospace", weight="bold")
        ax.text(x0 + 3.95, y + 0.1, "[" + ", ".join(str(d) for d in s.shape) + "]", va="center", fontsize=10)
        ax.text(x0 + 3.95, y - 0.2, s.what, va="center", fontsize=8, color="0.3")
        if i + 1 < len(stages):
            ax.annotate("", (2.4, y - 0.62), (2.4, y - 0.34), arrowprops={"arrowstyle": "->", "color": "0.5"})
    if block_rows:
        top = len(stages) - 1 - block_rows[0] + 0.45
        bottom = len(stages) - 1 - block_rows[-1] - 0.45
        ax.add_patch(FancyBboxPatch((0.7, bottom), 9.2, top - bottom, boxstyle="round,pad=0.02", fc="none", ec="C0"))
        ax.text(9.8, top - 0.25, f"encoder block × {config.vt_num_hidden_layers}", ha="right", color="C0")
    L, M = _token_counts(config, grid_thws)
    ax.set_title(title or f"MoonViT-V2 on grid_thws {_grid(grid_thws).tolist()}: L = {L} tokens, M = {M} merged")
    return fig


# ============================================================================ parameters and FLOPs
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
    """Multiply-add FLOPs (2 per MAC) per stage for a packed grid, from SPEC.md's cost formulas.

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


# ============================================================================ RMSNorm's eps
def rmsnorm_output_rms(row_rms: Any, eps: float) -> np.ndarray:
    """RMS of `rmsnorm(x, 1, eps)` for rows whose own RMS is `row_rms`: `r / sqrt(r² + eps)` (float64).

    1 means the row came out unit-RMS as intended; below 1, eps has swallowed part of the signal.
    """
    r = np.asarray(row_rms, dtype=np.float64)
    if np.any(r < 0) or not np.all(np.isfinite(r)):
        raise ValueError("row_rms must be finite and >= 0")
    return r / np.sqrt(r * r + float(eps))


def plot_eps_effect(eps_values: Mapping[str, float], row_rms: Any | None = None, measured: Any = None) -> Figure:
    """Output RMS vs input-row RMS (log x) for each named eps; `measured` optionally adds
    `{label: (row_rms, output_rms)}` points computed by a real kernel or the reference."""
    r = np.logspace(-5, 1, 300) if row_rms is None else np.asarray(row_rms, dtype=np.float64)
    fig = Figure(figsize=(7, 3.8), layout="constrained")
    ax = fig.subplots()
    for i, (label, eps) in enumerate(eps_values.items()):
        ax.semilogx(r, rmsnorm_output_rms(r, eps), color=f"C{i}", label=f"{label} (eps = {eps:.3g})")
        ax.axvline(np.sqrt(eps), color=f"C{i}", ls=":", lw=1)
    for j, (label, (xr, yr)) in enumerate((measured or {}).items()):
        ax.semilogx(xr, yr, "o", ms=4, color=f"C{j + len(eps_values)}", label=label)
    ax.set_xlabel("RMS of the input row")
    ax.set_ylabel("RMS of rmsnorm(row), weight = 1")
    ax.set_ylim(0, 1.08)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("eps matters once a row's RMS nears √eps (dotted lines)")
    return fig


# ============================================================================ position grid
def position_grids(
    pos_weight: Any, sizes: Sequence[tuple[int, int]], mode: str = "bilinear", channel: int = 0
) -> list[np.ndarray]:
    """One channel of the learned grid `pos_weight [H0, W0, D]` resized to each `(h, w)` in `sizes`
    (`reference.interpolate_pos_grid`, float64): the term each patch of such an item gets."""
    grid = np.asarray(pos_weight, dtype=np.float64)
    if grid.ndim != 3 or not 0 <= channel < grid.shape[2]:
        raise ValueError(f"pos_weight shape {grid.shape} is not [H0, W0, D] with channel {channel} < D")
    from .reference import interpolate_pos_grid

    return [interpolate_pos_grid(grid, int(h), int(w), mode)[:, :, channel] for h, w in sizes]


def plot_position_grids(
    pos_weight: Any, sizes: Sequence[tuple[int, int]], mode: str = "bilinear", channel: int = 0
) -> Figure:
    """The learned grid (first panel) and its resized versions, one channel, on one colour scale."""
    H0, W0 = np.shape(pos_weight)[:2]
    panels = position_grids(pos_weight, [(H0, W0), *sizes], mode, channel)
    lo = min(float(p.min()) for p in panels)
    hi = max(float(p.max()) for p in panels)
    fig = Figure(figsize=(2.6 * len(panels) + 0.8, 2.8), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(panels)))
    for k, (ax, panel) in enumerate(zip(axes, panels, strict=True)):
        im = ax.imshow(panel, vmin=lo, vmax=hi, cmap="viridis", interpolation="nearest")
        ax.set_title(("learned " if k == 0 else f"{mode} → ") + f"{panel.shape[0]}×{panel.shape[1]}", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(im, ax=list(axes), shrink=0.8, label=f"channel {channel}")
    return fig


# ============================================================================ RoPE pairing
@dataclass(frozen=True)
class RopePair:
    """Two head dims rotated together as one complex number."""

    dims: tuple[int, int]
    axis: str  # "width" (column) or "height" (row)
    freq_index: int  # i in f_i = theta^(-4i/hd)


def rope_pairs(head_dim: int, convention: str = "interleaved") -> list[RopePair]:
    """Which dims of a head rotate together, and by which axis' angle.

    "interleaved" (K3, SPEC stage 4): complex slot j holds dims `(2j, 2j+1)`; even slots j = 2i
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


# ============================================================================ attention memory
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


# ============================================================================ patch merge
def merged_to_grid(merged: Any, h: int, w: int, merge_kernel_size: Sequence[int] = (2, 2)) -> np.ndarray:
    """Lay the merged tokens of one item back on its patch grid: `[M, kh·kw·D]` -> `[h, w, D]`.

    The inverse of the gather in `reference.tpool_patch_merger` (merged token `m = i·(w/kw) + j`,
    slot `a·kw + b` holds patch `(kh·i + a, kw·j + b)`); for a video it returns the frame mean.
    """
    kh, kw = (int(k) for k in merge_kernel_size)
    a = np.asarray(merged)
    if h % kh or w % kw:
        raise ValueError(f"grid {h}×{w} is not divisible by merge_kernel_size ({kh}, {kw})")
    M = (h // kh) * (w // kw)
    if a.ndim != 2 or a.shape[0] != M or a.shape[1] % (kh * kw):
        raise ValueError(f"merged shape {a.shape} is not [M = {M}, kh·kw·D] for a {h}×{w} grid")
    D = a.shape[1] // (kh * kw)
    return a.reshape(h // kh, w // kw, kh, kw, D).transpose(0, 2, 1, 3, 4).reshape(h, w, D)


# ============================================================================ backend comparison
def stage_report_series(report: Any) -> dict[str, np.ndarray]:
    """Arrays for a `compare.StageReport`: `stage` names, `max_rel` errors, `tolerance`, `ok`."""
    rows = list(report.rows)
    return {
        "stage": np.array([r.stage for r in rows]),
        "max_rel": np.array([r.max_rel for r in rows], dtype=np.float64),
        "tolerance": np.array([r.tolerance for r in rows], dtype=np.float64),
        "ok": np.array([r.ok for r in rows], dtype=bool),
    }


def plot_stage_report(report: Any, title: str | None = None) -> Figure:
    """Relative error per stage (log scale) against its tolerance; stages beyond it in red."""
    s = stage_report_series(report)
    x = np.arange(len(s["stage"]))
    floor = 1e-18  # an exact stage (error 0) still gets a visible bar on a log axis
    fig = Figure(figsize=(max(6, 0.6 * len(x) + 2), 3.8), layout="constrained")
    ax = fig.subplots()
    ax.bar(x, np.maximum(s["max_rel"], floor), color=np.where(s["ok"], "C2", "C3"), label="max|a−b| / max|b|")
    ax.step(np.append(x, x[-1] + 1) - 0.5, np.append(s["tolerance"], s["tolerance"][-1]), where="post", color="k")
    ax.plot([], [], color="k", label="tolerance")
    ax.set_yscale("log")
    ax.set_xticks(x, s["stage"], rotation=45, ha="right")
    ax.set_ylabel("relative error")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(title or f"{getattr(report, 'candidate', 'candidate')} vs {getattr(report, 'reference', 'reference')}")
    return fig


# ============================================================================ timings
def median_seconds(
    fn: Callable[[], Any], repeat: int = 5, warmup: int = 1, synchronize: Callable[[], Any] | None = None
) -> dict[str, float]:
    """Wall-clock seconds of `fn()`: `warmup` untimed calls (compilation, caches), then `repeat`
    timed ones, each followed by `synchronize()` (e.g. `numba.cuda.synchronize`) so that
    asynchronous GPU work is inside the measurement. Returns `median`, `min`, `max`."""
    if repeat < 1 or warmup < 0:
        raise ValueError(f"repeat must be >= 1 and warmup >= 0, got {repeat}, {warmup}")
    sync = synchronize or (lambda: None)
    for _ in range(warmup):
        fn()
        sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return {"median": float(np.median(times)), "min": min(times), "max": max(times)}


def plot_timings(seconds: Mapping[str, float], where: str, unit: str = "ms", title: str = "") -> Figure:
    """Horizontal bars of measured times (`{label: seconds}`), labelled with where they ran."""
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    labels = list(seconds)
    values = np.array([seconds[k] for k in labels], dtype=np.float64) * scale
    fig = Figure(figsize=(7, 0.45 * len(labels) + 1.4), layout="constrained")
    ax = fig.subplots()
    ax.barh(labels, values, color="C0")
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.3g} {unit}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.set_xlim(0, values.max() * 1.25 if len(values) and values.max() > 0 else 1)
    ax.set_title(f"{title} — measured on {where}" if title else f"measured on {where}")
    return fig


# ============================================================================ tables
def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table: `header` names the columns, each row holds one value per column
    (ints get thousands separators, floats 4 significant digits, everything else `str`)."""

    def cell(v: Any) -> str:
        if isinstance(v, (bool, np.bool_)):
            return str(bool(v))
        if isinstance(v, (int, np.integer)):
            return f"{int(v):,}"
        if isinstance(v, (float, np.floating)):
            return f"{float(v):.4g}"
        return str(v).replace("|", "\\|")

    width = len(header)
    lines = ["| " + " | ".join(str(h) for h in header) + " |", "|" + "---|" * width]
    for i, row in enumerate(rows):
        if len(row) != width:
            raise ValueError(f"row {i} has {len(row)} values for {width} columns")
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines)
