"""The FLOP / byte model of one kernel launch, at K3 sizes unless other `Sizes` are given.

K3 shapes come from `VisionConfig.k3()` (docs/model.md): D = 1024, Q = 1536 (12 heads of hd 128), MLP 4096,
patch K = 3·14·14 = 588, 2x2 merge -> 4096-wide projector input, text width T = 7168. One launch is modelled
on one 896x896 image: L = 4096 tokens (the 64 x 64 patches of the position-embedding grid), M' = L/4 = 1024
merged tokens. `Sizes.of(config, tokens)` gives another config's widths at another token count (gpu_check
times 1024 tokens too); the registry's models are K3's (`K3`).

FLOPs: 2 x the multiply-adds of the GEMMs and attention's QKᵀ and PV (`fma_exact`: the X-ray scales the
SASS of their FMA loops by them); a nominal count for the memory-bound kernels.

Bytes, per launch:
  dram     compulsory DRAM traffic: every input read once, every output written once (the floor
           no tiling can beat; the roofline's lower-bound time uses it);
  request  what the kernel's global loads ask for as written (each version's tiling: v1 GEMM reads
           A and B K times per output, shared tiles divide that by the tile edge, ...), counting each
           requested byte once, i.e. L1/L2 -> SM traffic with perfect coalescing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .config import VisionConfig


@dataclass(frozen=True)
class Sizes:
    """The sizes one launch is modelled at: `tokens` of one frame and a config's widths."""

    tokens: int  # L
    hidden: int  # D
    qkv: int  # Q = heads · head_dim
    heads: int
    head_dim: int
    mlp: int
    patch_k: int  # 3·p·p
    merged: int  # merged tokens: L / (kh·kw)
    merged_w: int  # their width: kh·kw·D
    text: int
    grid_h: int  # the position-embedding table: grid_h x grid_w rows of D
    grid_w: int

    @classmethod
    def of(cls, c: VisionConfig, tokens: int) -> Sizes:
        """`tokens` of one frame with the widths of config `c`."""
        kh, kw = c.merge_kernel_size
        return cls(tokens=tokens, hidden=c.vt_hidden_size, qkv=c.qkv_hidden_size, heads=c.vt_num_attention_heads,
                   head_dim=c.head_dim, mlp=c.vt_intermediate_size, patch_k=c.patch_dim, merged=tokens // (kh * kw),
                   merged_w=c.merged_hidden_size, text=c.text_hidden_size, grid_h=c.init_pos_emb_height,
                   grid_w=c.init_pos_emb_width)  # fmt: skip


_K3 = VisionConfig.k3()
K3 = Sizes.of(_K3, _K3.init_pos_emb_height * _K3.init_pos_emb_width)  # one 896x896 image: its 64 x 64 patches
GRID_H, GRID_W = K3.grid_h, K3.grid_w
L = K3.tokens  # 4096
D = K3.hidden
Q = K3.qkv
HEADS = K3.heads
HD = K3.head_dim
MLP = K3.mlp
PATCH_K = K3.patch_k
MERGED = K3.merged
MERGED_W = K3.merged_w
TEXT = K3.text

# GEMM shape per epilogue: the layer of the tower that uses it (M, N, K, what)
GEMM_SHAPES = {
    "none": (L, 3 * Q, D, "wqkv: M=L, N=3Q, K=D"),
    "gelu_tanh": (L, MLP, D, "fc0: M=L, N=MLP, K=D"),
    "residual": (L, D, MLP, "fc1: M=L, N=D, K=MLP"),
    "gelu_erf": (MERGED, MERGED_W, MERGED_W, "proj.0: M=L/4, N=K=4D"),
}

PEAKS = ("fp32", "mma_sync", "wgmma")


@dataclass(frozen=True)
class Model:
    """One launch's model (K3 sizes unless other `Sizes` were given); `flops` etc. stay None where K3 never
    launches the instantiation."""

    k3: bool = True  # False for instantiations that K3 does not launch (e.g. hd 24 of the tiny config)
    flops: float | None = None
    dram_bytes: float | None = None
    request_bytes: float | None = None
    formula: str = ""
    peak: str = "fp32"  # the compute roof: "fp32" (FFMA), "mma_sync" (bf16 HMMA) or "wgmma" (bf16 HGMMA)
    fma_shares: tuple[float, ...] = ()  # FLOPs share of each phase's loop (xray.launch_counts.fma_loops)
    fma_exact: bool = False  # FLOPs = 2 x the kernel's multiply-adds (GEMM, attention): the SASS can be scaled by them

    def __post_init__(self) -> None:
        if self.peak not in PEAKS:
            raise ValueError(f"peak {self.peak!r} is not one of {PEAKS}")

    def but(self, **changes) -> Model:
        """This model with `changes` (dataclasses.replace)."""
        return dataclasses.replace(self, **changes)


def gemm(epilogue: str, in_b: int, out_b: int, tile_m: int | None, tile_n: int | None, peak: str = "fp32") -> Model:
    """`gemm_mnk` at the K3 layer that uses `epilogue`."""
    if epilogue not in GEMM_SHAPES:
        raise ValueError(f"GEMM epilogue {epilogue!r} has no K3 layer: expected one of {sorted(GEMM_SHAPES)}")
    M, N, K, what = GEMM_SHAPES[epilogue]
    return gemm_mnk(M, N, K, epilogue, in_b, out_b, tile_m, tile_n, peak, what)


def gemm_mnk(
    M: int,
    N: int,
    K: int,
    epilogue: str,
    in_b: int,
    out_b: int,
    tile_m: int | None = None,
    tile_n: int | None = None,
    peak: str = "fp32",
    what: str = "",
) -> Model:
    """C[M, N] = A[M, K]·B[N, K]ᵀ (+ epilogue; "residual" also reads C), elements of `in_b` / `out_b` bytes;
    `tile_m` x `tile_n` outputs share their loads (None: one output per thread, no reuse)."""
    res = out_b * M * N if epilogue == "residual" else 0
    if tile_m is None:  # one output per thread, no reuse: A row and B row per output
        request = 2.0 * M * N * K * in_b + out_b * M * N + res
    else:
        request = in_b * M * N * K * (1 / tile_n + 1 / tile_m) + out_b * M * N + res
    reuse = "2·M·N·K" if tile_m is None else f"M·N·K·(1/{tile_n} + 1/{tile_m})"
    formula = (
        f"{what or f'M={M}, N={N}, K={K}'}; FLOPs = 2·M·N·K; dram = {in_b}·(M·K + N·K) + {out_b}·M·N"
        f"{' (+R)' if res else ''}; request = {in_b}·{reuse} + stores"
    )
    dram = in_b * (M * K + N * K) + out_b * M * N + res
    return Model(True, 2.0 * M * N * K, dram, request, formula, peak, fma_exact=True)


def attention(
    elem: int, block_q: int | None, peak: str = "fp32", fma_shares: tuple[float, ...] = (), at: Sizes = K3
) -> Model:
    """Attention over one item of L tokens, H heads of hd, elements of `elem` bytes; K and V are read once
    per `block_q`-row query tile (None: once per query row)."""
    L, Q, H, hd = at.tokens, at.qkv, at.heads, at.head_dim
    kv_reads = L if block_q is None else L / block_q  # times K and V of the item are read
    request = elem * (kv_reads * 2 * L * hd * H + L * Q + L * Q) + 4 * L * H
    formula = (
        f"one item of L={L}, H={H}, hd={hd}; FLOPs = 4·L²·hd·H (QKᵀ and PV); dram = {elem}·(3·L·Q + L·Q) + 4·L·H; "
        f"request: K,V read {'once per query row' if block_q is None else f'once per {block_q}-row query tile'}"
    )
    dram = elem * (3 * L * Q + L * Q) + 4 * L * H
    return Model(True, 4.0 * L * L * hd * H, dram, request, formula, peak, fma_shares, fma_exact=True)


def attention_at(head_dim: int, elem: int, block_q: int | None, peak: str = "fp32", fma_shares=()) -> Model:
    """`attention` when `head_dim` is K3's; otherwise only the peak and phases (K3 never launches it)."""
    if head_dim == HD:
        return attention(elem, block_q, peak, fma_shares)
    return Model(k3=False, peak=peak, fma_shares=fma_shares)


def rmsnorm(in_b: int, out_b: int, at: Sizes = K3) -> Model:
    """RMSNorm of L rows of D (fp32 weight, fp32 rstd per row)."""
    L, D = at.tokens, at.hidden
    dram = in_b * L * D + out_b * L * D + 4 * D + 4 * L
    request = 2 * in_b * L * D + out_b * L * D + 4 * L * D + 4 * L  # x twice, weight per row
    formula = f"rows=L={L}, D={D}; FLOPs = 4·L·D; dram = {in_b}·L·D + {out_b}·L·D + 4·(D + L)"
    return Model(True, 4.0 * L * D, dram, request, formula)


def rope(elem: int, at: Sizes = K3) -> Model:
    """2D RoPE in place on q and k of L tokens."""
    L, Q = at.tokens, at.qkv
    dram = 2.0 * elem * 2 * L * Q
    formula = f"L={L}, q and k of Q={Q}; FLOPs = 3·2·L·Q (+ sin/cos); dram = 2·{elem}·2·L·Q (read + write)"
    return Model(True, 3.0 * 2 * L * Q, dram, dram, formula)


def merge(in_b: int, out_b: int, at: Sizes = K3) -> Model:
    """The 2x2 merge gather of one frame: x [L, D] -> [L/4, 4D]."""
    L, D = at.tokens, at.hidden
    dram = in_b * L * D + out_b * at.merged * at.merged_w
    formula = f"x [L={L}, D] -> [L/4, 4D], one frame; FLOPs = 2·L·D; dram = {in_b}·L·D + {out_b}·L·D"
    return Model(True, 2.0 * L * D, dram, dram, formula)


def pos_emb(mode: str, at: Sizes = K3) -> Model:
    """The interpolated position embedding (`mode` bilinear or bicubic) added to L tokens of D, fp32."""
    L, D, gh, gw = at.tokens, at.hidden, at.grid_h, at.grid_w
    taps = 4 if mode == "bicubic" else 2
    formula = (
        f"L={L}, D={D}, {gh}x{gw} grid, {taps}x{taps} taps; FLOPs = (2·{taps}² + 2·{taps})·L·D; "
        f"dram = 4·(2·L·D + {gh}·{gw}·D); request = 4·(2·L·D + {taps}²·L·D)"
    )
    return Model(
        True,
        float(2 * taps * taps + 2 * taps) * L * D,
        4.0 * (2 * L * D + gh * gw * D),
        4.0 * (2 * L * D + taps * taps * L * D),
        formula,
    )


def input_check(at: Sizes = K3) -> Model:
    """The device scan of pixel_values [L, 3·p·p] for a non-finite value."""
    dram = 4.0 * at.tokens * at.patch_k
    return Model(
        True, 0.0, dram, dram, "device pixel_values [L, 3·p·p] float32 read once; one int32 atomic on a bad value"
    )
