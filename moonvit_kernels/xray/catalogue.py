"""What the X-ray knows about each kernel beyond its binary: family, version, launch shape at K3
sizes, and the FLOP / byte model of one launch.

K3 shapes (docs/model.md): D = 1024, Q = 1536 (12 heads of hd 128), MLP 4096, patch K = 3·14·14 = 588,
2x2 merge -> 4096-wide projector input, text width T = 7168. One launch is modelled on one
896x896 image: L = 4096 tokens (64 x 64 patches), M' = L/4 = 1024 merged tokens.

FLOPs: 2 x the multiply-adds of the GEMMs and attention's QKᵀ and PV (`fma_exact`: the X-ray scales the
SASS of their FMA loops by them, `launch_counts`); a nominal count for the memory-bound kernels.

Bytes, per launch:
  dram     compulsory DRAM traffic: every input read once, every output written once (the floor
           no tiling can beat; the roofline's lower-bound time uses it);
  request  what the kernel's global loads ask for as written (each version's tiling: v1 GEMM reads
           A and B K times per output, shared tiles divide that by the tile edge, ...), counting each
           requested byte once, i.e. L1/L2 -> SM traffic with perfect coalescing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

L = 4096  # tokens of one 896x896 image
D = 1024
Q = 1536
HEADS = 12
HD = 128
MLP = 4096
PATCH_K = 3 * 14 * 14
MERGED = L // 4
MERGED_W = 4 * D
TEXT = 7168

# GEMM shape per epilogue: the layer of the tower that uses it (M, N, K, what)
GEMM_SHAPES = {
    "none": (L, 3 * Q, D, "wqkv: M=L, N=3Q, K=D"),
    "gelu_tanh": (L, MLP, D, "fc0: M=L, N=MLP, K=D"),
    "residual": (L, D, MLP, "fc1: M=L, N=D, K=MLP"),
    "gelu_erf": (MERGED, MERGED_W, MERGED_W, "proj.0: M=L/4, N=K=4D"),
}


@dataclass
class KernelInfo:
    """Catalogue entry of one kernel instantiation."""

    backend: str
    label: str
    family: str  # gemm, attention, rmsnorm, rope, merge, pos_emb, input_check
    version: str  # "v1", "v3", "bf16 tc", ...
    specialisation: str
    threads: int  # launch block size at K3
    dynamic_shared: int = 0
    k3: bool = True  # False for instantiations that K3 does not launch (e.g. hd 24 of the tiny config)
    flops: float | None = None
    dram_bytes: float | None = None
    request_bytes: float | None = None
    formula: str = ""
    peak: str = "fp32"  # the compute roof: "fp32" (FFMA), "mma_sync" (bf16 HMMA) or "wgmma" (bf16 HGMMA)
    fma_shares: tuple[float, ...] = ()  # FLOPs share of each phase's loop (launch_counts.fma_loops)
    fma_exact: bool = False  # FLOPs = 2 x the kernel's multiply-adds (GEMM, attention): the SASS can be scaled by them


def _gemm(info: KernelInfo, epilogue: str, in_b: int, out_b: int, tile_m: int | None, tile_n: int | None) -> None:
    M, N, K, what = GEMM_SHAPES[epilogue]
    info.flops = 2.0 * M * N * K
    info.fma_exact = True
    res = out_b * M * N if epilogue == "residual" else 0
    info.dram_bytes = in_b * (M * K + N * K) + out_b * M * N + res
    if tile_m is None:  # one output per thread, no reuse: A row and B row per output
        info.request_bytes = 2.0 * M * N * K * in_b + out_b * M * N + res
    else:
        info.request_bytes = in_b * M * N * K * (1 / tile_n + 1 / tile_m) + out_b * M * N + res
    reuse = "2·M·N·K" if tile_m is None else f"M·N·K·(1/{tile_n} + 1/{tile_m})"
    info.formula = (
        f"{what}; FLOPs = 2·M·N·K; dram = {in_b}·(M·K + N·K) + {out_b}·M·N{' (+R)' if res else ''}; "
        f"request = {in_b}·{reuse} + stores"
    )


def _attention(info: KernelInfo, elem: int, block_q: int | None) -> None:
    per_head = L * L * HD
    info.flops = 4.0 * per_head * HEADS
    info.fma_exact = True
    info.dram_bytes = elem * (3 * L * Q + L * Q) + 4 * L * HEADS
    kv_reads = L if block_q is None else L / block_q  # times K and V of the item are read
    info.request_bytes = elem * (kv_reads * 2 * L * HD * HEADS + L * Q + L * Q) + 4 * L * HEADS
    info.formula = (
        f"one item of L={L}, H={HEADS}, hd={HD}; FLOPs = 4·L²·hd·H (QKᵀ and PV); dram = {elem}·(3·L·Q + L·Q) + 4·L·H; "
        f"request: K,V read {'once per query row' if block_q is None else f'once per {block_q}-row query tile'}"
    )


def describe(backend: str, label: str, threads: int | None = None, dynamic_shared: int = 0) -> KernelInfo:
    """The catalogue entry of a kernel label (as the compile tiers name their cubins)."""
    info = KernelInfo(backend, label, "other", "", "", threads or 256, dynamic_shared)
    if backend == "numba":
        _numba(info)
    else:
        _cuda(info)
    return info


def _numba(info: KernelInfo) -> None:
    label = info.label
    if m := re.fullmatch(r"gemm_v(\d)_(\w+?)(#\d+)?", label):
        v, ep = int(m.group(1)), m.group(2)
        info.family, info.version, info.specialisation, info.threads = "gemm", f"v{v}", ep, 256
        if ep in GEMM_SHAPES:
            tiles = {1: (None, None), 2: (16, 16), 3: (64, 64)}.get(v, (64, 64))
            _gemm(info, ep, 4, 4, *tiles)
    elif m := re.fullmatch(r"attention_v1_hd(\d+)_t(\d+)", label):
        hd, t = int(m.group(1)), int(m.group(2))
        info.family, info.version, info.specialisation, info.threads = "attention", "v1", f"hd{hd} t{t}", t
        info.k3 = hd == HD
        if info.k3:
            _attention(info, 4, None)
    elif m := re.fullmatch(r"attention_v2_hd(\d+)_q(\d+)_k(\d+)", label):
        hd, bq, bk = (int(g) for g in m.groups())
        info.family, info.version, info.specialisation, info.threads = "attention", "v2", f"hd{hd} q{bq} k{bk}", bq * bk
        info.k3 = hd == HD
        info.fma_shares = (0.5, 0.5)  # the QK loop and the PV loop do L²·hd multiply-adds each
        if info.k3:
            _attention(info, 4, bq)
    elif m := re.fullmatch(r"rmsnorm_kernel_t(\d+)", label):
        t = int(m.group(1))
        info.family, info.version, info.specialisation, info.threads = "rmsnorm", "v1", f"t{t}", t
        info.k3 = t == 256  # threads_for(D=1024, max 256)
        _rmsnorm(info, 4, 4)
    elif label == "rope2d_kernel":
        info.family, info.version, info.specialisation, info.threads = "rope", "v1", "", 128
        _rope(info, 4)
    elif label == "merge_gather_kernel":
        info.family, info.version, info.specialisation, info.threads = "merge", "v1", "", 128
        _merge(info, 4, 4)
    elif m := re.fullmatch(r"add_pos_emb_(\w+)", label):
        info.family, info.version, info.specialisation, info.threads = "pos_emb", "v1", m.group(1), 128
        _pos_emb(info, m.group(1))
    elif label == "first_nonfinite_row_kernel":
        info.family, info.version, info.specialisation, info.threads = "input_check", "v1", "", 256
        info.flops, info.dram_bytes = 0.0, 4.0 * L * PATCH_K
        info.request_bytes = info.dram_bytes
        info.formula = "device pixel_values [L, 3·p·p] float32 read once; one int32 atomic on a bad value"


def _cuda(info: KernelInfo) -> None:
    label = info.label
    size = {"f32": 4, "bf16": 2}
    if m := re.fullmatch(r"gemm_bf16_tc_(f32|bf16)_(\w+)", label):
        info.family, info.version, info.specialisation = "gemm", "CUDA bf16 tc", f"out {m[1]}, {m[2]}"
        info.peak = "mma_sync"
        _gemm(info, m[2], 2, size[m[1]], 128, 128)
    elif m := re.fullmatch(r"gemm_bf16_sm90_bn(\d+)_(f32|bf16)_(\w+)", label):
        info.family, info.version, info.specialisation = "gemm", "CUDA sm90 wgmma", f"BN {m[1]}, out {m[2]}, {m[3]}"
        info.peak = "wgmma"
        _gemm(info, m[3], 2, size[m[2]], 128, int(m[1]))
    elif m := re.fullmatch(r"flash_attn_sm90_hd(\d+)", label):
        hd = int(m[1])
        info.family, info.version, info.specialisation, info.peak = "attention", "CUDA sm90 wgmma", f"hd{hd}", "wgmma"
        info.k3 = hd == HD
        if info.k3:
            _attention(info, 2, 64)
    elif m := re.fullmatch(r"gemm_fp32_simt_(\w+)", label):
        info.family, info.version, info.specialisation = "gemm", "CUDA fp32 simt", m[1]
        _gemm(info, m[1], 4, 4, 64, 64)
    elif m := re.fullmatch(r"flash_attn_(f32|bf16)_hd(\d+)", label):
        hd = int(m[2])
        info.family, info.version, info.specialisation = "attention", f"CUDA flash {m[1]}", f"hd{hd}"
        info.peak = "mma_sync" if m[1] == "bf16" else "fp32"
        info.k3 = hd == HD
        if info.k3:
            _attention(info, size[m[1]], 64 if m[1] == "bf16" else 16)
    elif m := re.fullmatch(r"rmsnorm_rows_(f32|bf16)_(f32|bf16)", label):
        info.family, info.version, info.specialisation = "rmsnorm", "CUDA", f"{m[1]}->{m[2]}"
        _rmsnorm(info, size[m[1]], size[m[2]])
    elif m := re.fullmatch(r"tpool_merge_(f32|bf16)_(f32|bf16)", label):
        info.family, info.version, info.specialisation = "merge", "CUDA", f"{m[1]}->{m[2]}"
        _merge(info, size[m[1]], size[m[2]])
    elif m := re.fullmatch(r"rope_2d_inplace_(f32|bf16)", label):
        info.family, info.version, info.specialisation = "rope", "CUDA", m[1]
        _rope(info, size[m[1]])
    elif m := re.fullmatch(r"add_pos_emb_(\w+)", label):
        info.family, info.version, info.specialisation = "pos_emb", "CUDA", m[1]
        _pos_emb(info, m[1])


def _rmsnorm(info: KernelInfo, in_b: int, out_b: int) -> None:
    info.flops = 4.0 * L * D
    info.dram_bytes = in_b * L * D + out_b * L * D + 4 * D + 4 * L
    info.request_bytes = 2 * in_b * L * D + out_b * L * D + 4 * L * D + 4 * L  # x twice, weight per row
    info.formula = f"rows=L={L}, D={D}; FLOPs = 4·L·D; dram = {in_b}·L·D + {out_b}·L·D + 4·(D + L)"


def _rope(info: KernelInfo, elem: int) -> None:
    info.flops = 3.0 * 2 * L * Q
    info.dram_bytes = 2.0 * elem * 2 * L * Q
    info.request_bytes = info.dram_bytes
    info.formula = f"L={L}, q and k of Q={Q}; FLOPs = 3·2·L·Q (+ sin/cos); dram = 2·{elem}·2·L·Q (read + write)"


def _merge(info: KernelInfo, in_b: int, out_b: int) -> None:
    info.flops = 2.0 * L * D
    info.dram_bytes = in_b * L * D + out_b * MERGED * MERGED_W
    info.request_bytes = info.dram_bytes
    info.formula = f"x [L={L}, D] -> [L/4, 4D], one frame; FLOPs = 2·L·D; dram = {in_b}·L·D + {out_b}·L·D"


def _pos_emb(info: KernelInfo, mode: str) -> None:
    taps = 4 if mode == "bicubic" else 2
    info.flops = float(2 * taps * taps + 2 * taps) * L * D
    info.dram_bytes = 4.0 * (2 * L * D + 64 * 64 * D)
    info.request_bytes = 4.0 * (2 * L * D + taps * taps * L * D)
    info.formula = (
        f"L={L}, D={D}, 64x64 grid, {taps}x{taps} taps; FLOPs = (2·{taps}² + 2·{taps})·L·D; "
        f"dram = 4·(2·L·D + 64·64·D); request = 4·(2·L·D + {taps}²·L·D)"
    )
